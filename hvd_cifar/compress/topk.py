"""Top-k sparsification as Deep Gradient Compression runs it (Lin, Han, Mao, Wang and Dally, ICLR
2018): each rank sends, per gradient tensor, only the entries of its accumulated update largest in
magnitude, and keeps the rest for later. The four techniques of the paper, each a config key and
on by default:

    topk_local_clip             each rank clips its own gradient, at grad_clip x sqrt(N), before
                                accumulating it (the averaged update is not clipped again)
    topk_momentum_correction    the velocity u, not the raw gradient, is accumulated in the
                                residual; the optimizer then steps without its own momentum and
                                weight decay (they have moved in here)
    topk_momentum_masking       the velocity of the entries sent is cleared with their residual
    topk_warmup_epochs W        the share sent falls from 25 % to topk_fraction over W epochs,
                                geometrically (W = 4, f = 0.004: 25, 8.9, 3.2, 1.1, then 0.4 %)

Per matrix-shaped gradient G of n entries, with momentum m and weight decay wd of its optimizer
group, k = max(1, ceil(f_epoch x n)):

    G = G x min(1, grad_clip x sqrt(N) / |all of this rank's G|)    local clipping
    g = G + wd x w;  u = m u + g;  d = g + m u (nesterov) or u       momentum correction
    V = V + d                    V: what this rank has not sent yet (without correction: V + G)
    I = the k indices of the largest |V|;  sent = V[I];  V[I] = 0;  u[I] = 0 (masking)
    gather sent and I from every rank (two allgathers: all tensors' values, then their indices)
    update = zeros(n); update[I_r] += sent_r for every rank r; update /= ranks   the same everywhere
    w = w - lr x update          the optimizer, momentum 0 and weight decay 0 (with correction)

The paper scales a threshold on the *sum* of N gradients by N^(-1/2): N independent gradients of
norm c sum to a norm of about c sqrt(N). Here the update is their *mean*, of norm about c / sqrt(N),
so the threshold that holds the mean at grad_clip, as the loop clips it without compression, is
grad_clip x sqrt(N) per rank.

Ranks choose different indices, so the pieces are gathered, not summed. Biases and BatchNorm's
weights (vectors) go the same way to d, then d is averaged whole in one allreduce, as the paper's
code sends only the matrices sparse (their bytes are a sliver of the model's); so do matrices of
fewer than ``topk_min_entries`` entries (a first convolution, a small classifier: sent sparse, a
handful of entries an update, they lagged behind and cost accuracy). The first
``compression_warmup_steps`` updates average d whole (no residual is kept; the velocity is).
Residuals, velocities, the count of updates and the epoch (the warm-up's place) are part of the
checkpoint (``state_dict``).
"""
from __future__ import annotations

import math

import torch

from hvd_cifar.compress.base import Collective, Scheme
from hvd_cifar.core.cost import kept, topk_fraction_at, topk_parts, topk_sparse
from hvd_cifar.compress.flat import average_in_place, unflatten
from hvd_cifar.core.wire import allgather_bytes, ring_allreduce_bytes


class TopK(Scheme):
    name = "topk"

    def __init__(self, collective: Collective, fraction: float, warmup_steps: int = 0, warmup_epochs: float = 0,
                 momentum_correction: bool = False, momentum_masking: bool = False, clip: float = 0.0,
                 min_entries: int = 0):
        super().__init__(collective, warmup_steps)
        self.fraction = fraction                    # share sent once the warm-up is over
        self.warmup_epochs = warmup_epochs          # epochs over which the share falls to it
        self.momentum_correction = momentum_correction
        self.momentum_masking = momentum_masking
        self.clip = clip * math.sqrt(collective.size)  # each rank's own threshold; 0: no clipping here
        self.min_entries = min_entries              # smaller matrices are averaged whole
        self.errors: dict[str, torch.Tensor] = {}      # parameter name -> V (flat), this rank's
        self.velocities: dict[str, torch.Tensor] = {}  # parameter name -> u (flat), this rank's
        self.hyper: dict[str, tuple[float, bool, float]] = {}  # name -> (momentum, nesterov, weight decay)
        self.sent: list[tuple[torch.Tensor, torch.Tensor]] = []  # (grad, the update as sent): see before_step
        self.parts: dict[int, tuple[int, int]] = {}  # payload_bytes -> its (sparse, whole) bytes, for wire_bytes

    def track(self, named_parameters, optimizer=None) -> None:
        """With momentum correction, take each parameter's momentum, nesterov and weight decay
        from ``optimizer``'s groups and set the groups' to 0: the scheme applies them before
        accumulating, and the optimizer must not apply them a second time."""
        super().track(named_parameters)
        if not self.momentum_correction or optimizer is None:
            return
        names = {id(p): name for name, p in self.params}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) in names:
                    self.hyper[names[id(p)]] = (group["momentum"], group["nesterov"], group["weight_decay"])
            group.update(momentum=0.0, nesterov=False, weight_decay=0.0, dampening=0.0)

    def kept_fraction(self) -> float:
        """The share of each tensor sent in this epoch (the sparsity warm-up)."""
        return topk_fraction_at(self.epoch, self.fraction, self.warmup_epochs)

    def synchronize(self) -> None:
        params = [(name, p) for name, p in self.params if p.grad is not None]
        dense = self.updates < self.warmup_steps
        self.updates += 1
        if not params:
            return
        if self.clip:
            torch.nn.utils.clip_grad_norm_([p for _, p in params], self.clip)
        steps = [self.accumulated(name, p) for name, p in params]
        if dense:
            average_in_place(self.collective, steps, f"{self.name}.warmup")
        else:
            # Biases and BatchNorm's vectors are averaged whole (few bytes; sparse, they would
            # barely move), the matrices sparsified, as the paper's code registers only those.
            sparse = [i for i, (_, p) in enumerate(params) if topk_sparse(tuple(p.shape), self.min_entries)]
            average_in_place(self.collective, [s for i, s in enumerate(steps) if i not in sparse], "topk.whole")
            if sparse:
                self.exchange([params[i] for i in sparse], [steps[i] for i in sparse])
        with torch.no_grad():
            for (_, p), step in zip(params, steps):
                p.grad.copy_(step.view_as(p.grad))
        # What before_step() puts back after the loop's clip of the averaged update.
        self.sent = [(p.grad, p.grad.clone()) for _, p in params] if self.clip else []

    def accumulated(self, name: str, p: torch.nn.Parameter) -> torch.Tensor:
        """What this update adds to the residual of ``p`` (flat, a new tensor): the velocity step
        with momentum correction, else the gradient."""
        g = p.grad.detach().reshape(-1).clone()
        if name not in self.hyper:
            return g
        momentum, nesterov, weight_decay = self.hyper[name]
        if weight_decay:
            g.add_(p.detach().reshape(-1), alpha=weight_decay)
        u = self.velocities.get(name)
        u = g.clone() if u is None else u.mul_(momentum).add_(g)  # as torch.optim.SGD's buffer
        self.velocities[name] = u
        return g.add(u, alpha=momentum) if nesterov else u.clone()

    def exchange(self, params, steps: list[torch.Tensor]) -> None:
        """Add ``steps`` to the residuals, send each tensor's largest entries, and leave in
        ``steps`` the mean of every rank's sent entries."""
        values, indices, offset = [], [], 0
        fraction = self.kept_fraction()
        for (name, _), step in zip(params, steps):
            v = step + self.errors[name] if name in self.errors else step.clone()
            chosen = v.abs().topk(kept(v.numel(), fraction), sorted=False).indices
            values.append(v[chosen])
            v[chosen] = 0  # what is left is what this rank did not send
            self.errors[name] = v
            if self.momentum_masking and name in self.velocities:
                self.velocities[name][chosen] = 0
            indices.append(chosen + offset)  # into all the gradients laid end to end
            offset += v.numel()
        all_values = self.collective.allgather(torch.cat(values), "topk.values")
        all_indices = self.collective.allgather(torch.cat(indices).to(torch.int32), "topk.indices")
        dense = torch.zeros(offset, dtype=all_values.dtype, device=all_values.device)
        dense.index_add_(0, all_indices.long(), all_values)  # in rank order: the same sum everywhere
        dense /= self.collective.size
        for step, averaged in zip(steps, unflatten(dense, steps)):
            step.copy_(averaged)

    def before_step(self) -> None:
        """With local clipping the update is applied as sent: each rank clipped its own gradient
        before accumulating it, so the loop's clip of the averaged update (grad_clip, which ran
        since synchronize()) is undone here, as DGC does not clip after aggregation."""
        with torch.no_grad():
            for grad, sent in self.sent:
                grad.copy_(sent)
        self.sent = []

    def state_dict(self) -> dict:
        return {**super().state_dict(), "errors": dict(self.errors), "velocities": dict(self.velocities)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.errors, self.velocities = dict(state["errors"]), dict(state["velocities"])

    def payload_bytes(self, named_parameters) -> int:
        parts = topk_parts([tuple(p.shape) for _, p in named_parameters], self.fraction, self.min_entries)
        self.parts[sum(parts)] = parts
        return sum(parts)

    def wire_bytes(self, payload: int) -> int:
        """The sparse part in a ring allgather, the vectors in a ring allreduce."""
        sparse, whole = self.parts.get(payload, (payload, 0))
        return allgather_bytes(self.collective.size, sparse) + ring_allreduce_bytes(self.collective.size, whole)


def create(settings, collective: Collective) -> TopK:
    return TopK(collective, settings.topk_fraction, settings.compression_warmup_steps, settings.topk_warmup_epochs,
                settings.topk_momentum_correction, settings.topk_momentum_masking,
                settings.grad_clip if settings.topk_local_clip else 0.0, settings.topk_min_entries)
