"""The run folder: logs/RUN_NAME/ with config.yaml and resolved.yaml, metrics.jsonl, meta.json,
events.jsonl and rank logs (checkpoint_last.pt: hvd_cifar.runfolder.checkpoint; eval.json:
hvd_cifar.runfolder.evaluation). Files are written whole or not at all (temp + rename). The
trainer hands this module its objects; what goes into each file is composed here. No torch: the
writers of the text files (hvd_cifar.launch.slurm_resume, at every start of a Slurm job) start
without it."""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time

from hvd_cifar.core import launcher
from hvd_cifar.runfolder import reader
from hvd_cifar.core.errors import ReportError
from hvd_cifar.core.files import RunError, append_whole, atomic_write, write_error, write_json, write_text  # noqa: F401 (re-exported)

METRICS = reader.METRICS
EVENTS = reader.EVENTS


def default_run_name(cfg, world_size: int) -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{cfg.model}-{cfg.dataset}-{cfg.sync}-np{world_size}"


def resolve_resume(resume: str, log_dir: str) -> str:
    """A run folder path, or a run name under ``log_dir``."""
    for candidate in (resume, os.path.join(log_dir, resume)):
        if os.path.isfile(os.path.join(candidate, reader.CONFIG)):
            return os.path.abspath(candidate)
    raise RunError(f"resume: no run folder at {resume!r} (nor under {log_dir}/) with a config.yaml")


def saved_config(run_dir: str) -> dict:
    """The config a resumed run starts from: the one the run used (reader.read_config); a file
    there that cannot be read is bad input, one line naming it."""
    try:
        return reader.read_config(run_dir)
    except ReportError as exc:
        raise RunError(f"resume: {exc}") from None


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
        "launcher": launcher.launcher_name(),
        "comm_settings": comm_settings(),
        "unix_time": time.time(),
        **launcher.slurm_facts(),  # under Slurm: slurm_job_id, slurm_nodes, slurm_restart_count
    }


# Environment variables that change how ranks communicate: recorded with every run, since
# hvd_cifar.sync sets some of them itself when the launcher has not.
COMM_SETTINGS = ("HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CPU_OPERATIONS", "HOROVOD_CONTROLLER",
                 "HOROVOD_HIERARCHICAL_ALLREDUCE", "HOROVOD_AUTOTUNE", "HOROVOD_STALL_", "HOROVOD_GLOO_",
                 "HOROVOD_TIMELINE", "OMPI_MCA_", "NCCL_", "GLOO_SOCKET_IFNAME")


def comm_settings() -> dict:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(COMM_SETTINGS)}


# ----------------------------------------------------------------------------- checkpoints
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
    """At a run's first start: config.yaml, the config as given, and resolved.yaml, what the run
    settled (the run folder's name and place among them; a resumed run may have changed e.g.
    epochs: the folder's config says what ran), and meta.json (``metadata()``) or, on resume,
    the metrics cut back to the checkpoint (``start_epoch``; a preempted run's place in it
    ``resume_at``, the checkpoint's metrics line ``resume_record``). Returns the run's wall time
    before this start."""
    cfg = cfg.settle("the run folder's name", run_name=os.path.basename(run_dir)).settle(
        "the folder the run folder is in", log_dir=os.path.dirname(run_dir))
    cfg.save(os.path.join(run_dir, reader.CONFIG), os.path.join(run_dir, reader.RESOLVED))
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
