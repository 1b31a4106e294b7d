"""The set-up recipe: the install script (which the Dockerfile runs) and the Dockerfile itself."""
import json
import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import BIN, ROOT, TINY, run_train

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def test_install_script_is_idempotent_and_fast_the_second_time():
    start = time.monotonic()
    proc = subprocess.run(["bash", "scripts/install.sh"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, VENV=str(BIN.parent)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert time.monotonic() - start < 60
    assert "ready" in proc.stdout


def test_horovod_build_has_pytorch_mpi_and_gloo():
    """What `horovodrun --check-build` (which scripts/install.sh runs after installing Horovod)
    lists, asked of the PyTorch extension itself in one process: it loads, with MPI and Gloo.
    (--check-build imports torch once per question, about 12 CPU-seconds.)"""
    probe = "import horovod.torch as hvd; print(hvd.mpi_built(), hvd.gloo_built())"
    out = subprocess.run([str(BIN / "python"), "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr


def test_horovodruns_build_check_asks_the_library_not_torch():
    """Fix 8 (scripts/install.sh): horovodrun's question whether Horovod was built with MPI and
    Gloo, asked at every launch, is answered by the torch extension's library through ctypes, in
    a process that never imports torch (it imported torch, 2.5 CPU-s, at every launch)."""
    probe = ("import sys\nfrom horovod.common import util\n"
             "print(util._built_in_library('torch', 'built with MPI'), util._built_in_library('torch', 'built with Gloo'),"
             " util._built_in_library('torch', 'built with NCCL'), 'torch' in sys.modules)")
    out = subprocess.run([str(BIN / "python"), "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "True", "None", "False"], out.stdout + out.stderr


# Rank 0 stops for HOLD_S after its third step; rank 1 measures its fourth step, wall time and
# its main thread's CPU: the step that needs rank 0's part of the allreduce.
HELD_PEER = """
import json, os, time
from hvd_cifar.core import launcher
from hvd_cifar.trainer import loop
HOLD_S = 2.0
_after_step, mark = loop.TrainingState.after_step, []
def after_step(self, step, images):
    _after_step(self, step, images)
    rank, at = launcher.launch_rank(), (self.epoch, step)
    if rank == 0 and at == (0, 3):
        time.sleep(HOLD_S)
    if rank == 1 and at in ((0, 3), (0, 4)):
        mark.append((time.monotonic(), time.thread_time()))
        if len(mark) == 2:
            with open(os.path.join(os.environ["WAITS_DIR"], "rank1.json"), "w") as f:
                json.dump([mark[1][0] - mark[0][0], mark[1][1] - mark[0][1]], f)
loop.TrainingState.after_step = after_step
"""


def test_a_rank_waiting_for_a_late_peer_sleeps_instead_of_spinning(tmp_path):
    """Fix 9 (scripts/install.sh): while rank 0 is held for 2 s, rank 1's next step waits for
    rank 0's part of a collective. That wait sleeps: the step costs a fraction of its wall time
    in CPU (Horovod 0.28.1 polled with sched_yield, a whole core for the whole wait)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HELD_PEER)
    env = {"PYTHONPATH": f"{hook}:{os.environ.get('PYTHONPATH', '')}", "WAITS_DIR": str(tmp_path)}
    run_train(["--config", TINY, "--epochs", "1", "--log-dir", str(tmp_path), "--checkpoint-every", "0"],
              launcher="mpirun", np=2, env=env)
    wall, cpu = json.loads((tmp_path / "rank1.json").read_text())  # rank 1's step that waited
    assert wall >= 1.0, wall  # it waited for the hold (less only by how far rank 1 was behind)
    assert cpu < 0.2 * wall, f"rank 1 spent {cpu:.2f} CPU-s of a {wall:.2f} s wait"


def test_install_script_explains_each_horovod_fix():
    script = (ROOT / "scripts" / "install.sh").read_text()
    for fix in ("Fix 1", "Fix 2", "Fix 3"):
        assert fix in script
    assert "CMAKE_CXX_STANDARD 17" in script and "HOROVOD_GPU_OPERATIONS" in script
    assert "--no-build-isolation" in script


def test_dockerfile_lints_clean():
    hadolint = shutil.which("hadolint", path=str(BIN))
    if hadolint is None:
        pytest.skip("hadolint not installed")
    proc = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout


def test_dockerfile_recipe():
    # pinned base, a build argument for a CUDA base and the GPU build
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11\.\d+-slim-bookworm$", DOCKERFILE, re.M)
    assert "ARG HOROVOD_GPU_OPERATIONS" in DOCKERFILE and "nvidia/cuda:" in DOCKERFILE
    # the same install script CI runs, and a build-time horovod check
    assert "bash scripts/install.sh" in DOCKERFILE and "horovodrun --check-build" in DOCKERFILE
    # ends as an unprivileged user
    users = re.findall(r"^USER (\S+)", DOCKERFILE, re.M)
    assert users and users[-1] not in ("root", "0")
    # every file the image copies exists
    for src in re.findall(r"^COPY (\S+)", DOCKERFILE, re.M):
        assert (ROOT / src).exists(), src


# Two ranks that have started Horovod and then do nothing: the CPU their background threads use
# a second, over IDLE_S. Each thread wakes once a cycle (5 ms, hvd_cifar's default) and
# negotiates with the other rank. Without Fix 7 the ranks' cycles keep the phase they began
# with, and the rank ahead polls in Open MPI for the rest of each cycle. Measured here
# (2026-11-26), the busier rank of the two: without the fix 80-999 ms a second (how much depends
# on the phase the ranks start in, set by chance); with it 10-20 ms, also beside 2 and 4 CPU
# hogs (35-45 ms at a 1 ms cycle).
IDLE_S = 3.0
IDLE_LIMIT_MS_PER_S = 60
IDLE_RANK = """
import json, os, sys, time
import psutil
from hvd_cifar.sync import openmpi
openmpi.apply_defaults()
os.environ["HOROVOD_CYCLE_TIME"] = "5"
import horovod.torch as hvd, torch
hvd.init()

def others() -> float:  # CPU seconds of every thread but the main one
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id != os.getpid())

hvd.allreduce(torch.zeros(1), name="start")
before, start = others(), time.monotonic()
time.sleep(float(sys.argv[1]))
used = (others() - before) / (time.monotonic() - start) * 1000
with open(os.path.join(sys.argv[2], f"rank{hvd.rank()}.json"), "w") as f:  # not stdout: mpirun may join two ranks' lines
    json.dump({"ms_per_s": used}, f)
hvd.allreduce(torch.zeros(1), name="end")
"""


@pytest.mark.slow  # a 2-rank mpirun job
def test_idle_horovod_ranks_do_not_poll_for_each_other(tmp_path):
    """Fix 7: the background threads' cycles start together, so neither waits for the other."""
    from hvd_cifar.launch import commands
    script = tmp_path / "idle_rank.py"
    script.write_text(IDLE_RANK)
    program = [str(BIN / "python"), str(script), str(IDLE_S), str(tmp_path)]
    proc = subprocess.run(commands.argv("mpirun", 2, program=program), cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    used = sorted(json.loads((tmp_path / f"rank{r}.json").read_text())["ms_per_s"] for r in (0, 1))
    assert used[-1] < IDLE_LIMIT_MS_PER_S, used
