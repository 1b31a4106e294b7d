"""checkpoint_last.pt: what a checkpoint holds (the weights, the optimizer, the scaler, the
freezing policy, each rank's own state, and for a preempted run the place in the epoch), written
whole or not at all; read back and checked before any of it is used: every key a resume reads
and its type (``contents_problem``), then against the run it should continue (its identity, the
shapes of its weights, its optimizer state and its BatchNorm statistics). A file that fails is
a RunError naming it and what is wrong. torch is imported only where a checkpoint or a model is
touched."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hvd_cifar.core.files import RunError, atomic_write
from hvd_cifar.runfolder.reader import EVENTS
from hvd_cifar.runfolder.writer import append_metrics

if TYPE_CHECKING:
    import torch

CHECKPOINT = "checkpoint_last.pt"

# What a resume reads of a checkpoint, with the type of each: (type, required). Every checkpoint
# holds the first four; the others only some (a preempted run's place, a scheme's rank states).
INTEGER, NUMBER, LIST = "an integer >= 0", "a number", "a list"
CONTENTS = {"epoch": (INTEGER, True), "identity": (dict, True), "model": (dict, True), "optimizer": (dict, True),
            "frozen_blocks": (INTEGER, False), "freezing": (dict, False), "scaler": (dict, False),
            "record": (dict, False), "rank_states": (LIST, False), "position": (dict, False)}
POSITION = {"step": (INTEGER, True), "position": (INTEGER, True), "totals": (LIST, True),
            "elapsed_s": (NUMBER, True), "world_size": (INTEGER, False), "rank_buffers": (LIST, False)}


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
    that does not fit them (or whose saved BatchNorm statistics, any rank's, do not fit this
    model) is a RunError, the same on every rank, since every rank holds the same checkpoint."""
    mismatch = state_dict_mismatch(model.state_dict(), ckpt["model"])
    buffers = dict(model.named_buffers())
    for rank, saved in enumerate((ckpt.get("position") or {}).get("rank_buffers") or ()):
        mismatch = mismatch or (f"rank {rank}'s BatchNorm statistics: {found}"
                                if (found := state_dict_mismatch(buffers, saved)) else "")
    if mismatch:
        raise RunError(f"resume: the checkpoint's weights do not fit this {model_name} ({mismatch}); "
                       f"was it saved with other model settings (e.g. batchnorm)?")
    if settings := param_groups_mismatch(optimizer.param_groups, ckpt["optimizer"]["param_groups"]):
        raise RunError(f"resume: the checkpoint's optimizer does not fit this run's ({settings})")
    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        if scaler is not None and "scaler" in ckpt:
            scaler.load_state_dict(ckpt["scaler"])
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        raise RunError(f"resume: checkpoint does not fit this model/optimizer "
                       f"({str(exc).splitlines()[0]})") from None
    if reshaped := optimizer_state_mismatch(optimizer):
        raise RunError(f"resume: the checkpoint's optimizer state does not fit this {model_name} ({reshaped})")


def optimizer_state_mismatch(optimizer) -> str:
    """A loaded optimizer state that would fail at the first update, in a few words ('' when it
    fits): load_state_dict takes a parameter's state (SGD's momentum) as it is, so a tensor of
    another shape, or something other than a tensor, is found here."""
    import torch
    for number, param in enumerate(p for group in optimizer.param_groups for p in group["params"]):
        for key, value in optimizer.state.get(param, {}).items():
            if value is not None and not isinstance(value, torch.Tensor):
                return f"{key} of parameter {number} is {type(value).__name__}, not a tensor"
            if value is not None and value.dim() and tuple(value.shape) != tuple(param.shape):
                return f"{key} of parameter {number} is {tuple(value.shape)}, the parameter {tuple(param.shape)}"
    return ""


def param_groups_mismatch(live: list[dict], saved: list[dict]) -> str:
    """The saved optimizer's group settings against this run's ('' when they fit): every setting
    this run's groups hold saved too, and each number (lr, momentum, ...) a number, since
    load_state_dict puts the saved groups in place of this run's as they are."""
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    for index, (mine, theirs) in enumerate(zip(live, saved)):
        for key, value in mine.items():
            if key != "params" and key not in theirs:
                return f"group {index} has no {key!r}"
            if key != "params" and number(value) and not number(theirs[key]):
                return f"group {index}'s {key!r} is {_described(theirs[key])}, not a number"
    return ""


def _is(value, kind) -> bool:
    if kind == INTEGER:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if kind == NUMBER:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == LIST:
        return isinstance(value, (list, tuple))
    return isinstance(value, kind)


def _described(value) -> str:
    """A value's type, and the value itself where it is a short scalar (never a tensor's lines)."""
    shown = f" {value!r:.40}" if isinstance(value, (bool, int, float, str)) else ""
    return type(value).__name__ + shown


def _keys_problem(state: dict, schema: dict, where: str) -> str:
    """What is wrong with ``state``'s keys against ``schema`` ('' when nothing is)."""
    for key, (kind, required) in schema.items():
        if key not in state:
            if required:
                return f"{where}{key!r} is missing"
        elif not _is(state[key], kind):
            return f"{where}{key!r} is {_described(state[key])}, not {'a dict' if kind is dict else kind}"
    return ""


def _tensors_problem(tensors, where: str) -> str:
    import torch
    if not isinstance(tensors, dict):
        return f"{where} is {type(tensors).__name__}, not a dict of tensors"
    bad = next((k for k, v in tensors.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)), None)
    return "" if bad is None else f"{where} holds {type(tensors[bad]).__name__} at {bad!r}, not a tensor"


def contents_problem(state) -> str:
    """What a resume would trip on in a checkpoint's contents, in a few words ('' when nothing):
    a key missing, or of the wrong type, anywhere a resume reads."""
    if not isinstance(state, dict):
        return f"it holds {_described(state)}, not a checkpoint's dict"
    problem = _keys_problem(state, CONTENTS, "")
    optimizer = state.get("optimizer", {})
    if not problem and not (isinstance(optimizer.get("state"), dict) and isinstance(optimizer.get("param_groups"), list)
                            and all(isinstance(g, dict) and isinstance(g.get("params"), list)
                                    for g in optimizer["param_groups"])):
        problem = "'optimizer' is not an optimizer's state (its 'state' dict and 'param_groups' list)"
    problem = problem or _tensors_problem(state["model"], "'model'")
    if not problem and "record" in state:
        problem = _keys_problem(state["record"], {"epoch": (INTEGER, True)}, "'record': ")
    if not problem and "rank_states" in state and not all(isinstance(r, dict) for r in state["rank_states"]):
        problem = "'rank_states' holds something other than dicts"
    position = state.get("position")
    if not problem and position is not None:
        problem = _keys_problem(position, POSITION, "'position': ")
        if not problem and not all(_is(t, NUMBER) for t in position["totals"]):
            problem = "'position': 'totals' holds something other than numbers"
        for rank, buffers in enumerate(position.get("rank_buffers") or ()):
            problem = problem or _tensors_problem(buffers, f"'position': rank {rank}'s buffers")
    return problem


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
    if problem := contents_problem(state):
        raise RunError(f"resume: {path} is not a checkpoint this program wrote ({problem})")
    if state["identity"] != identity:
        raise RunError(f"resume: checkpoint {path} is for {state.get('identity')}, "
                       f"but this run is {identity}")
    return state
