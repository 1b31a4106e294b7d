#!/usr/bin/env bash
# Host discovery for Horovod's elastic mode: prints the hosts of a hostfile as "HOST:SLOTS",
# one per line. horovodrun runs it about once a second, so editing the file while a job runs
# adds workers (a new line, or more slots) or retires them (a line removed).
#
#   HVD_CIFAR_HOSTFILE=hostfiles/example-cluster horovodrun -np 4 --min-np 2 --max-np 8 \
#       --host-discovery-script launch/discover-hosts.sh \
#       python -m hvd_cifar.train --config configs/cifar10_vgg11.yaml --elastic true
#
# The file is read by the rules of every hostfile here (hvd_cifar/launch/hostfile.py: "HOST
# slots=N", "HOST:N" or "HOST", '#' comments, each host once); default: hostfiles/localhost. A
# file that breaks them prints one line naming the line and exits 2: at the start that ends the
# job, later horovodrun keeps the hosts it had and says so. Python without site-packages (-S),
# the module needing only the standard library: it starts in tens of milliseconds, once a second.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -S -m hvd_cifar.launch.hostfile \
  "${HVD_CIFAR_HOSTFILE:-$ROOT/hostfiles/localhost}" --format lines
