# Sourced by launch/horovodrun.sh and launch/mpirun.sh: the checkout, its Python, the defaults of
# the options both scripts take, and the hostfile read the same way by both.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"

np=0                                  # -np N; 0: every slot the hostfile lists
hostfile="$ROOT/hostfiles/localhost"  # -hostfile FILE
module=hvd_cifar.train                # --probe: hvd_cifar.probe

# hosts=HOST:SLOTS,... as the hostfile says (checked first: a bad line ends the script with one
# line naming it), and np, when it was 0, the sum of the slots. No temp file that would outlive
# an exec'd launcher.
resolve_hosts() {
  hosts="$("$PY" -m hvd_cifar.launch.hostfile "$hostfile" --np "$np" --format horovod)"
  if [ "$np" -eq 0 ]; then
    IFS=',' read -ra entries <<< "$hosts"
    for entry in "${entries[@]}"; do np=$((np + ${entry##*:})); done
  fi
}
