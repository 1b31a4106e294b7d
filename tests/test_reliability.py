"""Faults: a rank killed mid-epoch ends the job; a checkpoint write killed half-way loses nothing."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT, TINY, launch_argv, run_train


def rank_pids(marker: str) -> list[int]:
    """PIDs of the python ranks (not launchers, not shells) whose command line holds ``marker``."""
    out = subprocess.run(["pgrep", "-f", "--", f"hvd_cifar.train .*{marker}"], capture_output=True, text=True).stdout
    pids = []
    for pid in map(int, out.split()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[1:3] == [b"-m", b"hvd_cifar.train"]:
            pids.append(pid)
    return pids


@pytest.mark.slow
@pytest.mark.parametrize("launcher, sync", [
    ("horovodrun", "horovod"), ("horovodrun-gloo", "horovod"), ("mpirun", "horovod"),
    ("mpirun", "mpi-allreduce"), ("mpirun", "mpi-gather-scatter"), ("mpirun", "ddp"),
    ("horovodrun-gloo", "ddp"),
])
def test_sigkill_of_one_rank_ends_the_job_quickly(tmp_path, launcher, sync):
    marker = f"killtest-{launcher}-{sync}-{os.getpid()}"
    args = ["--config", TINY, "--epochs", "200", "--max-steps-per-epoch", "20", "--log-dir", str(tmp_path),
            "--run-name", marker, "--sync", sync]
    job = subprocess.Popen([*launch_argv(launcher, 2), *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / marker / "metrics.jsonl").exists():  # training is under way
            assert job.poll() is None, job.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.5)
        victims = rank_pids(marker)
        assert len(victims) == 2
        os.kill(victims[-1], signal.SIGKILL)
        killed_at = time.monotonic()
        code = job.wait(timeout=90)
        assert time.monotonic() - killed_at < 60
        assert code != 0
        time.sleep(1)
        assert rank_pids(marker) == []  # no orphaned rank left running
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


KILL_MID_WRITE = """
import os, signal, sys, torch
from hvd_cifar import runlog
def half_then_die(f):
    f.write(b"x" * 1000)
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
runlog.atomic_write(os.path.join(sys.argv[1], runlog.CHECKPOINT), half_then_die)
"""


def test_a_checkpoint_write_killed_half_way_leaves_the_last_good_one(tmp_path, tiny_args):
    run_train([*tiny_args, "--epochs", "1"])
    run = tmp_path / "logs" / "run"
    before = (run / "checkpoint_last.pt").read_bytes()
    proc = subprocess.run([sys.executable, "-c", KILL_MID_WRITE, str(run)], cwd=ROOT)
    assert proc.returncode == -signal.SIGKILL
    assert (run / "checkpoint_last.pt").read_bytes() == before
    torch.load(run / "checkpoint_last.pt", weights_only=True)
    # and the run still resumes from it
    proc = run_train(["--resume", str(run), "--epochs", "2"])
    assert "resuming after epoch 1 of 2" in proc.stdout


def test_unwritable_log_dir_is_one_line(tmp_path, tiny_args):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = run_train([*tiny_args, "--log-dir", str(blocker / "logs")], check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hvd_cifar: error: log_dir: cannot create")


def test_batch_times_ranks_larger_than_the_data_set(tmp_path, tiny_args):
    proc = run_train([*tiny_args, "--batch-size", "800"], launcher="mpirun", np=2, check=False)
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if "hvd_cifar" in line]
    assert ours == ["hvd_cifar: error: batch_size: 800 x 2 ranks is larger than the 1437 training images"]


def test_corrupt_checkpoint_is_one_line(tmp_path, tiny_args):
    run_train([*tiny_args, "--epochs", "1", "--max-steps-per-epoch", "1"])
    run = tmp_path / "logs" / "run"
    (run / "checkpoint_last.pt").write_bytes(b"this is not a checkpoint")
    proc = run_train(["--resume", str(run), "--epochs", "2"], check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"hvd_cifar: error: resume: {run}/checkpoint_last.pt is not a readable checkpoint (")
