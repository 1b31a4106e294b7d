#!/usr/bin/env bash
# Launch hvd_cifar training with horovodrun, reading the hosts from a hostfile.
#
#   launch/horovodrun.sh -np 4 -hostfile hostfiles/example-cluster --config configs/cifar10_vgg11.yaml
#   launch/horovodrun.sh -np 2 --gloo --config configs/demo.yaml           # hostfiles/localhost
#   launch/horovodrun.sh -np 4 -H hostfiles/example-cluster -p 2222 -- --epochs 3
#
# horovodrun's own -H wants "host:slots,..." and its -hostfile parser trips on comments and
# blank lines, so this script validates the file (saying which line is wrong), turns it into
# the -H list and runs horovodrun with it. Options before the training flags (or before --):
#   -np N                  processes (default: all slots in the hostfile)
#   -hostfile FILE | -H FILE
#   --gloo | --mpi         controller (default: horovodrun's choice, MPI when mpirun exists)
#   -p PORT                ssh port on the remote hosts
#   --network-interfaces IF, --start-timeout S, --verbose   passed to horovodrun
#   --probe                run python -m hvd_cifar.probe instead (times the network; its flags follow)
# Everything else goes to python -m hvd_cifar.train.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

hvd_args=()
while (($#)); do
  case "$1" in
    -np|--num-proc) np="$2"; shift 2 ;;
    -hostfile|--hostfile|-H|--hosts) hostfile="$2"; shift 2 ;;
    --gloo|--mpi|--verbose) hvd_args+=("$1"); shift ;;
    -p|--ssh-port|--network-interfaces|--start-timeout) hvd_args+=("$1" "$2"); shift 2 ;;
    --probe) module=hvd_cifar.probe; shift ;;  # time the network instead (python -m hvd_cifar.probe)
    --) shift; break ;;
    *) break ;;
  esac
done

resolve_hosts
# horovodrun itself, through hvd_cifar.launch.horovodrun: when a rank fails, the launcher's ending is one
# line instead of a traceback of horovodrun's driver; signals sent to this script's pid reach
# the launcher (exec), which stops every rank; and it stops them when this script's parent dies
# ($PPID, checked by hvd_cifar.launch.commands.die_with_parent). Arguments go through as an array:
# nothing from the command line is ever re-parsed by a shell.
HVD_CIFAR_LAUNCH_PARENT="$PPID" exec "$PY" -m hvd_cifar.launch.horovodrun -np "$np" -H "$hosts" ${hvd_args[@]+"${hvd_args[@]}"} "$PY" -m "$module" "$@"
