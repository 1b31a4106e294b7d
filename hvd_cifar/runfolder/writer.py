"""The run folder: logs/RUN_NAME/ with config.yaml, metrics.jsonl, meta.json, events.jsonl, rank
logs and checkpoint_last.pt (eval.json: hvd_cifar.runfolder.evaluation). Files are written whole or not at
all (temp + rename). The trainer hands this module its objects; what goes into each file, the
checkpoint's contents included, is composed here. torch is imported only where a checkpoint or
a model is touched: the writers of the text files (hvd_cifar.launch.slurm_resume, at every start
of a Slurm job) start without it."""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from hvd_cifar.core import slurm_job
from hvd_cifar.runfolder import reader
from hvd_cifar.core.files import RunError, append_whole, atomic_write, write_error, write_json, write_text  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    import torch

CHECKPOINT = "checkpoint_last.pt"
METRICS = reader.METRICS
EVENTS = reader.EVENTS


def default_run_name(cfg, world_size: int) -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{cfg.model}-{cfg.dataset}-{cfg.sync}-np{world_size}"


def resolve_resume(resume: str, log_dir: str) -> str:
    """A run folder path, or a run name under ``log_dir``."""
    for candidate in (resume, os.path.join(log_dir, resume)):
        if os.path.isfile(os.path.join(candidate, "config.yaml")):
            return os.path.abspath(candidate)
    raise RunError(f"resume: no run folder at {resume!r} (nor under {log_dir}/) with a config.yaml")


def create_run_dir(cfg, world_size: int) -> str:
    """Make a new, empty run folder; never reuse an existing one (resuming goes elsewhere)."""
    try:
        os.makedirs(cfg.log_dir, exist_ok=True)
    except OSError as exc:
        raise RunError(f"log_dir: cannot create {cfg.log_dir!r} ({exc.strerror})") from None
    if not os.access(cfg.log_dir, os.W_OK | os.X_OK):
        raise RunError(f"log_dir: {cfg.log_dir!r} is not writable")
    base = cfg.run_name or default_run_name(cfg, world_size)
    name, n = base, 1
    while True:
        path = os.path.join(cfg.log_dir, name)
        try:
            os.mkdir(path)
            return os.path.abspath(path)
        except FileExistsError:
            if cfg.run_name:
                raise RunError(f"run_name: {path} already exists; pick another name or resume it "
                               f"with --resume {path}") from None
            n += 1
            name = f"{base}-{n}"
        except OSError as exc:
            raise RunError(f"log_dir: cannot create {path!r} ({exc.strerror})") from None


class RankLog:
    """A per-rank text log in the run folder; rank 0 also prints its lines. The log is a record
    for people, not the run's data: when the file cannot be written (disk full, read-only), the
    rank says so once on stderr and goes on without it; rank 0 still prints every line."""

    def __init__(self, run_dir: str, rank: int, echo: bool):
        self.path = os.path.join(run_dir, f"rank{rank}.log")
        self.rank, self.echo = rank, echo
        try:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as exc:
            raise write_error(self.path, exc) from None

    def __call__(self, message: str) -> None:
        stamp = dt.datetime.now().strftime("%H:%M:%S")
        if self.fd is not None:
            try:
                append_whole(self.path, f"{stamp} [rank {self.rank}] {message}\n".encode(), self.fd, durable=False)
            except OSError as exc:
                self.close()
                sys.stderr.write(f"hvd_cifar: warning: rank {self.rank}: {write_error(self.path, exc)}; "
                                 f"its log stops here\n")
        if self.echo:
            # One write per message, newline included: print() writes the newline separately, and
            # under horovodrun/mpirun, which tag each piece of a rank's output they read, a lone
            # newline arrives as a line of its own ("...threads/rank=1[1,0]<stdout>:").
            sys.stdout.write(message + "\n")
            sys.stdout.flush()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def append_metrics(run_dir: str, record: dict, name: str = METRICS) -> None:
    """One JSON object per line; each line is written with one write() and fsynced."""
    path = os.path.join(run_dir, name)
    try:
        append_whole(path, (json.dumps(record) + "\n").encode())
    except OSError as exc:
        raise write_error(path, exc) from None


def epoch_records(run_dir: str) -> list[dict]:
    """The run's whole epoch records so far (none before the first); the one reader's rule for a
    torn last line applies (hvd_cifar.runfolder.reader)."""
    return reader.read_metrics(run_dir, missing_ok=True).records


def remove_stale_temp_files(run_dir: str) -> None:
    """On resume: temp files that a killed job's atomic_write left behind (never read)."""
    for name in os.listdir(run_dir):
        if name.startswith(".") and name.endswith(".tmp"):
            os.unlink(os.path.join(run_dir, name))


def truncate_metrics(run_dir: str, epochs_done: int) -> None:
    """On resume, drop lines for epochs the checkpoint does not cover (they will be rerun),
    and any torn last line."""
    kept = [r for r in epoch_records(run_dir) if r["epoch"] < epochs_done]
    atomic_write(os.path.join(run_dir, METRICS),
                 lambda f: f.write("".join(json.dumps(r) + "\n" for r in kept).encode()))


def git_commit() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def launcher_name() -> str:
    """What started the ranks, as far as the environment tells: horovodrun's MPI mode runs
    mpirun, and its ranks see the same variables as plain mpirun's."""
    if os.environ.get("HOROVOD_ELASTIC") == "1":
        return "horovodrun-elastic"
    from hvd_cifar.core.lifecycle import launched_by_mpi
    # Open MPI's mpirun gives each process it starts its OMPI_COMM_WORLD_* variables; a task that
    # srun started through PMIx has a Slurm step and PMIx's rank, but none of those.
    if "SLURM_STEP_ID" in os.environ and "PMIX_RANK" in os.environ and "OMPI_COMM_WORLD_SIZE" not in os.environ:
        return "srun (PMIx)"
    if launched_by_mpi():
        return "mpi (mpirun, or horovodrun over MPI)"
    if "HOROVOD_RANK" in os.environ:
        return "horovodrun-gloo"
    return "single-process"


def run_metadata(world_size: int, hostnames: list[str], sync_name: str, device: str) -> dict:
    from importlib import metadata

    versions = {}
    for pkg in ("torch", "torchvision", "horovod", "mpi4py", "numpy", "scikit-learn"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "command": [sys.executable, "-m", "hvd_cifar.train", *sys.argv[1:]],
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "versions": versions,
        "world_size": world_size,
        "hostnames": hostnames,
        "sync": sync_name,
        "device": device,
        "launcher": launcher_name(),
        "comm_settings": comm_settings(),
        "unix_time": time.time(),
        **slurm_job.facts(),  # under Slurm: slurm_job_id, slurm_nodes, slurm_restart_count
    }


# Environment variables that change how ranks communicate: recorded with every run, since
# hvd_cifar.sync sets some of them itself when the launcher has not.
COMM_SETTINGS = ("HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CPU_OPERATIONS", "HOROVOD_CONTROLLER",
                 "HOROVOD_HIERARCHICAL_ALLREDUCE", "HOROVOD_AUTOTUNE", "HOROVOD_STALL_", "HOROVOD_GLOO_TIMEOUT_SECONDS",
                 "HOROVOD_TIMELINE", "OMPI_MCA_", "NCCL_", "GLOO_SOCKET_IFNAME")


def comm_settings() -> dict:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(COMM_SETTINGS)}


# ----------------------------------------------------------------------------- checkpoints
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


def record_epoch(run_dir: str, record: dict) -> list[dict]:
    """Append an epoch's metrics line; returns the run's epoch records with it, as the file now
    holds them. A line for this epoch or a later one can only be there when an elastic reset
    reran the epoch's end after recording it: it is dropped first."""
    records = epoch_records(run_dir)
    if records and records[-1]["epoch"] >= record["epoch"]:
        truncate_metrics(run_dir, record["epoch"])
        records = [r for r in records if r["epoch"] < record["epoch"]]
    append_metrics(run_dir, record)
    return [*records, record]


def write_start_files(run_dir: str, cfg, start_epoch: int, resume_at: dict | None, resume_record: dict | None,
                      metadata) -> float:
    """At a run's first start: config.yaml (a resumed run may have changed e.g. epochs: the
    folder's config says what ran), and meta.json (``metadata()``) or, on resume, the metrics
    cut back to the checkpoint (``start_epoch``; a preempted run's place in it ``resume_at``, the
    checkpoint's metrics line ``resume_record``). Returns the run's wall time before this start."""
    cfg.save(os.path.join(run_dir, "config.yaml"))
    if not cfg.resume:
        write_json(os.path.join(run_dir, "meta.json"), metadata())
        return 0.0
    truncate_metrics(run_dir, start_epoch)
    remove_stale_temp_files(run_dir)
    if resume_at:  # preempted mid-epoch: the time until then
        return resume_at["elapsed_s"]
    kept = epoch_records(run_dir)
    if resume_record and (not kept or kept[-1]["epoch"] < resume_record["epoch"]):
        # Killed after the checkpoint was written and before its metrics line was (record_epoch).
        append_metrics(run_dir, resume_record)
        kept.append(resume_record)
    return kept[-1].get("elapsed_s", 0.0) if kept else 0.0
