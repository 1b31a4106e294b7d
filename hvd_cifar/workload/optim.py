"""The optimizer: SGD over the trainable parameters, rebuilt whenever that set changes (freezing)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hvd_cifar.core.config import settings_for


@dataclass(frozen=True)
class OptimSettings:
    """What the optimizer and its learning-rate schedule read of the run's config."""
    lr: float
    momentum: float
    nesterov: bool
    weight_decay: float
    lr_scaling: str
    warmup_epochs: float
    schedule: str
    epochs: int
    accumulation_steps: int

    @classmethod
    def of(cls, cfg) -> "OptimSettings":
        return settings_for(cls, cfg)


def _undecorated(method):
    """The function under the wrappers torch puts around an optimizer method (each one made
    with functools.wraps, so ``__wrapped__`` leads to what it wraps)."""
    while hasattr(method, "__wrapped__"):
        method = method.__wrapped__
    return method


class SGD(torch.optim.SGD):
    """torch.optim.SGD, computing exactly what it computes, without importing torch._dynamo.

    torch wraps step() and four methods of every optimizer to keep torch.compile from tracing
    them; the wrappers import torch._dynamo on first use, which costs every rank 1.4-1.7 s of
    CPU at start on this kind of machine (`python -X importtime`), for a compiler hvd_cifar
    never runs. Outside torch.compile those wrappers only switch autograd off around step(),
    which step() here does itself. tests/test_startup.py checks the weights bit for bit
    against torch.optim.SGD and that a training process never loads torch._dynamo."""

    _step = staticmethod(_undecorated(torch.optim.SGD.step))
    add_param_group = _undecorated(torch.optim.Optimizer.add_param_group)
    zero_grad = _undecorated(torch.optim.Optimizer.zero_grad)
    state_dict = _undecorated(torch.optim.Optimizer.state_dict)
    load_state_dict = _undecorated(torch.optim.Optimizer.load_state_dict)

    def step(self, closure=None):
        with torch.no_grad():  # torch's wrapper: autograd follows the `differentiable` flag, False here
            return self._step(self, closure)


def sgd(named: list[tuple[str, torch.nn.Parameter]], cfg: OptimSettings, old: torch.optim.Optimizer | None = None
        ) -> SGD:
    """SGD with momentum (``lr``, ``momentum``, ``nesterov``) over ``named``, weight decay on
    weights only; the momentum ``old`` held for parameters still in ``named`` carries over."""
    decay = [p for n, p in named if p.ndim > 1]           # no weight decay on biases / BN
    no_decay = [p for n, p in named if p.ndim <= 1]
    opt = SGD([{"params": decay, "weight_decay": cfg.weight_decay},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
    if old is not None:
        opt.state.update({p: old.state[p] for _, p in named if p in old.state})
    return opt


# ----------------------------------------------------------------------------- learning rate
# A longer warm-up leaves a short run too few updates near its peak: on digits at 4 ranks
# (66 updates in 6 epochs) half the run in warm-up left the small CNN at 93.9 % where a quarter
# reaches 95.8 %, and VGG-11 trains with a warm-up as short as one epoch once gradients are
# clipped (docs/CONVERGENCE.md).
WARMUP_MAX_FRACTION = 0.25


class LrSchedule:
    """The learning rate of each optimizer update.

    ``lr`` is tuned for one rank at ``batch_size`` images per update. An update of this run
    averages ``m = world size x accumulation steps`` such batches, and its peak rate is
    ``lr x m`` (``lr_scaling: linear``, Goyal et al.'s rule), ``lr x sqrt(m)`` (``sqrt``) or
    ``lr`` (``none``). Warm-up (gradual, as in Goyal et al., counted in updates) rises linearly
    from 0 by the same amount per image seen as a one-rank run's does: one rank reaches ``lr``
    after ``warmup_epochs`` epochs, so a peak ``f`` times higher is reached after ``f x
    warmup_epochs`` epochs: the warm-up grows with the multiplier (2 ranks with a one-epoch
    warm-up take 2 epochs to reach twice the rate, not one epoch of half as many updates). It is
    capped at WARMUP_MAX_FRACTION of the run; then ``schedule`` takes the rate down to the end.
    docs/CONVERGENCE.md has the measurements behind the rule and the defaults.
    """

    def __init__(self, cfg: OptimSettings, world_size: int, updates_per_epoch: int):
        multiplier = world_size * cfg.accumulation_steps
        factor = {"linear": multiplier, "sqrt": math.sqrt(multiplier), "none": 1.0}[cfg.lr_scaling]
        self.peak = cfg.lr * factor
        self.total = cfg.epochs * updates_per_epoch
        self.warmup = min(round(cfg.warmup_epochs * factor * updates_per_epoch),
                          round(self.total * WARMUP_MAX_FRACTION))
        self.schedule = cfg.schedule

    def __call__(self, update: int) -> float:
        """The rate for optimizer update ``update`` (0-based, counted from the run's start)."""
        if update < self.warmup:
            return self.peak * (update + 1) / self.warmup
        progress = (update - self.warmup) / max(self.total - self.warmup, 1)
        if self.schedule == "onecycle":
            return self.peak * max(1.0 - progress, 0.0)
        if self.schedule == "cosine":
            return self.peak * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
        return self.peak * 0.1 ** sum(progress >= m for m in (0.5, 0.75))  # step


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
