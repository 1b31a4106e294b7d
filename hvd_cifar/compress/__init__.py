"""Communication reduction: one file per scheme, each a state object with its error feedback
beside it, written against the two collectives of ``Collective``.

    compression: fp16       fp16.py: each gradient on the wire as half precision (every sync method's own averaging does it natively)
    compression: powersgd   powersgd.py: low-rank P/Q of each matrix-shaped gradient (Vogels et al. 2019)
    compression: topk       topk.py: the largest fraction of each gradient, values and indices gathered
    compression: local-sgd  localsgd.py: after a warm-up of averaged gradients, the models averaged every local_sgd_steps updates

A scheme whose registry entry's ``native`` names what a sync method's own averaging can do (fp16)
is done by the method its own way, and no scheme object is built for a run (hvd_cifar.sync.make).
Any other scheme replaces the method's gradient averaging (``horovod``, ``ddp``; sync/schemes.py
holds the method and the scheme side by side) and gets each update instead: ``synchronize()``
after the update's last backward, ``after_step()`` after the optimizer step, ``end_epoch()`` after
the epoch's last update (through ``run_epoch``). The training loop does not know which scheme runs.

No torch at import. The schemes' names, modules, settings, byte plans and labels are in one
registry (hvd_cifar/core/schemes.py), which the config, the scaling model, predict, explain and
the reports loop over.

May import: hvd_cifar.core.
"""
from __future__ import annotations

import importlib
from types import SimpleNamespace

from hvd_cifar.core import schemes
from hvd_cifar.compress.base import Collective, Scheme


def settings(cfg) -> SimpleNamespace:
    """All of the config that compress reads: which scheme runs, that scheme's own keys and those
    its registry entry names in ``reads`` (the warm-up, the clipping threshold)."""
    spec = schemes.SCHEMES[cfg.compression]
    return SimpleNamespace(**{key: getattr(cfg, key) for key in ("compression", *spec.settings, *spec.reads)})


def make(settings: SimpleNamespace, collective: Collective) -> Scheme | None:
    """The scheme ``settings`` (compress.settings) asks for, or None (compression: none, the sync
    method's own averaging). Each scheme's module, named by its registry entry, is imported only
    when asked for (it loads torch)."""
    module = schemes.SCHEMES[settings.compression].module
    return None if module is None else importlib.import_module(module).create(settings, collective)
