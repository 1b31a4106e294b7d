"""PyTorch DistributedDataParallel: bucketed allreduce overlapped with backward, like Horovod,
but through torch.distributed (Gloo on CPU, NCCL for CUDA tensors).

DDP brings no launcher of its own here; the ranks come from whichever one started the job:

    mpirun -np 2 python -m hvd_cifar.train --config configs/tiny.yaml --sync ddp
    horovodrun -np 2 -H localhost:2 python -m hvd_cifar.train --config configs/tiny.yaml --sync ddp
    horovodrun --gloo -np 2 -H localhost:2 python -m hvd_cifar.train --config configs/tiny.yaml --sync ddp
    python -m hvd_cifar.train --config configs/tiny.yaml --sync ddp     # one process

Rendezvous: rank 0 opens torch.distributed's key-value store on a free port and tells the
others where it is over whatever the launcher already provides (mpi4py under MPI, Horovod's
own Gloo rendezvous under ``horovodrun --gloo``). ``MASTER_ADDR`` overrides the address rank 0
advertises (e.g. to pick a network on a multi-homed host).
"""
from __future__ import annotations

import contextlib
import gc
import os
import socket
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from hvd_cifar import compress
from hvd_cifar.core import launcher
from hvd_cifar.sync import overlap
from hvd_cifar.sync import openmpi
from hvd_cifar.sync.base import SyncMethod


def _launcher() -> tuple[int, int, int, int, Any]:
    """Rank, size, local rank and local size as the launcher set them, a function that hands
    rank 0's object to every rank, and one to call once the rendezvous no longer needs it."""
    if launcher.launched_by_mpi():
        openmpi.apply_defaults()
        from mpi4py import MPI  # also what abort_job uses to take all ranks down on a failure
        comm = MPI.COMM_WORLD
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        ranks = comm.Get_rank(), comm.Get_size(), node.Get_rank(), node.Get_size()
        node.Free()
        return (*ranks, lambda obj: comm.bcast(obj, root=0), lambda: None)
    if launcher.horovod_gloo():  # horovodrun --gloo: no MPI, but Horovod's Gloo rendezvous
        import horovod.torch as hvd
        # Torch's Gloo should use the network interface horovodrun found common to all hosts.
        if launcher.gloo_interface():
            os.environ.setdefault("GLOO_SOCKET_IFNAME", launcher.gloo_interface())
        hvd.init()
        ranks = hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()
        # An explicit name: Horovod matches collectives by name, and its default (the object's
        # type) differs between rank 0 (a tuple) and the others (None).
        return (*ranks, lambda obj: hvd.broadcast_object(obj, root_rank=0, name="ddp.rendezvous"),
                hvd.shutdown)
    return 0, 1, 0, 1, lambda obj: obj, lambda: None  # one process, no launcher


class DdpSync(SyncMethod):
    name = "ddp"
    # Even after close(), torch keeps the Gloo group's worker threads alive once DDP was built:
    # the process must end without the interpreter's shutdown (lifecycle.exit_process says why).
    leaves_threads_running = True

    def __init__(self):
        self.rank, self.size, self.local_rank, self.local_size, broadcast, done = _launcher()
        if self.rank == 0:
            # The address the others can reach rank 0 by: the host name the launcher used for it.
            host = launcher.rendezvous_host(socket.gethostname())
            # Port 0: the OS picks a free port, with no window for another process to take it.
            store = dist.TCPStore(host, 0, self.size, is_master=True, wait_for_workers=False)
            address = (host, store.port)
        address = broadcast(address if self.rank == 0 else None)
        done()
        if self.rank != 0:
            store = dist.TCPStore(address[0], address[1], self.size, is_master=False)
        # CPU tensors (metrics, objects, and all gradients on a CPU-only host) go through Gloo;
        # CUDA tensors through NCCL.
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.size)
        self.ddp = None
        self.timeline = False
        self.comm: list[tuple[float, float]] = []   # this epoch's buckets: (gradients ready, allreduce done)
        self.waits: list[tuple[float, float]] = []  # per update: (last bucket ready, backward returned)

    def configure(self, cfg):
        self.timeline = cfg.comm_timeline

    def collective(self):
        return TorchCollective(self.size)

    # --- model and optimizer -------------------------------------------------------
    def wrap(self, model, optimizer, named_parameters, accumulation_steps):
        # Called again with the plain model when the trainable set changes: DDP decides which
        # parameters it reduces (those with requires_grad) and lays out its buckets when it is
        # built, so a new trainable set needs a new wrapper. Frozen parameters are skipped there,
        # which is the same set the loop passes in ``named_parameters``.
        self.ddp = None  # let the previous wrapper and its reducer go first
        self.ddp = DistributedDataParallel(
            model,
            device_ids=[self.local_rank] if next(model.parameters()).is_cuda else None,
            # Like Horovod and the MPI methods: BatchNorm statistics stay each rank's own
            # between broadcast_state() calls (which the loop makes after every wrap(); DDP
            # also copies rank 0's at construction), instead of being overwritten by rank 0's
            # at every forward pass. (The older name of this flag is broadcast_buffers.)
            forward_sync_buffers=False,
        )
        # fp16: gradients are cast to fp16 (and pre-divided by the world size) before allreduce,
        # and back to fp32 after. comm_timeline: DDP's own allreduce, as a hook, to time it.
        hook = default_hooks.fp16_compress_hook if self.fp16 else default_hooks.allreduce_hook
        if self.fp16 or self.timeline:
            self.ddp.register_comm_hook(state=None, hook=self.timed(hook) if self.timeline else hook)
        return self.ddp, optimizer

    def timed(self, hook):
        """``hook`` recording, per bucket, when its gradients were ready (the hook is called) and
        when its allreduce finished (its future completes)."""
        def timed_hook(state, bucket):
            ready = time.perf_counter()

            def done(fut):
                self.comm.append((ready, time.perf_counter()))
                return fut.value()
            return hook(state, bucket).then(done)
        return timed_hook

    @contextlib.contextmanager
    def update_window(self):
        """Around an update's last backward: from its last bucket's readiness (autograd has no
        gradient left to compute) to backward's return, backward only waits for the allreduce."""
        first = len(self.comm)
        yield
        if len(self.comm) > first:
            self.waits.append((max(ready for ready, _ in self.comm[first:]), time.perf_counter()))

    def run_epoch(self, ctx, train):
        """With ``comm_timeline: true``: the epoch's allreduce time, split into what ran while
        backward still computed (hidden) and what backward waited for at its end (exposed)."""
        self.comm, self.waits = [], []
        result = train()
        if self.timeline:
            result.extra.update(overlap.hidden_and_exposed(self.comm, self.waits))
        return result

    def comm_spans(self):
        return [("allreduce", ready, done) for ready, done in self.comm]  # each bucket, from its readiness

    def accumulate(self, model, sync_now):
        # no_sync(): backward only accumulates into .grad; the update's last backward
        # allreduces the accumulated sum, so k micro-batches cost one synchronisation.
        if not sync_now:
            return model.no_sync()
        return self.update_window() if self.timeline else contextlib.nullcontext()

    def synchronize(self, optimizer):
        # Nothing left to do: DDP's allreduce already ran, overlapped, inside the last backward
        # (and waited for its end before backward returned); its cost is in backward time.
        pass

    def broadcast_state(self, model):
        for tensor in model.state_dict().values():  # parameters and buffers, in place
            dist.broadcast(tensor, src=0)

    # --- small collectives ---------------------------------------------------------
    def allreduce_sum(self, tensor):
        out = tensor.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    def allreduce_sum_async(self, tensor, name):
        out = tensor.detach().clone()
        work = dist.all_reduce(out, op=dist.ReduceOp.SUM, async_op=True)
        return lambda: (work.wait(), out)[1]

    def broadcast_object(self, obj: Any) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def allgather_object(self, obj: Any) -> list:
        out = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def close(self):
        # A DistributedDataParallel wrapper sits in a reference cycle: collect it now rather
        # than during interpreter shutdown.
        self.ddp = None
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()


class TorchCollective(compress.Collective):
    """The schemes' collectives on torch.distributed's process group (Gloo on CPU), in place of
    DDP's bucketed allreduce."""

    def _allreduce_mean(self, tensor, name):
        out = tensor.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.div_(self.size)

    def _allgather(self, tensor, name):
        parts = [torch.empty_like(tensor) for _ in range(self.size)]
        dist.all_gather(parts, tensor.detach().contiguous())
        return torch.cat(parts)


def create(name: str, cfg=None) -> SyncMethod:
    return DdpSync()
