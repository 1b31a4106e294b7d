#!/usr/bin/env bash
# Host discovery for Horovod's elastic mode: prints the hosts of a hostfile as "HOST:SLOTS",
# one per line. horovodrun runs it about once a second, so editing the file while a job runs
# adds workers (a new line, or more slots) or retires them (a line removed).
#
#   HVD_CIFAR_HOSTFILE=hostfiles/example-cluster horovodrun -np 4 --min-np 2 --max-np 8 \
#       --host-discovery-script launch/discover-hosts.sh \
#       python -m hvd_cifar.train --config configs/cifar10_vgg11.yaml --elastic true
#
# The file has the format of every hostfile here ("HOST slots=N", "HOST:N" or "HOST",
# '#' comments); default: hostfiles/localhost. Pure awk rather than Python: it runs every second.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec awk '
  { sub(/#.*/, "") }
  NF == 0 { next }
  $1 ~ /:/ { print $1; next }
  { slots = 1
    for (i = 2; i <= NF; i++) if ($i ~ /^slots=/) { split($i, kv, "="); slots = kv[2] }
    print $1 ":" slots }
' "${HVD_CIFAR_HOSTFILE:-$ROOT/hostfiles/localhost}"
