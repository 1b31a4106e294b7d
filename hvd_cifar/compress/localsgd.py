"""``compression: local-sgd``: local SGD, or periodic model averaging, started after a phase of
plain data-parallel SGD (Lin et al.'s post-local SGD; PyTorch's ``PostLocalSGDState.start_localSGD_iter``):
the first ``compression_warmup_steps`` updates average the gradients whole, so the ranks keep one
model and one momentum through the start of training; after them every rank steps on its own
gradients, and every ``local_sgd_steps`` updates the ranks average their models' trainable
parameters, in one allreduce.

Momentum buffers stay each rank's own (not averaged): averaging them would double the bytes, and
each rank's buffer follows its own gradients. BatchNorm's running statistics are averaged at
the epoch's end as under every method. The epoch's last update always averages (``end_epoch``),
so evaluation and the checkpoint see one model on every rank; the count of updates since the
last average starts again there. The checkpoint holds the counts (``state_dict``) and, since
momentum is each rank's own, every rank's optimizer state beside them (sync/schemes.py's
``rank_state``); a preempted epoch, stopped between two averages, also each rank's own
parameters (the checkpoint's model is rank 0's): a resumed run ends on the unbroken run's weights.
"""
from __future__ import annotations

import torch

from hvd_cifar.compress.base import Collective, Scheme
from hvd_cifar.core.cost import localsgd_payload
from hvd_cifar.compress.flat import average_in_place


class LocalSGD(Scheme):
    name = "localsgd"  # its collectives' names
    averages_gradients = False  # after the warm-up each rank's momentum is its own: each rank checkpoints it

    def __init__(self, collective: Collective, every: int, warmup_steps: int = 0):
        super().__init__(collective, warmup_steps)
        self.every = every
        self.since_average = 0  # updates since the models were last averaged
        self.averages = 0       # model averages so far (this process)

    def synchronize(self) -> None:
        self.begin_update()  # in the warm-up it averages the gradients; after it they stay this rank's own

    def shares_gradients(self) -> bool:
        return self.updates <= self.warmup_steps  # a warm-up update averaged them

    def after_step(self) -> None:
        if self.shares_gradients():  # a warm-up update: the models are still one
            return
        self.since_average += 1
        if self.since_average >= self.every:
            self.average()

    def end_epoch(self) -> None:
        if self.since_average:
            self.average()

    def average(self) -> None:
        average_in_place(self.collective, [p.data for _, p in self.params], "localsgd.params")
        self.since_average = 0
        self.averages += 1

    def state_dict(self) -> dict:
        """The counts and, between two averages (a preempted epoch), this rank's own parameters:
        the checkpoint's model is rank 0's alone."""
        own = {"params": {name: p.detach().clone() for name, p in self.params}} if self.since_average else {}
        return {**super().state_dict(), "since_average": self.since_average, "averages": self.averages, **own}

    def load_state_dict(self, state: dict) -> None:
        """Loaded after the checkpoint's model (rank 0's): this rank's own parameters win."""
        super().load_state_dict(state)
        self.since_average, self.averages = state["since_average"], state["averages"]
        with torch.no_grad():
            for name, p in self.params:
                if name in state.get("params", {}):
                    p.copy_(state["params"][name])

    def payload_bytes(self, named_parameters) -> int:
        return localsgd_payload(sum(p.numel() for _, p in named_parameters), self.every)


def create(settings, collective: Collective) -> LocalSGD:
    return LocalSGD(collective, settings.local_sgd_steps, settings.compression_warmup_steps)
