"""checkpoint_last.pt: what a checkpoint holds (the weights, the optimizer, the scaler, the
freezing policy, each rank's own state, and for a preempted run the place in the epoch), written
whole or not at all; read back and checked against the run it should continue (its identity,
its weights' shapes). torch is imported only where a checkpoint or a model is touched."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hvd_cifar.core.files import RunError, atomic_write
from hvd_cifar.runfolder.reader import EVENTS
from hvd_cifar.runfolder.writer import append_metrics

if TYPE_CHECKING:
    import torch

CHECKPOINT = "checkpoint_last.pt"


def checkpoint_identity(cfg, num_classes: int) -> dict:
    """What must match for a checkpoint's tensors to fit this run."""
    return {"model": cfg.model, "dataset": cfg.dataset, "num_classes": num_classes}


def state_dict_mismatch(expected: dict, got: dict) -> str:
    """How a checkpoint's tensors differ from a model's, in a few words ('' when they fit)."""
    missing = [k for k in expected if k not in got]
    unexpected = [k for k in got if k not in expected]
    reshaped = [k for k in expected if k in got and hasattr(got[k], "shape")
                and tuple(got[k].shape) != tuple(expected[k].shape)]
    parts = [f"{len(keys)} {what}, e.g. {keys[0]}" for keys, what in
             ((missing, "tensors missing"), (unexpected, "tensors this model lacks"),
              (reshaped, "tensors of another shape")) if keys]
    return "; ".join(parts)


def save_checkpoint(run_dir: str, state: dict) -> None:
    import torch
    atomic_write(os.path.join(run_dir, CHECKPOINT), lambda f: torch.save(state, f))


def save_training(run_dir: str, epoch: int, *, identity: dict, cfg, model, optimizer, frozen_blocks: int,
                  freezing, scaler, rank_states: list[dict] | None = None, position: dict | None = None,
                  record: dict | None = None) -> None:
    """The checkpoint: ``epoch`` is done, and ``record`` its metrics line; or, with ``position``
    (a preempted run), is under way from there. ``rank_states``: each rank's own state of the
    sync method, in rank order (SyncMethod.rank_state: a scheme's error feedback), if it has one."""
    ckpt = {"epoch": epoch if position else epoch + 1, "identity": identity, "config": cfg.to_dict(),
            "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "frozen_blocks": frozen_blocks, "freezing": freezing.state_dict()}
    if rank_states:
        ckpt["rank_states"] = rank_states
    if position:
        ckpt["position"] = position
    if record:
        ckpt["record"] = record
    if scaler is not None:
        ckpt["scaler"] = scaler.state_dict()
    save_checkpoint(run_dir, ckpt)


def save_preempted(run_dir: str, state, world_size: int, buffers: list[dict], elapsed_s: float, stop,
                   **training) -> None:
    """A preempted run: the checkpoint of where the epoch stands (the training ``state``'s step,
    position and the epoch's sums over all ranks so far, every rank's ``buffers``), then the
    events.jsonl line of the ``stop`` (a preemption.Preempted). ``training``: as save_training's."""
    save_training(run_dir, state.epoch, position={
        "step": state.step, "position": state.position, "totals": state.totals, "world_size": world_size,
        "rank_buffers": buffers, "elapsed_s": elapsed_s}, **training)
    append_metrics(run_dir, stop.event(elapsed_s), EVENTS)


def rank_buffers(model: torch.nn.Module) -> dict:
    """This rank's buffers (BatchNorm's running statistics, its own until the next evaluation)."""
    return {name: b.detach().cpu().clone() for name, b in model.named_buffers()}


def restore_rank_buffers(model: torch.nn.Module, resume_at: dict | None, rank: int, world_size: int) -> None:
    """A run preempted mid-epoch (``resume_at``: the checkpoint's position): each rank takes back
    its own BatchNorm statistics, when the world is the same size as when it stopped."""
    saved = (resume_at or {}).get("rank_buffers")
    if not saved or len(saved) != world_size:
        return
    own = saved[rank]
    import torch
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(own[name])


def rank_state(ckpt: dict | None, rank: int, world_size: int) -> dict | None:
    """This rank's own state of the sync method as the checkpoint holds it (save_training's
    ``rank_states``), or None: none saved, or saved by another number of ranks (whose residuals
    belong to other shards of the data; the method then starts its state afresh)."""
    saved = (ckpt or {}).get("rank_states")
    return saved[rank] if saved and len(saved) == world_size else None


def restore_training(ckpt: dict, model, optimizer, scaler, model_name: str) -> None:
    """The checkpoint's weights, optimizer state and grad scaler into this run's; a checkpoint
    that does not fit them is a RunError."""
    mismatch = state_dict_mismatch(model.state_dict(), ckpt["model"])
    if mismatch:
        raise RunError(f"resume: the checkpoint's weights do not fit this {model_name} ({mismatch}); "
                       f"was it saved with other model settings (e.g. batchnorm)?")
    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:
        raise RunError(f"resume: checkpoint does not fit this model/optimizer "
                       f"({str(exc).splitlines()[0]})") from None
    if scaler is not None and "scaler" in ckpt:
        scaler.load_state_dict(ckpt["scaler"])


def load_checkpoint(run_dir: str, identity: dict) -> dict:
    path = os.path.join(run_dir, CHECKPOINT)
    if not os.path.exists(path):
        raise RunError(f"resume: {run_dir} has no {CHECKPOINT} (no epoch finished yet?)")
    import torch
    try:
        # weights_only: a checkpoint is data; never run pickled code from a file.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user-facing fault
        raise RunError(f"resume: {path} is not a readable checkpoint ({type(exc).__name__})") from None
    if state.get("identity") != identity:
        raise RunError(f"resume: checkpoint {path} is for {state.get('identity')}, "
                       f"but this run is {identity}")
    return state
