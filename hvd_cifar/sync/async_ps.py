"""mpi-async-ps: an asynchronous parameter server over mpi4py, on one flat buffer.

The first ``ps_servers`` ranks (default 1) are servers, the others workers. The servers hold the
weights: the flat buffer of every trainable parameter, cut into one contiguous shard per server,
with SGD's momentum beside it. A worker runs the ordinary step loop (loop.train_one_epoch) on
its shard of the data (the data is sharded over the workers only). At each update it pushes its
gradient, checked and clipped by the loop's guard as under every method, to the servers (to
each server its shard) and pulls back the weights each holds right after applying it. A server
applies each push the moment it arrives, so no worker waits for another; a worker's next
gradient is then computed on weights that other workers' pushes may already have moved on: the
staleness, which every metrics line records (with the servers' updates per second).

    mpirun -np 3 python -m hvd_cifar.train --config configs/tiny.yaml --sync mpi-async-ps
    horovodrun -np 4 -H localhost:4 python -m hvd_cifar.train --sync mpi-async-ps --ps-servers 2

Pushes and pulls are buffer-based (uppercase) mpi4py calls on numpy views of the flat buffers,
on a duplicate of COMM_WORLD of their own, so no small collective can ever match one of them.

Where it meets the loop (docs/ARCHITECTURE.md): a server rank runs ``serve_epoch`` where a worker
runs loop.train_one_epoch (``run_epoch``); after the epoch every rank takes the servers'
weights and momentum and the workers' mean BatchNorm statistics (``consolidate``), so evaluation
and rank 0's checkpoint (rank 0 is a server) see the servers' model, and --resume gives it back.

Learning rate: a push is one update made of one worker's batch (times the accumulation steps),
so the servers follow a one-rank run's schedule (optim.LrSchedule with world size 1) over
workers x updates-per-worker updates an epoch: as many as a one-rank run makes.

Bytes: per update a worker sends S (its gradient) and receives S (the weights), S being the
flat buffer's bytes; each server takes in and sends out S / ps_servers per update of any worker.

Not here: compression: fp16 and amp: fp16 (its registry entry, hvd_cifar/core/methods.py, has no
``native`` compression and takes no grad scaler, so the config refuses them), and preemption as a pause:
without a vote (a collective per update would make the workers wait for one another) the ranks
cannot agree where to stop, so a stop signal ends the rank at its next update, which ends the
job as a killed rank does; --resume continues from the last epoch's checkpoint.
"""
from __future__ import annotations

import time

import torch

from hvd_cifar.core import stops
from hvd_cifar.core.errors import ConfigError
from hvd_cifar.core.names import PHASES
from hvd_cifar.sync.base import SyncMethod
from hvd_cifar.sync.mpi import MpiSync
from hvd_cifar.workload.epoch import EpochContext, EpochResult, progress_bar, zero_sums

_PUSH = 21  # worker -> server: a gradient shard
_PULL = 22  # server -> worker: the weight shard after applying it


def shard_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) pieces of a buffer of ``numel`` elements, one per server, their
    sizes within one element of each other."""
    edges = [numel * i // parts for i in range(parts + 1)]
    return list(zip(edges[:-1], edges[1:]))


def copy_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Consecutive slices of ``flat`` into ``tensors`` (shapes kept)."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


class FlatSgd:
    """torch.optim.SGD's update (dampening 0), as the servers compute it on flat buffers, from
    the optimizer's settings: one momentum and Nesterov flag, weight decay per parameter group
    (none on biases, BN). A zero momentum buffer stands for SGD's missing one: its first step is
    then the same."""

    def __init__(self, optimizer, params: list[torch.Tensor]):
        group = optimizer.param_groups[0]
        self.momentum_factor, self.nesterov = group["momentum"], group["nesterov"]
        decay = {p: g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
        self.decay = torch.cat([torch.full((p.numel(),), float(decay[p])) for p in params])

    def apply(self, weights, momentum, grad, lr: float, span: tuple[int, int]) -> None:
        """Update ``weights`` and ``momentum`` (the flat elements ``span`` of the model) by ``grad``, in place."""
        grad.addcmul_(self.decay[span[0]:span[1]], weights)  # weight decay, per element
        momentum.mul_(self.momentum_factor).add_(grad)
        step = grad.add_(momentum, alpha=self.momentum_factor) if self.nesterov else momentum
        weights.add_(step, alpha=-lr)


def flatten_state(params, optimizer, weights: torch.Tensor, momentum: torch.Tensor) -> None:
    """The parameters into ``weights`` and SGD's momentum buffers into ``momentum`` (zero where
    it has none yet), consecutively."""
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            weights[offset:offset + n].copy_(p.reshape(-1))
            buf = optimizer.state.get(p, {}).get("momentum_buffer")
            if buf is None:
                momentum[offset:offset + n].zero_()
            else:
                momentum[offset:offset + n].copy_(buf.reshape(-1))
            offset += n


def serving_figures(servers_comm, staleness: list[int], seconds: float) -> dict:
    """The epoch's staleness over every server's pushes, and the servers' mean update rate."""
    every = servers_comm.allgather((sum(staleness), len(staleness), max(staleness, default=0),
                                    len(staleness) / seconds))
    return {"staleness_mean": sum(e[0] for e in every) / max(sum(e[1] for e in every), 1),
            "staleness_max": max(e[2] for e in every),
            "server_updates_per_s": sum(e[3] for e in every) / len(every)}


def average_worker_buffers(mpi, comm, model, is_server: bool, workers: int) -> None:
    """BatchNorm's running statistics: the workers' mean (a server never runs a forward pass,
    so its own are the initial ones and count for nothing)."""
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    if not buffers:
        return
    flat = torch.cat([b.detach().reshape(-1).double().cpu() for b in buffers])
    if is_server:
        flat.zero_()
    comm.Allreduce(mpi.IN_PLACE, flat.numpy(), op=mpi.SUM)
    copy_into(flat / workers, buffers)


class AsyncPsSync(MpiSync):
    """Servers first: rank 0, which speaks and writes the checkpoint under every method, is then
    a rank that holds the weights, so it needs nothing from the workers to save them."""

    diverges_together = False  # a worker's guard checks its own gradient, which no other rank sees
    stops_by_vote = False  # the ranks share no update boundary to vote at; see stops.end_if_asked

    def __init__(self, name: str):
        super().__init__(name)
        self.ps = self.comm.Dup()  # pushes and pulls only
        self.servers, self.servers_comm = 1, None

    def configure(self, cfg):
        servers = cfg.own["ps_servers"]
        if servers >= self.size:  # the world size is known here, not in the config
            raise ConfigError(f"ps_servers: {servers} server rank(s) leave no worker among {self.size} "
                              f"rank(s); sync: mpi-async-ps needs at least {servers + 1} ranks")
        self.servers = servers
        # The servers' own communicator, for their per-epoch figures (the workers get none).
        self.servers_comm = self.comm.Split(0 if self.is_server else self.MPI.UNDEFINED, self.rank)

    # --- roles ------------------------------------------------------------------------
    @property
    def is_server(self) -> bool:
        return self.rank < self.servers

    @property
    def workers(self) -> int:
        return self.size - self.servers

    @property
    def worker_rank(self) -> int:
        # A server takes worker 0's shard only to know how many steps a worker's epoch has.
        return max(self.rank - self.servers, 0)

    def run_epoch(self, ctx, train):
        return self.serve_epoch(ctx) if self.is_server else train()

    # --- buffers ------------------------------------------------------------------------
    def wrap(self, model, optimizer, named_parameters, accumulation_steps):
        model, optimizer = super().wrap(model, optimizer, named_parameters, accumulation_steps)
        self.sgd = FlatSgd(optimizer, self.params)
        return model, optimizer

    def allocate(self, numel):
        self.shards = shard_bounds(numel, self.servers)
        self.weights = torch.zeros(numel)   # a worker's pulls; on a server its own shard is the weights
        self.momentum = torch.zeros(numel)  # on a server its own shard is SGD's momentum
        if self.is_server:
            start, end = self.shards[self.rank]
            # One receive and one reply buffer per worker: each worker has at most one push and
            # one reply in flight, and the weights move on while a reply is still being sent.
            self.pushed = [torch.empty(end - start) for _ in range(self.workers)]
            self.replies = [torch.empty(end - start) for _ in range(self.workers)]

    # --- a worker's update --------------------------------------------------------------
    def synchronize(self, optimizer):
        """Nothing to average: the gradient goes to the servers as it is, in ``step``, once the
        loop's guard has checked and clipped it."""

    def step(self, optimizer, scaler=None):
        """Push this worker's gradient; pull the weights the servers hold once they applied it."""
        self.pack_gradients()
        requests = []
        for server, (start, end) in enumerate(self.shards):
            requests.append(self.ps.Irecv(self.weights.numpy()[start:end], source=server, tag=_PULL))
            requests.append(self.ps.Isend(self.flat.numpy()[start:end], dest=server, tag=_PUSH))
        self.MPI.Request.Waitall(requests)
        copy_into(self.weights, self.params)

    # --- a server's epoch ---------------------------------------------------------------
    def serve_epoch(self, ctx: EpochContext) -> EpochResult:
        """Apply every worker's pushes as they come and answer each with the weights, until every
        worker has made its updates of the epoch; the server's figures go into the metrics line."""
        per_worker, epoch = ctx.updates_per_epoch, ctx.epoch
        total = per_worker * self.workers
        schedule = ctx.lr_schedule(1, total)  # a push is one worker's batch: a one-rank run's rate
        self.begin_serving(ctx.optimizer)
        pulled = [0] * self.workers  # the version (updates applied this epoch) each worker last pulled
        left = [per_worker] * self.workers
        receives = [self.receive(k) for k in range(self.workers)]
        replies = [self.MPI.REQUEST_NULL] * self.workers
        staleness, lr = [], 0.0
        bar = progress_bar(total, 0, f"epoch {epoch + 1}/{ctx.epochs} server", ctx.progress)
        began = time.perf_counter()
        for version in range(total):
            k = self.MPI.Request.Waitany(receives)
            staleness.append(version - pulled[k])
            lr = schedule(epoch * total + version)
            self.apply(self.pushed[k], lr)
            pulled[k] = version + 1
            replies[k].Wait()  # its last reply is out before the buffer takes the new weights
            start, end = self.shards[self.rank]
            self.replies[k].copy_(self.weights[start:end])
            replies[k] = self.ps.Isend(self.replies[k].numpy(), dest=self.servers + k, tag=_PULL)
            left[k] -= 1
            receives[k] = self.receive(k) if left[k] else self.MPI.REQUEST_NULL
            stops.end_if_asked()
            bar.update(1)
        self.MPI.Request.Waitall(replies)
        bar.close()
        seconds = time.perf_counter() - began
        return EpochResult(zero_sums(ctx.device), dict.fromkeys(PHASES, 0.0),
                           ctx.steps, 0, per_worker, seconds, lr,
                           serving_figures(self.servers_comm, staleness, seconds) | {"ps_servers": self.servers})

    def receive(self, k: int):
        """Start receiving worker ``k``'s next push."""
        return self.ps.Irecv(self.pushed[k].numpy(), source=self.servers + k, tag=_PUSH)

    def begin_serving(self, optimizer) -> None:
        """The weights and momentum from where the last ``consolidate`` or a checkpoint left them."""
        flatten_state(self.params, optimizer, self.weights, self.momentum)

    def apply(self, grad: torch.Tensor, lr: float) -> None:
        """SGD's update of this server's shard by ``grad``, in place."""
        start, end = self.shards[self.rank]
        self.sgd.apply(self.weights[start:end], self.momentum[start:end], grad, lr, (start, end))

    # --- after the epoch ----------------------------------------------------------------
    def consolidate(self, model, optimizer):
        """Every rank takes the servers' weights and momentum (each server broadcasts its shard)
        and the workers' mean BatchNorm statistics: the model the run evaluates and saves."""
        for server, (start, end) in enumerate(self.shards):
            self.comm.Bcast(self.weights.numpy()[start:end], root=server)
            self.comm.Bcast(self.momentum.numpy()[start:end], root=server)
        copy_into(self.weights, self.params)
        if self.sgd.momentum_factor:  # SGD keeps no buffer without momentum
            offset = 0
            for p in self.params:
                optimizer.state[p]["momentum_buffer"] = self.momentum[offset:offset + p.numel()].view_as(p).clone()
                offset += p.numel()
        average_worker_buffers(self.MPI, self.comm, model, self.is_server, self.workers)

    # --- accounting ---------------------------------------------------------------------
    def wire_bytes_per_sync(self, payload_bytes):
        """What a worker sends per update: its whole gradient (and it receives as much back)."""
        return payload_bytes

    def close(self):
        for comm in (self.ps, self.servers_comm):
            if comm is not None and comm != self.MPI.COMM_NULL:
                comm.Free()
        self.ps = self.servers_comm = None


def create(name: str, cfg=None) -> SyncMethod:
    return AsyncPsSync(name)
