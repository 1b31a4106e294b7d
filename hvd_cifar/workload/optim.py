"""The optimizer: SGD over the trainable parameters, rebuilt whenever that set changes (freezing)."""
from __future__ import annotations

import torch


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


def sgd(named: list[tuple[str, torch.nn.Parameter]], cfg, old: torch.optim.Optimizer | None = None
        ) -> SGD:
    """SGD with momentum (``cfg.lr``, ``momentum``, ``nesterov``) over ``named``, weight decay
    on weights only; the momentum ``old`` held for parameters still in ``named`` carries over."""
    decay = [p for n, p in named if p.ndim > 1]           # no weight decay on biases / BN
    no_decay = [p for n, p in named if p.ndim <= 1]
    opt = SGD([{"params": decay, "weight_decay": cfg.weight_decay},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
    if old is not None:
        opt.state.update({p: old.state[p] for _, p in named if p in old.state})
    return opt
