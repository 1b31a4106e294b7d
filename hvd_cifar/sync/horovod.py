"""Horovod: ring allreduce over MPI or Gloo, overlapped with backward by per-parameter hooks."""
from __future__ import annotations

import math
import os
from typing import Any

import horovod.torch as hvd

from hvd_cifar.sync import SyncMethod


class HorovodSync(SyncMethod):
    name = "horovod"

    def __init__(self):
        # A rank that stops submitting collectives (a bug, a dead peer) would otherwise leave the
        # rest waiting forever with only a warning: after this long Horovod shuts down with an
        # error instead, which the entry point turns into an aborted job.
        os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", "30")
        os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "120")
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        self.optimizer = None

    def wrap(self, model, optimizer, named_parameters, accumulation_steps, fp16):
        # Named parameters give every allreduce a stable name across ranks. Only trainable
        # parameters are passed: Horovod hooks what it is given when the optimizer is built,
        # so a frozen parameter left in would still have zeros allreduced every step.
        if self.optimizer is not None:
            # The previous wrapper's hooks stay on the parameters' gradient accumulators (Horovod
            # keeps no handle to remove them) and would allreduce under the same names as the new
            # one's; a countdown that never reaches zero keeps them from starting any allreduce.
            for p in self.optimizer._allreduce_delay:
                self.optimizer._allreduce_delay[p] = math.inf
        distributed = self.optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=named_parameters,
            compression=hvd.Compression.fp16 if fp16 else hvd.Compression.none,
            # Horovod counts backward passes per parameter and allreduces on the k-th, so
            # k micro-batches cost one synchronisation.
            backward_passes_per_step=accumulation_steps,
            op=hvd.Average,
        )
        # Horovod builds a new optimizer from the param groups, with empty state: carry over the
        # momentum buffers the loop put in the one it was given (on a change of trainable set).
        distributed.state.update(optimizer.state)
        return model, distributed

    def synchronize(self, optimizer):
        # Waits for the allreduces the backward hooks started. Called explicitly (rather than
        # inside step()) so that the wait is measured as sync time and so that an update with
        # fewer than k micro-batches (an epoch's tail) still gets its gradients allreduced.
        optimizer.synchronize()

    def step(self, optimizer, scaler=None):
        with optimizer.skip_synchronize():  # synchronize() already ran
            super().step(optimizer, scaler)

    def broadcast_state(self, model):
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def allreduce_sum(self, tensor):
        return hvd.allreduce(tensor, op=hvd.Sum)

    def broadcast_object(self, obj: Any) -> Any:
        # A fixed name: Horovod's default derives it from type(obj), which differs when rank 0
        # holds a value and the others hold None, and mismatched names never complete.
        return hvd.broadcast_object(obj, root_rank=0, name="hvd_cifar.broadcast_object")

    def allgather_object(self, obj: Any) -> list:
        return hvd.allgather_object(obj, name="hvd_cifar.allgather_object")

    def barrier(self):
        hvd.barrier()

    def close(self):
        hvd.shutdown()


def create(name: str) -> SyncMethod:
    return HorovodSync()
