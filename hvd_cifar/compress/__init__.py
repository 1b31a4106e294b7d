"""Communication reduction: one file per scheme, each a state object with its error feedback
beside it, written against the two collectives of ``Collective``.

    compression: fp16       fp16.py: each gradient on the wire as half precision (every sync method's own averaging does it natively)
    compression: powersgd   powersgd.py: low-rank P/Q of each matrix-shaped gradient (Vogels et al. 2019)
    compression: topk       topk.py: the largest fraction of each gradient, values and indices gathered
    local_sgd_steps: H > 1  localsgd.py: after a warm-up of averaged gradients, the models averaged every H updates

A scheme whose registry entry's ``native`` names what a sync method's own averaging can do (fp16)
is handed to the method, which does it its own way (``native``). Any other scheme replaces the method's gradient averaging
(``horovod``, ``ddp``; sync/schemes.py holds the method and the scheme side by side) and gets
each update instead: ``synchronize()`` after the update's last backward,
``after_step()`` after the optimizer step, ``end_epoch()`` after the epoch's last update (through
``run_epoch``). The training loop does not know which scheme runs.

No torch at import: the byte counts (cost.py) are read by the scaling model. The schemes' names,
settings, byte plans and labels are in one registry (registry.py), which the config, the scaling
model, predict, explain and the reports loop over.

May import: hvd_cifar.core.
"""
from __future__ import annotations

import importlib
from types import SimpleNamespace

from hvd_cifar.compress import registry
from hvd_cifar.compress.base import Collective, Scheme

CHOICE = ("compression", "local_sgd_steps")  # which scheme runs
LOCAL_SGD = ("compression_warmup_steps",)     # what local SGD reads besides its period


def settings(cfg) -> SimpleNamespace:
    """All of the config that compress reads: which scheme runs and that scheme's own keys
    (registry.py) with those it names in ``reads`` (local SGD: LOCAL_SGD)."""
    spec = registry.SCHEMES[cfg.compression]
    keys = (*CHOICE, *(LOCAL_SGD if cfg.local_sgd_steps > 1 else (*spec.settings, *spec.reads)))
    return SimpleNamespace(**{key: getattr(cfg, key) for key in keys})


def native(settings: SimpleNamespace) -> str | None:
    """What of the chosen scheme a sync method's own averaging does natively ("fp16"), or None:
    the scheme, if any, replaces that averaging."""
    return None if settings.local_sgd_steps > 1 else registry.SCHEMES[settings.compression].native


def make(settings: SimpleNamespace, collective: Collective) -> Scheme | None:
    """The scheme ``settings`` (compress.settings) asks for (compression, or local SGD with
    local_sgd_steps > 1), or None: the sync method's own averaging, uncompressed. Each scheme's
    module is imported only when asked for (it loads torch)."""
    name = "hvd_cifar.compress.localsgd" if settings.local_sgd_steps > 1 else registry.SCHEMES[settings.compression].module
    return None if name is None else importlib.import_module(name).create(settings, collective)
