#!/usr/bin/env bash
# The GPU check, in one command, for a machine with one NVIDIA GPU, its driver, CUDA's nvcc and
# a CUDA build of torch, and no network (e.g. one H100 or H200, PyTorch 2.11 + CUDA 13, no MPI
# library): about 10 minutes on 16 cores.
#   1. builds Horovod 0.28.1 with NCCL and Gloo (and MPI only where mpicxx exists) against that
#      machine's torch, with scripts/build-horovod-gpu.sh, into a folder of its own ($WORK/site)
#   2. runs scripts/check_gpu.py: hvd_cifar's training on CUDA (fp32, AMP fp16 and bf16,
#      channels-last; VGG-11 and ResNet-18; horovod and ddp; each against a plain PyTorch loop),
#      digits to 95 %, and 2 ranks sharing the GPU under horovodrun --gloo
#   3. writes every figure into one JSON file, $OUT/check-gpu.json (or --out FILE)
#
#   scripts/check-gpu.sh                   # on the GPU machine
#   scripts/check-gpu.sh --dry-run         # here, without a GPU: step 2 on the CPU at tiny sizes
#                                          # with .venv's Horovod; checks this script, not a GPU
#
# Without a network the Horovod source must be on disk: fetch it once where PyPI is reachable,
#   python3 -m pip download --no-deps --no-binary :all: horovod==0.28.1 -d .whl
# and bring .whl/ along (HOROVOD_SDIST names another file). On a machine with no GPU the check
# stops at once with one line saying so, exit status 1.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WORK="${HVD_CIFAR_GPU_WORK:-/tmp/hvd_cifar-check-gpu}"
out="${OUT:-$WORK}/check-gpu.json"
dry_run=0
while (($#)); do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --out) out="${2:?--out needs a file}"; shift ;;
    *) echo "check-gpu.sh: unknown argument $1 (takes --dry-run, --out FILE)" >&2; exit 2 ;;
  esac
  shift
done
log() { printf '[check-gpu] %s\n' "$*" >&2; }
mkdir -p "$WORK" "$(dirname "$out")"

if ((dry_run)); then
  PYTHON="$ROOT/.venv/bin/python"
  log "dry run: CPU, tiny sizes, .venv's Horovod; results -> $out"
  exec "$PYTHON" "$ROOT/scripts/check_gpu.py" --out "$out" --dry-run
fi

# --- a GPU, or one line and exit 1 ----------------------------------------------------------------
if ! gpu="$("$PYTHON" -c 'import torch; assert torch.cuda.is_available(); print(torch.cuda.get_device_name(0))' 2>/dev/null)"; then
  echo "check-gpu.sh: no CUDA GPU visible to $PYTHON's torch ($("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo 'not importable')): this check runs on a machine with an NVIDIA GPU (--dry-run runs its CPU parts)" >&2
  exit 1
fi
log "GPU: $gpu"

# --- 1. Horovod with NCCL and Gloo, against this machine's torch ----------------------------------
# The machine's own toolkit (it has no network for PyPI's); its nvcc must match torch's CUDA
# (build-horovod-gpu.sh checks). Kernels for this GPU's architecture only, to keep the build short.
# The toolkit: the folder of the nvcc on PATH, where it is one (/usr/local/bin/nvcc can be a
# wrapper script that execs the real one: then the folder it names), else /usr/local/cuda.
if [ -z "${CUDA_HOME:-}" ]; then
  for candidate in "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc; do
    [ -n "$candidate" ] && [ -x "$candidate" ] || continue
    real="$(readlink -f "$candidate")"
    if ! head -c 4 "$real" | grep -q ELF; then
      real="$(grep -o '/[^ "]*/bin/nvcc' "$real" | head -n 1 || true)"
    fi
    [ -n "$real" ] && [ -f "$(dirname "$(dirname "$real")")/include/cuda_runtime.h" ] || continue
    CUDA_HOME="$(dirname "$(dirname "$real")")"
    break
  done
  [ -n "${CUDA_HOME:-}" ] || { echo "check-gpu.sh: no CUDA toolkit: no nvcc on PATH or in /usr/local/cuda; set CUDA_HOME" >&2; exit 1; }
  export CUDA_HOME
fi
if [ -z "${HOROVOD_SDIST:-}" ] && [ -f "$ROOT/.whl/horovod-0.28.1.tar.gz" ]; then
  export HOROVOD_SDIST="$ROOT/.whl/horovod-0.28.1.tar.gz"
fi
export HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-$("$PYTHON" -c 'import torch; print("%d%d" % torch.cuda.get_device_capability(0))')}"
export MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}"
start=$SECONDS
wheel="$(bash "$ROOT/scripts/build-horovod-gpu.sh" --python "$PYTHON" --target "$WORK/site")"
build_s=$((SECONDS - start))
log "Horovod built and installed into $WORK/site in $build_s s"

# --- 2. and 3. the runs and the results file --------------------------------------------------------
export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}" PATH="$WORK/site/bin:$PATH"
"$PYTHON" "$ROOT/scripts/check_gpu.py" --out "$out" --note "horovod_wheel=$(basename "$wheel")" \
  --note "horovod_build_and_install_s=$build_s" --note "MAKEFLAGS=$MAKEFLAGS" --note "CUDA_HOME=$CUDA_HOME"
