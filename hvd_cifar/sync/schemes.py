"""What a sync method becomes when a scheme replaces its gradient averaging: a mixin placed
before the method's class (``class HorovodSchemes(SchemeHooks, HorovodSync)``), whose members
hand each update to the scheme. The method keeps its backend, its small collectives, its
broadcast and its epoch-end BatchNorm averaging; it no longer wraps the model or the optimizer
(the scheme reads the gradients as backward left them, accumulated over an update's
micro-batches, and communicates after the update's last backward)."""
from __future__ import annotations

import contextlib

from hvd_cifar.compress.base import Scheme
from hvd_cifar.sync.base import SyncMethod


class SchemeHooks:
    scheme: Scheme

    def use(self, scheme: Scheme) -> None:
        self.scheme = scheme

    @property
    def diverges_together(self) -> bool:
        """Local SGD after its warm-up: each rank checks its own gradients, which no other rank sees."""
        return self.scheme.shares_gradients()

    def wrap(self, model, optimizer, named_parameters, accumulation_steps, fp16):
        self.scheme.track(named_parameters, optimizer)
        self.optimizer = optimizer  # this rank's own, where its gradients are (rank_state)
        return model, optimizer

    def accumulate(self, model, sync_now):
        return contextlib.nullcontext()  # nothing runs during backward

    def synchronize(self, optimizer):
        self.scheme.synchronize()

    def step(self, optimizer, scaler=None):
        self.scheme.before_step()
        SyncMethod.step(self, optimizer, scaler)
        self.scheme.after_step()

    def epoch_loop(self, train_one_epoch):
        return super().epoch_loop(self.scheme.epoch_loop(train_one_epoch))

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

    def payload_bytes(self, named_parameters, fp16):
        return self.scheme.payload_bytes(named_parameters)

    def wire_bytes_per_sync(self, payload_bytes):
        return self.scheme.wire_bytes(payload_bytes)
