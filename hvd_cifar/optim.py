"""The optimizer: SGD over the trainable parameters, rebuilt whenever that set changes (freezing)."""
from __future__ import annotations

import torch


def sgd(named: list[tuple[str, torch.nn.Parameter]], cfg, old: torch.optim.Optimizer | None = None
        ) -> torch.optim.SGD:
    """SGD with momentum (``cfg.lr``, ``momentum``, ``nesterov``) over ``named``, weight decay
    on weights only; the momentum ``old`` held for parameters still in ``named`` carries over."""
    decay = [p for n, p in named if p.ndim > 1]           # no weight decay on biases / BN
    no_decay = [p for n, p in named if p.ndim <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": cfg.weight_decay},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
    if old is not None:
        opt.state.update({p: old.state[p] for _, p in named if p in old.state})
    return opt
