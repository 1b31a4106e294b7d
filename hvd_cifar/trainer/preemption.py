"""Preemption is a pause, not a loss: SIGTERM or SIGUSR1 to the ranks stops training at an update
boundary that every rank agrees on, with a checkpoint of the position inside the epoch.

Slurm sends such a signal before a job's time limit (``--signal``) and when it preempts a job;
``kill -USR1`` to the ranks (or to mpirun, which passes SIGUSR1 on) does the same by hand:

    kill -USR1 RANK_PID ...                       # then, later:
    python -m hvd_cifar.train --resume logs/RUN_NAME

How: the signal handler only records that a stop was asked for. After each optimizer update
with more steps to come, the training state's hook (loop.TrainingState.after_update) reads
the sum of every rank's flag, a 1-element allreduce started after the update before and left to
run in the background meanwhile (StopVote); ranks may get the signal at different steps, but
all read the same sum after the same update, so all stop there together: at the second update
boundary after the signal (in an epoch's first update, the third). The entry point then
writes the checkpoint (the epoch, the steps taken in it, the images consumed and the epoch's
running sums over all ranks), appends a ``preempted`` line to ``events.jsonl`` and exits with
EXIT_PREEMPTED (hvd_cifar/trainer/exits.py). A stop signal within 2 s of the first
(core.stops.STOP_REPEAT_WINDOW_S) is the same stop: ``pkill -USR1 -f hvd_cifar.train`` reaches
mpirun, which passes it on, and each rank, so every rank gets it twice. A stop signal later than
that takes its default action and ends the process at once; SIGINT stays an immediate stop too
(train.main aborts the job). Under Slurm (SLURM_JOB_ID set) later stop signals are ignored
instead: Slurm delivers one preemption or requeue more than once (SIGTERM from the step, then
again when srun forwards its own), and ends a job that does not stop with SIGKILL after KillWait
anyway (docs/SLURM.md).
"""
from __future__ import annotations

import signal
import time

import torch

from hvd_cifar.core import launcher
from hvd_cifar.core.stops import asked
from hvd_cifar.runfolder import checkpoint
from hvd_cifar.trainer.ranks import on_main, speak


class StopVote:
    """The ranks' agreement to stop, taken one update late so that nobody waits for it: after an
    update each rank starts summing its flag in the background (``sync.allreduce_sum_async``)
    and reads the sum it started after the update before, which had a whole step to arrive.
    Every rank reads the same sums after the same updates, so all stop after the same one. A
    flag stays set once raised, so a vote that is dropped (``settle``) loses nothing."""

    def __init__(self, sync):
        self.sync, self.pending = sync, None

    def ranks_asked(self) -> int:
        """After an update, on every rank: how many ranks had been asked to stop as of the
        update before (0 after an epoch's first update)."""
        asked_then = int(self.pending().item()) if self.pending else 0
        self.pending = None
        if not asked_then:
            flag = torch.tensor([1.0 if asked() else 0.0], dtype=torch.float64)
            self.pending = self.sync.allreduce_sum_async(flag, "stop_vote")
        return asked_then

    def settle(self) -> None:
        """Wait for the vote in flight (at an epoch's end: none may be left when the run ends)."""
        if self.pending:
            self.pending()
            self.pending = None


class Preempted(Exception):
    """Raised on every rank after the same update when a stop was asked for; carries where the
    run stands so the entry point can checkpoint it."""

    def __init__(self, epoch: int, step: int, position: int, ranks_asked: int, world_size: int):
        super().__init__(f"stopped in epoch {epoch + 1} after step {step}")
        self.epoch, self.step, self.position = epoch, step, position
        self.ranks_asked, self.world_size = ranks_asked, world_size
        self.signal = signal.Signals(asked()).name if asked() else ""
        self.run_dir = ""  # the entry point's to fill in

    def event(self, elapsed_s: float) -> dict:
        """The events.jsonl line (``signal``: what reached the rank that writes it, "" if none)."""
        return {"event": "preempted", "time": time.time(), "signal": self.signal, "epoch": self.epoch,
                "step": self.step, "position": self.position,
                "ranks_asked": self.ranks_asked, "world_size": self.world_size, "elapsed_s": elapsed_s,
                **launcher.slurm_facts()}  # under Slurm: the job, its nodes and its restart count

    def line(self) -> str:
        """What rank 0 says, once."""
        return (f"hvd_cifar: preempted: a stop signal reached {self.ranks_asked} of {self.world_size} "
                f"rank(s); {self}, checkpoint saved; continue with --resume {self.run_dir}")


def save_and_stop(run, state, stopped: Preempted) -> Preempted:
    """On every rank, after the same update (``run``: the context.Training): rank 0 writes the checkpoint of the place in the
    epoch (with every rank's BatchNorm statistics and communication state) and says so once.

    No rank may exit before rank 0 has saved and said so: the launcher ends the job at the
    first exit. on_main's hand-off after both is that wait, so no rank lingers at exit for rank
    0's line (a launcher that waits for its ranks, like horovodrun --gloo's, ends sooner).
    Returns the stop without its traceback, which holds the loop's frames and in them the
    wrapped model."""
    sync = run.setup.sync
    buffers = sync.allgather_object(checkpoint.rank_buffers(run.setup.model))  # each rank's BatchNorm statistics
    rank_states = run.rank_states()
    stopped, stopped.run_dir = stopped.with_traceback(None), run.run_dir

    def save_and_say() -> None:
        checkpoint.save_preempted(run.run_dir, state, sync.size, buffers, run.elapsed_s(), stopped,
                              **run.checkpointed(rank_states))
        speak(stopped.line())

    on_main(sync, save_and_say)
    return stopped
