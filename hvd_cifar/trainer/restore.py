"""Where a run starts (``start_training``): at epoch 0, or resumed from its checkpoint. Rank 0
reads the checkpoint and hands it to every rank, then the freezing policy, the trainable set,
the model, the optimizer, the grad scaler and each rank's own communication state take it back,
so that the resumed run goes on as the unbroken one would (docs/RUN_FOLDER.md, "Resuming").
Rank 0 checks the checkpoint's contents before it hands them on (``checkpoint.load_checkpoint``);
what does not fit this run then is one RunError, the same on every rank, and rank 0 says it."""
from __future__ import annotations

import os

from hvd_cifar.core.errors import ConfigError
from hvd_cifar.core.files import RunError
from hvd_cifar.runfolder import checkpoint
from hvd_cifar.trainer.context import Setup, Start, Training
from hvd_cifar.trainer.ranks import before_loop, on_every_rank

# What a state's load_state_dict raises when a checkpoint's part of it has other contents.
LOAD_ERRORS = (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError)


def start_training(setup: Setup, run_dir: str) -> Training:
    """The Training this process starts with: where the checkpoint left off (``--resume``; rank 0
    reads it and hands it to every rank, elastic: every rank reads it and the state's first
    broadcast makes sure they agree), or epoch 0 with the policy's first trainable set."""
    cfg, sync = setup.cfg, setup.sync
    ckpt = None
    if cfg.resume:
        ckpt = before_loop(sync, lambda: checkpoint.load_checkpoint(run_dir, setup.identity))
    start = Start(ckpt["epoch"], ckpt.get("position"), ckpt.get("record")) if ckpt else Start()
    loading(run_dir, "the freezing policy's",
            lambda: setup.freezing.load_state_dict(ckpt.get("freezing", {}) if ckpt else {}))
    # The trainable set the checkpoint's optimizer was saved with; the epoch loop's
    # freezing.follow_schedule then moves on to the set of start.epoch, as an unbroken run would.
    saved_frozen = ckpt.get("frozen_blocks") if ckpt else None
    run = Training(setup, start, setup.trainable_set(
        setup.freezing.frozen_blocks(start.epoch, 0) if saved_frozen is None else saved_frozen))
    if ckpt:
        checkpoint.restore_training(ckpt, setup.model, run.trainable.optimizer, setup.scaler, cfg.model)
    if (own := checkpoint.rank_state(ckpt, sync.rank, sync.size)) is not None:
        # After the trainable set: the scheme knows its parameters. Each rank loads its own, so
        # one that fails stops them all (on_every_rank), with rank 0's line.
        before_loop(sync, lambda: loading(run_dir, f"rank {sync.rank}'s communication",
                                          lambda: sync.load_rank_state(own)), on_every_rank)
    if ckpt and cfg.stop_after and cfg.stop_after <= start.epoch < cfg.epochs:
        raise ConfigError(f"stop_after: the run already stopped after epoch {start.epoch} of {cfg.epochs}, as "
                          f"its stop_after: {cfg.stop_after} asks; to go on: --resume {run_dir} --stop-after 0 "
                          f"(to the end) or --stop-after N (N > {start.epoch})")
    return run


def loading(run_dir: str, part: str, load) -> None:
    """``load()``, a part of the run taking back its state; a checkpoint whose part does not fit
    is a RunError naming the file and the part."""
    try:
        load()
    except LOAD_ERRORS as exc:
        path = os.path.join(run_dir, checkpoint.CHECKPOINT)
        raise RunError(f"resume: {path}: {part} state does not fit this run "
                       f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
