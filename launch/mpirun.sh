#!/usr/bin/env bash
# Launch hvd_cifar training with Open MPI's mpirun (clusters with a shared file system).
#
#   launch/mpirun.sh -np 4 -hostfile hostfiles/example-cluster --config configs/cifar10_vgg11.yaml
#   launch/mpirun.sh -np 2 --oversubscribe --config configs/tiny.yaml      # hostfiles/localhost
#
# The hostfile is validated first (comments, blank lines, "HOST slots=N" or "HOST:N") and
# handed to mpirun as -H HOST:SLOTS,... The flags are the ones Horovod's docs give for Open MPI
# (-bind-to none -map-by slot, -x for the environment remote ranks need, -mca pml ob1 -mca btl
# ^openib), listed once, with why, in hvd_cifar/launch/commands.py, which prints them here.
# Options before the training flags (or before --): -np N, -hostfile FILE | -H FILE,
# --oversubscribe (more ranks than cores), -p PORT (ssh port of the remote hosts), --probe (run
# python -m hvd_cifar.probe instead: times the network; its flags follow).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

mpi_args=()
while (($#)); do
  case "$1" in
    -np|-n) np="$2"; shift 2 ;;
    -hostfile|--hostfile|-H) hostfile="$2"; shift 2 ;;
    --oversubscribe) mpi_args+=(--oversubscribe); shift ;;
    -p|--ssh-port) mpi_args+=(-mca plm_rsh_args "-p $2"); shift 2 ;;
    --probe) module=hvd_cifar.probe; shift ;;  # time the network instead (python -m hvd_cifar.probe)
    --) shift; break ;;
    *) break ;;
  esac
done

resolve_hosts
[ "$(id -u)" -ne 0 ] || mpi_args+=(--allow-run-as-root)
flags="$("$PY" -m hvd_cifar.launch.commands mpirun-flags)"   # one per line
mapfile -t horovod_flags <<< "$flags"

# exec: mpirun takes this script's pid, so a SIGTERM or SIGINT sent to it (a person, timeout,
# a supervisor) reaches mpirun, which stops every rank; a shell waiting for mpirun would die
# alone and leave mpirun and the ranks running. hvd_cifar.launch.commands exec also has mpirun
# stopped when this script's parent dies.
HVD_CIFAR_LAUNCH_PARENT="$PPID" exec "$PY" -m hvd_cifar.launch.commands exec \
  mpirun -np "$np" -H "$hosts" "${horovod_flags[@]}" \
  ${mpi_args[@]+"${mpi_args[@]}"} \
  "$PY" -m "$module" "$@"
