"""Slurm's client commands, as the tests and the CLI use them on a cluster: submit, read a job's
state, wait for one, let a requeued job start now, and the completion log (``sacct -c``)."""
from __future__ import annotations

import re
import subprocess
import time
from typing import Iterable, Mapping

from hvd_cifar.launch.slurm import command, job
from testbed.slurmcluster.daemons import SlurmError

SACCT_FIELDS = ("jobid", "jobname", "partition", "nodelist", "state", "exitcode")


def wait(job_id: str, env: Mapping[str, str], states: Iterable[str], timeout_s: float = 120,
         restarts: int | None = None) -> dict[str, str]:
    """Poll until the job is in one of ``states`` (with ``restarts`` requeues behind it, if
    given); its fields. A timeout is a SlurmError saying where the job stood."""
    wanted, info = set(states), {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = job(job_id, env)
        if info.get("JobState") in wanted and (restarts is None or info.get("Restarts") == str(restarts)):
            return info
        time.sleep(0.3)
    raise SlurmError(f"job {job_id} not {'/'.join(sorted(wanted))} after {timeout_s:.0f} s: state "
                     f"{info.get('JobState')}, reason {info.get('Reason')}, restarts {info.get('Restarts')}")


def start_now(job_id: str, env: Mapping[str, str]) -> None:
    """A requeued job waits about 120 s (reason BeginTime) before it may start again; start it now."""
    command(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env)


def node_states(env: Mapping[str, str]) -> dict[str, str]:
    """Each node's state as sinfo says it (idle, allocated, down, ...); {} if slurmctld does not answer."""
    proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=dict(env), capture_output=True, text=True,
                          timeout=30)
    if proc.returncode != 0:
        return {}
    return dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)


def agent_queue(env: Mapping[str, str]) -> int:
    """How many messages to nodes slurmctld holds to send again (sdiag's "Agent queue size")."""
    found = re.search(r"Agent queue size:\s*(\d+)", command(["sdiag"], env))
    if not found:
        raise SlurmError("sdiag: no \"Agent queue size\" line")
    return int(found[1])


def completions(env: Mapping[str, str]) -> list[dict[str, str]]:
    """``sacct -c``: one row per end of a job's run (its state and exit code), oldest first."""
    out = command(["sacct", "-c", "-n", "-P", "-o", ",".join(SACCT_FIELDS)], env)
    return [dict(zip(SACCT_FIELDS, line.split("|"))) for line in out.splitlines() if line.strip()]
