"""Stopping a job from outside leaves nothing behind: SIGTERM or SIGINT to the launcher (the
launch scripts, ``python -m hvd_cifar.launch.horovodrun`` in MPI and Gloo mode), a ``timeout`` that
expires, or the death of whatever started the launcher ends every rank and mpirun within
STOP_BOUND_S. Real 2-rank jobs; the job's processes are the launcher's process tree, taken just
before the signal, and each is checked (and, should the test fail, stopped) by its pid."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import PYTHON, ROOT, TINY, seconds_until_it_ends

STOP_BOUND_S = 30.0
HOROVODRUN_SH = str(ROOT / "launch" / "horovodrun.sh")
MPIRUN_SH = str(ROOT / "launch" / "mpirun.sh")
# The launcher commands under test (the trainer's flags follow each).
LAUNCHERS = {
    "horovodrun.sh": [HOROVODRUN_SH, "-np", "2"],
    "horovodrun.sh --gloo": [HOROVODRUN_SH, "-np", "2", "--gloo"],
    "mpirun.sh": [MPIRUN_SH, "-np", "2"],
    "hvd_cifar.launch.horovodrun": [PYTHON, "-m", "hvd_cifar.launch.horovodrun", "-np", "2", "-H", "localhost:2",
                             PYTHON, "-m", "hvd_cifar.train"],
    "hvd_cifar.launch.horovodrun --gloo": [PYTHON, "-m", "hvd_cifar.launch.horovodrun", "-np", "2", "-H", "localhost:2",
                                    "--gloo", PYTHON, "-m", "hvd_cifar.train"],
    # Horovod's own console script, as its usage line shows it (Fix 5 of scripts/install.sh).
    "horovodrun": [str(Path(PYTHON).parent / "horovodrun"), "-np", "2", "-H", "localhost:2",
                   PYTHON, "-m", "hvd_cifar.train"],
}
# A parent that starts the launcher and waits for it, as a supervisor or a batch script would.
PARENT = [PYTHON, "-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"]


def start(command: list[str], work: Path, flags: list[str] | None = None, stderr: Path | None = None):
    """A 2-rank job, by default of the tiny config with far more epochs than the test waits
    for (run folder work/run), in a session of its own (so no signal meant for it reaches the
    test, and none for the test reaches it); its stderr goes to ``stderr`` (work/stderr.txt)."""
    if flags is None:
        flags = ["--config", TINY, "--epochs", "500", "--log-dir", str(work), "--run-name", "run"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    with open(stderr or work / "stderr.txt", "w") as err:
        return subprocess.Popen([*command, *flags], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)


def is_rank(process: psutil.Process) -> bool:
    try:
        return process.cmdline()[1:3] == ["-m", "hvd_cifar.train"]
    except psutil.Error:
        return False


def job_tree(job: subprocess.Popen, work: Path, deadline_s: float = 240,
             stderr: Path | None = None) -> list[psutil.Process]:
    """Once both ranks have opened their logs (Horovod started, data loaded, training begun or
    about to): the job's processes, ``job`` and every descendant, ranks included."""
    deadline = time.monotonic() + deadline_s
    while not all((work / "run" / f"rank{r}.log").exists() for r in (0, 1)):
        assert job.poll() is None, f"the job ended early:\n{(stderr or work / 'stderr.txt').read_text()[-3000:]}"
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.3)
    # A rank's short-lived child (forked before it execs, e.g. git for meta.json) looks like a
    # rank for a moment: take the tree again until it holds the two ranks alone.
    while True:
        root = psutil.Process(job.pid)
        tree = [root, *root.children(recursive=True)]
        if sum(map(is_rank, tree)) == 2:
            return tree
        assert time.monotonic() < deadline, [describe(p) for p in tree]
        time.sleep(0.3)


def describe(process: psutil.Process) -> str:
    try:
        return f"{process.pid} {' '.join(process.cmdline())[:100]}"
    except psutil.Error as exc:  # gone, or a zombie, since the tree was taken
        return f"{process.pid} ({type(exc).__name__})"


def alive(tree: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running: is_running() also checks the start time, so a reused pid is not
    taken for the old process; a zombie has ended (only its parent has not reaped it yet)."""
    def running(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    return [p for p in tree if running(p)]


def wait_all_gone(job: subprocess.Popen, tree: list[psutil.Process], bound_s: float) -> float:
    """Seconds until ``job`` exited and nothing of ``tree`` runs; fails after ``bound_s``."""
    start = time.monotonic()
    while job.poll() is None or alive(tree):
        if time.monotonic() - start > bound_s:
            left = [f"{p.pid} {' '.join(p.cmdline())[:100]}" for p in alive(tree)]
            pytest.fail(f"{bound_s:.0f} s after the signal, still running: {left}"
                        f"{' (and the launcher)' if job.poll() is None else ''}")
        time.sleep(0.2)
    return time.monotonic() - start


def stop_leftovers(job: subprocess.Popen, tree: list[psutil.Process]) -> None:
    """Whatever a failed test left running, by pid (the tree as taken, and anything since)."""
    extra = []
    try:
        extra = psutil.Process(job.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        pass
    for p in alive([*tree, *extra]):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    if job.poll() is None:
        job.kill()
    job.wait()


@pytest.mark.slow
# launch/horovodrun.sh execs python -m hvd_cifar.launch.horovodrun, so a signal to the script's pid is
# one to that launcher itself: its cases cover both. In MPI mode the pid is mpirun's by then
# (hvd_cifar.launch.horovodrun execs it), which takes SIGINT as it takes SIGTERM: SIGINT once there
# (horovodrun.sh); under Gloo horovodrun's Python driver gets each its own way: both.
@pytest.mark.parametrize("launcher, signum", [
    ("horovodrun.sh", signal.SIGTERM), ("horovodrun.sh", signal.SIGINT),
    ("horovodrun.sh --gloo", signal.SIGTERM), ("horovodrun.sh --gloo", signal.SIGINT),
    ("mpirun.sh", signal.SIGTERM), ("horovodrun", signal.SIGTERM)],
    ids=lambda v: v.name if isinstance(v, signal.Signals) else v)
def test_a_signal_to_the_launcher_stops_the_whole_job(tmp_path, launcher, signum):
    job = start(LAUNCHERS[launcher], tmp_path)
    tree = []
    try:
        tree = job_tree(job, tmp_path)
        job.send_signal(signum)  # the launcher's pid alone, as `kill PID` does
        wait_all_gone(job, tree, STOP_BOUND_S)
        assert job.returncode != 0, (tmp_path / "stderr.txt").read_text()[-2000:]
    finally:
        stop_leftovers(job, tree)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["horovodrun.sh", "horovodrun.sh --gloo", "mpirun.sh"])
def test_a_job_under_timeout_stops_when_the_time_is_up(tmp_path, launcher):
    """``timeout`` acts when its timer fires (SIGALRM): it sends SIGTERM to the command and its
    process group, and exits 124. The test fires the timer by sending that SIGALRM itself, so
    the time limit falls while training runs however long the start-up takes on a busy machine."""
    job = start(["timeout", "3600", *LAUNCHERS[launcher]], tmp_path)
    tree = []
    try:
        tree = job_tree(job, tmp_path)
        job.send_signal(signal.SIGALRM)
        wait_all_gone(job, tree, STOP_BOUND_S)
        assert job.returncode == 124, (job.returncode, (tmp_path / "stderr.txt").read_text()[-2000:])
    finally:
        stop_leftovers(job, tree)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["horovodrun.sh", "horovodrun.sh --gloo", "mpirun.sh",
                                      "hvd_cifar.launch.horovodrun"])
def test_the_job_stops_when_the_launchers_parent_dies(tmp_path, launcher):
    """SIGKILL to the process that started the launcher (nothing can catch it there): the
    launcher, now nobody's child, must still stop the job (PR_SET_PDEATHSIG)."""
    parent = start([*PARENT, *LAUNCHERS[launcher]], tmp_path)
    tree = []
    try:
        tree = job_tree(parent, tmp_path)
        parent.kill()
        parent.wait()
        wait_all_gone(parent, tree, STOP_BOUND_S)
    finally:
        stop_leftovers(parent, tree)


def test_die_with_parent_signals_a_process_whose_parent_is_already_gone():
    """A launcher whose starter died before it could ask the kernel to be told: the pid it was
    given ($PPID) is no longer its parent, so it stops itself (SIGTERM) rather than run on."""
    code = "from hvd_cifar.launch import commands; commands.die_with_parent(1); print('still here')"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGTERM and "still here" not in proc.stdout
    code = "import os; from hvd_cifar.launch import commands; commands.die_with_parent(os.getppid()); print('ok')"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "ok\n"


def test_a_stopped_workers_shell_ends_without_waiting_out_horovods_grace(tmp_path):
    """Horovod's middleman ends a worker by terminating the shell's children, freezing the shell
    (SIGSTOP), then terminating it; continued (Fix 6 of scripts/install.sh), the shell ends at
    once, where a frozen one sat out the 5 s grace and was killed."""
    from horovod.runner.common.util import safe_shell_exec

    # A shell that waits for its child, then (the child gone) runs on by itself.
    shell = subprocess.Popen(["/bin/sh", "-c", "sleep 60; while :; do :; done"])
    time.sleep(0.3)
    took = seconds_until_it_ends(shell, lambda: safe_shell_exec.terminate_executor_shell_and_children(shell.pid))
    assert shell.returncode != -signal.SIGKILL, "the shell sat out the grace and was killed"
    assert took < safe_shell_exec.GRACEFUL_TERMINATION_TIME_S - 1, took


# A benchmark's way of running a job (testbed.jobs.run, every script in benchmarks/) and
# hvd-cifar-bench's (LocalRunner.run), each in a process of its own that the test then stops.
JOB_RUNNERS = {
    "testbed.jobs": "from testbed import jobs; jobs.run('job', argv, timeout=3600)",
    "hvd-cifar-bench": ("from hvd_cifar.launch.runners import LocalRunner; "
                        "LocalRunner('horovodrun', None).run(argv, work + '/out.txt', work + '/err.txt', 3600)"),
}


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("runner", JOB_RUNNERS)
def test_a_stopped_benchmark_stops_the_job_it_runs(tmp_path, runner, signum):
    """A benchmark or a sweep that is stopped (SIGTERM: it stops the job on its way out; SIGKILL:
    the kernel tells the job's launcher, PR_SET_PDEATHSIG) leaves none of its job running: the
    job sits in a session of its own, which no signal to the benchmark would otherwise reach."""
    flags = ["--config", TINY, "--epochs", "500", "--log-dir", str(tmp_path), "--run-name", "run"]
    argv = [str(Path(PYTHON).parent / "horovodrun"), "-np", "2", "-H", "localhost:2", PYTHON, "-m", "hvd_cifar.train", *flags]
    code = f"import sys; argv, work = {argv!r}, {str(tmp_path)!r}; {JOB_RUNNERS[runner]}"
    bench = start([PYTHON, "-c", code], tmp_path, flags=[])
    tree = []
    try:
        tree = job_tree(bench, tmp_path)
        bench.send_signal(signum)
        wait_all_gone(bench, tree, STOP_BOUND_S)
        assert bench.returncode == (128 + signum if signum == signal.SIGTERM else -signum), \
            (bench.returncode, (tmp_path / "stderr.txt").read_text()[-2000:])
    finally:
        stop_leftovers(bench, tree)
