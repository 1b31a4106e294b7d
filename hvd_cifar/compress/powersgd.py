"""PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019) as PyTorch's ddp_comm_hooks run it
(``PowerSGDState``): each matrix-shaped gradient is sent as two thin matrices of
``powersgd_rank`` columns, found by one step of power iteration, with error feedback. The state's
settings are config keys:

    powersgd_rank                   matrix_approximation_rank
    compression_warmup_steps        start_powerSGD_iter: plain allreduce of every gradient before
                                    it (no error kept); error feedback starts there
    powersgd_min_compression_rate   min_compression_rate: a matrix whose rows·cols / (r·(rows +
                                    cols)) is not above it is sent whole, with the vectors
    powersgd_error_feedback         use_error_feedback
    powersgd_warm_start             warm_start: Q is the previous update's; without it, a new
                                    random Q every update (the same on every rank)

Per matrix-shaped gradient G (a conv weight (out, in, kh, kw) is the matrix (out, in*kh*kw)):

    M = G + E                  E: what earlier updates left out (error feedback), zero at first
    P = M Q                    Q: (cols, r), the previous update's (warm start); random at first
    P = mean of P over ranks   first allreduce (all matrices' P in one buffer)
    P = orthonormal columns    Gram-Schmidt
    Q = M^T P
    Q = mean of Q over ranks   second allreduce
    approx = P Q^T             the same on every rank: what the update applies
    E = M - approx             this rank's own

Biases, BatchNorm's weights and any matrix below the minimum compression rate are averaged whole
in a third allreduce. Error, Q and the count of updates are part of the checkpoint
(``state_dict``), so a resumed run goes on as the unbroken one would.
"""
from __future__ import annotations

import zlib

import torch

from hvd_cifar.compress.base import Collective, Scheme
from hvd_cifar.core.cost import MIN_COMPRESSION_RATE, matrix_shape, powersgd_payload
from hvd_cifar.compress.flat import average_in_place, flatten, unflatten

EPS = 1e-8  # a column of norm below this is left at zero, not divided by


def orthonormalise(p: torch.Tensor) -> torch.Tensor:
    """Make the columns of ``p`` orthonormal, in place (modified Gram-Schmidt), and return it."""
    for i in range(p.shape[1]):
        col = p[:, i]
        for j in range(i):
            col -= torch.dot(p[:, j], col) * p[:, j]
        norm = col.norm()
        if norm > EPS:
            col /= norm
        else:
            col.zero_()
    return p


class PowerSGD(Scheme):
    name = "powersgd"

    def __init__(self, collective: Collective, rank: int, warmup_steps: int = 0,
                 min_rate: float = MIN_COMPRESSION_RATE, error_feedback: bool = True, warm_start: bool = True):
        super().__init__(collective, warmup_steps)
        self.rank = rank
        self.min_rate = min_rate
        self.error_feedback = error_feedback
        self.warm_start = warm_start
        self.errors: dict[str, torch.Tensor] = {}  # parameter name -> E, this rank's
        self.qs: dict[str, torch.Tensor] = {}      # parameter name -> Q, the same on every rank

    def synchronize(self) -> None:
        params = self.begin_update()
        if params is None:
            return
        matrices = [(name, p) for name, p in params if self.compressed(p)]
        whole = [p.grad for name, p in params if not self.compressed(p)]
        average_in_place(self.collective, whole, "powersgd.whole")
        if matrices:
            self.compress(matrices)

    def compressed(self, p: torch.nn.Parameter) -> bool:
        return matrix_shape(tuple(p.shape), self.rank, self.min_rate) is not None

    def compress(self, matrices: list[tuple[str, torch.nn.Parameter]]) -> None:
        """The two allreduces of the power step over every matrix-shaped gradient at once."""
        ms = []
        for name, p in matrices:
            m = p.grad.detach().reshape(p.shape[0], -1)
            ms.append(m + self.errors[name] if name in self.errors else m.clone())
        qs = [self.q(name, m) for (name, _), m in zip(matrices, ms)]
        ps = [m @ q for m, q in zip(ms, qs)]
        ps = unflatten(self.collective.allreduce_mean(flatten(ps), "powersgd.P"), ps)
        for p in ps:
            orthonormalise(p)
        qs = [m.t() @ p for m, p in zip(ms, ps)]
        qs = unflatten(self.collective.allreduce_mean(flatten(qs), "powersgd.Q"), qs)
        with torch.no_grad():
            for (name, param), m, p, q in zip(matrices, ms, ps, qs):
                approx = p @ q.t()
                if self.error_feedback:
                    self.errors[name] = m - approx
                if self.warm_start:
                    self.qs[name] = q.clone()  # the start of the next update
                param.grad.copy_(approx.view_as(param.grad))

    def q(self, name: str, m: torch.Tensor) -> torch.Tensor:
        """The Q to multiply ``m`` by: the last update's (warm start), or one drawn from a seed
        that depends only on the parameter's name (and without warm start the update's count),
        so that every rank draws the same."""
        q = self.qs.get(name)
        if q is not None and q.shape == (m.shape[1], self.rank):
            return q
        seed = zlib.crc32(name.encode()) + (0 if self.warm_start else self.updates)
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(m.shape[1], self.rank, generator=generator).to(m)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "errors": dict(self.errors), "qs": dict(self.qs)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.errors, self.qs = dict(state["errors"]), dict(state["qs"])

    def payload_bytes(self, named_parameters) -> int:
        return powersgd_payload([tuple(p.shape) for _, p in named_parameters], self.rank, self.min_rate)


def create(settings, collective: Collective) -> PowerSGD:
    return PowerSGD(collective, settings.powersgd_rank, settings.compression_warmup_steps, settings.powersgd_min_compression_rate,
                    settings.powersgd_error_feedback, settings.powersgd_warm_start)
