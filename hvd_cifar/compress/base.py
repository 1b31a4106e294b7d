"""The two interfaces of communication reduction: ``Collective``, the two collectives a scheme
may use (a sync method implements them with its backend's calls), and ``Scheme``, what a sync
method calls when a scheme replaces its gradient averaging. No torch at import."""
from __future__ import annotations

from hvd_cifar.core.wire import allgather_bytes, ring_allreduce_bytes


class Collective:
    """The two collectives a scheme needs, over all ranks, counting what this rank sends.
    A sync method subclasses it with its backend's calls (Horovod's, torch.distributed's); the
    tests with ranks simulated in one process. ``name`` is the same on every rank for the same
    collective (Horovod matches collectives by name)."""

    def __init__(self, size: int):
        self.size = size
        self.sent_bytes = 0  # since the count was last reset (run_epoch: per epoch)

    def allreduce_mean(self, tensor, name: str):
        """The mean of ``tensor`` over the ranks; identical on every rank."""
        self.sent_bytes += ring_allreduce_bytes(self.size, tensor.numel() * tensor.element_size())
        return self._allreduce_mean(tensor, name)

    def allgather(self, tensor, name: str):
        """Every rank's ``tensor`` (same shape on every rank), concatenated along dim 0 in rank
        order; identical on every rank."""
        self.sent_bytes += allgather_bytes(self.size, tensor.numel() * tensor.element_size())
        return self._allgather(tensor, name)

    def _allreduce_mean(self, tensor, name: str):
        raise NotImplementedError

    def _allgather(self, tensor, name: str):
        raise NotImplementedError


class Scheme:
    """What a sync method calls when a scheme replaces its gradient averaging. Subclasses keep
    their state (error feedback, warm starts) per parameter name."""

    name = "base"
    # Whether the ranks step on averaged gradients for the whole run, so that their optimizer
    # states stay alike and the checkpoint's (rank 0's) serves every rank (sync/schemes.py's rank_state);
    # local SGD: no. Whether one update's gradients were shared: shares_gradients().
    averages_gradients = True

    def __init__(self, collective: Collective, warmup_steps: int = 0):
        self.collective = collective
        self.warmup_steps = warmup_steps  # updates averaged uncompressed first, as the papers do
        self.updates = 0                  # synchronize() calls so far (this process)
        self.epoch = 0                    # the epoch being trained (run_epoch sets it)
        self.params: list = []            # (name, parameter) being trained

    def track(self, named_parameters, optimizer=None) -> None:
        """The trainable parameters, again after every change of the trainable set, and the
        optimizer that steps them (a scheme that takes over its momentum reads it there)."""
        self.params = list(named_parameters)

    def synchronize(self) -> None:
        """After the update's last backward: leave in every ``.grad`` what the update applies."""
        raise NotImplementedError

    def shares_gradients(self) -> bool:
        """Whether the update synchronize() last made left the same gradients on every rank."""
        return self.averages_gradients

    def begin_update(self) -> list | None:
        """Count this update and return the (name, parameter) pairs that hold a gradient; in the
        warm-up, average those gradients whole instead and return None (the update is done)."""
        params = [(name, p) for name, p in self.params if p.grad is not None]
        warming_up = self.updates < self.warmup_steps
        self.updates += 1
        if not warming_up:
            return params
        # Imported here, not above: this module stays free of torch (the scaling model reads it).
        from hvd_cifar.compress.flat import average_in_place
        average_in_place(self.collective, [p.grad for _, p in params], f"{self.name}.warmup")
        return None

    def before_step(self) -> None:
        """After the loop's checks and clipping of the averaged gradients, before the optimizer
        step."""

    def after_step(self) -> None:
        """After the optimizer step."""

    def state_dict(self) -> dict:
        """This rank's state, for the checkpoint: the count of updates (the warm-up's place) and
        what the subclass adds (its error feedback). Without it a resumed run would warm up
        again and drop the residuals, and end on other weights than the unbroken run."""
        return {"updates": self.updates, "epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.updates, self.epoch = state["updates"], state["epoch"]

    def end_epoch(self) -> None:
        """After the epoch's last update, before evaluation and the checkpoint."""

    def payload_bytes(self, named_parameters) -> int:
        """Bytes one update sends, as the scheme's collectives carry them (steady state, after
        the warm-up): what ``wire_bytes`` turns into bytes on the wire."""
        raise NotImplementedError

    def wire_bytes(self, payload: int) -> int:
        """Bytes one rank sends per update of ``payload`` bytes: a ring allreduce unless the
        scheme gathers."""
        return ring_allreduce_bytes(self.collective.size, payload)

    def run_epoch(self, epoch: int, train):
        """``train()`` (the epoch's step loop) followed by ``end_epoch``, with the epoch's bytes as
        the collectives counted them (the warm-up's full-size updates and local SGD's averages
        included) as the metrics line's ``comm_bytes_per_rank``."""
        self.collective.sent_bytes, self.epoch = 0, epoch
        result = train()
        self.end_epoch()
        result.extra.update({"compression": self.name, "comm_bytes_per_rank": self.collective.sent_bytes})
        return result
