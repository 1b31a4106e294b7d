"""The fault drill's cases and pass criteria: every bad input, rank kill and preemption that the
reliability guarantees (docs/RELIABILITY.md) cover, each run for real with the shipped launchers,
timed and judged. ``benchmarks/reliability.py`` runs them all and writes the tables;
tests/test_bad_inputs.py, test_reliability.py, test_preemption.py and test_async_ps.py run them
(or, for the config errors, check the same one line in-process) with the same criteria.

Bad inputs (``BAD_INPUTS``, judged by ``run_bad_input``): each case is one real command
(``mpirun -np 2`` of the trainer unless the case is about another launcher) given one mistake. A
case passes when the command exits non-zero within BAD_INPUT_BOUND_S, stderr holds no Python
traceback, and exactly one line comes from hvd_cifar (``hvd_cifar: error: ...``) holding the
case's ``expect``: one line from one rank. The launcher's own note that a process exited
non-zero is counted apart; it is not ours to silence. Cases marked ``config_error`` are
mistakes in the config alone, which the trainer's ``load_config`` rejects before anything else.

Kills (``KILL_JOBS``, ``kill_drill``): a 2-rank job on the tiny config, one rank SIGKILLed once its
first epoch is written; the launcher must exit non-zero within KILL_BOUND_S and, a second later,
no rank of the job may be left running.

Preemptions (``PREEMPT_JOBS``, ``preempt_drill``): a stop signal once the first epoch is written,
through the launcher (SIGUSR1) or to one or both ranks (SIGTERM); the job must exit 4 within
PREEMPT_BOUND_S with one line, one ``preempted`` event and no rank left, and ``--resume`` under the
same launcher must finish the run.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hvd_cifar.launch import commands

from testbed import jobs

ROOT = Path(commands.ROOT)
TINY = str(ROOT / "configs" / "tiny.yaml")
BAD_INPUT_BOUND_S = 30.0   # "within seconds": the slowest case pays for mpirun, torch and MPI start-up
KILL_BOUND_S = 60.0
PREEMPT_BOUND_S = 60.0
# The test suite runs three jobs at once on two cores, so its tests hold each bound times
# SUITE_SLACK: there they catch a hang, not a loaded machine. benchmarks/reliability.py runs the
# drill alone and holds the bounds themselves (docs/RELIABILITY.md).
SUITE_SLACK = 3.0
# horovodrun tags each line a rank prints: "[RANK]<stderr>:" (Gloo), "[JOB,RANK]<stderr>:" (MPI)
RANK_TAG = re.compile(r"^\[[\d,]+\]<stderr>:")


def launcher_argv(launcher: str, np: int) -> list[str]:
    """The command prefix that starts ``np`` ranks of ``python -m hvd_cifar.train`` here."""
    return commands.argv(launcher, np)


def job_env() -> dict:
    """Every drill job's environment: one OpenMP thread per rank (2 ranks share the cores)."""
    return commands.job_env(OMP_NUM_THREADS="1")


def our_lines(stderr: str, speaker: str = "hvd_cifar") -> list[str]:
    """The lines of ``stderr`` that hvd_cifar wrote (a launcher's rank tags taken off); ``speaker``:
    "horovodrun" for what our fixes to Horovod's launcher say in its name."""
    return [line for line in stderr.splitlines() if RANK_TAG.sub("", line).startswith(speaker)]


# ----------------------------------------------------------------------------- bad inputs
def tiny(work: Path, *flags: str) -> list[str]:
    """Trainer flags for a tiny run whose folder is work/logs/run."""
    return ["--config", TINY, "--log-dir", str(work / "logs"), "--run-name", "run", *flags]


_FINISHED: list[Path] = []  # the first finished run this process trained, which later cases copy


def finished_run(work: Path) -> None:
    """A run folder with a checkpoint at work/logs/run: one epoch of one step, one process;
    trained once per process, copied for every later case (each case changes its own copy)."""
    if _FINISHED and (_FINISHED[0] / "checkpoint_last.pt").exists():
        shutil.copytree(_FINISHED[0], work / "logs" / "run", symlinks=True)
        return
    jobs.run("a finished run to resume", [*launcher_argv("single", 1), *tiny(work, "--epochs", "1",
             "--max-steps-per-epoch", "1")], env=job_env(), timeout=300)
    keep = Path(tempfile.mkdtemp(prefix="hvd_cifar-drill-")) / "run"
    atexit.register(shutil.rmtree, keep.parent, True)
    shutil.copytree(work / "logs" / "run", keep, symlinks=True)
    _FINISHED[:] = [keep]


def write(path: Path, content: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())


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


# The generated set of the cases below: small, made by the loader itself into work/data.
SMALL_SHAPES = ("--dataset", "shapes", "--shapes-train", "1000", "--shapes-test", "200", "--data-dir", "{w}/data")


def small_shapes(work: Path) -> Path:
    """The small generated set (SMALL_SHAPES) made in work/data; its batches' folder."""
    from hvd_cifar.workload import data  # torch: only for the cases that need the set made
    data.load("shapes", str(work / "data"), shapes_sizes=(1000, 200, 0))
    return work / "data" / "shapes-seed0-1000-200" / "cifar-10-batches-py"


def flipped_pixels(work: Path) -> None:
    """16 bytes inside image 5's pixels of data_batch_3 inverted, the file's size kept: only its
    checksum can tell."""
    path = small_shapes(work) / "data_batch_3"
    raw = bytearray(path.read_bytes())
    with open(path, "rb") as f:
        at = raw.find(pickle.load(f, encoding="latin1")["data"][5].tobytes()) + 1000
    raw[at:at + 16] = bytes(255 - b for b in raw[at:at + 16])
    path.write_bytes(bytes(raw))


def label_beyond_the_classes(work: Path) -> None:
    """test_batch written again with image 7 labelled 99 and its checksum brought up to date:
    only the label is wrong."""
    folder = small_shapes(work)
    with open(folder / "test_batch", "rb") as f:
        batch = pickle.load(f, encoding="latin1")
    batch["labels"][7] = 99
    raw = pickle.dumps(batch, protocol=4)
    (folder / "test_batch").write_bytes(raw)
    manifest = json.loads((folder.parent / "checksums.json").read_text())
    manifest["files"]["test_batch"] = {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}
    (folder.parent / "checksums.json").write_text(json.dumps(manifest))


def changed_checkpoint(change: Callable[[dict], object]) -> Callable[[Path], None]:
    """A finished run whose checkpoint is saved again as ``change`` makes it (given the
    checkpoint's dict; what it returns is saved, or the dict it changed in place)."""
    def prepare(work: Path) -> None:
        import torch  # only for the cases that rewrite a checkpoint
        finished_run(work)
        path = work / "logs" / "run" / "checkpoint_last.pt"
        saved = torch.load(path, weights_only=True)
        made = change(saved)
        torch.save(saved if made is None else made, path)
    return prepare


def other_momentum(saved: dict) -> None:
    """The first parameter's momentum buffer one element longer than the parameter."""
    import torch
    state = saved["optimizer"]["state"]
    first = next(iter(state))
    state[first]["momentum_buffer"] = torch.zeros(state[first]["momentum_buffer"].numel() + 1)


def one_host_twice(work: Path) -> None:
    write(work / "hosts", "localhost slots=1\nlocalhost slots=1\n")


def unwritable(work: Path) -> None:
    write(work / "file", "a file where the log folder's parent should be")


@dataclass
class BadInput:
    name: str                                  # the mistake, as a user would describe it
    argv: Callable[[Path], list[str]]          # the whole command, given the case's folder
    expect: str                                # what our one line must hold
    prepare: Callable[[Path], None] = field(default=lambda work: None)
    config_error: bool = False                 # the config alone is wrong: load_config rejects it
    status: int = 2                            # the exit status (hvd_cifar.trainer.exits: 2 is bad input)
    speaker: str = "hvd_cifar"                 # who says the one line (plain horovodrun: "horovodrun")

    def trainer_flags(self, work: Path) -> list[str]:
        """The trainer's own flags in the case's command (what follows ``-m hvd_cifar.train``)."""
        argv = self.argv(work)
        return argv[argv.index("hvd_cifar.train") + 1:]


def mpirun2(*flags: str) -> Callable[[Path], list[str]]:
    """The trainer under mpirun -np 2 with these flags (``{w}`` becomes the case's folder)."""
    return lambda w: [*launcher_argv("mpirun", 2), *(f.format(w=w) for f in flags)]


def mpirun2_tiny(*flags: str) -> Callable[[Path], list[str]]:
    return lambda w: [*launcher_argv("mpirun", 2), *tiny(w, *(f.format(w=w) for f in flags))]


def bad_flags(name: str, flags: tuple[str, ...], expect: str) -> BadInput:
    """A config error in the flags of a tiny run under mpirun -np 2."""
    return BadInput(name, mpirun2_tiny(*flags), f"hvd_cifar: error: {expect}", config_error=True)


def bad_config_file(name: str, expect: str, content: str | bytes | None = None, path: str = "{w}/bad.yaml") -> BadInput:
    """A config error in the file given with --config (``content`` written to ``path``; None: none)."""
    prepare = (lambda w: write(Path(path.format(w=w)), content)) if content is not None else (lambda w: None)
    return BadInput(name, mpirun2("--config", path), expect, prepare, config_error=True)


BAD_INPUTS: list[BadInput] = [
    bad_flags("unknown config key (flag)", ("--learning-rate", "0.1"), "learning_rate: unknown config key"),
    bad_config_file("unknown config key (YAML file)", "hvd_cifar: error: lerning_rate: unknown config key",
                    "model: smallcnn\nlerning_rate: 0.1\n"),
    bad_flags("wrong type (flag)", ("--epochs", "two"), "epochs: expected int, got 'two'"),
    bad_config_file("wrong type (YAML file)", "hvd_cifar: error: batch_size: expected int", "batch_size: [32]\n"),
    bad_config_file("YAML that does not parse", "hvd_cifar: error: config:", "model: [smallcnn\n"),
    bad_config_file("config file missing", "hvd_cifar: error: config: file", path="{w}/absent.yaml"),
    bad_flags("negative learning rate", ("--lr", "-0.1"), "lr: must be > 0, got -0.1"),
    bad_flags("zero batch size", ("--batch-size", "0"), "batch_size: must be >= 1, got 0"),
    bad_flags("accumulation steps 0", ("--accumulation-steps", "0"), "accumulation_steps: must be >= 1, got 0"),
    bad_flags("unknown compression", ("--compression", "zip"), "compression: 'zip' is not one of"),
    bad_flags("fp16 allreduce with another compression", ("--fp16-allreduce", "true", "--compression", "topk"),
              "fp16_allreduce: true means compression: fp16, which conflicts with compression: topk"),
    bad_flags("top-k fraction out of range", ("--compression", "topk", "--topk-fraction", "1.5"),
              "topk_fraction: must be in (0, 1], got 1.5"),
    bad_flags("local SGD with a compression", ("--local-sgd-steps", "4", "--compression", "powersgd"),
              "local_sgd_steps: averages whole models every 4 updates, not with compression: powersgd"),
    bad_flags("compression under a sync method that does not run it", ("--compression", "powersgd", "--sync",
              "mpi-allreduce"), "compression: powersgd: needs sync: horovod or ddp, got sync: mpi-allreduce"),
    bad_flags("compression with amp fp16", ("--compression", "topk", "--amp", "fp16"),
              "compression: topk: not with amp: fp16"),
    bad_flags("local SGD with freeze: auto", ("--local-sgd-steps", "4", "--freeze", "auto"),
              "compression: local-sgd: not with freeze: auto"),
    BadInput("freeze beyond the model's depth", mpirun2_tiny("--freeze", "9"),
             "hvd_cifar: error: freeze: 9 blocks asked for but smallcnn has 3"),
    bad_flags("unknown model", ("--model", "resnet999"), "model: 'resnet999' is not one of"),
    bad_flags("unknown data set", ("--dataset", "mnist"), "dataset: 'mnist' is not one of"),
    bad_flags("unknown sync method", ("--sync", "nccl"), "sync: 'nccl' is not one of"),
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
             "hvd_cifar: error: resume: no run folder at", config_error=True),
    BadInput("unwritable log dir", mpirun2("--config", TINY, "--log-dir", "{w}/file/logs"),
             "hvd_cifar: error: log_dir: cannot create", unwritable),
    BadInput("batch size x world size larger than the data set", mpirun2_tiny("--batch-size", "800"),
             "hvd_cifar: error: batch_size: 800 x 2 ranks is larger than the 1437 training images"),
    BadInput("elastic without horovodrun's elastic mode", mpirun2_tiny("--elastic", "true"),
             "hvd_cifar: error: elastic:"),
    BadInput("MPI sync method under horovodrun --gloo",
             lambda w: [str(ROOT / "launch" / "horovodrun.sh"), "-np", "2", "--gloo", *tiny(w, "--sync", "mpi-allreduce")],
             "hvd_cifar: error: sync: 'mpi-allreduce' needs an MPI launcher"),
    BadInput("a learning rate that diverges (lr 1000: losses of 1e17, exit status 3)",
             mpirun2_tiny("--lr", "1000"), "hvd_cifar: diverged: training loss ", status=3),
    # Found once DDP's process group is up: its Gloo threads must not abort the process's end.
    BadInput("run name that already exists, under DDP", mpirun2_tiny("--sync", "ddp"),
             "hvd_cifar: error: run_name: ", lambda w: (w / "logs" / "run").mkdir(parents=True)),
    BadInput("accumulation steps of the wrong type, under horovodrun (MPI)",
             lambda w: [str(ROOT / "launch" / "horovodrun.sh"), "-np", "2", *tiny(w, "--accumulation-steps", "1.5")],
             "hvd_cifar: error: accumulation_steps: expected int", config_error=True),
    bad_config_file("config file that is not UTF-8 text (Latin-1)",
                    "is not UTF-8 text (byte 0xe9 at offset 3); a config is a YAML file",
                    "# r\u00e9glages\nmodel: smallcnn\n".encode("latin-1")),
    bad_config_file("config path that is a folder", "hvd_cifar: error: config: cannot read ", path="{w}"),
    BadInput("threads per rank beyond the host's CPUs", mpirun2_tiny("--threads-per-rank", "100000"),
             "hvd_cifar: error: threads_per_rank: 100000 is more than the "),
    BadInput("network interface that does not exist (--nic)", mpirun2_tiny("--nic", "eth9"),
             "hvd_cifar: error: nic: 'eth9' is not a network interface of "),
    BadInput("generated data set whose pixel bytes were changed on disk", mpirun2_tiny(*SMALL_SHAPES),
             "cifar-10-batches-py/data_batch_3 is not the file written: its checksum differs", flipped_pixels),
    BadInput("data set batch with a label outside the classes", mpirun2_tiny(*SMALL_SHAPES),
             "test_batch: image 7 has label 99, not one of the 10 classes (0-9)", label_beyond_the_classes),
    BadInput("generated data set larger than the machine's memory",
             mpirun2_tiny("--dataset", "shapes", "--shapes-train", "100000000", "--data-dir", "{w}/data"),
             "hvd_cifar: error: dataset: shapes: 100,000,000 training and 10,000 test images need"),
    BadInput("checkpoint that is not a checkpoint's dict (a list)", mpirun2("--resume", "{w}/logs/run", "--epochs", "2"),
             "hvd_cifar: error: resume: ", changed_checkpoint(lambda saved: [saved])),
    BadInput("checkpoint without its epoch", mpirun2("--resume", "{w}/logs/run", "--epochs", "2"), "('epoch' is missing)",
             changed_checkpoint(lambda saved: (saved.pop("epoch"), saved)[1])),
    BadInput("checkpoint whose epoch is a string", mpirun2("--resume", "{w}/logs/run", "--epochs", "2"), "('epoch' is str '",
             changed_checkpoint(lambda saved: saved.update(epoch=str(saved["epoch"])))),
    BadInput("checkpoint whose momentum does not fit the model", mpirun2("--resume", "{w}/logs/run", "--epochs", "2"),
             "hvd_cifar: error: resume: the checkpoint's optimizer state does not fit this smallcnn (",
             changed_checkpoint(other_momentum)),
    BadInput("hostfile listing a host twice, plain horovodrun -H FILE",
             lambda w: [str(ROOT / ".venv" / "bin" / "horovodrun"), "-np", "2", "-H", str(w / "hosts"),
                        *launcher_argv("single", 1), *tiny(w)],
             "horovodrun: error: hostfile ", one_host_twice, speaker="horovodrun"),
    BadInput("hostfile listing a host twice, launch/mpirun.sh",
             lambda w: [str(ROOT / "launch" / "mpirun.sh"), "-np", "2", "-hostfile", str(w / "hosts"), *tiny(w)],
             "hvd_cifar: error: hostfile ", one_host_twice),
]


def run_bad_input(case: BadInput, work: Path, bound_s: float = BAD_INPUT_BOUND_S) -> dict:
    """Prepare the case in ``work``, run it, and judge it (``ok``; ``why`` when not) against
    ``bound_s``."""
    work.mkdir(parents=True, exist_ok=True)
    case.prepare(work)
    argv = case.argv(work)
    done = jobs.run(case.name, argv, env=job_env(), timeout=bound_s + 90, check=False)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    ours = our_lines(done.stderr, case.speaker)
    problems = []
    if done.code is None:
        problems.append(f"still running after {bound_s + 90:.0f} s (stopped)")
    elif done.code != case.status:
        problems.append(f"exit status {done.code}, not {case.status}")
    if done.seconds > bound_s:
        problems.append(f"took {done.seconds:.1f} s")
    if any("Traceback" in line for line in lines):
        problems.append("a Python traceback on stderr")
    if len(ours) != 1:
        problems.append(f"{len(ours)} lines from {case.speaker}")
    elif case.expect not in ours[0]:
        problems.append(f"the line does not hold {case.expect!r}")
    return {"case": case.name, "command": argv, "exit": done.code, "seconds": round(done.seconds, 2),
            "line": ours[0] if len(ours) == 1 else " | ".join(ours), "other_lines": len(lines) - len(ours),
            "stderr": done.stderr[-4000:], "ok": not problems, "why": "; ".join(problems)}


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


def start_job(argv: list[str]) -> subprocess.Popen:
    """A drill's job, left running to be signalled: its own session, stderr kept."""
    return subprocess.Popen(argv, cwd=ROOT, env=job_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def end_job(job: subprocess.Popen, marker: str) -> None:
    """SIGKILL to what is left of a drill's job: the launcher's session, and any rank it left."""
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    for pid in rank_pids(marker):
        os.kill(pid, signal.SIGKILL)


def kill_drill(launcher: str, sync: str, victim: int, work: Path, np: int = 2,
               signum: int = signal.SIGKILL, bound_s: float = KILL_BOUND_S) -> dict:
    """Start an ``np``-rank job, SIGKILL (or ``signum``) rank ``victim`` once training is under
    way, and time the end against ``bound_s``."""
    marker = f"killdrill-{launcher}-{sync}-r{victim}-{os.getpid()}"
    args = ["--config", TINY, "--epochs", "200", "--max-steps-per-epoch", "20", "--log-dir", str(work),
            "--run-name", marker, "--sync", sync]
    result = {"launcher": launcher, "sync": sync, "victim": victim, "exit": None, "seconds": None,
              "orphans": None, "ok": False, "why": ""}
    job = start_job([*launcher_argv(launcher, np), *args])
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
            result["exit"] = job.wait(timeout=bound_s + 30)
        except subprocess.TimeoutExpired:
            result["why"] = f"still running {bound_s + 30:.0f} s after the kill"
            return result
        result["seconds"] = round(time.monotonic() - killed_at, 2)
        time.sleep(1)
        result["orphans"] = len(rank_pids(marker))
        problems = []
        if result["exit"] == 0:
            problems.append("exit status 0")
        if result["seconds"] > bound_s:
            problems.append(f"took {result['seconds']} s")
        if result["orphans"]:
            problems.append(f"{result['orphans']} ranks left running")
        result["ok"], result["why"] = not problems, "; ".join(problems)
        return result
    finally:
        end_job(job, marker)


# ----------------------------------------------------------------------------- preemptions
# (launcher, sync, who gets the signal, the signal): mpirun passes SIGUSR1 on to every rank (also
# as launch/mpirun.sh, and as horovodrun's MPI mode, which launch/horovodrun.sh makes exec
# mpirun); a scheduler's preemption signals the ranks themselves, one or all.
PREEMPT_JOBS = [("mpirun", "horovod", "launcher", "SIGUSR1"), ("mpirun", "ddp", "rank 1", "SIGTERM"),
                ("mpirun.sh", "mpi-allreduce", "launcher", "SIGUSR1"),
                ("horovodrun.sh", "horovod", "launcher", "SIGUSR1"),
                ("horovodrun.sh --gloo", "horovod", "ranks", "SIGTERM")]


def preempt_argv(launcher: str) -> list[str]:
    """2 ranks of the trainer under a launcher of PREEMPT_JOBS (a name or a launch script)."""
    if launcher.startswith(("horovodrun.sh", "mpirun.sh")):
        script, *options = launcher.split()
        return [str(ROOT / "launch" / script), "-np", "2", *options]
    return launcher_argv(launcher, 2)


def preempt_drill(launcher: str, sync: str, target: str, signame: str, work: Path,
                  bound_s: float = PREEMPT_BOUND_S) -> dict:
    """Start a 2-rank job, send ``signame`` to ``target`` once an epoch is recorded; the job must
    exit 4 within ``bound_s`` with one line, a checkpoint inside the epoch and a ``preempted``
    event, leave no rank behind, and ``--resume`` under the same launcher must finish the run."""
    marker = f"preemptdrill-{launcher.replace(' ', '')}-{sync}-{target.replace(' ', '')}-{os.getpid()}"
    run = work / marker
    args = ["--config", TINY, "--epochs", "3", "--max-steps-per-epoch", "20", "--log-dir", str(work),
            "--run-name", marker, "--sync", sync]
    result = {"launcher": launcher, "sync": sync, "target": target, "signal": signame, "exit": None,
              "seconds": None, "stopped": "", "resume_exit": None, "ok": False, "why": ""}
    job = start_job([*preempt_argv(launcher), *args])
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
            _, stderr = job.communicate(timeout=bound_s + 30)
        except subprocess.TimeoutExpired:
            result["why"] = f"still running {bound_s + 30:.0f} s after the signal"
            return result
        result["exit"], result["seconds"] = job.returncode, round(time.monotonic() - signalled, 2)
        time.sleep(1)
        return judge_preemption(result, launcher, run, marker, stderr, bound_s)
    finally:
        end_job(job, marker)


def judge_preemption(result: dict, launcher: str, run: Path, marker: str, stderr: str, bound_s: float) -> dict:
    """The pass criteria of preempt_drill, then the resume."""
    problems = []
    ours = our_lines(stderr)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()] \
        if (run / "events.jsonl").exists() else []
    if result["exit"] != 4:
        problems.append(f"exit {result['exit']}")
    if result["seconds"] > bound_s:
        problems.append(f"took {result['seconds']} s")
    if len(ours) != 1 or "hvd_cifar: preempted:" not in ours[0]:
        problems.append(f"{len(ours)} lines from hvd_cifar")
    if [e["event"] for e in events] != ["preempted"]:
        problems.append(f"events: {[e['event'] for e in events]}")
    else:
        result["stopped"] = f"epoch {events[0]['epoch'] + 1}, step {events[0]['step']}"
    if rank_pids(marker):
        problems.append("ranks left running")
    resumed = jobs.run(f"resume under {launcher}", [*preempt_argv(launcher), "--resume", str(run)],
                       env=job_env(), timeout=600, check=False)
    result["resume_exit"] = resumed.code
    if resumed.code != 0 or not (run / "eval.json").exists():
        problems.append(f"resume exited {resumed.code}: {resumed.stderr[-500:]}")
    result["ok"], result["why"] = not problems, "; ".join(problems)
    return result
