"""Who decides which leading feature blocks are frozen: the config (``freeze: N``,
``freeze_schedule``), or ``freeze: auto``, a policy that watches the gradients (AutoFreeze,
Liu et al. 2021: a block whose gradients have stopped changing has stopped learning much).

The auto measure, per feature block b that trains: ``g_b(e)``, the mean over epoch e's
optimizer updates of the L2 norm of b's gradients, taken after synchronisation (every rank
holds the same averaged gradients, so every rank computes the same numbers and decides the
same with no collective of its own) and before clipping (clipping scales every block by the
same global factor, which would move every block's norm with the others'). Its relative
change over the last two epochs, ``|g_b(e) - g_b(e-1)| / g_b(e-1)``, is what
``freeze_auto_threshold`` is compared with. At an epoch boundary, the deepest block whose
change is below the threshold is frozen together with every block before it (freezing is
by leading blocks: a frozen block needs no backward only if nothing before it trains).
Freezing only grows. The decision is a function of the recorded history, so a resumed run
that restores the history (``state_dict``) decides as the uninterrupted run would.

Both policies answer the same calls, so the loop (hvd_cifar/trainer/loop.py) and the entry point
(hvd_cifar/train.py) never ask which one runs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from hvd_cifar.core.config import settings_for
from hvd_cifar.core.errors import ConfigError

from hvd_cifar.runfolder import writer


@dataclass(frozen=True)
class FreezeSettings:
    """What the freezing policies read of the run's config."""
    freeze: int | str
    freeze_schedule: dict
    freeze_auto_threshold: float

    @classmethod
    def of(cls, cfg) -> "FreezeSettings":
        return settings_for(cls, cfg)

    def frozen_blocks(self, epoch: int) -> int:
        """Feature blocks frozen during ``epoch`` (0-based): ``freeze``, then the schedule."""
        frozen = self.freeze
        for start in sorted(self.freeze_schedule):
            if epoch >= start:
                frozen = self.freeze_schedule[start]
        return frozen


class ConfigFreezing:
    """``freeze: N`` and ``freeze_schedule``: the config says what is frozen in each epoch."""

    def __init__(self, settings: FreezeSettings):
        self.settings = settings

    def observe(self, scaler) -> None:
        """Nothing to measure."""

    def end_epoch(self) -> None:
        """Nothing to close."""

    def frozen_blocks(self, epoch: int, current: int) -> int:
        return self.settings.frozen_blocks(epoch)

    def record(self) -> dict:
        """What goes into the epoch's metrics line (nothing: config.yaml says it)."""
        return {}

    def why(self) -> dict:
        """What goes into a freeze event line besides the new trainable set."""
        return {"policy": "config"}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore: the config is the state."""


class AutoFreeze:
    """``freeze: auto``: see the module doc. ``blocks`` are the model's ``feature_blocks``."""

    def __init__(self, blocks: list[torch.nn.Module], threshold: float):
        self.params = [list(block.parameters()) for block in blocks]
        self.threshold = threshold
        self.history: list[list[float | None]] = []  # per epoch: g_b per block, None where frozen
        device = self.params[0][0].device
        # Summed on the device, read once per epoch: no host sync per update on a GPU.
        self.norm_sums = torch.zeros(len(blocks), dtype=torch.float64, device=device)
        self.updates = torch.zeros(len(blocks), dtype=torch.float64, device=device)

    def observe(self, scaler) -> None:
        """After ``sync.synchronize``, before clipping: add each training block's gradient norm.
        Under an fp16 grad scaler the gradients are still scaled (unscaled here), and an update
        the scaler will skip (non-finite gradients) is not counted."""
        live = [i for i, params in enumerate(self.params) if params[0].requires_grad]
        if not live:
            return
        norms = torch.stack([torch.nn.utils.get_total_norm([p.grad for p in self.params[i] if p.grad is not None])
                             for i in live]).double()
        if scaler is not None:
            norms = norms / scaler.get_scale()
        counted = torch.isfinite(norms).all()
        self.norm_sums[live] += torch.where(counted, norms, torch.zeros_like(norms))
        self.updates[live] += counted.double()

    def end_epoch(self) -> None:
        """Close the epoch's measurement: its mean norm per block joins the history."""
        sums, updates = self.norm_sums.tolist(), self.updates.tolist()
        self.history.append([s / n if n else None for s, n in zip(sums, updates)])
        self.norm_sums.zero_()
        self.updates.zero_()

    def changes(self) -> list[float | None]:
        """Per block, the relative change of g_b over the last two epochs (None: not known)."""
        if len(self.history) < 2:
            return [None] * len(self.params)
        return [abs(now - before) / before if now is not None and before else None
                for before, now in zip(self.history[-2], self.history[-1])]

    def frozen_blocks(self, epoch: int, current: int) -> int:
        return decide(self.changes(), self.threshold, current)

    def record(self) -> dict:
        """The measure, per block, for the epoch's metrics line."""
        return {"block_grad_norm": self.history[-1] if self.history else None,
                "block_grad_norm_change": self.changes()}

    def why(self) -> dict:
        return {"policy": "auto", "threshold": self.threshold, "block_grad_norm_change": self.changes()}

    def state_dict(self) -> dict:
        """The history and the open epoch's sums (a run preempted mid-epoch keeps them)."""
        return {"history": self.history, "norm_sums": self.norm_sums.tolist(), "updates": self.updates.tolist()}

    def load_state_dict(self, state: dict) -> None:
        if not state:  # a fresh run
            return
        self.history = [list(h) for h in state["history"]]
        self.norm_sums.copy_(torch.tensor(state["norm_sums"], dtype=torch.float64))
        self.updates.copy_(torch.tensor(state["updates"], dtype=torch.float64))


def decide(changes: list[float | None], threshold: float, current: int) -> int:
    """Blocks to freeze: the deepest block whose change is below ``threshold``, with every block
    before it; never fewer than ``current`` (freezing only grows)."""
    passed = [i for i, change in enumerate(changes) if change is not None and change < threshold]
    return max(current, passed[-1] + 1) if passed else current


def check_depth(settings: FreezeSettings, model: torch.nn.Module, model_name: str) -> None:
    """Every number of frozen blocks the config names is at most ``model``'s feature blocks."""
    depth = len(model.feature_blocks)
    for frozen in (settings.freeze, *settings.freeze_schedule.values()):
        if frozen != "auto" and frozen > depth:
            raise ConfigError(f"freeze: {frozen} blocks asked for but {model_name} has {depth}")


def make(settings: FreezeSettings, model: torch.nn.Module):
    """The policy the config asks for, over ``model``'s feature blocks."""
    if settings.freeze == "auto":
        return AutoFreeze(model.feature_blocks, settings.freeze_auto_threshold)
    return ConfigFreezing(settings)


def event(epoch: int, before: int, after: int, trainable: int, why: dict) -> dict:
    """The events.jsonl line of a change of the frozen set."""
    return {"event": "freeze", "time": time.time(), "epoch": epoch, "frozen_blocks": after,
            "frozen_before": before, "trainable_params": trainable, **why}


def follow_schedule(run, state, epoch: int) -> None:
    """The freezing policy's set for ``epoch`` (every rank decides alike); a new trainable set
    needs a new optimizer and new sync hooks, and is an events.jsonl line."""
    setup, before = run.setup, run.trainable.frozen_blocks
    frozen = setup.freezing.frozen_blocks(epoch, before)
    if frozen == before:
        return
    run.set_trainable(frozen)
    state.optimizer = run.trainable.optimizer
    setup.sync.broadcast_state(setup.model)
    trainable = run.trainable.param_count
    run.log(f"epoch {epoch}: {frozen} feature block(s) frozen, {trainable:,} trainable parameters")
    if run.is_main:
        writer.append_metrics(run.run_dir, event(epoch, before, frozen, trainable, setup.freezing.why()),
                              writer.EVENTS)
