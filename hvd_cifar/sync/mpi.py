"""Gradient averaging written out by hand with mpi4py, on one flat contiguous buffer.

Two methods share everything but the averaging itself:

    mpi-allreduce       Allreduce(SUM) of the buffer, then divide by the number of ranks
    mpi-gather-scatter  Gather every rank's buffer on rank 0, average there, send the average
                        from rank 0 to each other rank (the parameter-server pattern)

Both use mpi4py's buffer-based (uppercase) calls: the gradients cross as raw memory, never
pickled, in one message per synchronisation rather than one per parameter. Nothing is
communicated during backward; gradients accumulate locally in ``.grad`` and all the traffic
happens in ``synchronize()``, so sync time here is the whole cost of averaging (Horovod and DDP
hide part of theirs inside backward).

They need an MPI launcher (``mpirun``, or ``horovodrun`` in its default MPI mode):

    mpirun -np 2 python -m hvd_cifar.train --config configs/tiny.yaml --sync mpi-gather-scatter
    horovodrun -np 2 -H localhost:2 python -m hvd_cifar.train --config configs/tiny.yaml --sync mpi-allreduce

Under ``horovodrun --gloo`` there is no MPI job, and every rank would quietly train alone as
a world of one; that is refused with a config error instead.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hvd_cifar.core import wire
from hvd_cifar.core.errors import ConfigError
from hvd_cifar.core import launcher
from hvd_cifar.sync import openmpi
from hvd_cifar.sync.base import SyncMethod

_MEAN_TAG = 17  # point-to-point messages carrying the averaged gradients from rank 0



def start_mpi(method: str):
    """mpi4py's MPI module, initialised; or a one-line ConfigError naming ``sync`` when several
    processes were started without an MPI job around them."""
    # Several processes without an MPI job around them (horovodrun --gloo, torchrun): mpi4py would
    # initialise each as a singleton world of size 1.
    if not launcher.launched_by_mpi() and (started := launcher.non_mpi_size()):
        var, size = started
        raise ConfigError(f"sync: {method!r} needs an MPI launcher (mpirun, or horovodrun "
                          f"without --gloo), but this job was started without MPI "
                          f"({var}={size}); use sync: horovod or ddp here")
    openmpi.apply_defaults()
    from mpi4py import MPI  # importing initialises MPI (a singleton world when run alone)
    return MPI


def _fp16_sum(inbuf, inoutbuf, datatype) -> None:
    """MPI reduction for float16, which Open MPI 4 cannot sum itself (the buffers are declared
    as 16-bit integers). numpy adds each pair in higher precision and rounds once, like Horovod."""
    acc = np.frombuffer(inoutbuf, dtype=np.float16)
    acc += np.frombuffer(inbuf, dtype=np.float16)


class MpiSync(SyncMethod):
    """What both MPI methods share: ranks, the flat buffer, the small collectives."""

    def __init__(self, name: str):
        self.MPI = MPI = start_mpi(name)
        self.name = name
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED)  # the ranks on this host
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        node.Free()
        self.params: list[torch.nn.Parameter] = []

    # --- model and optimizer -------------------------------------------------------
    def wrap(self, model, optimizer, named_parameters, accumulation_steps):
        # Only the trainable parameters the loop hands over are averaged: a frozen layer costs
        # no bytes. The buffers are allocated here, once per trainable set, not per step.
        self.params = [p for _, p in named_parameters]
        fp16 = self.fp16
        numel = sum(p.numel() for p in self.params)
        # In host memory: MPI reads and writes it directly (no CUDA-aware MPI assumed).
        self.flat = torch.zeros(numel, dtype=torch.float32)
        # What crosses the wire: the fp32 buffer itself, or a half-size float16 copy of it.
        self.wire = torch.zeros(numel, dtype=torch.float16) if fp16 else self.flat
        self.wire_type = self.MPI.UINT16_T if fp16 else self.MPI.FLOAT  # 2 raw bytes / a float
        self.allocate(numel)
        return model, optimizer

    def allocate(self, numel: int) -> None:
        """Extra buffers a method needs for ``numel`` gradient elements."""

    def pack_gradients(self) -> None:
        """Every trainable gradient into its slice of ``self.flat``."""
        offset = 0
        for p in self.params:
            n = p.numel()
            if p.grad is None:  # a parameter that took no part in this update contributes zeros
                self.flat[offset:offset + n].zero_()
            else:
                self.flat[offset:offset + n].copy_(p.grad.reshape(-1))
            offset += n

    def synchronize(self, optimizer):
        if self.size == 1:  # one rank's gradients are already the mean
            return
        self.pack_gradients()
        self.average()
        offset = 0
        for p in self.params:  # unpack: the average back into each .grad
            n = p.numel()
            mean = self.flat[offset:offset + n].view_as(p)
            if p.grad is None:
                p.grad = mean.to(p.device, copy=True)
            else:
                p.grad.copy_(mean)
            offset += n

    def average(self) -> None:
        """Replace ``self.flat`` (this rank's gradients) with the mean over all ranks."""
        raise NotImplementedError

    def run_epoch(self, ctx, train):
        """Nothing moves during backward here: the whole wait in synchronize() is exposed
        communication, none is hidden (hvd_cifar/sync/overlap.py's figures, measured as they are)."""
        result = train()
        result.extra.update(comm_hidden_s=0.0, comm_exposed_s=result.phase_times["sync"])
        return result

    def broadcast_state(self, model):
        for tensor in model.state_dict().values():  # parameters and buffers (BN statistics)
            host = tensor.detach().cpu().contiguous()
            self.comm.Bcast(host.numpy(), root=0)
            if self.rank != 0:
                tensor.copy_(host)

    # --- small collectives: pickled lowercase calls are fine for a few numbers ----------
    def allreduce_sum(self, tensor):
        host = tensor.detach().to("cpu", copy=True).contiguous()
        self.comm.Allreduce(self.MPI.IN_PLACE, host.numpy(), op=self.MPI.SUM)
        return host.to(tensor.device)

    def allreduce_sum_async(self, tensor, name):
        # Non-blocking: Open MPI moves it along inside the next MPI calls (the gradients' own).
        host = tensor.detach().to("cpu", copy=True).contiguous()
        request = self.comm.Iallreduce(self.MPI.IN_PLACE, host.numpy(), op=self.MPI.SUM)

        def wait() -> torch.Tensor:
            request.Wait()
            return host.to(tensor.device)
        return wait

    def broadcast_object(self, obj: Any) -> Any:
        return self.comm.bcast(obj, root=0)

    def allgather_object(self, obj: Any) -> list:
        return self.comm.allgather(obj)


class MpiAllreduceSync(MpiSync):
    """MPI's own Allreduce (for large messages Open MPI picks a ring or similar), so the bytes
    per rank are the ring figure of the base class."""

    def allocate(self, numel):
        if self.fp16 and not hasattr(self, "fp16_sum"):
            self.fp16_sum = self.MPI.Op.Create(_fp16_sum, commute=True)

    def average(self):
        if self.fp16:
            self.wire.copy_(self.flat)  # fp32 -> fp16: half the bytes on the wire
            self.comm.Allreduce(self.MPI.IN_PLACE, [self.wire.numpy(), self.wire_type], op=self.fp16_sum)
            self.flat.copy_(self.wire)  # the sum, back in fp32 before dividing
        else:
            self.comm.Allreduce(self.MPI.IN_PLACE, [self.flat.numpy(), self.wire_type], op=self.MPI.SUM)
        self.flat.div_(self.size)

    def close(self):
        if hasattr(self, "fp16_sum"):
            self.fp16_sum.Free()
            del self.fp16_sum


class MpiGatherScatterSync(MpiSync):
    """A parameter-server shape: every buffer goes to rank 0, the mean comes back. Rank 0's
    links carry (N-1) buffers each way per synchronisation, so its traffic grows with N while
    a ring's stays under twice the buffer."""

    def allocate(self, numel):
        # Rank 0 receives one buffer per rank into rows of one preallocated block.
        self.gathered = torch.empty(self.size, numel, dtype=self.wire.dtype) if self.rank == 0 else None

    def average(self):
        if self.fp16:
            self.wire.copy_(self.flat)
        recv = [self.gathered.numpy(), self.wire_type] if self.rank == 0 else None
        self.comm.Gather([self.wire.numpy(), self.wire_type], recv, root=0)
        if self.rank == 0:
            # Sum in fp32 whatever crossed the wire (adding fp16 rows into the fp32 buffer
            # converts each element), in rank order, then divide once.
            self.flat.copy_(self.gathered[0])
            for row in self.gathered[1:]:
                self.flat.add_(row)
            self.flat.div_(self.size)
            if self.fp16:
                self.wire.copy_(self.flat)
        self.scatter_mean()
        if self.fp16:
            # Every rank, rank 0 included, takes the fp16-rounded mean, so weights stay identical.
            self.flat.copy_(self.wire)

    def scatter_mean(self) -> None:
        """Rank 0 sends the mean in ``self.wire`` to every other rank itself, one message each,
        as a parameter server does. (A Bcast would not: for buffers this size Open MPI relays
        it along a chain or tree of ranks, so the root sent one copy, measured at the NICs.)"""
        buf = [self.wire.numpy(), self.wire_type]
        if self.rank == 0:
            self.MPI.Request.Waitall([self.comm.Isend(buf, dest=r, tag=_MEAN_TAG) for r in range(1, self.size)])
        else:
            self.comm.Recv(buf, source=0, tag=_MEAN_TAG)

    def wire_bytes_per_sync(self, payload_bytes):
        """Rank 0, the busiest rank, sends the mean to each of the N-1 others (and receives
        as many buffers in the Gather); every other rank sends and receives one buffer."""
        return wire.gather_scatter_root_bytes(self.size, payload_bytes)


def create(name: str, cfg=None) -> SyncMethod:
    return {"mpi-allreduce": MpiAllreduceSync, "mpi-gather-scatter": MpiGatherScatterSync}[name](name)
