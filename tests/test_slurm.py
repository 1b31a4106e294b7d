"""launch/slurm.sbatch under a real Slurm (22.05, Debian's packages), on a cluster of 4 slurmd
nodes on this machine's loopback started by hvd_cifar.slurmcluster: the shipped script trains
across 2 nodes under both launch styles (mpirun inside the allocation, srun --mpi=pmix), and a
job stopped mid-epoch by each of `scontrol requeue`, `scancel --signal=USR1 --batch` and a
preemption by a higher-priority partition saves its place, is requeued, resumes the same run
folder and ends on the weights of the job never stopped, bit for bit. The jobs run side by side
(one module fixture) to keep the file short on two cores.

A job to be stopped carries a hook (sitecustomize) that holds its rank 0 after step 4 of epoch 2
on its first run, until a stop signal arrives: the stop then comes mid-epoch, at the same step
every time, however slowly the machine runs."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT
from hvd_cifar.slurmcluster import SlurmCluster, jobs
from hvd_cifar.slurmcluster.daemons import missing_programs
from test_preemption import FLAGS, assert_same_training, events

def needs_slurm(test):
    """On a Slurm cluster of this machine: root, and Debian's slurm-wlm and munge installed."""
    test = pytest.mark.skipif(os.geteuid() != 0, reason="the Slurm daemons run as root: run the tests as root")(test)
    return pytest.mark.skipif(bool(missing_programs()), reason=f"Slurm not installed ({', '.join(missing_programs())}"
                              " missing): bash scripts/install.sh installs slurm-wlm and munge")(pytest.mark.slow(test))


# ----------------------------------------------------------------------------- without Slurm
REPEATED_STOP = """
import os, signal, time
from hvd_cifar import preempt
preempt.install()
for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGUSR1):
    os.kill(os.getpid(), sig)
    time.sleep(0.1)
print(signal.Signals(preempt.asked()).name, "still here", flush=True)
"""


def test_under_slurm_a_repeated_stop_signal_does_not_end_the_rank():
    """Slurm delivers one requeue or preemption twice (the step's SIGTERM, srun's forwarded one):
    a rank of a Slurm job keeps saving; outside Slurm the second signal ends it (test_preemption)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run([sys.executable, "-c", REPEATED_STOP], cwd=ROOT, env={**env, "SLURM_JOB_ID": "7"},
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "SIGTERM still here\n"), proc
    proc = subprocess.run([sys.executable, "-c", REPEATED_STOP], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGTERM, proc


# ----------------------------------------------------------------------------- on a Slurm cluster here

HOLD = """
import os, time
from hvd_cifar import engine, lifecycle, preempt
_after_step = engine.TrainingState.after_step
def after_step(self, step, images):
    _after_step(self, step, images)
    if (os.environ.get("SLURM_RESTART_COUNT", "0") == "0" and lifecycle.launch_rank() == 0
            and (self.epoch, step) == (1, 4)):
        open(os.environ["HOLD_FILE"], "w").close()
        deadline = time.monotonic() + 240
        while not preempt.asked() and time.monotonic() < deadline:
            time.sleep(0.05)
engine.TrainingState.after_step = after_step
"""
PAIR_A, PAIR_B = "n1,n2", "n3,n4"   # the straight job and two stopped ones; the preempted one
STOPPED = ("requeue", "usr1", "preempted")


def submit(cluster: SlurmCluster, tmp: Path, nodes: str, extra_env: dict | None = None,
           options: tuple[str, ...] = ()) -> str:
    """launch/slurm.sbatch as a user submits it, with CPU resources chosen on the command line."""
    env = {**cluster.env(), **(extra_env or {})}
    return jobs.sbatch(["-N", "2", "--ntasks-per-node=1", "--cpus-per-task=1", "-w", nodes,
                        f"--output={tmp}/slurm-%j.out", *options, "launch/slurm.sbatch", *FLAGS,
                        "--log-dir", str(tmp / "logs")], env, cwd=str(ROOT))


def wait_for_file(path: Path, job: str, env: dict, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        state = jobs.job(job, env).get("JobState")
        assert state in ("PENDING", "RUNNING", "CONFIGURING"), f"job {job} is {state} before reaching its hold"
        assert time.monotonic() < deadline, f"job {job} did not reach its hold in {timeout_s:.0f} s"
        time.sleep(0.3)


def stop(cluster: SlurmCluster, how: str, job: str, env: dict) -> None:
    if how == "requeue":
        jobs.command(["scontrol", "requeue", job], env)
    elif how == "usr1":  # the time limit's warning, by hand: USR1 to the batch script alone
        jobs.command(["scancel", "--signal=USR1", "--batch", job], env)
    else:  # a job in the higher-priority partition wants both nodes of the preempted job
        jobs.sbatch(["-p", "urgent", "-N", "2", "-w", PAIR_B, "--exclusive", "--output=/dev/null",
                     "--wrap", "sleep 1"], env)


@pytest.fixture(scope="module")
def slurm_runs(tmp_path_factory):
    """One job straight through (mpirun style) and three stopped once each (srun style) and let
    go again at once (a requeued job would wait about 120 s); all finished."""
    tmp = tmp_path_factory.mktemp("slurm")
    hook = tmp / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOLD)
    with SlurmCluster(nodes=4, cpus_per_node=4) as cluster:
        env = cluster.env()
        ids = {"straight": submit(cluster, tmp, PAIR_A, {"HVD_CIFAR_SLURM_LAUNCH": "mpirun"})}
        for how in STOPPED:
            ids[how] = submit(cluster, tmp, PAIR_B if how == "preempted" else PAIR_A, {
                "PYTHONPATH": str(hook), "HOLD_FILE": str(tmp / f"hold-{how}")})
        for how in STOPPED:
            wait_for_file(tmp / f"hold-{how}", ids[how], env)
            stop(cluster, how, ids[how], env)
        for how in STOPPED:
            jobs.wait(ids[how], env, ["PENDING"], timeout_s=90, restarts=1)
            cluster.start_now(ids[how])  # once the first run's slurmstepds are gone
        finished = {how: jobs.wait(job, env, ["COMPLETED", "FAILED", "CANCELLED"], timeout_s=240)
                    for how, job in ids.items()}
        completions = jobs.completions(env)
    return {"tmp": tmp, "ids": ids, "finished": finished, "completions": completions,
            "runs": {how: tmp / "logs" / f"slurm-{job}" for how, job in ids.items()}}


def job_output(runs: dict, how: str) -> str:
    return (runs["tmp"] / f"slurm-{runs['ids'][how]}.out").read_text()


@needs_slurm
def test_the_shipped_script_trains_across_two_nodes_under_both_launch_styles(slurm_runs):
    for how, launcher in (("straight", "mpi"), ("requeue", "mpi")):
        info = slurm_runs["finished"][how]
        assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, job_output(slurm_runs, how))
        meta = json.loads((slurm_runs["runs"][how] / "meta.json").read_text())
        assert meta["world_size"] == 2 and sorted(meta["hostnames"]) == ["n1", "n2"], meta
        assert meta["slurm_job_id"] == slurm_runs["ids"][how] and meta["slurm_nodes"] == "n[1-2]"
        assert meta["slurm_restart_count"] == 0 and meta["launcher"].startswith(launcher)
        assert "2 rank(s) (n1, n2)" in job_output(slurm_runs, how)


@needs_slurm
@pytest.mark.parametrize("how, stop_signal", [("requeue", "SIGTERM"), ("usr1", "SIGUSR1"), ("preempted", "SIGTERM")])
def test_a_stopped_job_is_requeued_resumes_its_run_folder_and_ends_bit_identical(slurm_runs, how, stop_signal):
    run, job = slurm_runs["runs"][how], slurm_runs["ids"][how]
    info = slurm_runs["finished"][how]
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, job_output(slurm_runs, how))
    [event] = events(run)
    assert event["event"] == "preempted" and event["signal"] == stop_signal
    assert (event["epoch"], event["slurm_job_id"], event["slurm_restart_count"]) == (1, job, 0), event
    out = job_output(slurm_runs, how)
    assert f"slurm_resume: job {job}, restart 1: resume {run} (it holds a checkpoint)" in out
    assert ("requeueing job" in out) == (how == "usr1")  # only USR1 is the script's to requeue
    assert not list(run.parent.glob(f"slurm-{job}-*"))    # no second run folder
    assert_same_training(run, slurm_runs["runs"]["straight"])


@needs_slurm
def test_sacct_lists_each_run_of_each_job(slurm_runs):
    states = {}
    for row in slurm_runs["completions"]:
        states.setdefault(row["jobid"], []).append(row["state"])
    ids = slurm_runs["ids"]
    assert states[ids["straight"]] == ["COMPLETED"], states
    for how in STOPPED:  # Slurm 22.05's completion log: a requeued run as the job's state after it
        first = "PREEMPTED" if how == "preempted" else "PENDING"
        assert states[ids[how]] == [first, "COMPLETED"], (how, states)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@needs_slurm
def test_the_cli_passes_on_the_exit_status_and_sigterm_leaves_nothing_running(tmp_path):
    """`run -- COMMAND`: COMMAND's exit status is the CLI's; SIGTERM to the CLI while a job runs
    stops the job's processes and every daemon, and removes the temp dir."""
    cli = [sys.executable, "-m", "hvd_cifar.slurmcluster", "run", "--nodes", "1", "--"]
    proc = subprocess.run([*cli, "sinfo -h -o %D; exit 3"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (3, "1\n"), proc.stderr
    pid_file = tmp_path / "job.pid"
    proc = subprocess.Popen([*cli, f"sbatch --output=/dev/null --wrap 'echo $$ > {pid_file}; exec sleep 300'; sleep 300"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "no job"
        time.sleep(0.2)
    tmpdir = Path(proc.stderr.readline().split("SLURM_CONF=")[1].split()[0].rstrip(";")).parent
    daemons = json.loads((tmpdir / "pids.json").read_text())["daemons"]
    proc.terminate()
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    job = int(pid_file.read_text())
    assert not [pid for pid in [job, *daemons] if alive(pid)] and not tmpdir.exists()
