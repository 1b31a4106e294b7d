"""Preemption is a pause, not a loss: a stop signal (SIGTERM, SIGUSR1) to the ranks ends the run
at an update boundary every rank agrees on, with a checkpoint of the place inside the epoch, an
events.jsonl line, one line from rank 0 and exit status 4; ``--resume`` then ends on the weights
and metrics of a run never interrupted. launch/slurm.sbatch, driven here without Slurm (a
stand-in srun and scontrol on PATH), passes the scheduler's USR1 on, requeues, and resumes the
same run folder; hvd_cifar.launch.slurm_resume's decision is tested on its own."""
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from conftest import (ROOT, STOP_BATCH, STOP_FLAGS, TINY, launch_argv, read_metrics, run_train, seconds_until_it_ends,
                      unmeasured)
from hvd_cifar.core import stops
from hvd_cifar.launch import slurm_resume
from hvd_cifar.trainer import exits
from testbed import drill

# 3 epochs of 12 steps in updates of 2 micro-batches: a stop asked for mid-update waits for its end.
FLAGS = STOP_FLAGS


def assert_same_training(resumed: Path, straight: Path, sync: str | None = None) -> None:
    """Bit-identical final weights and optimizer state, and the same metrics lines apart from
    what is measured. ``sync``: the resumed run's sync method, where ``straight`` is the Horovod
    run standing in for that method's own (``straight_2``): its lines then with that ``sync``."""
    a = torch.load(resumed / "checkpoint_last.pt", weights_only=True)
    b = torch.load(straight / "checkpoint_last.pt", weights_only=True)
    assert a["epoch"] == b["epoch"] and "position" not in a
    for key, tensor in b["model"].items():
        assert torch.equal(a["model"][key], tensor), key
    for i, state in b["optimizer"]["state"].items():
        assert torch.equal(a["optimizer"]["state"][i]["momentum_buffer"], state["momentum_buffer"]), i
    want = unmeasured(read_metrics(straight))
    if sync is not None:
        want = [{**r, "sync": sync} for r in want]
    assert unmeasured(read_metrics(resumed)) == want


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


# rank 0's line when mpirun passed a stop signal on (and maybe the ranks got it themselves too)
PREEMPTED_BY_SIGNAL = r"hvd_cifar: preempted: a stop signal reached [12] of 2 rank\(s\); stopped in epoch "


def hvd_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("hvd_cifar")]


@pytest.fixture
def straight_2(straight_run):
    """FLAGS run straight through by 2 ranks under mpirun: conftest's straight_run of the Horovod
    method, once per session (tests/test_reliability.py reads it too). It stands for the
    mpi-allreduce and DDP runs as well: at 2 ranks each method's average is the one sum of two
    gradients halved (a sum of two is the same in either order, halving is exact), and their
    uninterrupted runs ended on bit-identical weights and momentum, and the same metrics lines
    but for their "sync" field (checked with torch.equal, each run on its own)."""
    return lambda: straight_run("horovod")


# ----------------------------------------------------------------------------- the signal handler
STOP_FLAG = """
import os, signal, time
from hvd_cifar.core import stops
stops.install()
os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(0.1)
print(stops.asked(), flush=True)      # alive: the first signal only set the flag
os.kill(os.getpid(), signal.SIG{second})
time.sleep(0.5)
print("the same stop", flush=True)    # alive: a second signal within the window is the same stop
time.sleep(stops.STOP_REPEAT_WINDOW_S)
os.kill(os.getpid(), signal.SIG{second})
time.sleep(5)
print("still here", flush=True)
"""


@pytest.mark.parametrize("second", ["TERM", "USR1"])
def test_a_stop_signal_sets_a_flag_a_repeat_is_the_same_stop_and_a_later_one_ends_the_process(second):
    proc = subprocess.run([sys.executable, "-c", STOP_FLAG.format(second=second)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout == f"{int(signal.SIGUSR1)}\nthe same stop\n", proc
    assert proc.returncode == -getattr(signal, f"SIG{second}"), proc


# After its stop signal, the main thread blocks where Python never gets to run a handler: a
# second lock of a mutex it holds (as a rank waits in a collective, inside the C++ of Horovod).
BLOCKED_IN_C = """
import ctypes, os, signal
from hvd_cifar.core import stops
stops.install()
os.kill(os.getpid(), signal.SIGUSR1)
libc = ctypes.CDLL(None)
mutex = ctypes.create_string_buffer(64)
libc.pthread_mutex_init(mutex, None)
libc.pthread_mutex_lock(mutex)
print("blocked", flush=True)
libc.pthread_mutex_lock(mutex)
"""


def test_a_later_stop_signal_ends_a_process_blocked_outside_python_at_once():
    proc = subprocess.Popen([sys.executable, "-c", BLOCKED_IN_C], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "blocked\n"
        proc.send_signal(signal.SIGUSR1)  # within the window: the same stop
        time.sleep(0.5)
        assert proc.poll() is None
        time.sleep(stops.STOP_REPEAT_WINDOW_S)
        took = seconds_until_it_ends(proc, lambda: proc.send_signal(signal.SIGTERM), timeout=10)
        assert proc.returncode == -signal.SIGTERM and took < 1.0, (proc.returncode, took)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ----------------------------------------------------------------------------- 2 ranks, one signalled
# Rank RANK gets SIGNAL from itself right after step STEP of epoch EPOCH (0-based): a real
# signal, delivered at a known step.
SIGNAL_AT_STEP = """
import os, signal
from hvd_cifar.core import launcher
from hvd_cifar.trainer import loop
_after_step = loop.TrainingState.after_step
def after_step(self, step, images):
    _after_step(self, step, images)
    if launcher.launch_rank() == {rank} and (self.epoch, step) == ({epoch}, {step}):
        os.kill(os.getpid(), signal.{signal})
loop.TrainingState.after_step = after_step
"""


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["horovod", "mpi-allreduce", "ddp"])
def test_one_rank_signalled_mid_update_stops_both_and_resumes_exactly(tmp_path, straight_2, sync):
    """SIGUSR1 to rank 1 alone after step 4 of epoch 1 (the first micro-batch of an update): the
    vote started after that update (step 5) carries it, and is read after the next one, so both
    ranks stop after step 7; exit 4, one line, one event; the checkpoint holds epoch 1, step 8,
    8 x STOP_BATCH x 2 images and the epoch's sums so far; --resume then ends on the uninterrupted run's
    weights and metrics."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SIGNAL_AT_STEP.format(rank=1, epoch=1, step=4, signal="SIGUSR1"))
    env = dict(os.environ, PYTHONPATH=f"{hook}:{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    run = tmp_path / "paused"
    proc = subprocess.run([*launch_argv("mpirun", 2), *FLAGS, "--sync", sync, "--log-dir", str(tmp_path),
                           "--run-name", "paused"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == exits.EXIT_PREEMPTED, proc.stderr[-3000:]
    assert hvd_lines(proc.stderr) == [
        f"hvd_cifar: preempted: a stop signal reached 1 of 2 rank(s); stopped in epoch 2 after step 8, "
        f"checkpoint saved; continue with --resume {run}"]
    [event] = events(run)
    assert {k: event[k] for k in ("event", "signal", "epoch", "step", "position", "ranks_asked", "world_size")} == {
        "event": "preempted", "signal": "", "epoch": 1, "step": 8, "position": 8 * STOP_BATCH * 2, "ranks_asked": 1,
        "world_size": 2}  # "signal": what rank 0 got (nothing)
    ckpt = torch.load(run / "checkpoint_last.pt", weights_only=True)
    assert ckpt["epoch"] == 1 and ckpt["position"]["step"] == 8 and ckpt["position"]["position"] == 8 * STOP_BATCH * 2
    assert ckpt["position"]["totals"][2] == 8 * STOP_BATCH * 2  # images trained in the epoch so far, over both ranks
    assert [r["epoch"] for r in read_metrics(run)] == [0]

    resumed = run_train(["--resume", str(run)], launcher="mpirun", np=2)
    assert "resuming epoch 2 of 3 after step 8" in resumed.stdout
    assert [r.get("resumed_at_step") for r in read_metrics(run)] == [None, 8, None]
    assert_same_training(run, straight_2(), sync)


def signalled_job(log_dir: Path, name: str, signal_it) -> tuple[subprocess.Popen, str]:
    """A 2-rank mpirun job of FLAGS into LOG_DIR/NAME, given to ``signal_it`` once its first
    epoch is recorded; the ended job and its stderr (SIGKILL to its session if it outlives that)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    run = log_dir / name
    job = subprocess.Popen([*launch_argv("mpirun", 2), *FLAGS, "--log-dir", str(log_dir), "--run-name", name],
                           cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text():
            assert job.poll() is None and time.monotonic() < deadline, "training never got through epoch 1"
            time.sleep(0.2)
        signal_it(job)
        _, stderr = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)  # mpirun's session: the launcher and its ranks
            job.wait()
    return job, stderr


@pytest.mark.slow
def test_sigusr1_to_mpirun_pauses_the_job_and_resume_finishes_it_exactly(tmp_path, straight_2):
    """kill -USR1 of mpirun once the first epoch is recorded (mpirun forwards SIGUSR1 to every
    rank, each at its own moment): exit 4 with a checkpoint inside epoch 2 or at the start of
    epoch 3; resumed, the run ends where the uninterrupted one did."""
    run = tmp_path / "paused"
    job, stderr = signalled_job(tmp_path, "paused", lambda job: job.send_signal(signal.SIGUSR1))
    assert job.returncode == exits.EXIT_PREEMPTED, stderr[-3000:]
    [line] = hvd_lines(stderr)  # both ranks, or one whose signal came just after its flag was read
    assert re.match(PREEMPTED_BY_SIGNAL, line), line
    [event] = events(run)
    assert (event["signal"], event["ranks_asked"] in (1, 2)) == ("SIGUSR1", True) and event["epoch"] in (1, 2)
    run_train(["--resume", str(run)], launcher="mpirun", np=2)
    assert_same_training(run, straight_2())


def job_processes(marker: str) -> list[psutil.Process]:
    """The processes whose command line holds ``marker``, as ``pkill -f`` finds them: mpirun and
    its ranks, in pid order."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if marker in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return sorted(found, key=lambda p: p.pid)


@pytest.mark.slow
def test_sigusr1_to_mpirun_and_both_ranks_at_once_is_one_stop_every_time(tmp_path, straight_2):
    """``pkill -USR1 -f hvd_cifar.train`` reaches mpirun, which passes it on, and each rank, so
    each rank gets SIGUSR1 twice within milliseconds: three jobs, each signalled so once the
    first epoch is recorded, each ends as one stop (exit 4, one line, one event, a checkpoint
    inside the epoch), and each resumed run ends on the uninterrupted run's weights and metrics."""
    def pkill_usr1(job: subprocess.Popen) -> None:
        targets = job_processes(f"--run-name {job.args[-1]}")
        assert len(targets) == 3 and targets[0].pid == job.pid, targets  # mpirun and its 2 ranks
        for target in targets:
            target.send_signal(signal.SIGUSR1)

    for attempt in range(3):  # each job is a stop and a resume: about 30 s here
        name = f"paused-{attempt}"
        run = tmp_path / name
        job, stderr = signalled_job(tmp_path, name, pkill_usr1)
        assert job.returncode == exits.EXIT_PREEMPTED, f"job {attempt + 1}: {stderr[-3000:]}"
        # The vote counts the ranks whose flag was up when it was taken: both, or one when the
        # other's signal came just after its flag was read (it is read again, too late to matter).
        [line] = hvd_lines(stderr)
        assert re.match(PREEMPTED_BY_SIGNAL, line), line
        [event] = events(run)
        assert (event["event"], event["signal"], event["ranks_asked"] in (1, 2)) == ("preempted", "SIGUSR1", True)
        assert "position" in torch.load(run / "checkpoint_last.pt", weights_only=True)
        run_train(["--resume", str(run)], launcher="mpirun", np=2)
        assert_same_training(run, straight_2())


@pytest.mark.slow
@pytest.mark.parametrize("launcher, sync, target, signame",
                         [job for job in drill.PREEMPT_JOBS if job[0].startswith("horovodrun")])
def test_the_drills_preemptions_under_horovodrun(tmp_path, launcher, sync, target, signame):
    """The fault drill's horovodrun jobs (the mpirun ones are the tests above): SIGUSR1 to
    launch/horovodrun.sh (horovodrun's MPI mode, which it makes exec mpirun), SIGTERM to both
    ranks under --gloo; exit 4 with one line, one event, no rank left, and the resume finishes
    (the drill's time bound times the suite's slack, testbed.drill.SUITE_SLACK)."""
    result = drill.preempt_drill(launcher, sync, target, signame, tmp_path,
                                 bound_s=drill.SUITE_SLACK * drill.PREEMPT_BOUND_S)
    assert result["ok"], result["why"]


# ----------------------------------------------------------------------------- launch/slurm.sbatch
FAKE_SRUN = """#!/usr/bin/env bash
# srun's stand-in: drop its options and become the one task (signals to this pid reach it)
while [[ "$1" == --* ]]; do shift; done
exec "$@"
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
echo "$*" >> "$SCONTROL_LOG"
"""


def real_slurm_here() -> bool:
    """tests/test_slurm.py runs the same script under a real Slurm (root, slurm-wlm and munge
    installed): the USR1 requeue, the SIGTERM that the script leaves to Slurm, and the resume
    into the same run folder, each checked there. The stand-ins below cover machines without it."""
    from testbed.slurmcluster.daemons import missing_programs
    return os.geteuid() == 0 and not missing_programs()


STAND_IN = pytest.mark.skipif(real_slurm_here(), reason="a real Slurm runs here: tests/test_slurm.py checks this")


def slurm_job(tmp_path: Path, restart: int) -> subprocess.Popen:
    """launch/slurm.sbatch as Slurm would start the batch script of job 4242 (run number
    ``restart``), with srun and scontrol stand-ins first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="4242",
               SLURM_RESTART_COUNT=str(restart), SLURM_SUBMIT_DIR=str(ROOT), SLURM_CPUS_PER_TASK="1",
               SCONTROL_LOG=str(tmp_path / "scontrol.log"), PYTHONUNBUFFERED="1")
    return subprocess.Popen(["bash", str(ROOT / "launch" / "slurm.sbatch"), *FLAGS, "--log-dir", str(tmp_path / "logs")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(job: subprocess.Popen, timeout: float = 240) -> tuple[str, str]:
    try:
        return job.communicate(timeout=timeout)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)  # the script's session: the script and its task
            job.wait()


@pytest.mark.slow
@STAND_IN
def test_slurm_script_passes_usr1_on_requeues_and_resumes_the_same_run(tmp_path):
    """The batch script gets USR1 (Slurm's --signal=B:USR1@...) while the rank trains: the rank
    saves and exits 4, the script asks scontrol to requeue job 4242. Started again as the
    requeued job (SLURM_RESTART_COUNT=1), it resumes logs/slurm-4242 and finishes there, on the
    weights of a run never stopped."""
    run = tmp_path / "logs" / "slurm-4242"
    job = slurm_job(tmp_path, restart=0)
    try:
        deadline = time.monotonic() + 240
        while not (run / "rank0.log").exists():  # the rank has started (and caught stop signals)
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.2)
        job.send_signal(signal.SIGUSR1)  # to the batch shell alone
    finally:
        _, stderr = finish(job)
    assert job.returncode == exits.EXIT_PREEMPTED, stderr[-3000:]
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n"
    assert "slurm_resume: job 4242, restart 0: new run" in stderr
    assert events(run)[0]["event"] == "preempted"

    job = slurm_job(tmp_path, restart=1)
    _, stderr = finish(job)
    assert job.returncode == 0, stderr[-3000:]
    assert f"slurm_resume: job 4242, restart 1: resume {run} (it holds a checkpoint)" in stderr
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n"  # no second requeue
    run_train([*FLAGS, "--log-dir", str(tmp_path), "--run-name", "straight"])
    assert_same_training(run, tmp_path / "straight")


@pytest.mark.slow
@STAND_IN
def test_slurm_script_does_not_requeue_a_job_stopped_by_sigterm(tmp_path):
    """SIGTERM (scancel; a preemption, which Slurm requeues itself) reaches the rank directly:
    it saves and exits 4, and the script, which waited, requeues nothing."""
    run = tmp_path / "logs" / "slurm-4242"
    job = slurm_job(tmp_path, restart=0)
    try:
        deadline = time.monotonic() + 240
        while not (run / "rank0.log").exists():
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.2)
        [rank] = [p for p in psutil.Process(job.pid).children(recursive=True)
                  if p.cmdline()[1:3] == ["-m", "hvd_cifar.train"]]
        job.send_signal(signal.SIGTERM)
        rank.send_signal(signal.SIGTERM)
    finally:
        _, stderr = finish(job)
    assert job.returncode == exits.EXIT_PREEMPTED, stderr[-3000:]
    assert "waiting for the ranks to save" in stderr
    assert not (tmp_path / "scontrol.log").exists()
    assert torch.load(run / "checkpoint_last.pt", weights_only=True)["position"]["step"] > 0


# ----------------------------------------------------------------------------- the resume decision
def decide(tmp_path: Path, *flags: str, **env: str) -> tuple[list[str], str]:
    base = ["--config", TINY, "--log-dir", str(tmp_path), *flags]
    chosen, why = slurm_resume.decide(base, env)
    assert chosen[:len(base)] == base  # the job's own flags, unchanged, first
    return chosen[len(base):], why


def test_slurm_resume_decision(tmp_path):
    assert decide(tmp_path) == ([], "not under Slurm (no SLURM_JOB_ID): flags unchanged")
    assert decide(tmp_path, SLURM_JOB_ID="7")[0] == ["--run-name", "slurm-7"]
    (tmp_path / "slurm-7").mkdir()  # a first run killed before its first checkpoint
    added, why = decide(tmp_path, SLURM_JOB_ID="7", SLURM_RESTART_COUNT="1")
    assert added == ["--run-name", "slurm-7-2"] and "slurm-7 has no checkpoint; left as it is" in why
    (tmp_path / "slurm-7-2").mkdir()
    (tmp_path / "slurm-7-2" / "checkpoint_last.pt").write_bytes(b"")
    added, why = decide(tmp_path, SLURM_JOB_ID="7", SLURM_RESTART_COUNT="2")
    assert added == ["--resume", str(tmp_path / "slurm-7-2")] and why.startswith("job 7, restart 2: resume")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "checkpoint_last.pt").write_bytes(b"")
    assert decide(tmp_path, "--run-name", "mine", SLURM_JOB_ID="7")[0] == ["--resume", str(tmp_path / "mine")]
    assert decide(tmp_path, "--run-name", "other", SLURM_JOB_ID="7")[0] == []  # fresh, under the given name
    assert decide(tmp_path, "--resume", "somewhere", SLURM_JOB_ID="7") == (
        [], "job 7: --resume given: flags unchanged")


def test_slurm_resume_command_line(tmp_path):
    env = dict(os.environ, SLURM_JOB_ID="9")
    cmd = [sys.executable, "-m", "hvd_cifar.launch.slurm_resume"]
    proc = subprocess.run([*cmd, "--", "--log-dir", str(tmp_path), "--epochs", "2"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.split("\0") == ["--log-dir", str(tmp_path), "--epochs", "2",
                                                                 "--run-name", "slurm-9", ""]
    assert proc.stderr == f"slurm_resume: job 9, restart 0: new run {tmp_path}/slurm-9\n"
    proc = subprocess.run([*cmd, "--dry-run", "--", "--log-dir", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines()[1] == f"python -m hvd_cifar.train --log-dir {tmp_path} --run-name slurm-9"
    proc = subprocess.run([*cmd, "--", "--batch-sise", "8"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "hvd_cifar: error: batch_sise: unknown config key (did you mean 'batch_size'?)\n"
