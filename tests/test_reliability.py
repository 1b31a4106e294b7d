"""Faults: a rank killed mid-epoch ends the job; a checkpoint write killed half-way loses nothing."""
import signal
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, run_train


sys.path.insert(0, str(ROOT / "benchmarks"))
import reliability  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("launcher, sync, victim", [
    (launcher, sync, i % 2) for i, (launcher, sync) in enumerate(reliability.KILL_JOBS)])
def test_sigkill_of_one_rank_ends_the_job_quickly(tmp_path, launcher, sync, victim):
    """SIGKILL to rank 1 (or rank 0, every other case) once an epoch is written: the launcher
    exits non-zero within 60 s and no rank is left running."""
    result = reliability.kill_drill(launcher, sync, victim, tmp_path)
    assert result["ok"], result["why"]
    assert result["exit"] != 0 and result["seconds"] <= 60 and result["orphans"] == 0


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


def test_lost_peer_tells_a_dead_peer_from_a_fault_of_this_rank():
    from hvd_cifar.sync import lost_peer

    class HorovodInternalError(RuntimeError):  # Horovod's name; matched by name, as Horovod may be absent
        pass

    assert lost_peer(HorovodInternalError("Horovod has been shut down"))
    assert lost_peer(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:27858"))
    assert not lost_peer(OSError("disk on fire"))
    assert not lost_peer(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not lost_peer(ValueError("Connection closed by peer"))  # only what collectives raise
