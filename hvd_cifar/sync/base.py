"""The interface every gradient synchronisation method implements (one module each beside this
one), and nothing of the training loop: a method sees the model's gradients and parameters, its
communicator and the run's config, and answers the loop's calls. A compression scheme that
replaces a method's averaging is held beside the method (schemes.py), never mixed into it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Callable, Mapping

import torch

from hvd_cifar.compress.base import Collective
from hvd_cifar.core import methods, wire
from hvd_cifar.workload.epoch import EpochContext, EpochResult


@dataclass(frozen=True)
class SyncSettings:
    """What a sync method is given of the run's config: the keys any method may choose its path
    by (elastic training, the timeline, the compression), and the method's own keys as its
    registry entry declares them (core.methods: Horovod's tuning, the parameter server's
    servers), by name."""
    elastic: bool = False
    comm_timeline: bool = False
    compression: str = "none"
    own: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, cfg, method: str | None = None) -> "SyncSettings":
        """``cfg``'s common keys and method ``method``'s own (default: ``cfg.sync``'s)."""
        common = {f.name: getattr(cfg, f.name) for f in fields(cls) if f.name != "own"}
        own = {key: getattr(cfg, key) for key in methods.METHODS[method or cfg.sync].settings}
        return cls(**common, own=MappingProxyType(own))


class SyncMethod:
    """What the training loop needs from a gradient synchronisation method.

    Per optimizer update the loop calls, in order:
      ``accumulate(model, sync_now)`` around each micro-batch's forward and backward,
      ``synchronize(optimizer)`` once the last micro-batch of the update has run backward,
      ``step(optimizer, scaler)`` to apply the averaged gradients.
    """

    name = "base"
    # Whether close() leaves native communication threads running, so that the process must end
    # without the interpreter's shutdown (hvd_cifar.core.lifecycle.exit_process says why).
    leaves_threads_running = False
    # Whether every rank sees a divergence at the same update (the averaged gradients are the
    # same everywhere), so all stop together and rank 0 speaks. False where a rank checks a
    # gradient no other rank sees (mpi-async-ps's workers): that rank says so and ends the job.
    diverges_together = True
    # Whether a stop signal pauses the run at an update boundary that the ranks agree on by a
    # vote (a small collective per update; hvd_cifar/trainer/preemption.py). False where the
    # ranks share no such boundary (mpi-async-ps): a stop signal then ends the rank.
    stops_by_vote = True
    rank = 0
    size = 1
    local_rank = 0
    local_size = 1
    # Gradients cross the wire as fp16 (compression: fp16, where the method's registry entry has
    # it in ``native``): set by hvd_cifar.sync.make from the config, before the first wrap().
    fp16 = False
    # What the probe (hvd_cifar.probe) records this method's timings under: which of its registry
    # entry's transports this job's collectives go over, and a wait every collective has whatever
    # the ranks (Horovod's negotiation cycle), fitted apart from latency.
    transport_index = 0
    collective_wait_s = 0.0

    def configure(self, cfg: SyncSettings) -> None:
        """Read the config keys this method has (``cfg.own``, e.g. ``ps_servers``) once, right
        after ``make``, on every rank; a setting it cannot honour here (at this world size, with
        this build) is a ConfigError. What no run of the method can honour the config refuses,
        from the method's registry entry."""

    # --- roles: every rank trains, unless a method gives some ranks another part ----------
    @property
    def workers(self) -> int:
        """Ranks that run the step loop: the data is sharded over them, metrics averaged."""
        return self.size

    @property
    def worker_rank(self) -> int:
        """This rank's data shard, in [0, workers)."""
        return self.rank

    def run_epoch(self, ctx: EpochContext, train: Callable[[], EpochResult]) -> EpochResult:
        """This rank's part of epoch ``ctx.epoch``: ``train()``, the step loop
        (loop.train_one_epoch), unless the method gives this rank another part (a parameter
        server's ranks serve the workers instead) or records something around it."""
        return train()

    def consolidate(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """After an epoch's training, before evaluation and the checkpoint: make every rank hold
        the one model the run evaluates and saves. Here the weights agree already and only
        BatchNorm's running statistics, each rank's own, are averaged."""
        average_buffers(model, self)

    # --- model and optimizer -------------------------------------------------------
    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             named_parameters: list[tuple[str, torch.nn.Parameter]],
             accumulation_steps: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """Return the (model, optimizer) the loop should use; called again when the set of
        trainable parameters changes, with the *unwrapped* model and a new optimizer."""
        raise NotImplementedError

    def accumulate(self, model: torch.nn.Module, sync_now: bool):
        """Context for one micro-batch; ``sync_now`` is False for all but the last of an update."""
        return contextlib.nullcontext()

    def synchronize(self, optimizer: torch.optim.Optimizer) -> None:
        """Finish averaging gradients across ranks (the part of sync time not hidden in backward)."""
        raise NotImplementedError

    def step(self, optimizer: torch.optim.Optimizer, scaler=None) -> None:
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()

    def broadcast_state(self, model: torch.nn.Module) -> None:
        """Make every rank's parameters and buffers equal to rank 0's."""
        raise NotImplementedError

    # --- small collectives for metrics and coordination ------------------------------
    def allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def allreduce_sum_async(self, tensor: torch.Tensor, name: str):
        """Start summing ``tensor`` over the ranks and return at once; the returned function waits
        for the sum and gives it. Every rank starts the same sums (``name``: what it carries) in
        the same order. Here the sum is done before returning; methods whose collectives can run
        in the background override this."""
        total = self.allreduce_sum(tensor)
        return lambda: total

    def broadcast_object(self, obj: Any) -> Any:
        raise NotImplementedError

    def allgather_object(self, obj: Any) -> list:
        raise NotImplementedError

    def comm_spans(self) -> list[tuple[str, float, float]]:
        """With ``comm_timeline: true``: this epoch's collectives on this rank, as far as the
        method records them, as (what, start, end) in time.perf_counter() seconds; what is
        "allreduce", or "negotiation" (ranks agreeing on what to reduce next). Empty where it
        records none (trainer.steptrace draws the step without them)."""
        return []

    # --- training state, and elastic membership ---------------------------------------
    elastic = False

    def run_elastic(self, train):
        """``train(state)`` made restartable after workers come or go; here, as it is."""
        return train

    def rank_state(self) -> dict | None:
        """What of this rank's own communication state a checkpoint must hold for a resumed run
        to go on as the unbroken one would (a scheme's error feedback differs per rank), or None
        when the method keeps none (the default)."""
        return None

    def load_rank_state(self, state: dict) -> None:
        """Take back this rank's ``rank_state()`` as a checkpoint saved it."""

    # --- accounting ----------------------------------------------------------------
    def payload_bytes(self, named_parameters: list[tuple[str, torch.nn.Parameter]]) -> int:
        """Gradient bytes one synchronisation averages: every trainable parameter's gradient, as
        it crosses the wire (2 bytes an element with fp16 compression)."""
        return sum(wire.gradient_bytes(p.numel(), self.fp16, p.element_size()) for _, p in named_parameters)

    def wire_bytes_per_sync(self, payload_bytes: int) -> int:
        """Bytes one rank sends per synchronisation of ``payload_bytes`` of gradients (the busiest
        rank where ranks differ). Ring allreduce: reduce-scatter then allgather, each moving
        (N-1)/N of the payload."""
        return wire.ring_allreduce_bytes(self.size, payload_bytes)

    def collective(self) -> Collective:
        """The two collectives a compression scheme uses, on this method's backend: here through
        allreduce_sum and allgather_object; a method with native ones returns those."""
        return MethodCollective(self)

    def close(self) -> None:
        pass


class MethodCollective(Collective):
    """A scheme's collectives through any method's small collectives."""

    def __init__(self, method: SyncMethod):
        super().__init__(method.size)
        self.method = method

    def _allreduce_mean(self, tensor, name):
        return self.method.allreduce_sum(tensor) / self.size

    def _allgather(self, tensor, name):
        return torch.cat(self.method.allgather_object(tensor))


def average_buffers(model: torch.nn.Module, sync: SyncMethod) -> None:
    """Average the floating-point buffers (BatchNorm's running statistics) over the ranks.
    Each rank's statistics come from its own shard only; after this every rank evaluates, and
    rank 0 checkpoints, one and the same model, so a resumed run continues exactly."""
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    if sync.size == 1 or not buffers:
        return
    flat = torch.cat([b.detach().reshape(-1).double().cpu() for b in buffers])
    flat = sync.allreduce_sum(flat) / sync.size
    offset = 0
    with torch.no_grad():
        for b in buffers:
            b.copy_(flat[offset:offset + b.numel()].view_as(b))
            offset += b.numel()
