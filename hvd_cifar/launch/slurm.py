"""Slurm's client commands as a sweep uses them on a real cluster (``hvd_cifar.bench --slurm``):
submit launch/slurm.sbatch, read a job's state, cancel it. A failed command is a SlurmError
with its last line."""
from __future__ import annotations

import re
import subprocess
from typing import Mapping, Sequence


class SlurmError(RuntimeError):
    """A Slurm command failed, or a job did not reach the state asked for; the message says which."""


_FIELD = re.compile(r"(\w+)=(\S*)")


def command(argv: Sequence[str], env: Mapping[str, str], timeout: float = 30) -> str:
    """Run one of Slurm's commands; its stdout, or a SlurmError with its last line."""
    proc = subprocess.run(list(argv), env=dict(env), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise SlurmError(f"`{' '.join(argv)}` failed ({proc.returncode}): {lines[-1] if lines else 'no output'}")
    return proc.stdout


def sbatch(args: Sequence[str], env: Mapping[str, str], cwd: str | None = None) -> str:
    """``sbatch --parsable ARGS`` from ``cwd``; the job id."""
    proc = subprocess.run(["sbatch", "--parsable", *args], env=dict(env), cwd=cwd, capture_output=True,
                          text=True, timeout=30)
    if proc.returncode != 0:
        raise SlurmError(f"sbatch failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout.strip().split(";")[0]


def job(job_id: str, env: Mapping[str, str]) -> dict[str, str]:
    """``scontrol show job``'s fields (JobState, Reason, Restarts, ExitCode, NodeList, ...)."""
    return dict(_FIELD.findall(command(["scontrol", "-o", "show", "job", job_id], env)))
