"""Gradient synchronisation methods, interchangeable behind one small interface
(``SyncMethod``, hvd_cifar/sync/base.py): Horovod, mpi4py allreduce and gather/scatter, torch DDP,
and an asynchronous parameter server, one module each. The training loop talks only to the
interface; adding a method means adding its module here and its entry in
hvd_cifar/core/methods.py, which names the module. A compression scheme (hvd_cifar/compress/)
is done natively by the method (fp16) or held beside it (schemes.SchemeSync) when it replaces
the method's averaging.

May import: hvd_cifar.core, hvd_cifar.compress, hvd_cifar.workload.
"""
from __future__ import annotations

import importlib

from hvd_cifar import compress
from hvd_cifar.core import methods
# By name: this package's own ``schemes`` is SchemeSync's module (sync/schemes.py).
from hvd_cifar.core.schemes import replaces_averaging
from hvd_cifar.sync.base import SyncMethod, SyncSettings
from hvd_cifar.sync.schemes import SchemeSync


def make(name: str, cfg=None) -> SyncMethod:
    """Start method ``name``'s communication backend, configured for ``cfg``, the run's config:
    the settings a method needs before its backend starts (Horovod's tuning, elastic), those it
    reads after (``configure``), and the compression the config asks for. Without ``cfg`` (the
    probes, the benchmarks) each method starts with the launcher's and its defaults.

    The method's module, named by its registry entry, is imported only when the method is asked
    for: importing one starts its library (mpi4py initialises MPI; Horovod loads its native
    library)."""
    spec = methods.METHODS.get(name)
    if spec is None:
        raise ValueError(f"unknown sync method {name!r}")
    settings = None if cfg is None else SyncSettings.of(cfg, name)  # all a method is given of the config
    method = importlib.import_module(spec.module).create(name, settings)
    if cfg is None:
        return method
    method.configure(settings)
    if replaces_averaging(cfg.compression):  # powersgd, topk, local SGD: the scheme averages, the method carries
        return SchemeSync(method, compress.make(compress.settings(cfg), method.collective()))
    # What is left is the method's own averaging, as it is (none) or done its own way (fp16, the
    # one compression in a method's ``native``; the config refuses it where the method has none).
    method.fp16 = cfg.compression in spec.native
    return method
