"""fp16 on the wire: each gradient crosses it as half precision and is averaged back into its
fp32 buffer. Every sync method that takes it does it natively (its registry entry's ``native``):
Horovod's ``Compression.fp16`` inside its DistributedOptimizer, DDP's ``fp16_compress_hook``, the
MPI methods' cast of their flat buffer; so the method keeps its own averaging, overlapped with
backward where it overlaps, and a run builds no ``Fp16``. ``synchronize`` is the same arithmetic
through the two collectives: what compress/compute.py times as fp16's own cost per update.
"""
from __future__ import annotations

import torch

from hvd_cifar.compress.base import Collective, Scheme
from hvd_cifar.compress.flat import average_in_place
from hvd_cifar.core.wire import gradient_bytes


class Fp16(Scheme):
    name = "fp16"

    def synchronize(self) -> None:
        grads = [p.grad for _, p in self.params if p.grad is not None]
        halves = [g.half() for g in grads]
        average_in_place(self.collective, halves, "fp16.grads")
        with torch.no_grad():
            for g, h in zip(grads, halves):
                g.copy_(h)

    def payload_bytes(self, named_parameters) -> int:
        return sum(gradient_bytes(p.numel(), True, p.element_size()) for _, p in named_parameters)


def create(settings, collective: Collective) -> Fp16:
    return Fp16(collective)
