"""What a Slurm job step prints on stderr, made readable when a rank or node is lost, and the
loss told to the batch script at once. launch/slurm.sbatch runs the launcher's stderr through
it (srun's, or mpirun's; with them the ranks' and slurmstepd's lines):

    srun ... 2>FIFO &  python -m hvd_cifar.launch.slurm_output --lost LOST.json --status STATUS --notify PID <FIFO >&2

Every line passes through unchanged (the ranks' hvd_cifar lines among them), except these:

* Open MPI's notice that a peer went away ("An MPI communication peer process has unexpectedly
  disconnected", 10 lines between two rules, from every rank that was talking to it): dropped.
  Open MPI 4.1's parameters (ompi_info --all) include none that silences it. It names the
  peer's host, and it is the only word of a node lost whole (its slurmd and slurmstepd gone
  with its ranks: srun says nothing until Slurm marks the node down, SlurmdTimeout later).
  Under srun (--notify), unless srun says within GRACE_S how a task ended, the peer's node
  is lost. Open MPI's TCP transport prints it: on another transport (UCX, InfiniBand) a node
  lost whole waits for Slurm.
* The launcher's word on the first task to end, when it died by a signal or with its node:
  srun's ``srun: error: n2: task 1: Killed`` (or ``Node failure on n2``), mpirun's ``mpirun
  noticed that process rank 1 with PID P on node n2 exited on signal 9 (Killed).`` and ``ORTE
  has lost communication with a remote daemon`` (its node gone). Taken out; after it, the
  step's end as srun, slurmstepd and mpirun tell it is dropped too.

The first loss is written to LOST.json ({"node": "n2", "tasks": "1", "why": "Killed"}; "tasks"
empty when only the node is known) the moment it is known, and again, as the launcher may have
told more, when the stream ends; PID (the batch script, under srun) gets SIGUSR2 then: srun
waits for a lost node until Slurm gives up on it, so the script ends the step itself. Only the first task to end can be lost: when it exits with a
status instead, its line and the step's end pass as they are, and that status goes to STATUS
(srun's own is the highest of all tasks', 143 for the ones it stopped, not the one that says why).

The filter ignores the stop signals Slurm sends to the whole batch step, and reads to the end.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import threading
from typing import Callable, Iterable, Iterator

GRACE_S = 10.0  # srun, after a peer's notice: time for srun to say a task ended (measured: ~0.1 s)
RULE = re.compile(r"^-{40,}$")  # Open MPI's help messages sit between two such lines
PEER_GONE = "unexpectedly disconnected"  # help-mpi-btl-tcp.txt, [peer hung up]
PEER_HOST = re.compile(r"^\s*Peer host:\s*(?P<node>\S+)", re.M)
DAEMON_LOST = re.compile(r"lost communication with a remote daemon.*?Remote daemon:.*? on node (?P<node>\S+)", re.S)
MPIRUN_LOST = re.compile(r"mpirun noticed that process rank (?P<tasks>\d+) with PID \d+ on node (?P<node>\S+) "
                         r"exited on signal \d+ \((?P<why>[^)]+)\)")
MPIRUN_EXITED = re.compile(r"exited with non-zero status.*?Process name: \[\[\d+,\d+\],(?P<tasks>\d+)\].*?"
                           r"Exit code:\s+(?P<status>\d+)", re.S)
MPI_ABORT = re.compile(r"MPI_ABORT was invoked on rank (?P<tasks>\d+) in communicator \S+\s+with errorcode (?P<status>\d+)")
MPIRUN_ABORTED = "Per user-direction, the job has been aborted"  # before its verdict: held until it comes
TASK_ENDED = re.compile(r"^srun: error: (?P<node>\S+): tasks? (?P<tasks>[0-9,\-]+): (?P<why>.+)$")
# srun's wording for a node that failed under a running step: a guess, never seen here (a node
# killed whole leaves srun silent; its ranks' peers' notices say it).
NODE_FAILED = re.compile(r"^srun: error: Node failure on (?P<node>\S+)")
EXITED = re.compile(r"^Exited with exit code (?P<status>\d+)$")
STEP_CHATTER = ("srun: ", "slurmstepd")  # after a loss: the step's end, as srun and slurmstepd tell it


def task_end(line: str) -> dict | None:
    """What a line of srun's says about a task's end: the node, the tasks, why, and either the
    exit status or, for a task that died by a signal or with its node, that it was lost."""
    if found := NODE_FAILED.match(line):
        return {"node": found["node"], "tasks": "", "why": "node failure", "lost": True}
    if found := TASK_ENDED.match(line):
        exited = EXITED.match(found["why"])
        return {**found.groupdict(), "lost": not exited, **({"status": int(exited["status"])} if exited else {})}
    return None


def block_end(text: str) -> dict | None:
    """What one of Open MPI's messages (rules included) says about the first task's end."""
    if found := DAEMON_LOST.search(text):
        return {"node": found["node"], "tasks": "", "why": "its node's Open MPI daemon lost", "lost": True}
    if found := MPIRUN_LOST.search(text):
        return {**found.groupdict(), "lost": True}
    if found := MPI_ABORT.search(text):  # a rank that failed ended the job: its own error said why
        return {"node": "", "tasks": found["tasks"], "why": f"MPI_ABORT with errorcode {found['status']}",
                "lost": False, "status": int(found["status"])}
    if found := MPIRUN_EXITED.search(text):
        return {"node": "", "tasks": found["tasks"], "why": f"exited with status {found['status']}", "lost": False,
                "status": int(found["status"])}
    return None


class Watch:
    """The step's stderr, line by line (``lines``), with what it says about the first task to
    end kept in ``first_end``; ``on_loss(first_end)`` is called once, when a loss is known. With
    ``grace_s`` (srun: no launcher word comes for a node lost whole), a peer's notice is a loss
    of the peer's node ``grace_s`` later, from a timer thread, unless a task's end came meanwhile;
    a status that comes after it still takes its place (the stream's end is the last word)."""

    def __init__(self, on_loss: Callable[[dict], None] = lambda end: None, grace_s: float | None = None):
        self.first_end: dict = {}
        self.on_loss, self.grace_s = on_loss, grace_s
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._guessed = False  # first_end is the timer's: only a peer's notice named the node
        self._closed = False   # the stream ended: the timer has no say any more

    def _found(self, end: dict, guess: bool = False) -> None:
        """A task's end: the first is the one, but a loss only the timer guessed gives way to the
        launcher's word (a status: no loss; a loss on the same node: its task number)."""
        with self._lock:
            if guess and self._closed:
                return
            if not self.first_end:
                self.first_end.update(end)
                self._guessed = guess
                if end["lost"]:
                    self.on_loss(dict(self.first_end))
            elif self._guessed and not end["lost"]:
                self.first_end.clear()
                self.first_end.update(end)
                self._guessed = False
            elif self.first_end.get("lost") and end["lost"] and not self.first_end["tasks"] \
                    and end["node"] == self.first_end["node"]:
                self.first_end.update(tasks=end["tasks"], why=end["why"])

    def _suspect(self, node: str) -> None:
        if self.grace_s is not None and self._timer is None and not self.first_end:
            lost = {"node": node, "tasks": "", "why": "connection lost", "lost": True}
            self._timer = threading.Timer(self.grace_s, self._found, [lost, True])
            self._timer.daemon = True
            self._timer.start()

    def result(self) -> dict:
        """What the stream said of the first task's end, once it has ended."""
        with self._lock:
            return dict(self.first_end)

    def lines(self, stream: Iterable[str]) -> Iterator[str]:
        block: list[str] = []  # an Open MPI help message being read, from its opening rule
        held: list[str] = []   # mpirun's "job aborted" message: dropped if its verdict is a loss
        for line in stream:
            text = line.rstrip("\n")
            if block:
                block.append(line)
                if RULE.match(text):
                    yield from self._message("".join(block), held)
                    block = []
                continue
            if RULE.match(text):
                block = [line]
                continue
            if found := task_end(text):
                self._found(found)  # a loss: this line and the step's end after it are dropped
            if not (self.first_end.get("lost") and text.startswith(STEP_CHATTER)):
                yield line
        with self._lock:
            self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        yield from block  # an unclosed message: the step ended in the middle of it
        if not self.first_end.get("lost"):
            yield from held

    def _message(self, text: str, held: list[str]) -> Iterator[str]:
        if PEER_GONE in text:
            if found := PEER_HOST.search(text):
                self._suspect(found["node"])
            return
        if MPIRUN_ABORTED in text and not self.first_end:
            held.append(text)
            return
        if (found := block_end(text)) is not None:
            self._found(found)
            if found["lost"]:
                return
        if self.first_end and not self.first_end.get("lost"):
            yield from held
            held.clear()
        yield text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hvd_cifar.launch.slurm_output", description=__doc__.splitlines()[0])
    p.add_argument("--lost", required=True, help="where to write the lost task's facts (JSON), if the first to end was lost")
    p.add_argument("--status", required=True, help="where to write the exit status of the first task to end, if it exited")
    p.add_argument("--notify", type=int, metavar="PID", help="send PID SIGUSR2 as soon as a loss is known")
    args = p.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the batch step's signals are for the ranks

    def write(path: str, text: str) -> None:
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)  # whole: the script may read it at any time

    def write_lost(end: dict) -> None:
        write(args.lost, json.dumps({k: v for k, v in end.items() if k != "lost"}))

    def lost(end: dict) -> None:  # at once: the script may end the step before the stream ends
        write_lost(end)
        if args.notify:
            with contextlib.suppress(OSError):  # the script is gone: nobody to tell
                os.kill(args.notify, signal.SIGUSR2)

    sys.stdin.reconfigure(errors="replace")  # whatever the ranks print, the filter goes on
    sys.stdout.reconfigure(errors="replace")
    watch = Watch(lost, GRACE_S if args.notify else None)
    for line in watch.lines(sys.stdin):
        sys.stdout.write(line)
        sys.stdout.flush()
    first_end = watch.result()
    if first_end.get("lost"):
        write_lost(first_end)  # again: the launcher may have told more since
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(args.lost)  # a loss the timer guessed, then a status: no loss
        if "status" in first_end:
            write(args.status, f"{first_end['status']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
