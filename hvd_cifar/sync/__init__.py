"""Gradient synchronisation methods, interchangeable behind one small interface
(``SyncMethod``, hvd_cifar/sync/base.py): Horovod, mpi4py allreduce and gather/scatter, torch DDP,
and an asynchronous parameter server, one module each. The training loop talks only to the
interface; adding a method means adding one module and one line to ``make``. A compression
scheme (hvd_cifar/compress/) is given to the method it runs under, or held beside it
(schemes.SchemeSync) when it replaces the method's averaging.

May import: hvd_cifar.core, hvd_cifar.compress, hvd_cifar.workload.
"""
from __future__ import annotations

from hvd_cifar import compress
from hvd_cifar.core.names import SYNC_METHODS
from hvd_cifar.sync.base import SyncMethod, SyncSettings
from hvd_cifar.sync.schemes import SchemeSync


def make(name: str, cfg=None) -> SyncMethod:
    """Start method ``name``'s communication backend, configured for ``cfg``, the run's config:
    the settings a method needs before its backend starts (Horovod's tuning, elastic), those it
    reads after (``configure``), and the compression scheme the config asks for. Without ``cfg``
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
    settings = None if cfg is None else SyncSettings.of(cfg)  # all a method is given of the config
    method = module.create(name, settings)
    if cfg is None:
        return method
    method.configure(settings)
    chosen = compress.settings(cfg)  # which scheme, and its own keys alone
    scheme = compress.make(chosen, method.collective())
    if scheme is None:
        return method
    native = compress.native(chosen)
    if native is None:  # powersgd, topk, local SGD: the scheme averages, the method carries
        return SchemeSync(method, scheme)
    method.fp16 = native == "fp16"
    return method
