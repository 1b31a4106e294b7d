"""How hvd_cifar.bench runs one configuration: on this machine (or a hostfile's hosts) through
a launcher, or as a Slurm job of launch/slurm.sbatch. Both are given the rank count and the
trainer's flags; both give back the command (what a dry run prints and the table records) and,
once it ran, how it ended, with its stdout and stderr in the files named:

    runner = LocalRunner("mpirun", hostfile=None)    # or SlurmRunner(tasks_per_node=1, options=[...])
    cmd = runner.command(2, flags)
    ended = runner.run(cmd, "OUT/logs/NAME.stdout.txt", "OUT/logs/NAME.stderr.txt", timeout=900)
    ended.code, ended.seconds, ended.why      # exit status (None: timeout), wall clock, Slurm's word
"""
from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Sequence

from hvd_cifar.launch import commands
from hvd_cifar.launch import slurm
from hvd_cifar.launch.commands import job_env, stop
from hvd_cifar.launch.slurm import SlurmError

ROOT = commands.ROOT
SBATCH_SCRIPT = "launch/slurm.sbatch"
# Slurm's job states after which a job runs no more (a requeued job goes back to PENDING).
ENDED_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE")
POLL_S = 1.0  # between two looks at a Slurm job's state


@dataclass
class Ended:
    code: int | None    # exit status (negative: killed by that signal); None: stopped at the timeout
    seconds: float      # wall clock, start (or submission) to end
    why: str = ""       # a failure that is no exit status: Slurm's job state, sbatch's refusal


def bench_env() -> dict:
    """The environment of a job: unbuffered output, this Python, this checkout first on the path."""
    return job_env(PYTHON=sys.executable, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))


class LocalRunner:
    """The ranks started here by horovodrun or mpirun (with a hostfile: through launch/*.sh)."""

    def __init__(self, launcher: str, hostfile: str | None):
        self.launcher, self.hostfile = launcher, hostfile

    def describe(self) -> str:
        where = f" with hostfile {self.hostfile}" if self.hostfile else " on this machine"
        return f"launcher {self.launcher}{where}"

    def command(self, n: int, flags: Sequence[str]) -> list[str]:
        """The job's argument list (never a shell string), from hvd_cifar.launch.commands."""
        if self.hostfile:  # the launch script checks the hostfile and adds the launcher's flags
            options = ["--oversubscribe"] if self.launcher == "mpirun" else []
            return [*commands.script(self.launcher, n, self.hostfile, options), *flags]
        # mpirun oversubscribes (a sweep may ask for more ranks than cores) and binds ranks to no
        # core, so that each uses its threads instead of being pinned to one.
        return [*commands.argv(self.launcher, n), *flags]

    def run(self, cmd: list[str], stdout_path: str, stderr_path: str, timeout: int) -> Ended:
        """Run one job to its end or its timeout."""
        start = time.perf_counter()
        with open(stdout_path, "w") as out, open(stderr_path, "w") as err:
            # Its own session: on a timeout the launcher and every rank it started go down together.
            with commands.terminate_raises():
                proc = commands.start(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=ROOT, env=bench_env())
                try:
                    code = proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    stop(proc)
                    code = None
                except BaseException:  # Ctrl-C, SIGTERM: take the job down with us
                    stop(proc)
                    raise
        return Ended(code, time.perf_counter() - start)


class SlurmRunner:
    """One Slurm job per configuration: launch/slurm.sbatch submitted with the nodes and tasks the
    rank count needs (``tasks_per_node`` ranks on each node, fewer on the last), ``options``
    added (a partition, --cpus-per-task, ...), then watched until it ends. The job's stdout and
    stderr go to the files ``run`` is given; the sweep waits for each job before the next, so
    that no two configurations share the nodes' cores while they are timed."""

    def __init__(self, tasks_per_node: int, options: Sequence[str]):
        self.tasks_per_node, self.options = tasks_per_node, list(options)

    def describe(self) -> str:
        extra = f", sbatch options {shlex.join(self.options)}" if self.options else ""
        return f"Slurm jobs of {SBATCH_SCRIPT} ({self.tasks_per_node} rank(s) per node{extra})"

    def command(self, n: int, flags: Sequence[str]) -> list[str]:
        nodes = -(-n // self.tasks_per_node)
        return ["sbatch", f"--nodes={nodes}", f"--ntasks={n}", f"--ntasks-per-node={self.tasks_per_node}",
                *self.options, SBATCH_SCRIPT, *flags]

    def run(self, cmd: list[str], stdout_path: str, stderr_path: str, timeout: int) -> Ended:
        """Submit, say the job's id on the progress line, poll until the job ends (or cancel it at
        the timeout). A refused submission is a failure with sbatch's reason, in the stderr file too."""
        start, env = time.perf_counter(), bench_env()
        try:
            job = slurm.sbatch([f"--output={stdout_path}", f"--error={stderr_path}", *cmd[1:]], env, cwd=ROOT)
        except SlurmError as exc:
            with open(stderr_path, "w") as f:
                f.write(f"{exc}\n")
            return Ended(None, time.perf_counter() - start, str(exc))
        print(f"job {job} ", end="", flush=True)
        deadline = start + timeout
        try:
            with commands.terminate_raises():
                info = self._wait(job, env, deadline)
        except BaseException:  # Ctrl-C, SIGTERM: the job goes too
            with contextlib.suppress(SlurmError, subprocess.TimeoutExpired):
                slurm.command(["scancel", job], env)
            raise
        seconds = time.perf_counter() - start
        if info is None:
            slurm.command(["scancel", job], env)
            return Ended(None, seconds)
        return ended(info, seconds)

    @staticmethod
    def _wait(job: str, env: dict, deadline: float) -> dict | None:
        """The job's fields once it ended; None at the deadline."""
        while time.perf_counter() < deadline:
            info = slurm.job(job, env)
            if info.get("JobState") in ENDED_STATES:
                return info
            time.sleep(POLL_S)
        return None


def ended(info: dict, seconds: float) -> Ended:
    """How a Slurm job ended, from ``scontrol show job``: ExitCode is STATUS:SIGNAL, and a state
    other than COMPLETED or FAILED (CANCELLED, NODE_FAIL, TIMEOUT, ...) is the failure's name."""
    status, _, signal_number = info.get("ExitCode", "0:0").partition(":")
    code = -int(signal_number) if signal_number.strip("0") else int(status or 0)
    state = info["JobState"]
    if state == "COMPLETED" or (state == "FAILED" and code != 0):
        return Ended(code, seconds)
    reason = info.get("Reason", "None")
    return Ended(code, seconds, f"Slurm job {state}" + (f", {reason}" if reason != "None" else ""))
