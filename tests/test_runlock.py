"""One job per run folder (hvd_cifar.runfolder.lock), and a resume that has nothing to do says so.

A second job on a held run folder stops with one line naming the holder's host and pid; the
lock of a holder that died (SIGKILL: nothing of it ran at exit) does not block the next job."""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys

import pytest

from conftest import ROOT, read_metrics, run_train
from hvd_cifar.core.files import RunError
from hvd_cifar.runfolder import lock

HOLD = ("import sys, time; from hvd_cifar.runfolder import lock; lock.hold(sys.argv[1]); "
        "print('held', flush=True); time.sleep(120)")


@pytest.fixture
def holder():
    """``holder(folder)``: another process holding the folder's lock, until killed."""
    started = []

    def start(folder) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=ROOT, stdout=subprocess.PIPE,
                                text=True)
        started.append(proc)
        assert proc.stdout.readline() == "held\n"
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()
    lock.release_all()


def test_a_held_run_folder_is_refused_with_its_holder_and_freed_when_the_holder_dies(tmp_path, holder):
    proc = holder(tmp_path)
    with pytest.raises(RunError) as refused:
        lock.hold(str(tmp_path))
    assert str(refused.value).startswith(f"run folder {tmp_path} is in use by another job "
                                         f"(host {socket.gethostname()} pid {proc.pid} since ")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lock.hold(str(tmp_path))  # the dead holder's lock went with it
    assert lock.holder(str(tmp_path)).startswith(f"host {socket.gethostname()} pid ")
    lock.release_all()
    proc = holder(tmp_path)  # and this process let go of it again
    assert f"pid {proc.pid} " in lock.holder(str(tmp_path))


def test_a_second_job_resuming_a_held_run_is_one_line_and_touches_nothing(tmp_path, tiny_run, holder):
    run = tmp_path / "run"
    shutil.copytree(tiny_run().run, run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.name != lock.LOCK_NAME}
    proc = holder(run)
    second = run_train(["--resume", str(run), "--epochs", "3"], check=False)
    assert second.returncode == 2, second.stderr[-2000:]
    assert second.stderr.splitlines() == [
        f"hvd_cifar: error: run folder {run} is in use by another job ({lock.holder(str(run))}): one job "
        f"per run folder; wait for it to end, or stop it"]
    assert f"pid {proc.pid} " in second.stderr
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.name != lock.LOCK_NAME} == before


def test_resuming_a_run_that_reached_its_stop_after_says_how_to_go_on(tmp_path, tiny_run):
    """A run stopped by its stop_after (here: 2 epochs of 3 done, stop_after 2) has nothing to
    train when resumed as it was saved: one line that gives the command that goes on, which does."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run().run, run)
    stopped = run_train(["--resume", str(run), "--epochs", "3", "--stop-after", "2"], check=False)
    assert stopped.returncode == 2, stopped.stderr[-2000:]
    assert stopped.stderr.splitlines() == [
        f"hvd_cifar: error: stop_after: the run already stopped after epoch 2 of 3, as its stop_after: 2 asks; "
        f"to go on: --resume {run} --stop-after 0 (to the end) or --stop-after N (N > 2)"]
    run_train(["--resume", str(run), "--epochs", "3", "--stop-after", "0"])
    assert [r["epoch"] for r in read_metrics(run)] == [0, 1, 2]
