"""Which run a Slurm job trains: the same command line every time the job runs (first start, and
each requeue after a preemption or a time limit), in the same run folder, resumed once that
folder holds a checkpoint. launch/slurm.sbatch asks here before it starts the ranks:

    python -m hvd_cifar.launch.slurm_resume --dry-run -- --config configs/cifar10_vgg11.yaml
    #  -> slurm_resume: job 4242, restart 1: resume logs/slurm-4242 (it holds a checkpoint)
    #     python -m hvd_cifar.train --config configs/cifar10_vgg11.yaml --resume /abs/logs/slurm-4242
    python -m hvd_cifar.launch.slurm_resume -- FLAGS...     # the trainer's flags, NUL-separated (for the script)
    python -m hvd_cifar.launch.slurm_resume --lost LOST.json -- FLAGS...   # after a lost rank: requeue?

The run folder is ``--run-name`` when given, else ``slurm-$SLURM_JOB_ID`` (a job keeps its id
when it is requeued), under the config's ``log_dir``. A folder without a checkpoint (a job
killed before its first one) is left as it is, and the next attempt starts afresh in
``NAME-2`` (``-3``, ...); the newest such folder is the one resumed. Outside Slurm (no
SLURM_JOB_ID), or when the flags already say ``--resume``, the flags pass through unchanged.

A run that lost a rank (a node gone, a rank killed: hvd_cifar.launch.slurm_output names it in
LOST.json) is requeued once: ``--lost`` appends a ``rank_lost`` line to the run folder's
events.jsonl, says one line, and exits 0 when the job should requeue itself, that is when the
folder holds no more than HVD_CIFAR_SLURM_LOST_REQUEUES (default 1) such lines; else 1, and
the line says how to go on by hand. A fault that repeats (a node that keeps failing) so stops
after one more try instead of looping.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from typing import Mapping

from hvd_cifar.core import config as config_mod
from hvd_cifar.core import launcher
from hvd_cifar.core.errors import ConfigError, ReportError
from hvd_cifar.core.files import RunError
from hvd_cifar.runfolder import reader
from hvd_cifar.runfolder.checkpoint import CHECKPOINT
from hvd_cifar.runfolder.writer import EVENTS, append_metrics


def attempts(log_dir: str, name: str) -> list[str]:
    """The run folders earlier runs of this job made: NAME, NAME-2, NAME-3, ... while they exist."""
    found, n = [], 1
    while os.path.isdir(path := os.path.join(log_dir, name if n == 1 else f"{name}-{n}")):
        found.append(path)
        n += 1
    return found


def decide(flags: list[str], env: Mapping[str, str]) -> tuple[list[str], str]:
    """The trainer's flags for this run of the job, and one line saying why."""
    job = env.get("SLURM_JOB_ID", "")
    if not job:
        return flags, "not under Slurm (no SLURM_JOB_ID): flags unchanged"
    _, given = config_mod.parse_flags(flags)
    if given.get("resume"):
        return flags, f"job {job}: --resume given: flags unchanged"
    cfg = config_mod.from_args(flags)  # the log_dir and run_name the trainer will use
    name = cfg.run_name or f"slurm-{job}"
    where = f"job {job}, restart {env.get('SLURM_RESTART_COUNT', '0')}"
    earlier = attempts(cfg.log_dir, name)
    if earlier and os.path.isfile(os.path.join(earlier[-1], CHECKPOINT)):
        run_dir = os.path.abspath(earlier[-1])
        return [*flags, "--resume", run_dir], f"{where}: resume {earlier[-1]} (it holds a checkpoint)"
    fresh = name if not earlier else f"{name}-{len(earlier) + 1}"
    why = "" if not earlier else f" ({earlier[-1]} has no checkpoint; left as it is)"
    if fresh != cfg.run_name:  # the last --run-name wins: ours goes after the user's
        flags = [*flags, "--run-name", fresh]
    return flags, f"{where}: new run {os.path.join(cfg.log_dir, fresh)}{why}"


def run_folder(flags: list[str]) -> str:
    """The run folder the trainer's flags (as ``decide`` made them) train in."""
    _, given = config_mod.parse_flags(flags)
    if given.get("resume"):
        return given["resume"]
    cfg = config_mod.from_args(flags)
    return os.path.join(cfg.log_dir, cfg.run_name)


def after_loss(lost: dict, flags: list[str], env: Mapping[str, str]) -> tuple[bool, str]:
    """A run of the job lost a rank: the ``rank_lost`` line in its run folder's events.jsonl,
    whether the job requeues itself, and the one line that says what happened and what next."""
    job, limit = env.get("SLURM_JOB_ID", "?"), env.get("HVD_CIFAR_SLURM_LOST_REQUEUES", "1")
    if not limit.isdigit():
        raise ConfigError(f"HVD_CIFAR_SLURM_LOST_REQUEUES={limit!r}: a whole number of requeues (0: none)")
    limit = int(limit)
    run_dir = run_folder(flags)
    lost = {**lost, "tasks": lost["tasks"] or ranks_on(run_dir, lost["node"])}
    ranks = "ranks" if any(c in lost["tasks"] for c in ",-") else "rank"  # srun's "1-3", meta.json's "1,3"
    tasks = f"{ranks} {lost['tasks']} on node {lost['node']}" if lost["tasks"] else f"node {lost['node']}"
    what = f"slurm.sbatch: job {job}: {tasks} lost ({lost['why']})"
    if not os.path.isdir(run_dir):  # lost before the run folder was made: nothing to resume
        return False, f"{what}; no run folder {run_dir} yet; submit the job again"
    losses = 1 + sum(1 for e in reader.read_events(run_dir) if e["event"] == "rank_lost")  # (read before the append)
    append_metrics(run_dir, {"event": "rank_lost", "time": time.time(), **lost, **launcher.slurm_facts(env)}, EVENTS)
    if losses <= limit:
        return True, (f"{what}; requeued to resume {run_dir} from its last checkpoint "
                      f"(lost-rank requeue {losses} of {limit})")
    return False, (f"{what}; not requeued ({losses} losses in {run_dir}, HVD_CIFAR_SLURM_LOST_REQUEUES={limit});"
                   f" it resumes from its last checkpoint after: scontrol requeue {job}")


def ranks_on(run_dir: str, node: str) -> str:
    """The ranks the run had on ``node`` (meta.json's hostnames, one per rank), e.g. "1" or "2,3"; "" if unknown."""
    try:
        meta = reader.read_meta(run_dir)
    except ReportError:
        return ""
    hostnames = meta.get("hostnames", []) if isinstance(meta, dict) else []
    return ",".join(str(rank) for rank, host in enumerate(hostnames) if host == node)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hvd_cifar.launch.slurm_resume", description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true",
                   help="say what would run, as one line and a command line, instead of the NUL-separated flags")
    p.add_argument("--lost", metavar="LOST.json",
                   help="the run lost a rank (hvd_cifar.launch.slurm_output's file): record it, say one line, "
                        "exit 0 if the job should requeue itself, 1 if not")
    p.add_argument("flags", nargs=argparse.REMAINDER, help="-- then the trainer's flags")
    args = p.parse_args(argv)
    flags = args.flags[1:] if args.flags[:1] == ["--"] else args.flags
    try:
        if args.lost:
            with open(args.lost) as f:
                requeue, line = after_loss(json.load(f), flags, os.environ)
            sys.stderr.write(line + "\n")
            return 0 if requeue else 1
        chosen, why = decide(flags, os.environ)
    except (ConfigError, RunError, ReportError) as exc:  # a bad value, a run folder that cannot be written or read
        sys.stderr.write(f"hvd_cifar: error: {exc}\n")
        return 2
    if args.dry_run:
        sys.stdout.write(f"slurm_resume: {why}\n{shlex.join(['python', '-m', 'hvd_cifar.train', *chosen])}\n")
    else:
        sys.stderr.write(f"slurm_resume: {why}\n")
        sys.stdout.write("".join(f + "\0" for f in chosen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
