"""What a Slurm job step prints on stderr, made readable when a rank is lost. launch/slurm.sbatch
runs srun's stderr through it (the ranks' stderr, srun's and slurmstepd's own lines):

    srun ... 2>FIFO &  python -m hvd_cifar.slurm_output --lost LOST.json --status STATUS <FIFO >&2

Every line passes through unchanged (the ranks' hvd_cifar lines among them), except two kinds:

* Open MPI's notice that a peer went away ("An MPI communication peer process has unexpectedly
  disconnected", 10 lines between two rules, from every rank that was talking to it): dropped.
  Open MPI 4.1's parameters (ompi_info --all) include none that silences it.
* srun's line naming the first task to end, when it died by a signal or with its node
  (``srun: error: n2: task 1: Killed``, ``srun: error: Node failure on n2``): taken out and
  written to LOST.json ({"node": "n2", "tasks": "1", "why": "Killed"}), for the script's one
  line; after it, srun's and slurmstepd's lines about ending the step (the step cancelled, the
  other tasks killed) are dropped too.

Only the first task to end can be lost. When it exits with a status instead (``Exited with
exit code 2``: a bad input; 4: a pause), its line and the step's end pass as they are, the
other tasks stopped by it (``Terminated``) included, and that status goes to STATUS: srun's own
is the highest of all tasks' (143 for the stopped ones), not the one that says why.

The filter ignores the stop signals Slurm sends to the whole batch step, and reads to the end:
srun writes until the step is over.
"""
from __future__ import annotations

import argparse
import json
import re
import signal
import sys
from typing import Iterable, Iterator

RULE = re.compile(r"^-{40,}$")           # Open MPI's help messages sit between two such lines
PEER_GONE = "unexpectedly disconnected"  # help-mpi-btl-tcp.txt, [peer hung up]
TASK_ENDED = re.compile(r"^srun: error: (?P<node>\S+): tasks? (?P<tasks>[0-9,\-]+): (?P<why>.+)$")
# srun's wording for a node that failed under a running step: a guess, never seen here (a node
# killed whole left srun silent until Slurm cancelled the job; docs/SLURM.md).
NODE_FAILED = re.compile(r"^srun: error: Node failure on (?P<node>\S+)")
STEP_CHATTER = ("srun: ", "slurmstepd")   # after a loss: the step's end, as srun and slurmstepd tell it


EXITED = re.compile(r"^Exited with exit code (?P<status>\d+)$")


def task_end(line: str) -> dict | None:
    """What a line of srun's says about a task's end: the node, the tasks, why, and either the
    exit status or, for a task that died by a signal or with its node, that it was lost."""
    if found := NODE_FAILED.match(line):
        return {"node": found["node"], "tasks": "", "why": "node failure", "lost": True}
    if found := TASK_ENDED.match(line):
        exited = EXITED.match(found["why"])
        return {**found.groupdict(), "lost": not exited, **({"status": int(exited["status"])} if exited else {})}
    return None


def condense(lines: Iterable[str], first_end: dict) -> Iterator[str]:
    """``lines`` without Open MPI's lost-peer notices, and, when the first task to end was lost,
    without that line and the step's end after it. That first end goes into ``first_end``
    (left empty if no task ended badly). A task that exits first (a bad input's exit 2) is no
    loss, nor are the others that the step's end then stops (``Terminated``)."""
    block: list[str] = []  # an Open MPI help message being read, from its opening rule
    for line in lines:
        if block:
            block.append(line)
            if RULE.match(line.rstrip("\n")):
                if not any(PEER_GONE in b for b in block):
                    yield from block
                block = []
            continue
        text = line.rstrip("\n")
        if RULE.match(text):
            block = [line]
            continue
        if not first_end and (found := task_end(text)):
            first_end.update(found)
            if found["lost"]:
                continue
        if not (first_end.get("lost") and text.startswith(STEP_CHATTER)):
            yield line
    yield from block  # an unclosed message: the step ended in the middle of it


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hvd_cifar.slurm_output", description=__doc__.splitlines()[0])
    p.add_argument("--lost", required=True, help="where to write the lost task's facts (JSON), if the first to end was lost")
    p.add_argument("--status", required=True, help="where to write the exit status of the first task to end, if it exited")
    args = p.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the batch step's signals are for the ranks
    sys.stdin.reconfigure(errors="replace")    # whatever the ranks print, the filter goes on
    sys.stdout.reconfigure(errors="replace")
    first_end: dict = {}
    for line in condense(sys.stdin, first_end):
        sys.stdout.write(line)
        sys.stdout.flush()
    if first_end.pop("lost", False):
        with open(args.lost, "w") as f:
            json.dump(first_end, f)
    elif "status" in first_end:
        with open(args.status, "w") as f:
            f.write(f"{first_end['status']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
