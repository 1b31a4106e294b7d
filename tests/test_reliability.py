"""Faults: a rank killed mid-epoch ends the job; a checkpoint write killed half-way loses nothing."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT, STOP_FLAGS, launch_argv, read_metrics, run_train, seconds_until_it_ends, unmeasured
from testbed import drill


# The drill's kill cases (benchmarks/reliability.py runs all ten) cut to what differs: under MPI
# (mpirun, and horovodrun, which runs mpirun) Open MPI ends the job whatever the method, so each
# method once there; under Gloo the survivors are stuck in the method's own collective, so both.
KILLED_HERE = [("horovodrun", "mpi-allreduce"), ("horovodrun", "mpi-gather-scatter"), ("mpirun", "horovod"),
               ("mpirun", "ddp"), ("horovodrun-gloo", "horovod"), ("horovodrun-gloo", "ddp")]


@pytest.mark.slow
@pytest.mark.parametrize("launcher, sync, victim", [
    (launcher, sync, i % 2) for i, (launcher, sync) in enumerate(KILLED_HERE)])
def test_sigkill_of_one_rank_ends_the_job_quickly(tmp_path, launcher, sync, victim):
    """SIGKILL to rank 1 (or rank 0, every other case) once an epoch is written: the launcher
    exits non-zero within the drill's bound (times the suite's slack, testbed.drill.SUITE_SLACK)
    and no rank is left running."""
    assert (launcher, sync) in drill.KILL_JOBS
    bound_s = drill.SUITE_SLACK * drill.KILL_BOUND_S
    result = drill.kill_drill(launcher, sync, victim, tmp_path, bound_s=bound_s)
    assert result["ok"], result["why"]
    assert result["exit"] != 0 and result["seconds"] <= bound_s and result["orphans"] == 0


# Rank 0's second checkpoint write dies half-way: the bytes of a real checkpoint, half of
# them written to atomic_write's temp file, then SIGKILL to the rank in the middle of the write.
KILL_MID_WRITE = """
import io, os, signal, torch
from hvd_cifar.runfolder import checkpoint
calls = []
def save_checkpoint(run_dir, state):
    calls.append(run_dir)
    if len(calls) < 2:
        return original(run_dir, state)
    buf = io.BytesIO()
    torch.save(state, buf)
    def half_then_die(f):
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    checkpoint.atomic_write(os.path.join(run_dir, checkpoint.CHECKPOINT), half_then_die)
original, checkpoint.save_checkpoint = checkpoint.save_checkpoint, save_checkpoint
"""


@pytest.mark.slow
def test_a_job_killed_while_writing_a_checkpoint_keeps_the_last_good_one(tmp_path, straight_run):
    """A 2-rank mpirun job whose rank 0 is killed half-way through writing its epoch-2
    checkpoint: the job ends, the epoch-1 checkpoint is intact, and resuming from it ends on
    the same weights and metrics as a run that was never interrupted. The training is
    conftest's STOP_FLAGS (a checkpoint after each of 3 epochs), so that the run never
    interrupted is the session's straight_run, which tests/test_preemption.py reads too."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_MID_WRITE)
    flags = [*STOP_FLAGS, "--checkpoint-every", "1", "--log-dir", str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=f"{hook}:{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1")
    start = time.monotonic()
    proc = subprocess.run([*launch_argv("mpirun", 2), *flags, "--run-name", "killed"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0 and time.monotonic() - start < 120, proc.stderr[-2000:]
    run = tmp_path / "killed"
    [stale] = [p.name for p in run.iterdir() if p.name.endswith(".tmp")]  # the torn write, aside
    assert torch.load(run / "checkpoint_last.pt", weights_only=True)["epoch"] == 1

    run_train(["--resume", str(run)], launcher="mpirun", np=2)
    straight_dir = straight_run("horovod")  # STOP_FLAGS under mpirun, never interrupted
    assert not (run / stale).exists()
    resumed = torch.load(run / "checkpoint_last.pt", weights_only=True)
    straight = torch.load(straight_dir / "checkpoint_last.pt", weights_only=True)
    assert resumed["epoch"] == straight["epoch"] == 3
    for key, tensor in straight["model"].items():
        assert torch.equal(resumed["model"][key], tensor), key
    assert unmeasured(read_metrics(run)) == unmeasured(read_metrics(straight_dir))


def test_a_torn_last_metrics_line_is_not_a_record(tmp_path):
    from hvd_cifar.runfolder import writer
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 0}\n{"epoch": 1}\n{"epo')
    assert writer.epoch_records(str(tmp_path)) == [{"epoch": 0}, {"epoch": 1}]
    writer.truncate_metrics(str(tmp_path), 5)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"epoch": 0}\n{"epoch": 1}\n'


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


def test_corrupt_checkpoint_is_one_line(tmp_path, tiny_run):
    run = tiny_run().copy_to(tmp_path)  # the session's one-process run of 2 epochs, checkpoint and all
    (run / "checkpoint_last.pt").write_bytes(b"this is not a checkpoint")
    proc = run_train(["--resume", str(run), "--epochs", "3"], check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"hvd_cifar: error: resume: {run}/checkpoint_last.pt is not a readable checkpoint (")


def test_lost_peer_tells_a_dead_peer_from_a_fault_of_this_rank():
    from hvd_cifar.core.lifecycle import lost_peer

    class HorovodInternalError(RuntimeError):  # Horovod's name; matched by name, as Horovod may be absent
        pass

    assert lost_peer(HorovodInternalError("Horovod has been shut down"))
    assert lost_peer(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:27858"))
    assert not lost_peer(OSError("disk on fire"))
    assert not lost_peer(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not lost_peer(ValueError("Connection closed by peer"))  # only what collectives raise


EXIT_WITH_A_THREAD_LEFT = """
import threading, time
from hvd_cifar.core import lifecycle
threading.Thread(target=time.sleep, args=(600,)).start()  # not a daemon: shutdown would wait
print("written", flush=False)
lifecycle.exit_process(3, threads_left_running={left})
"""


@pytest.mark.parametrize("left", [True, False])
def test_exit_process_skips_interpreter_shutdown_only_when_threads_were_left(left):
    """With threads left running (DDP's Gloo workers), exit_process ends the process at once,
    with the code given and stdout flushed, rather than going through interpreter shutdown;
    without, it is sys.exit, and shutdown waits for the thread (here: until the timeout)."""
    code = EXIT_WITH_A_THREAD_LEFT.format(left=left)
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                              timeout=60 if left else 8)
    except subprocess.TimeoutExpired:
        assert not left, "exit_process waited for a thread although told threads were left"
        return
    assert left, "sys.exit returned without waiting for a non-daemon thread?"
    assert proc.returncode == 3 and proc.stdout == "written\n", (proc.returncode, proc.stdout, proc.stderr)


def test_a_silent_rank_waits_for_rank_0_to_speak_before_exiting():
    """On a bad input only rank 0 prints; any other rank stays silent and exits 2 only after
    ranks.SILENT_RANK_EXIT_DELAY_S, so that a launcher which stops the job at the first non-zero
    exit cannot stop rank 0 before its one line is out."""
    from hvd_cifar.trainer.ranks import SILENT_RANK_EXIT_DELAY_S
    env = dict(os.environ, HOROVOD_RANK="1")  # what horovodrun --gloo sets for rank 1
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "hvd_cifar.train", "--model", "resnet999"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    assert proc.returncode == 2 and proc.stderr == "" and proc.stdout == "", proc
    assert took >= SILENT_RANK_EXIT_DELAY_S, took



def test_a_silent_rank_waiting_for_rank_0_obeys_the_launchers_sigterm_at_once():
    """The wait is for rank 0's line, not against the launcher: a SIGTERM that comes while a
    silent rank waits (the launcher ending the job, as horovodrun's Gloo driver does at the
    first exit) ends it then, even with the run's stop handler installed."""
    code = ("import sys; from hvd_cifar.core import stops; from hvd_cifar.trainer import ranks; stops.install(); "
            "print('waiting', flush=True); sys.exit(ranks.say_once(1, 'unsaid', 2))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "waiting\n"
    time.sleep(0.5)
    took = seconds_until_it_ends(proc, lambda: proc.send_signal(signal.SIGTERM))
    assert proc.returncode == -signal.SIGTERM and took < 2.0, (proc.returncode, took)
