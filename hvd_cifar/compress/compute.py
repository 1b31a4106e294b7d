"""What a scheme's own arithmetic costs per update on this machine: PowerSGD's matrix products and
Gram-Schmidt, top-k's selection and scatter, and the flattening every scheme does; for
``compression: fp16``, casting each gradient to fp16 and back. The scaling model adds it to the
step (hvd_cifar.analysis.scaling.time_schemes); a run's phases cannot give it, since a run without the
option never did that work.

Timed here, in this process, on gradients of the model's real shapes, with the collectives
answered by this one rank (no wire, no wait), so that what is left is the scheme's compute. It
does not grow with the number of ranks, except top-k's scatter of the N ranks' pieces
(index_add_ of N·k entries, small beside the selection over every entry).
"""
from __future__ import annotations

import time

import torch

from hvd_cifar.compress import make, settings
from hvd_cifar.compress.base import Collective
from hvd_cifar.core.config import Config


class Alone(Collective):
    """The collectives of a world of one: every tensor is its own mean and its own gather."""

    def __init__(self):
        super().__init__(1)

    def _allreduce_mean(self, tensor, name):
        return tensor

    def _allgather(self, tensor, name):
        return tensor


def seconds_per_update(shapes: list[tuple[int, ...]], compression: str, values: dict | None = None,
                       threads: int = 0, updates: int = 8) -> float:
    """Mean seconds of scheme ``compression``'s synchronize() and after_step() (fp16: the casts),
    with ``values`` (its settings; the defaults for the rest), over ``updates`` updates (after one
    untimed: PowerSGD draws its first Q there) on random gradients of ``shapes``, with ``threads``
    torch threads (0: as this process has them); 0 for none."""
    # Every technique as the defaults have it, past the warm-ups; the values of momentum, weight
    # decay and the clip threshold change what is computed, not how long it takes.
    cfg = Config(**{**(values or {}), "compression": compression, "topk_warmup_epochs": 0,
                    "compression_warmup_steps": 0})
    scheme = make(settings(cfg), Alone())
    if scheme is None:
        return 0.0
    generator = torch.Generator().manual_seed(0)
    params = [(f"p{i}", torch.nn.Parameter(torch.zeros(shape))) for i, shape in enumerate(shapes)]
    grads = [torch.randn(shape, generator=generator) for shape in shapes]
    scheme.track(params, torch.optim.SGD([p for _, p in params], lr=0.1, momentum=0.9, nesterov=True,
                                         weight_decay=5e-4))
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        total = 0.0
        for update in range(updates + 1):
            for (_, p), g in zip(params, grads):
                p.grad = g.clone()  # as backward leaves it: the scheme overwrites .grad
            began = time.perf_counter()
            one_update(scheme)
            total += (time.perf_counter() - began) if update else 0.0
    finally:
        torch.set_num_threads(before)
    return total / updates


def one_update(scheme) -> None:
    """What one update computes beyond backward: the scheme's synchronize() and after_step()
    (fp16: each gradient cast to fp16 for the wire, laid in one buffer, and back into its fp32
    buffer, as Horovod's fusion buffer and DDP's buckets hold them)."""
    scheme.synchronize()
    scheme.after_step()
