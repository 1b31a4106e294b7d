"""Top-k sparsification with error feedback (as in Stich et al. 2018, Lin et al.'s Deep Gradient
Compression without its momentum correction): each rank sends, per gradient tensor, only the
``topk_fraction`` of its entries largest in magnitude, and keeps the rest for later.

Per gradient tensor G of n entries, k = max(1, ceil(topk_fraction x n)):

    M = G + E                E: what this rank has not sent yet (error feedback), zero at first
    I = the k indices of the largest |M|; V = M[I]
    gather V and I from every rank (two allgathers: all tensors' values, then their indices)
    G' = zeros(n); G'[I_r] += V_r for every rank r; G' /= ranks     the same on every rank
    E = M - (V at I, zero elsewhere)                                this rank's own

Ranks choose different indices, so the pieces are gathered, not summed. The first
``compression_warmup_steps`` updates average every gradient whole (no error is kept). The
residuals and the count of updates are part of the checkpoint (``state_dict``).
"""
from __future__ import annotations

import torch

from hvd_cifar.compress import Collective, Scheme, allgather_bytes
from hvd_cifar.compress.cost import kept, topk_payload
from hvd_cifar.compress.flat import unflatten


class TopK(Scheme):
    name = "topk"

    def __init__(self, collective: Collective, fraction: float, warmup_steps: int = 0):
        super().__init__(collective, warmup_steps)
        self.fraction = fraction
        self.errors: dict[str, torch.Tensor] = {}  # parameter name -> E (flat), this rank's

    def synchronize(self) -> None:
        params = self.begin_update()
        if not params:  # the warm-up averaged them, or none has a gradient
            return
        values, indices, offset = [], [], 0
        for name, p in params:
            m = p.grad.detach().reshape(-1)
            m = m + self.errors[name] if name in self.errors else m.clone()
            chosen = m.abs().topk(kept(m.numel(), self.fraction), sorted=False).indices
            sent = m[chosen]
            m[chosen] = 0  # what is left is what this rank did not send: M - sent
            self.errors[name] = m
            values.append(sent)
            indices.append(chosen + offset)  # into all the gradients laid end to end
            offset += m.numel()
        all_values = self.collective.allgather(torch.cat(values), "topk.values")
        all_indices = self.collective.allgather(torch.cat(indices).to(torch.int32), "topk.indices")
        dense = torch.zeros(offset, dtype=all_values.dtype, device=all_values.device)
        dense.index_add_(0, all_indices.long(), all_values)  # in rank order: the same sum everywhere
        dense /= self.collective.size
        grads = [p.grad for _, p in params]
        with torch.no_grad():
            for grad, averaged in zip(grads, unflatten(dense, grads)):
                grad.copy_(averaged)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "errors": dict(self.errors)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.errors = dict(state["errors"])

    def payload_bytes(self, named_parameters) -> int:
        return topk_payload([p.numel() for _, p in named_parameters], self.fraction)

    def wire_bytes(self, payload: int) -> int:
        return allgather_bytes(self.collective.size, payload)


def create(cfg, collective: Collective) -> TopK:
    return TopK(collective, cfg.topk_fraction, cfg.compression_warmup_steps)
