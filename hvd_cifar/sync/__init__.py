"""Gradient synchronisation methods, interchangeable behind one small interface
(``SyncMethod``, hvd_cifar/sync/base.py): Horovod, mpi4py allreduce and gather/scatter, torch DDP,
and an asynchronous parameter server, one module each. The training loop talks only to the
interface; adding a method means adding one module and one line to ``make``.

May import: hvd_cifar.core, hvd_cifar.compress, hvd_cifar.workload.
"""
from __future__ import annotations

from hvd_cifar.core.names import SYNC_METHODS
from hvd_cifar.sync.base import SyncMethod


def make(name: str, cfg=None) -> SyncMethod:
    """Start method ``name``'s communication backend. ``cfg``, the run's config, gives the
    settings a method needs before its backend starts (Horovod's tuning, elastic); without it
    (the probes, the benchmarks) each method starts with the launcher's and its defaults.

    Each module is imported only when its method is asked for: importing one starts its
    library (mpi4py initialises MPI; Horovod loads its native library)."""
    if name not in SYNC_METHODS:
        raise ValueError(f"unknown sync method {name!r}")
    if name == "horovod":
        from hvd_cifar.sync import horovod as module
    elif name == "ddp":
        from hvd_cifar.sync import ddp as module
    elif name == "mpi-async-ps":
        from hvd_cifar.sync import async_ps as module
    else:  # mpi-allreduce, mpi-gather-scatter
        from hvd_cifar.sync import mpi as module
    return module.create(name, cfg)
