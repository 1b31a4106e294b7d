"""Many tensors as one buffer: each scheme sends one collective per kind of message (all P
matrices together, all uncompressed gradients together), not one per parameter."""
from __future__ import annotations

import torch


def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.zeros(0)


def unflatten(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """``flat`` cut back into tensors shaped as ``like``."""
    out, offset = [], 0
    for t in like:
        out.append(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    return out


def average_in_place(collective, tensors: list[torch.Tensor], name: str) -> None:
    """Replace each of ``tensors`` by its mean over the ranks, in one allreduce."""
    if not tensors:
        return
    mean = collective.allreduce_mean(flatten(tensors), name)
    with torch.no_grad():
        for t, averaged in zip(tensors, unflatten(mean, tensors)):
            t.copy_(averaged)
