#!/usr/bin/env bash
# Builds Horovod 0.28.1 with NCCL (GPU allreduce, allgather, broadcast, ...) and Gloo, against
# the torch installed in a Python environment, on a machine with or without a GPU: compiling and
# linking need the CUDA toolkit and NCCL, not a GPU. The source, its fixes (1-7) and the build
# are scripts/install.sh's (install.sh --horovod-wheel); what is here is what a GPU build adds.
#
#   scripts/build-horovod-gpu.sh --python .venv/bin/python --target /tmp/hvd-gpu   # then pip --target
#   scripts/build-horovod-gpu.sh --python python3 --install   # into that Python's environment
#   scripts/build-horovod-gpu.sh --python python3             # the wheel only; its path is printed
#
# What it takes, each overridable through the environment:
#   CUDA toolkit  CUDA_HOME (a toolkit with bin/nvcc, e.g. a GPU machine's /usr/local/cuda);
#                 unset: PyPI's wheels of nvcc, its headers and the runtime, in the CUDA version
#                 torch was built with (torch.version.cuda; 13 and newer), unpacked into
#                 ~/.cache/hvd_cifar/cuda-VERSION. Its major version must be torch's.
#   NCCL          HOROVOD_NCCL_HOME (include/nccl.h, lib/libnccl.so*); unset: the nvidia-nccl wheel
#                 beside torch (PyPI's torch depends on it), so Horovod and torch share one NCCL
#   MPI           with MPI where mpicxx is on PATH, else without (HOROVOD_WITH_MPI=1 or
#                 HOROVOD_WITHOUT_MPI=1 decide instead)
#   GPU archs     HOROVOD_BUILD_CUDA_CC_LIST (e.g. 90 for H100/H200); unset: every one nvcc knows
#   jobs          MAKEFLAGS (default -j$(nproc))
#   source        HOROVOD_SDIST: a horovod-0.28.1.tar.gz on disk (no PyPI needed)
# The wheel is cached in ~/.cache/hvd_cifar/wheels/ (HVD_CIFAR_WHEEL_CACHE) by Horovod, fixes,
# torch, Python, CUDA, MPI and GPU archs; a second run reuses it. Then it prints what the
# library links (readelf, nm) and exits 1 if it calls no NCCL or CUDA runtime function. Its messages go to stderr,
# the wheel's path to stdout.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/hvd_cifar"

log() { printf '[build-horovod-gpu] %s\n' "$*" >&2; }
die() { printf 'build-horovod-gpu.sh: %s\n' "$*" >&2; exit 2; }

PYTHON=python3
install=""
target=""
while (($#)); do
  case "$1" in
    --python) PYTHON="${2:?--python needs a path}"; shift ;;
    --install) install=env ;;
    --target) install=target; target="${2:?--target needs a folder}"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (takes --python PY, --install, --target DIR)" ;;
  esac
  shift
done
PY="$(command -v "$PYTHON")" || die "$PYTHON not found"
# Absolute, without resolving links (a venv's python is a link to the base interpreter).
[[ "$PY" = /* ]] || PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
export PIP_DISABLE_PIP_VERSION_CHECK=1

# --- torch: the version and CUDA the build must match -------------------------------------------
probe="$("$PY" - <<'PYEOF'
import os, sys
try:
    import torch
except ImportError:
    sys.exit("build-horovod-gpu.sh: no torch in this Python environment")
try:
    import nvidia.nccl
    nccl = os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0]
except ImportError:
    nccl = "-"
print(torch.__version__.split("+")[0], torch.version.cuda or "-", "%d%d" % sys.version_info[:2], nccl)
PYEOF
)" || exit 2
read -r torch_version torch_cuda py_tag nccl_dir <<< "$probe"
[ "$torch_cuda" != - ] || die "torch $torch_version in $PY is a CPU-only build; a GPU build of Horovod needs a CUDA build of torch"
cuda_major="${torch_cuda%%.*}"
log "torch $torch_version (CUDA $torch_cuda) in $PY"

# --- the CUDA toolkit ------------------------------------------------------------------------------
if [ -n "${CUDA_HOME:-}" ]; then
  [ -x "$CUDA_HOME/bin/nvcc" ] || die "CUDA_HOME=$CUDA_HOME has no bin/nvcc"
else
  # PyPI's wheels, in torch's CUDA version. From CUDA 13 on they share one layout (nvidia/cu13/);
  # CUDA 12's spread over a folder per wheel, which nvcc cannot use as they come: give CUDA_HOME.
  [ "$cuda_major" -ge 13 ] ||
    die "torch was built with CUDA $torch_cuda: PyPI's toolkit is used from CUDA 13 on; set CUDA_HOME to a CUDA $cuda_major toolkit"
  toolkit="$CACHE/cuda-$torch_cuda"
  CUDA_HOME="$toolkit/nvidia/cu$cuda_major"
  if [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
    # nvcc's front end (crt) and its device compiler (nvvm) are wheels of their own.
    packages=("nvidia-cuda-nvcc==$torch_cuda.*" "nvidia-cuda-crt==$torch_cuda.*" "nvidia-nvvm==$torch_cuda.*"
              "nvidia-cuda-runtime==$torch_cuda.*" "nvidia-cuda-cccl==$torch_cuda.*")
    log "CUDA toolkit $torch_cuda from PyPI: ${packages[*]} -> $toolkit"
    PIP_CONFIG_FILE=/dev/null "$PY" -m pip install -q --no-deps --only-binary=:all: --target "$toolkit" "${packages[@]}" >&2
  fi
  # GPU fix 1: the wheels lay the toolkit out as nvidia/cuXX/{bin,include,lib}, while nvcc.profile
  # looks for its libraries in lib64 and its headers under targets/x86_64-linux (as a
  # /usr/local/cuda does), and CMake's FindCUDAToolkit wants an unversioned libcudart.so (the
  # wheel has only libcudart.so.13): without these links nvcc cannot link (-lcudart_static not
  # found) and CMake stops at "Could NOT find CUDAToolkit (missing: CUDA_CUDART)".
  ln -sfn lib "$CUDA_HOME/lib64"
  mkdir -p "$CUDA_HOME/targets/x86_64-linux"
  ln -sfn ../../include "$CUDA_HOME/targets/x86_64-linux/include"
  ln -sfn ../../lib "$CUDA_HOME/targets/x86_64-linux/lib"
  cudart="$(cd "$CUDA_HOME/lib" && ls libcudart.so.* | sort -V | tail -n 1)"
  ln -sfn "$cudart" "$CUDA_HOME/lib/libcudart.so"
fi
nvcc_version="$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')"
[ "${nvcc_version%%.*}" = "$cuda_major" ] ||
  die "nvcc $nvcc_version at $CUDA_HOME but torch was built with CUDA $torch_cuda: use a CUDA $cuda_major toolkit"
log "nvcc $nvcc_version at $CUDA_HOME"

# --- NCCL --------------------------------------------------------------------------------------
if [ -z "${HOROVOD_NCCL_HOME:-}" ]; then
  if [ "$nccl_dir" = - ]; then
    nccl_dir="$CACHE/nccl-cu$cuda_major/nvidia/nccl"
    [ -f "$nccl_dir/include/nccl.h" ] ||
      PIP_CONFIG_FILE=/dev/null "$PY" -m pip install -q --no-deps --only-binary=:all: \
        --target "$CACHE/nccl-cu$cuda_major" "nvidia-nccl-cu$cuda_major" >&2
  fi
  # GPU fix 2: the nvidia-nccl wheel ships libnccl.so.2 only, and Horovod's FindNCCL looks for
  # libnccl.so (or the static library, which the wheel lacks). A folder of links gives it that
  # name; the library records the soname libnccl.so.2, which is torch's own NCCL, already
  # loaded by `import torch` when horovod.torch loads.
  HOROVOD_NCCL_HOME="$CACHE/nccl-links-cu$cuda_major"
  mkdir -p "$HOROVOD_NCCL_HOME/lib"
  ln -sfn "$nccl_dir/include" "$HOROVOD_NCCL_HOME/include"
  ln -sfn "$nccl_dir/lib/libnccl.so.2" "$HOROVOD_NCCL_HOME/lib/libnccl.so"
fi
[ -f "$HOROVOD_NCCL_HOME/include/nccl.h" ] || die "HOROVOD_NCCL_HOME=$HOROVOD_NCCL_HOME has no include/nccl.h"
nccl_version="$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' "$HOROVOD_NCCL_HOME/include/nccl.h" | paste -sd.)"
log "NCCL $nccl_version at $HOROVOD_NCCL_HOME"

# --- MPI: where the machine has an MPI library ---------------------------------------------------
if [ -z "${HOROVOD_WITH_MPI:-}${HOROVOD_WITHOUT_MPI:-}" ]; then
  if command -v mpicxx > /dev/null; then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
fi
mpi=mpi; [ -z "${HOROVOD_WITHOUT_MPI:-}" ] || mpi=nompi

# --- the build -----------------------------------------------------------------------------------
export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$CUDA_HOME" CUDA_HOME HOROVOD_NCCL_HOME
export HOROVOD_NCCL_LINK=SHARED   # the wheel's NCCL is a shared library only
export PATH="$CUDA_HOME/bin:$PATH"
archs="${HOROVOD_BUILD_CUDA_CC_LIST:+-sm${HOROVOD_BUILD_CUDA_CC_LIST//,/_}}"
start=$SECONDS
wheel="$(bash "$ROOT/scripts/install.sh" --horovod-wheel "$PY" "-cu$torch_cuda-NCCL-$mpi$archs")"
log "wheel: $wheel ($((SECONDS - start)) s)"

# --- what it links -------------------------------------------------------------------------------
check="$(mktemp -d)"
trap 'rm -rf "$check"' EXIT
"$PY" -m zipfile -e "$wheel" "$check"
lib="$(ls "$check"/horovod/torch/mpi_lib_v2*.so)"
# NCCL and CUDA's runtime are shared libraries the extension needs by soname (libnccl.so.2,
# libcudart.so.N): at run time `import torch` has loaded torch's own copies of both already.
nccl_calls="$(nm -D --undefined-only "$lib" | awk '/ nccl/ {print $2}' | paste -sd' ')"
cudart_calls="$(nm -D --undefined-only "$lib" | grep -c ' cuda.*@libcudart' || true)"
log "$(basename "$lib") needs: $(readelf -d "$lib" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | grep -E 'nccl|cudart|cuda|mpi' | paste -sd' ')"
log "$(basename "$lib") calls NCCL's ${nccl_calls:-nothing}"
log "$(basename "$lib") calls $cudart_calls functions of CUDA's runtime"
[ -n "$nccl_calls" ] && [ "$cudart_calls" -gt 0 ] ||
  { echo "build-horovod-gpu.sh: $(basename "$lib") does not call NCCL and CUDA's runtime: not an NCCL build" >&2; exit 1; }

# --- install --------------------------------------------------------------------------------------
case "$install" in
  env) "$PY" -m pip install -q --no-deps --force-reinstall "$wheel" ;;
  target) "$PY" -m pip install -q --no-deps --upgrade --target "$target" "$wheel" ;;
esac
[ -z "$install" ] || log "installed $(basename "$wheel")${target:+ into $target}"
echo "$wheel"
