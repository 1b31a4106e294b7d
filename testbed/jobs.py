"""One way for a benchmark to run a job and keep what it said: the command (or a namespace
cluster's run of one) to its end or its timeout, its output in a log, and one error that names
the job when it fails. Every script under benchmarks/ runs its jobs through ``run``.

    done = jobs.run("np2 horovod", [*commands.argv("mpirun", 2), *flags], log="OUT/np2.log", timeout=900)
    done = jobs.run("bytes fp16 np=4", lambda: cluster.run_horovodrun(4, flags, gloo=True, timeout=900),
                    log="OUT/logs/bytes-fp16-np4.log")
    done.stdout, done.stderr, done.seconds        # (a cluster's output is all in stdout)
    jobs.run("case 3", argv, timeout=120, check=False).code   # a failure is a result, not an error
    run_dir = jobs.cluster_training(cluster, 4, flags, "OUT/runs", "fp16", label="bytes fp16 np=4",
                                    log="OUT/logs/bytes-fp16-np4.log", timeout=900)  # a training job, its run folder

Each job is noted for the results file (hvd_cifar.measure.results.note_job), so that it can
record the code its figures ran: a training job by its run folder (``--log-dir`` and
``--run-name``, or ``--resume``, in its command; a callable command names it with ``run_dir=``),
whose RUN/code.json lists the modules its ranks loaded; another program of the checkout (a script,
or ``-m hvd_cifar.X``; a callable command names it with ``program=``) by the modules it may import.
A callable that names neither, or a training job that left no code.json, is a job whose code is
not known: its results file goes stale by the older rule (any change to the package).

Also the parts of a benchmark's output that several scripts share: ``write_results`` (OUT/STEM.json
first, OUT/STEM.md from it, the table printed), ``machine`` (what the numbers were measured on),
the probe job, a training job and the trainer flags of every job on the namespace cluster. No
torch here.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar, Union

import psutil

from hvd_cifar.core.files import write_json, write_text
from hvd_cifar.launch.commands import ROOT, job_env, start, stop, terminate_raises
from hvd_cifar.measure import results as results_file

results_file.track_jobs()  # every benchmark's jobs run through ``run``: each is noted there

TAIL_CHARS = 3000  # of a failed job's output, in its error when it has no log

# Trainer flags of every training job a benchmark runs on the namespace cluster: reproducible,
# no checkpoints or progress bar, one thread per rank (the "hosts" share this machine's cores),
# bytes counted at each host's link to the switch.
CLUSTER_TRAIN_FLAGS = ("--seed", "0", "--checkpoint-every", "0", "--progress", "false",
                       "--threads-per-rank", "1", "--nic", "eth0")
# The probe's message sizes in the validation benchmarks (hvd_cifar.probe's --sizes, --min-bytes).
PROBE_SIZES, PROBE_MIN_BYTES = 6, 4096

# What ``run`` starts: an argument list run here, or a callable that runs the job elsewhere and
# returns what subprocess.run does (returncode, stdout), e.g. NetCluster.run_mpirun.
Command = Union[Sequence[str], Callable[[], Any]]


class JobError(RuntimeError):
    """A job that failed; the first line names it, its exit status and its log."""

    def __init__(self, label: str, code: int | None, log: str | None, output: str):
        self.label, self.code, self.log, self.output = label, code, log, output
        status = "no end within its timeout" if code is None else f"exit status {code}"
        where = f"; see {log}" if log else "\n" + output[-TAIL_CHARS:]
        super().__init__(f"{label}: {status}{where}")


@dataclass
class Finished:
    code: int | None   # exit status; None: stopped at its timeout
    stdout: str
    stderr: str
    seconds: float     # wall clock, start to end


def _run_here(argv: Sequence[str], timeout: float | None, env: dict | None, cwd: str) -> tuple:
    # Its own session: on a timeout (or Ctrl-C, or SIGTERM) the launcher and its ranks go down together.
    proc = start(argv, cwd=cwd, env=env if env is not None else job_env(), text=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        return proc.returncode, stdout, stderr
    except subprocess.TimeoutExpired:
        stop(proc)
        stdout, stderr = proc.communicate()
        return None, stdout, stderr
    except BaseException:
        stop(proc)
        raise


def _run_elsewhere(call: Callable[[], Any]) -> tuple:
    try:
        result = call()
    except subprocess.TimeoutExpired as exc:  # NetCluster.exec has stopped the job everywhere
        return None, exc.output or "", ""
    return result.returncode, result.stdout or "", getattr(result, "stderr", None) or ""


def run(label: str, command: Command, *, log: str | None = None, timeout: float | None = None,
        env: dict | None = None, cwd: str = ROOT, check: bool = True, run_dir: str | None = None,
        program: str | None = None) -> Finished:
    """Run one job (``label`` names it in errors) to its end or ``timeout`` seconds. ``log``:
    a file for its stdout then its stderr. ``env``: default ``job_env()``; a callable command
    sets its own environment and timeout, and may name the run folder (``run_dir``) or the
    program's file (``program``) it runs, for the results file's record of its code. A job that
    exits non-zero or outlives its timeout raises JobError, unless ``check`` is False."""
    began = time.perf_counter()
    with terminate_raises():  # a SIGTERM to the benchmark stops the job first
        if callable(command):
            code, stdout, stderr = _run_elsewhere(command)
        else:
            code, stdout, stderr = _run_here(command, timeout, env, cwd)
    done = Finished(code, stdout, stderr, time.perf_counter() - began)
    note_code(label, command, cwd, run_dir, program)
    if log:
        write_text(log, stdout + stderr)
    if check and code != 0:
        raise JobError(label, code, log, stdout + stderr)
    return done


TRAINER = os.path.join(ROOT, "hvd_cifar", "train.py")


def note_code(label: str, command: Command, cwd: str, run_dir: str | None = None,
              program: str | None = None) -> None:
    """Note for the results file what code a job ran (module docstring); a command that runs
    no program of the checkout (``ip``, ``tc``) ran none of it."""
    if not callable(command):
        run_dir = run_dir or trainer_run_dir(command, cwd)
        program = program or program_file(command, cwd)
    if run_dir:
        results_file.note_job(label, run_dir=run_dir)
    elif program == TRAINER or (callable(command) and not program):  # its run folder not known
        results_file.note_job(label)
    elif program:
        results_file.note_job(label, entry=program)


def trainer_run_dir(argv: Sequence[str], cwd: str = ROOT) -> str | None:
    """The run folder a trainer's command line names (``--resume DIR``, or ``--log-dir`` with
    ``--run-name``), or None."""
    argv, flags = [str(a) for a in argv], {}
    for i, arg in enumerate(argv):
        key, sep, value = arg.partition("=")
        if key in ("--resume", "--log-dir", "--run-name"):
            flags[key] = value if sep else argv[i + 1] if i + 1 < len(argv) else ""
    if flags.get("--resume"):
        return os.path.join(cwd, flags["--resume"])
    if flags.get("--log-dir") and flags.get("--run-name"):
        return os.path.join(cwd, flags["--log-dir"], flags["--run-name"])
    return None


def program_file(argv: Sequence[str], cwd: str = ROOT) -> str | None:
    """The file of the checkout a command runs: ``-m hvd_cifar.X``'s module, a Python script of
    the checkout, or TRAINER for a launch/ script; None for any other program."""
    argv = [str(a) for a in argv]
    for i, arg in enumerate(argv):
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1].split(".")[0] == "hvd_cifar":
            name = os.path.join(ROOT, *argv[i + 1].split("."))
            return name + ".py" if os.path.isfile(name + ".py") else os.path.join(name, "__main__.py")
        path = os.path.realpath(os.path.join(cwd, arg))
        if arg.endswith(".py") and os.path.isfile(path) and path.startswith(os.path.realpath(ROOT) + os.sep):
            return path
        if os.path.dirname(path) == os.path.realpath(os.path.join(ROOT, "launch")) and arg.endswith(".sh"):
            return TRAINER
    return None


def cluster_training(cluster, np: int, flags: Sequence[str], runs: str, name: str, *, label: str, log: str,
                     timeout: float) -> str:
    """A training job of ``np`` ranks on a NetCluster, ``horovodrun --gloo`` (Gloo's allreduce
    is a ring, what the analytic bytes count), with CLUSTER_TRAIN_FLAGS and ``flags``, into the
    run folder RUNS/NAME, which it returns; its seconds said on stderr as it ends (a
    benchmark's progress)."""
    train = [*CLUSTER_TRAIN_FLAGS, *flags, "--log-dir", runs, "--run-name", name]
    done = run(label, lambda: cluster.run_horovodrun(np, train, gloo=True, timeout=timeout), log=log,
               run_dir=os.path.join(runs, name))
    print(f"{label}: {done.seconds:.0f} s", file=sys.stderr, flush=True)
    return os.path.join(runs, name)


def probe(cluster, n: int, out: str, *, iters: int, timeout: float, max_bytes: int = 0,
          sizes: int = PROBE_SIZES, min_bytes: int = PROBE_MIN_BYTES) -> dict:
    """``python -m hvd_cifar.probe`` under mpirun on the first ``n`` hosts of a NetCluster; its
    probe.json (written to ``out``), read back."""
    flags = ["--iters", str(iters), "--sizes", str(sizes), "--min-bytes", str(min_bytes),
             *(["--max-bytes", str(max_bytes)] if max_bytes else []), "--out", out]
    argv = cluster.mpirun_argv(n, [], program=[cluster.python, "-m", "hvd_cifar.probe", *flags])
    run(f"probe at np={n}", lambda: cluster.exec(0, argv, timeout=timeout),
        program=os.path.join(ROOT, "hvd_cifar", "probe.py"))
    if not os.path.exists(out):
        raise JobError(f"probe at np={n}", 0, None, f"no {out} written")
    with open(out) as f:
        return json.load(f)


def rank_pids(job: subprocess.Popen) -> list[int]:
    """The process ids of a launched training job's ranks (``python -m hvd_cifar.train`` under
    the job's launcher); [] once the job is gone."""
    try:
        return [p.pid for p in psutil.Process(job.pid).children(recursive=True)
                if p.cmdline()[1:3] == ["-m", "hvd_cifar.train"]]
    except psutil.Error:
        return []


T = TypeVar("T")


def rotated(items: Sequence[T], k: int) -> list[T]:
    """Round ``k``'s order of a benchmark's variants: ``items`` rotated by ``k``, so that over the
    rounds no variant always runs first (interleaved, side by side)."""
    k %= len(items)
    return [*items[k:], *items[:k]]


def write_results(out: str, stem: str, results: Any, text: str) -> None:
    """OUT/STEM.json (the data, first), OUT/STEM.md (``text``, made from it), then ``text`` printed."""
    text = text.rstrip("\n")
    write_json(os.path.join(out, f"{stem}.json"), results)
    write_text(os.path.join(out, f"{stem}.md"), text + "\n")
    print(text)


def add_options(p: argparse.ArgumentParser, **defaults: Any) -> None:
    """The options several benchmarks share, with one help text each; only those given a default
    here are added (``batch_size=32`` adds --batch-size)."""
    helps = {"model": ("--model", str, "the model (hvd_cifar.workload.models)"),
             "batch_size": ("--batch-size", int, "images per rank per step"),
             "np": ("--np", int, "ranks per job"),
             "steps": ("--steps", int, "training steps per epoch per rank"),
             "epochs": ("--epochs", int, "epochs per job"),
             "repeats": ("--repeats", int, "rounds of every variant, in an order that rotates"),
             "timeout": ("--timeout", int, "seconds per job")}
    for key, default in defaults.items():
        flag, kind, text = helps[key]
        p.add_argument(flag, type=kind, default=default, help=f"{text} (default {default})")


def one_line_errors(prefix: str) -> Callable:
    """Decorate a benchmark's ``main``: a failure it raises (a JobError, the cluster's, the
    scaling model's, a file's: RuntimeErrors all) is one ``PREFIX: error: ...`` line on stderr
    and exit status 1."""
    def decorate(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def guarded(*args, **kwargs) -> int:
            try:
                return main(*args, **kwargs)
            except RuntimeError as exc:
                print(f"{prefix}: error: {exc}", file=sys.stderr)
                return 1
        return guarded
    return decorate


class Span:
    """When a benchmark ran, and the machine's load average at its start and end."""

    def __init__(self):
        self.started, self.load_start = utc_now(), os.getloadavg()[0]
        self.finished, self.load_end = "", float("nan")

    def end(self, **extra: Any) -> dict:
        """Mark the end; the results' ``meta`` (``extra`` appended)."""
        self.finished, self.load_end = utc_now(), os.getloadavg()[0]
        return {"started": self.started, "finished": self.finished, "load_average_start": self.load_start,
                "load_average_end": self.load_end, **extra}

    def line(self) -> str:
        return f"{self.started} to {self.finished}; load average {self.load_start:.2f} -> {self.load_end:.2f}"


def utc_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
