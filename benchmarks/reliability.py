"""Fault drill: every bad input and every rank kill that the reliability guarantees cover, run
for real with the shipped launchers and timed.

    .venv/bin/python benchmarks/reliability.py [--only bad-inputs|kills|preemptions] [--match TEXT ...] [--out DIR]

--match runs only the bad inputs whose name holds TEXT (rows keep their numbers in the table).

Bad inputs: each case is one real command (``mpirun -np 2`` of the trainer unless the case is
about another launcher) given one mistake. A case passes when the command exits non-zero
within BAD_INPUT_BOUND_S, stderr holds no Python traceback, and exactly one line comes from
hvd_cifar (``hvd_cifar: error: ...``): one line from one rank. mpirun's own note that a process
exited non-zero is counted apart (``launcher lines``); it is not ours to silence.

Kills: for each launcher and sync method, a 2-rank job on the tiny config is started, and once
its first epoch is written one rank (rank 0, then rank 1 in a second job) gets SIGKILL. A kill
passes when the launcher exits non-zero within KILL_BOUND_S of the signal and, a second later,
no rank of the job is left running.

Preemptions: a 2-rank job on the tiny config gets a stop signal once its first epoch is written,
through the launcher (SIGUSR1, which mpirun passes on) or straight to one or both ranks
(SIGTERM, as a scheduler's preemption). It passes when the job exits 4 within PREEMPT_BOUND_S
with one line from hvd_cifar, one ``preempted`` event and no rank left, and ``--resume`` under
the same launcher finishes the run.

Output: three Markdown tables (printed, and OUT/reliability.md) and OUT/reliability.json with
every case's exit code, seconds, and stderr. Each case works in its own folder under OUT.
The tests import this module: tests/test_bad_inputs.py runs every bad-input case and
tests/test_reliability.py the kills, tests/test_preemption.py the preemptions under horovodrun,
with the same pass criteria.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hvd_cifar import launchers

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.yaml")
BAD_INPUT_BOUND_S = 30.0   # "within seconds": the slowest case pays for mpirun, torch and MPI start-up
KILL_BOUND_S = 60.0


# ----------------------------------------------------------------------------- launchers
def launcher_argv(launcher: str, np: int) -> list[str]:
    """The command prefix that starts ``np`` ranks of ``python -m hvd_cifar.train`` here."""
    return launchers.argv(launcher, np)


def job_env() -> dict:
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")


# ----------------------------------------------------------------------------- bad inputs
def tiny(work: Path, *flags: str) -> list[str]:
    """Trainer flags for a tiny run whose folder is work/logs/run."""
    return ["--config", TINY, "--log-dir", str(work / "logs"), "--run-name", "run", *flags]


def finished_run(work: Path) -> None:
    """A run folder with a checkpoint: one epoch of one step, one process."""
    subprocess.run([*launcher_argv("single", 1), *tiny(work, "--epochs", "1", "--max-steps-per-epoch", "1")],
                   cwd=ROOT, env=job_env(), check=True, capture_output=True, timeout=300)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def corrupt_cifar10(work: Path) -> None:
    """CIFAR-10's on-disk layout (cifar-10-batches-py/ of pickled batches) whose first batch is
    cut short: torchvision's checksum test must catch it."""
    folder = work / "data" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(folder / name, "wb") as f:
            pickle.dump({"data": bytes(3072 * 4), "labels": [0] * 4}, f)
    (folder / "data_batch_1").write_bytes((folder / "data_batch_1").read_bytes()[:100])
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)


def unwritable(work: Path) -> None:
    write(work / "file", "a file where the log folder's parent should be")


@dataclass
class BadInput:
    name: str                                  # the mistake, as a user would describe it
    argv: Callable[[Path], list[str]]          # the whole command, given the case's folder
    expect: str                                # how our one line must start
    prepare: Callable[[Path], None] = field(default=lambda work: None)


def mpirun2(*flags: str) -> Callable[[Path], list[str]]:
    """The trainer under mpirun -np 2 with these flags (``{w}`` becomes the case's folder)."""
    return lambda w: [*launcher_argv("mpirun", 2), *(f.format(w=w) for f in flags)]


def mpirun2_tiny(*flags: str) -> Callable[[Path], list[str]]:
    return lambda w: [*launcher_argv("mpirun", 2), *tiny(w, *(f.format(w=w) for f in flags))]


BAD_INPUTS: list[BadInput] = [
    BadInput("unknown config key (flag)", mpirun2_tiny("--learning-rate", "0.1"),
             "hvd_cifar: error: learning_rate: unknown config key"),
    BadInput("unknown config key (YAML file)", mpirun2("--config", "{w}/bad.yaml"),
             "hvd_cifar: error: lerning_rate: unknown config key",
             lambda w: write(w / "bad.yaml", "model: smallcnn\nlerning_rate: 0.1\n")),
    BadInput("wrong type (flag)", mpirun2_tiny("--epochs", "two"),
             "hvd_cifar: error: epochs: expected int, got 'two'"),
    BadInput("wrong type (YAML file)", mpirun2("--config", "{w}/bad.yaml"),
             "hvd_cifar: error: batch_size: expected int",
             lambda w: write(w / "bad.yaml", "batch_size: [32]\n")),
    BadInput("YAML that does not parse", mpirun2("--config", "{w}/bad.yaml"),
             "hvd_cifar: error: config:",
             lambda w: write(w / "bad.yaml", "model: [smallcnn\n")),
    BadInput("config file missing", mpirun2("--config", "{w}/absent.yaml"),
             "hvd_cifar: error: config: file"),
    BadInput("negative learning rate", mpirun2_tiny("--lr", "-0.1"),
             "hvd_cifar: error: lr: must be > 0, got -0.1"),
    BadInput("zero batch size", mpirun2_tiny("--batch-size", "0"),
             "hvd_cifar: error: batch_size: must be >= 1, got 0"),
    BadInput("accumulation steps 0", mpirun2_tiny("--accumulation-steps", "0"),
             "hvd_cifar: error: accumulation_steps: must be >= 1, got 0"),
    BadInput("freeze beyond the model's depth", mpirun2_tiny("--freeze", "9"),
             "hvd_cifar: error: freeze: 9 blocks asked for but smallcnn has 3"),
    BadInput("unknown model", mpirun2_tiny("--model", "resnet999"),
             "hvd_cifar: error: model: 'resnet999' is not one of"),
    BadInput("unknown data set", mpirun2_tiny("--dataset", "mnist"),
             "hvd_cifar: error: dataset: 'mnist' is not one of"),
    BadInput("unknown sync method", mpirun2_tiny("--sync", "nccl"),
             "hvd_cifar: error: sync: 'nccl' is not one of"),
    BadInput("malformed hostfile line", lambda w: [str(ROOT / "launch" / "horovodrun.sh"), "-np", "2",
                                                   "-hostfile", str(w / "hosts"), *tiny(w)],
             "hvd_cifar: error: hostfile ",
             lambda w: write(w / "hosts", "localhost slots=2\nnode2 slots=two\n")),
    BadInput("hostfile with fewer slots than -np", lambda w: [str(ROOT / "launch" / "mpirun.sh"), "-np", "4",
                                                              "-hostfile", str(w / "hosts"), *tiny(w)],
             "hvd_cifar: error: hostfile ",
             lambda w: write(w / "hosts", "localhost slots=2\n")),
    BadInput("data set missing, download off", mpirun2_tiny("--dataset", "cifar10", "--data-dir", "{w}/data"),
             "hvd_cifar: error: dataset: cifar10 not found"),
    BadInput("corrupt data set file", mpirun2_tiny("--dataset", "cifar10", "--data-dir", "{w}/data"),
             "hvd_cifar: error: dataset: cifar10 in ", corrupt_cifar10),
    BadInput("checkpoint from a different model", mpirun2("--resume", "{w}/logs/run", "--model", "vgg11"),
             "hvd_cifar: error: resume: checkpoint ", finished_run),
    BadInput("checkpoint from a different config (no BatchNorm)",
             mpirun2("--resume", "{w}/logs/run", "--batchnorm", "false"),
             "hvd_cifar: error: resume: the checkpoint's weights do not fit this smallcnn (", finished_run),
    BadInput("corrupt checkpoint file", mpirun2("--resume", "{w}/logs/run", "--epochs", "2"),
             "hvd_cifar: error: resume: ",
             lambda w: (finished_run(w), (w / "logs" / "run" / "checkpoint_last.pt").write_bytes(b"not a checkpoint"))),
    BadInput("resume of a run folder that does not exist", mpirun2("--resume", "{w}/nope"),
             "hvd_cifar: error: resume: no run folder at"),
    BadInput("unwritable log dir", mpirun2("--config", TINY, "--log-dir", "{w}/file/logs"),
             "hvd_cifar: error: log_dir: cannot create", unwritable),
    BadInput("batch size x world size larger than the data set", mpirun2_tiny("--batch-size", "800"),
             "hvd_cifar: error: batch_size: 800 x 2 ranks is larger than the 1437 training images"),
    BadInput("elastic without horovodrun's elastic mode", mpirun2_tiny("--elastic", "true"),
             "hvd_cifar: error: elastic:"),
    BadInput("MPI sync method under horovodrun --gloo",
             lambda w: [str(ROOT / "launch" / "horovodrun.sh"), "-np", "2", "--gloo", *tiny(w, "--sync", "mpi-allreduce")],
             "hvd_cifar: error: sync: 'mpi-allreduce' needs an MPI launcher"),
    BadInput("Horovod's Gloo operations under mpirun (HOROVOD_CPU_OPERATIONS=gloo)",
             lambda w: [*launcher_argv("mpirun", 2)[:-3], "-x", "HOROVOD_CPU_OPERATIONS=gloo",
                        *launcher_argv("single", 1), *tiny(w)],
             "hvd_cifar: error: HOROVOD_CPU_OPERATIONS=gloo: Horovod's Gloo operations need"),
    BadInput("a learning rate that diverges (lr 1000: losses of 1e17, exit status 3)",
             mpirun2_tiny("--lr", "1000"), "hvd_cifar: diverged: training loss "),
    BadInput("accumulation steps of the wrong type, under horovodrun (MPI)",
             lambda w: [str(ROOT / "launch" / "horovodrun.sh"), "-np", "2", *tiny(w, "--accumulation-steps", "1.5")],
             "hvd_cifar: error: accumulation_steps: expected int"),
    BadInput("config file that is not UTF-8 text (Latin-1)", mpirun2("--config", "{w}/bad.yaml"),
             "is not UTF-8 text (byte 0xe9 at offset 3); a config is a YAML file",
             lambda w: write_bytes(w / "bad.yaml", "# r\u00e9glages\nmodel: smallcnn\n".encode("latin-1"))),
    BadInput("config path that is a folder", mpirun2("--config", "{w}"),
             "hvd_cifar: error: config: cannot read "),
    BadInput("threads per rank beyond the host's CPUs", mpirun2_tiny("--threads-per-rank", "100000"),
             "hvd_cifar: error: threads_per_rank: 100000 is more than the "),
    BadInput("network interface that does not exist (--nic)", mpirun2_tiny("--nic", "eth9"),
             "hvd_cifar: error: nic: 'eth9' is not a network interface of "),
]


def run_bad_input(case: BadInput, work: Path) -> dict:
    """Prepare the case in ``work``, run it, and judge it (``ok``; ``why`` when not)."""
    work.mkdir(parents=True, exist_ok=True)
    case.prepare(work)
    argv = case.argv(work)
    start = time.monotonic()
    job = subprocess.Popen(argv, cwd=ROOT, env=job_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        _, stderr = job.communicate(timeout=4 * BAD_INPUT_BOUND_S)
        code = job.returncode
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)  # the launcher and every rank it started
        _, stderr = job.communicate()
        code = None
    seconds = time.monotonic() - start
    lines = [line for line in stderr.splitlines() if line.strip()]
    # horovodrun tags each line a rank prints: "[RANK]<stderr>:" (Gloo), "[JOB,RANK]<stderr>:" (MPI)
    ours = [line for line in lines if re.sub(r"^\[[\d,]+\]<stderr>:", "", line).startswith("hvd_cifar")]
    problems = []
    if code is None:
        problems.append(f"still running after {4 * BAD_INPUT_BOUND_S:.0f} s (killed)")
    elif code == 0:
        problems.append("exit status 0")
    if seconds > BAD_INPUT_BOUND_S:
        problems.append(f"took {seconds:.1f} s")
    if any("Traceback" in line for line in lines):
        problems.append("a Python traceback on stderr")
    if len(ours) != 1:
        problems.append(f"{len(ours)} lines from hvd_cifar")
    elif case.expect not in ours[0]:
        problems.append(f"the line does not start with {case.expect!r}")
    return {"case": case.name, "command": argv, "exit": code, "seconds": round(seconds, 2),
            "line": ours[0] if len(ours) == 1 else " | ".join(ours), "other_lines": len(lines) - len(ours),
            "stderr": stderr[-4000:], "ok": not problems, "why": "; ".join(problems)}


# ----------------------------------------------------------------------------- kills
# Every method under horovodrun (MPI) and mpirun; the two that also run under horovodrun --gloo.
KILL_JOBS = [("horovodrun", "horovod"), ("horovodrun", "mpi-allreduce"), ("horovodrun", "mpi-gather-scatter"),
             ("horovodrun", "ddp"), ("mpirun", "horovod"), ("mpirun", "mpi-allreduce"),
             ("mpirun", "mpi-gather-scatter"), ("mpirun", "ddp"), ("horovodrun-gloo", "horovod"),
             ("horovodrun-gloo", "ddp")]


def rank_pids(marker: str) -> list[int]:
    """PIDs of the python ranks (not launchers, not shells) whose command line holds ``marker``,
    in rank order (each rank's ``--run-name`` is the same; ranks are told apart by environment)."""
    out = subprocess.run(["pgrep", "-f", "--", f"hvd_cifar.train .*{marker}"], capture_output=True, text=True).stdout
    ranks = []
    for pid in map(int, out.split()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if argv[1:3] == [b"-m", b"hvd_cifar.train"]:
            rank = env.get(b"OMPI_COMM_WORLD_RANK") or env.get(b"HOROVOD_RANK") or b"-1"
            ranks.append((int(rank), pid))
    return [pid for _, pid in sorted(ranks)]


def kill_drill(launcher: str, sync: str, victim: int, work: Path, np: int = 2,
               signum: int = signal.SIGKILL) -> dict:
    """Start an ``np``-rank job, SIGKILL (or ``signum``) rank ``victim`` once training is under
    way, and time the end."""
    marker = f"killdrill-{launcher}-{sync}-r{victim}-{os.getpid()}"
    args = ["--config", TINY, "--epochs", "200", "--max-steps-per-epoch", "20", "--log-dir", str(work),
            "--run-name", marker, "--sync", sync]
    result = {"launcher": launcher, "sync": sync, "victim": victim, "exit": None, "seconds": None,
              "orphans": None, "ok": False, "why": ""}
    job = subprocess.Popen([*launcher_argv(launcher, np), *args], cwd=ROOT, env=job_env(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (work / marker / "metrics.jsonl").exists():  # an epoch is done: training is under way
            if job.poll() is not None:
                result["why"] = f"the job ended before training: {job.stderr.read()[-1500:]}"
                return result
            if time.monotonic() > deadline:
                result["why"] = "training never started"
                return result
            time.sleep(0.5)
        ranks = rank_pids(marker)
        if len(ranks) != np:
            result["why"] = f"found {len(ranks)} ranks"
            return result
        result["pids"] = ranks  # the job's ranks, in rank order, for the caller to check by pid
        os.kill(ranks[victim], signum)
        killed_at = time.monotonic()
        try:
            result["exit"] = job.wait(timeout=KILL_BOUND_S + 30)
        except subprocess.TimeoutExpired:
            result["why"] = f"still running {KILL_BOUND_S + 30:.0f} s after the kill"
            return result
        result["seconds"] = round(time.monotonic() - killed_at, 2)
        time.sleep(1)
        result["orphans"] = len(rank_pids(marker))
        problems = []
        if result["exit"] == 0:
            problems.append("exit status 0")
        if result["seconds"] > KILL_BOUND_S:
            problems.append(f"took {result['seconds']} s")
        if result["orphans"]:
            problems.append(f"{result['orphans']} ranks left running")
        result["ok"], result["why"] = not problems, "; ".join(problems)
        return result
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        for pid in rank_pids(marker):  # whatever the launcher left behind, this drill stops
            os.kill(pid, signal.SIGKILL)


# ----------------------------------------------------------------------------- preemptions
# (launcher, sync, who gets the signal, the signal): mpirun passes SIGUSR1 on to every rank (also
# as launch/mpirun.sh, and as horovodrun's MPI mode, which launch/horovodrun.sh makes exec
# mpirun); a scheduler's preemption signals the ranks themselves, one or all.
PREEMPT_JOBS = [("mpirun", "horovod", "launcher", "SIGUSR1"), ("mpirun", "ddp", "rank 1", "SIGTERM"),
                ("mpirun.sh", "mpi-allreduce", "launcher", "SIGUSR1"),
                ("horovodrun.sh", "horovod", "launcher", "SIGUSR1"),
                ("horovodrun.sh --gloo", "horovod", "ranks", "SIGTERM")]
PREEMPT_BOUND_S = 60.0


def preempt_argv(launcher: str) -> list[str]:
    """2 ranks of the trainer under a launcher of PREEMPT_JOBS (a name or a launch script)."""
    if launcher.startswith(("horovodrun.sh", "mpirun.sh")):
        script, *options = launcher.split()
        return [str(ROOT / "launch" / script), "-np", "2", *options]
    return launcher_argv(launcher, 2)


def preempt_drill(launcher: str, sync: str, target: str, signame: str, work: Path) -> dict:
    """Start a 2-rank job, send ``signame`` to ``target`` once an epoch is recorded; the job must
    exit 4 within PREEMPT_BOUND_S with one line, a checkpoint inside the epoch and a ``preempted``
    event, leave no rank behind, and ``--resume`` under the same launcher must finish the run."""
    marker = f"preemptdrill-{launcher.replace(' ', '')}-{sync}-{target.replace(' ', '')}-{os.getpid()}"
    run = work / marker
    args = ["--config", TINY, "--epochs", "3", "--max-steps-per-epoch", "20", "--log-dir", str(work),
            "--run-name", marker, "--sync", sync]
    result = {"launcher": launcher, "sync": sync, "target": target, "signal": signame, "exit": None,
              "seconds": None, "stopped": "", "resume_exit": None, "ok": False, "why": ""}
    job = subprocess.Popen([*preempt_argv(launcher), *args], cwd=ROOT, env=job_env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text():
            if job.poll() is not None or time.monotonic() > deadline:
                result["why"] = "training never got through an epoch"
                return result
            time.sleep(0.2)
        ranks = rank_pids(marker)
        sent_to = {"launcher": [job.pid], "rank 1": ranks[1:2], "ranks": ranks}[target]
        for pid in sent_to:
            os.kill(pid, getattr(signal, signame))
        signalled = time.monotonic()
        try:
            _, stderr = job.communicate(timeout=PREEMPT_BOUND_S + 30)
        except subprocess.TimeoutExpired:
            result["why"] = f"still running {PREEMPT_BOUND_S + 30:.0f} s after the signal"
            return result
        result["exit"], result["seconds"] = job.returncode, round(time.monotonic() - signalled, 2)
        time.sleep(1)
        return judge_preemption(result, launcher, run, marker, stderr)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        for pid in rank_pids(marker):
            os.kill(pid, signal.SIGKILL)


def judge_preemption(result: dict, launcher: str, run: Path, marker: str, stderr: str) -> dict:
    """The pass criteria of preempt_drill, then the resume."""
    problems = []
    ours = [line for line in stderr.splitlines() if re.sub(r"^\[[\d,]+\]<stderr>:", "", line).startswith("hvd_cifar")]
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()] \
        if (run / "events.jsonl").exists() else []
    if result["exit"] != 4:
        problems.append(f"exit {result['exit']}")
    if result["seconds"] > PREEMPT_BOUND_S:
        problems.append(f"took {result['seconds']} s")
    if len(ours) != 1 or "hvd_cifar: preempted:" not in ours[0]:
        problems.append(f"{len(ours)} lines from hvd_cifar")
    if [e["event"] for e in events] != ["preempted"]:
        problems.append(f"events: {[e['event'] for e in events]}")
    else:
        result["stopped"] = f"epoch {events[0]['epoch'] + 1}, step {events[0]['step']}"
    if rank_pids(marker):
        problems.append("ranks left running")
    resumed = subprocess.run([*preempt_argv(launcher), "--resume", str(run)], cwd=ROOT, env=job_env(),
                             capture_output=True, text=True, timeout=600)
    result["resume_exit"] = resumed.returncode
    if resumed.returncode != 0 or not (run / "eval.json").exists():
        problems.append(f"resume exited {resumed.returncode}: {resumed.stderr[-500:]}")
    result["ok"], result["why"] = not problems, "; ".join(problems)
    return result



def run_preemptions(rows: list[dict], work: Path) -> list[str]:
    """Every job of PREEMPT_JOBS, appended to ``rows``; the table and its summary."""
    for job in PREEMPT_JOBS:
        rows.append(preempt_drill(*job, work))
        r = rows[-1]
        print(f"preempt {' '.join(job)}: exit {r['exit']} after {r['seconds']} s, resumed: {r['resume_exit']}"
              f"{'' if r['ok'] else ': ' + r['why']}", flush=True)
    times = [r["seconds"] for r in rows if r["seconds"] is not None]
    return [preempt_table(rows), "", f"preemptions: {sum(r['ok'] for r in rows)} of {len(rows)} exited 4 within "
            f"{PREEMPT_BOUND_S:.0f} s with a checkpoint and resumed to the end; slowest "
            f"{max(times, default=float('nan')):.1f} s", ""]


# ----------------------------------------------------------------------------- report
def bad_input_table(rows: list[dict]) -> str:
    out = ["| # | bad input | exit | seconds | the one line from hvd_cifar | launcher lines | pass |",
           "|---:|---|---:|---:|---|---:|---|"]
    for i, r in enumerate(rows, 1):
        line = r["line"].replace("|", "\\|")
        out.append(f"| {r.get('number', i)} | {r['case']} | {r['exit']} | {r['seconds']:.1f} | `{line}` | {r['other_lines']} | "
                   f"{'yes' if r['ok'] else 'NO: ' + r['why']} |")
    return "\n".join(out)


def kill_table(rows: list[dict]) -> str:
    out = ["| launcher | sync | rank killed | exit | seconds to exit | ranks left | pass |",
           "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        seconds = "-" if r["seconds"] is None else f"{r['seconds']:.1f}"
        out.append(f"| {r['launcher']} | {r['sync']} | {r['victim']} | {r['exit']} | {seconds} | "
                   f"{r['orphans']} | {'yes' if r['ok'] else 'NO: ' + r['why']} |")
    return "\n".join(out)


def preempt_table(rows: list[dict]) -> str:
    out = ["| launcher | sync | signal to | signal | exit | seconds to exit | stopped after | resume exit | pass |",
           "|---|---|---|---|---:|---:|---|---:|---|"]
    for r in rows:
        seconds = "-" if r["seconds"] is None else f"{r['seconds']:.1f}"
        out.append(f"| {r['launcher']} | {r['sync']} | {r['target']} | {r['signal']} | {r['exit']} | {seconds} | "
                   f"{r['stopped']} | {r['resume_exit']} | {'yes' if r['ok'] else 'NO: ' + r['why']} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("bad-inputs", "kills", "preemptions"))
    p.add_argument("--match", nargs="+", default=[], metavar="TEXT",
                   help="only the bad inputs whose name holds one of these")
    p.add_argument("--out", default=None, help="work folder (default: a new temporary folder)")
    args = p.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="hvd_cifar-reliability-"))
    out.mkdir(parents=True, exist_ok=True)
    report = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": platform.platform(),
              "cpus": os.cpu_count(), "load_start": os.getloadavg()[0], "bad_inputs": [], "kills": [],
              "preemptions": []}
    text = []
    if args.only in (None, "bad-inputs"):
        cases = [(i, case) for i, case in enumerate(BAD_INPUTS, 1)
                 if not args.match or any(text in case.name for text in args.match)]
        for i, case in cases:
            report["bad_inputs"].append({"number": i, **run_bad_input(case, out / f"bad-{i:02d}")})
            print(f"bad input {i}/{len(BAD_INPUTS)}: {case.name}: "
                  f"{'ok' if report['bad_inputs'][-1]['ok'] else report['bad_inputs'][-1]['why']}", flush=True)
        passed = sum(r["ok"] for r in report["bad_inputs"])
        text += [bad_input_table(report["bad_inputs"]), "",
                 f"bad inputs: {passed} of {len(cases)} passed (one line from hvd_cifar, no traceback, "
                 f"exit != 0 within {BAD_INPUT_BOUND_S:.0f} s); slowest "
                 f"{max(r['seconds'] for r in report['bad_inputs']):.1f} s", ""]
    if args.only in (None, "kills"):
        for launcher, sync in KILL_JOBS:
            for victim in (0, 1):
                report["kills"].append(kill_drill(launcher, sync, victim, out / "kills"))
                r = report["kills"][-1]
                print(f"kill rank {victim} of {launcher} {sync}: exit {r['exit']} after {r['seconds']} s"
                      f"{'' if r['ok'] else ': ' + r['why']}", flush=True)
        passed = sum(r["ok"] for r in report["kills"])
        times = [r["seconds"] for r in report["kills"] if r["seconds"] is not None]
        text += [kill_table(report["kills"]), "",
                 f"kills: {passed} of {len(report['kills'])} ended the job non-zero within {KILL_BOUND_S:.0f} s "
                 f"with no rank left running; slowest {max(times, default=float('nan')):.1f} s", ""]
    if args.only in (None, "preemptions"):
        text += run_preemptions(report["preemptions"], out / "preemptions")
    report["load_end"] = os.getloadavg()[0]
    report["ended"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    (out / "reliability.json").write_text(json.dumps(report, indent=1))
    (out / "reliability.md").write_text("\n".join(text))
    print("\n" + "\n".join(text))
    print(f"load average {report['load_start']:.2f} at the start, {report['load_end']:.2f} at the end; "
          f"details in {out}/reliability.json")
    ok = all(r["ok"] for r in report["bad_inputs"] + report["kills"] + report["preemptions"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
