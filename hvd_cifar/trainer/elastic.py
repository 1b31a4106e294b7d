"""Elastic training's side of the training state: commits, resets and the events file.

Workers may die, join or leave while the run goes on (Horovod's elastic driver, Gloo). The loop
in hvd_cifar/trainer/loop.py calls the same hooks on every training state; here they commit the state
every ``commit_every`` updates and at each epoch's end, fold the epoch's running sums into it so
that a reset keeps them exactly as far as the weights go, and write one line per (re)start to
``events.jsonl``. What is committed (broadcast from rank 0 to workers that join): the weights,
the optimizer, where the epoch stands (steps taken, images consumed) and the epoch's sums so far.
"""
from __future__ import annotations

import time

import horovod.torch as hvd
import torch
from horovod.common.elastic import ObjectState

from hvd_cifar.runfolder import writer
from hvd_cifar.sync.base import SyncMethod
from hvd_cifar.workload.epoch import no_sums


def zero_momentum_buffers(optimizer: torch.optim.Optimizer) -> None:
    """Zero momentum buffers where SGD has none yet: its first step then computes what it would
    have without them (buffer = gradient, dampening 0), and Horovod's state sync finds an
    optimizer state to broadcast instead of making one by a step of its own."""
    for group in optimizer.param_groups:
        if group["momentum"] and not group.get("dampening"):
            for p in group["params"]:
                if "momentum_buffer" not in optimizer.state[p]:
                    optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


class ElasticState(hvd.elastic.TorchState):
    """Horovod's elastic state: the model, the optimizer and the plain values below, which
    ``commit()`` saves and a reset restores (Horovod's TorchState keeps each keyword it is given
    as an attribute, a model or optimizer through its handler), with the training state's hooks
    (the fields mean what loop.TrainingState's do).

    One change to Horovod's order: the optimizer is synchronised before the model. Given an
    optimizer without state (SGD without momentum), Horovod makes some by taking one step with
    zero gradients, which weight decay turns into a change of the weights; with the model
    broadcast after that step, every rank still ends on rank 0's weights."""
    # Committed: what Horovod saves and restores.
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    restarts: int
    run_dir: str
    epoch: int
    step: int
    position: int
    totals: list[float]
    # This worker's own, never committed.
    sync_method: SyncMethod             # (``sync`` is Horovod's name: State.sync())
    commit_every: int                   # updates between commits
    reached: tuple[int, int]            # (epoch, step) this worker got to, committed or not

    def __init__(self, sync, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, commit_every: int,
                 run_dir: str, epoch: int, step: int, position: int, totals: list[float]):
        zero_momentum_buffers(optimizer)
        super().__init__(restarts=0, model=model, optimizer=optimizer, run_dir=run_dir, epoch=epoch, step=step,
                         position=position, totals=totals)
        # Set after Horovod recorded what to save, so not committed.
        self.sync_method, self.commit_every = sync, commit_every
        self.reached = (self.epoch, 0)

    def sync(self):
        """Horovod's "broadcast rank 0's state to every worker", optimizer first (class doc)."""
        for name in sorted(self._handlers, key=lambda n: n != "optimizer"):
            self._handlers[name].sync()
        ObjectState.sync(self)

    # --- the loop's hooks ---------------------------------------------------------------
    def begin(self, run) -> None:
        """At the start and after every reset: every rank is here with rank 0's state (the
        state's sync broadcast it), and the ranks may have changed."""
        hosts = sorted(set(run.hostnames))
        epoch, step = self.reached
        lost = max(0, step - self.step) if epoch == self.epoch else 0
        if run.is_main:
            writer.append_metrics(self.run_dir, {
                "event": "start" if self.restarts == 0 else "reset", "time": time.time(),
                "world_size": self.sync_method.size, "hosts": hosts, "epoch": self.epoch,
                "step": self.step, "position": self.position, "steps_lost": lost}, writer.EVENTS)
        if self.restarts:
            run.log(f"workers changed: now {self.sync_method.size} rank(s) on {', '.join(hosts)}; "
                    f"continuing epoch {self.epoch + 1} at step {self.step} ({lost} step(s) redone)")
        self.restarts += 1
        self.commit()  # from here on a reset is a restart, not the run's start

    def after_step(self, step: int, images: int) -> None:
        self.step, self.position = step + 1, self.position + images
        self.reached = (self.epoch, self.step)

    def after_update(self, sums: torch.Tensor, updates_done: int, more_steps: bool) -> None:
        if updates_done % self.commit_every == 0 and more_steps:
            # Fold this stretch's sums into the state, so that a reset keeps them exactly as far
            # as the weights go; then save, and hear of new workers (commit() raises for them).
            self.totals = (torch.tensor(self.totals, dtype=torch.float64)
                           + self.sync_method.allreduce_sum(sums.cpu())).tolist()
            sums.zero_()
            self.commit()

    def epoch_sums(self, reduced: torch.Tensor) -> torch.Tensor:
        return reduced + torch.tensor(self.totals, dtype=torch.float64)  # and before a reset

    def end_epoch(self, last: bool) -> None:
        self.epoch, self.step, self.position, self.totals = self.epoch + 1, 0, 0, no_sums()
        if not last:
            self.commit()
