"""Communication reduction: one file per scheme, each a state object with its error feedback
beside it, written against the two collectives of ``Collective``.

    compression: fp16       fp16.py: each gradient on the wire as half precision (every sync method's own averaging does it natively)
    compression: powersgd   powersgd.py: low-rank P/Q of each matrix-shaped gradient (Vogels et al. 2019)
    compression: topk       topk.py: the largest fraction of each gradient, values and indices gathered
    local_sgd_steps: H > 1  localsgd.py: after a warm-up of averaged gradients, the models averaged every H updates

A scheme whose ``native`` names what a sync method's own averaging can do (fp16) is handed to
the method, which does it its own way. Any other scheme replaces the method's gradient averaging
(``horovod``, ``ddp``; sync/schemes.py holds the method and the scheme side by side) and gets
each update instead: ``synchronize()`` after the update's last backward,
``after_step()`` after the optimizer step, ``end_epoch()`` after the epoch's last update (through
``epoch_loop``). The training loop does not know which scheme runs.

No torch at import: the byte counts (cost.py) are read by the scaling model. The schemes' names
are ``core.names.COMPRESSIONS``, their default settings ``core.config``'s.

May import: hvd_cifar.core.
"""
from __future__ import annotations

from hvd_cifar.compress.base import Collective, Scheme


def make(cfg, collective: Collective) -> Scheme | None:
    """The scheme ``cfg`` asks for (compression, local_sgd_steps and their keys), or None: the
    sync method's own averaging, uncompressed. Each scheme's module is imported only when asked
    for (it loads torch)."""
    if cfg.local_sgd_steps > 1:
        from hvd_cifar.compress import localsgd as module
    elif cfg.compression == "powersgd":
        from hvd_cifar.compress import powersgd as module
    elif cfg.compression == "topk":
        from hvd_cifar.compress import topk as module
    elif cfg.compression == "fp16":
        from hvd_cifar.compress import fp16 as module
    else:
        return None
    return module.create(cfg, collective)
