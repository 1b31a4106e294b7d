"""A sync method with a compression scheme in place of its gradient averaging: ``SchemeSync``
holds the method and the scheme side by side (composition, as torch's
``register_comm_hook(state, hook)`` and Horovod's ``compression=`` do). The method keeps its
backend, its small collectives, its broadcast and its epoch-end BatchNorm averaging; the scheme
gets each update. The model and the optimizer are not wrapped: the scheme reads the gradients as
backward left them, accumulated over an update's micro-batches, and communicates after the
update's last backward."""
from __future__ import annotations

import contextlib

from hvd_cifar.compress.base import Scheme
from hvd_cifar.sync.base import SyncMethod


class SchemeSync(SyncMethod):
    def __init__(self, method: SyncMethod, scheme: Scheme):
        self.method = method
        self.scheme = scheme
        self.optimizer = None  # this rank's own, where its gradients are (rank_state)
        self.name = method.name
        self.leaves_threads_running = method.leaves_threads_running
        self.stops_by_vote = method.stops_by_vote
        self.elastic = method.elastic

    # --- the method's: ranks, roles, collectives, broadcast, lifetime ---------------------
    rank = property(lambda self: self.method.rank)
    size = property(lambda self: self.method.size)
    local_rank = property(lambda self: self.method.local_rank)
    local_size = property(lambda self: self.method.local_size)
    workers = property(lambda self: self.method.workers)
    worker_rank = property(lambda self: self.method.worker_rank)

    def run_elastic(self, train):
        return self.method.run_elastic(train)

    def consolidate(self, model, optimizer):
        self.method.consolidate(model, optimizer)

    def broadcast_state(self, model):
        self.method.broadcast_state(model)

    def allreduce_sum(self, tensor):
        return self.method.allreduce_sum(tensor)

    def allreduce_sum_async(self, tensor, name):
        return self.method.allreduce_sum_async(tensor, name)

    def broadcast_object(self, obj):
        return self.method.broadcast_object(obj)

    def allgather_object(self, obj):
        return self.method.allgather_object(obj)

    def close(self):
        self.method.close()

    # --- the scheme's: each update's gradients ------------------------------------------
    @property
    def diverges_together(self) -> bool:
        """Local SGD after its warm-up: each rank checks its own gradients, which no other rank sees."""
        return self.scheme.shares_gradients()

    def run_epoch(self, ctx, train):
        return self.method.run_epoch(ctx, lambda: self.scheme.run_epoch(ctx.epoch, train))

    def wrap(self, model, optimizer, named_parameters, accumulation_steps):
        self.scheme.track(named_parameters, optimizer)
        self.optimizer = optimizer
        return model, optimizer

    def accumulate(self, model, sync_now):
        return contextlib.nullcontext()  # nothing runs during backward

    def synchronize(self, optimizer):
        self.scheme.synchronize()

    def step(self, optimizer, scaler=None):
        self.scheme.before_step()
        super().step(optimizer, scaler)
        self.scheme.after_step()

    def rank_state(self):
        """The scheme's state and, where each rank steps on its own gradients (local SGD), its
        own optimizer's (momentum), since the checkpoint's ``optimizer`` is rank 0's alone."""
        state = self.scheme.state_dict()
        if not self.scheme.averages_gradients:
            state = {**state, "optimizer": self.optimizer.state_dict()}
        return state

    def load_rank_state(self, state):
        self.scheme.load_state_dict(state)
        if "optimizer" in state:  # loaded after the checkpoint's (rank 0's): this rank's own wins
            self.optimizer.load_state_dict(state["optimizer"])

    def payload_bytes(self, named_parameters):
        return self.scheme.payload_bytes(named_parameters)

    def wire_bytes_per_sync(self, payload_bytes):
        return self.scheme.wire_bytes(payload_bytes)
