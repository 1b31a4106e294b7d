"""Shared helpers: run the real trainer (one process, horovodrun or mpirun) on real files."""
from __future__ import annotations

import csv
import ctypes
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hvd_cifar.core.names import RESOURCE_FIELDS
from hvd_cifar.launch import commands

# Every process the suite starts inherits this. Several workers share two cores, and OpenMP's
# threads spin between torch's parallel regions by default: a one-process run with two threads
# burned about 20 % more CPU spinning, CPU the other workers' jobs were waiting for.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
BIN = Path(PYTHON).parent
TINY = str(ROOT / "configs" / "tiny.yaml")


# Set in the C environment by MPI_Init (mpi4py.MPI's import, hvd.init() under no launcher):
# every process this test process starts afterwards inherits them and believes it is a rank of
# that one-process MPI job, so mpirun and horovodrun in later tests exit 1 without a word.
MPI_INIT_MARKS = (b"PMIX_RANK", b"OMPI_MCA_orte_launch")


@pytest.fixture(autouse=True)
def no_mpi_in_the_test_process():
    """Fail the test that initialised MPI in the pytest process, not the later ones it breaks.
    Python's os.environ does not see these variables (MPI sets them below it): ask libc."""
    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    before = {m for m in MPI_INIT_MARKS if getenv(m) is not None}
    yield
    after = {m.decode() for m in MPI_INIT_MARKS if m not in before and getenv(m) is not None}
    assert not after, (f"this test initialised MPI in the pytest process ({', '.join(sorted(after))} now set): "
                       "every launcher a later test starts would inherit its environment; run it in a subprocess")


def launch_argv(launcher: str, np: int) -> list[str]:
    """The command prefix that starts ``np`` ranks of ``python -m hvd_cifar.train``
    (single, horovodrun, horovodrun-gloo or mpirun: hvd_cifar.launch.commands)."""
    return commands.argv(launcher, np)


def run_train(args: list[str], launcher: str = "single", np: int = 1, timeout: int = 300,
              check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``args`` to the trainer under ``launcher``; ``env``: variables to add to the environment."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(env or {}))
    proc = subprocess.run([*launch_argv(launcher, np), *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"training exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\n"
                             f"stderr:\n{proc.stderr[-4000:]}")
    return proc


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def measured(key: str) -> bool:
    """Fields of a metrics line that differ between two runs of the same training: times, rates,
    interface counters, resource use, and where a resumed epoch's pass began (its times cover only
    that pass)."""
    return (key.endswith("_time_s") or key in ("images_per_s", "elapsed_s", "resumed_at_step", "step_time_median_s",
                                                *RESOURCE_FIELDS)
            or key.startswith(("nic_", "comm_hidden", "comm_exposed")))


def unmeasured(records: list[dict]) -> list[dict]:
    """Metrics lines without their ``measured`` fields: what two runs of one training share."""
    return [{k: v for k, v in r.items() if not measured(k)} for r in records]


@pytest.fixture
def tiny_args(tmp_path):
    """Base flags for a tiny run whose folder is tmp_path/logs/run."""
    return ["--config", TINY, "--log-dir", str(tmp_path / "logs"), "--run-name", "run"]


class SharedRun:
    """A finished run that several tests read: its run folder (``run``) and the launcher's
    output (``proc``). Read it, never write into it; a test that resumes or changes a run
    works on its own copy (``copy_to``)."""

    def __init__(self, proc: subprocess.CompletedProcess, run: Path):
        self.proc, self.run = proc, run

    def copy_to(self, parent: Path) -> Path:
        """A copy of the run folder as ``parent/<run name>``."""
        return Path(shutil.copytree(self.run, Path(parent) / self.run.name, symlinks=True))


_SHARED: dict = {}


def _shared_dir(tmp_path_factory) -> Path:
    """A folder every worker of this session sees: under xdist each worker's basetemp is
    ``<session's basetemp>/popen-gwN``, so their parent; without xdist the basetemp itself."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-runs"
    folder.mkdir(exist_ok=True)
    return folder


def shared(key: str, start, tmp_path_factory) -> SharedRun:
    """``start()`` once per session for ``key``, whichever of the session's workers (xdist) asks
    first; the others wait for it and read the same run (the files of several test modules, each
    on its own worker, read one run instead of starting one each: a 2-rank run is ~10 CPU-s of
    start-up). A failure is remembered, so that every test that reads the run fails with it and
    none starts it again."""
    from filelock import FileLock  # torch's own dependency

    done = _SHARED
    if key not in done:
        folder = _shared_dir(tmp_path_factory)
        with FileLock(str(folder / f"{key}.lock")):
            saved = folder / f"{key}.pickle"
            if saved.exists():
                kept = pickle.loads(saved.read_bytes())
                done[key] = kept if isinstance(kept, str) else SharedRun(*kept)
            else:
                try:
                    done[key] = start()
                except AssertionError as exc:
                    done[key] = f"the shared run {key!r} failed: {exc}"
                kept = done[key] if isinstance(done[key], str) else (done[key].proc, done[key].run)
                saved.write_bytes(pickle.dumps(kept))
    if isinstance(done[key], str):
        pytest.fail(done[key])
    return done[key]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """``tiny_run(launcher)``: configs/tiny.yaml as it is (2 epochs of 6 steps) under
    ``launcher`` (single: one process; horovodrun, horovodrun-gloo, mpirun: 2 ranks), run
    folder ``.../logs/run`` as ``tiny_args`` names it; each launcher's run once per session."""
    def get(launcher: str = "single") -> SharedRun:
        def start() -> SharedRun:
            logs = tmp_path_factory.mktemp(f"tiny-{launcher}") / "logs"
            proc = run_train(["--config", TINY, "--log-dir", str(logs), "--run-name", "run"], launcher=launcher,
                             np=1 if launcher == "single" else 2)
            return SharedRun(proc, logs / "run")
        return shared(f"tiny-{launcher}", start, tmp_path_factory)
    return get


# 3 epochs of 12 steps of STOP_BATCH images in updates of 2 micro-batches, one thread per rank:
# the training that tests/test_preemption.py stops mid-update (a stop asked for mid-update waits
# for its end) and tests/test_reliability.py kills mid-checkpoint, each against the same run never
# interrupted. Half tiny.yaml's batch: the Slurm and preemption jobs train it about twenty times.
STOP_BATCH = 16
STOP_FLAGS = ["--config", TINY, "--epochs", "3", "--max-steps-per-epoch", "12", "--accumulation-steps", "2",
              "--batch-size", str(STOP_BATCH),
              "--threads-per-rank", "1"]


@pytest.fixture(scope="session")
def straight_run(tmp_path_factory):
    """``straight_run(sync)``: STOP_FLAGS straight through by 2 ranks under mpirun with that sync
    method, run folder ``.../straight``; once per session (shared), whichever test asks first."""
    def get(sync: str = "horovod") -> Path:
        def start() -> SharedRun:
            logs = tmp_path_factory.mktemp(f"straight-{sync}")
            proc = run_train([*STOP_FLAGS, "--sync", sync, "--log-dir", str(logs), "--run-name", "straight"],
                             launcher="mpirun", np=2)
            return SharedRun(proc, logs / "straight")
        return shared(f"straight-{sync}", start, tmp_path_factory).run
    return get


def md_table(markdown: str, heading: str) -> list[dict[str, str]]:
    """The first Markdown table after the line starting with ``heading``, rows as {header: cell}."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    cells = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            cells.append([c.strip() for c in line.strip()[1:-1].split("|")])
        elif cells:
            break
    header, _separator, *body = cells
    return [dict(zip(header, row)) for row in body]


def _netns_works() -> bool:
    if not shutil.which("ip"):
        return False
    return subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0


# Marks for tests that build a cluster of network namespaces (testbed.netcluster).
NEEDS_NETNS = [
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(os.geteuid() == 0 and not _netns_works(), reason="`ip netns` is unavailable here"),
]


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def shown(cell: str, exact: float, decimals: int, scale: float = 1.0) -> None:
    """A table cell is ``exact / scale`` rounded to ``decimals`` places."""
    assert abs(float(cell) - exact / scale) <= 0.5 * 10 ** -decimals + 1e-9, (cell, exact / scale)


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert len(data) > 8_000, f"{path} is suspiciously small ({len(data)} bytes)"
    image = np.asarray(Image.open(path).convert("RGB"), dtype=float)
    height, width, _ = image.shape
    assert width >= 600 and height >= 350, f"{path} is {width}x{height}"
    assert image.std() > 10, f"{path} looks blank"


def seconds_until_it_ends(proc: subprocess.Popen, act, timeout: float = 30) -> float:
    """Do ``act()``, then wait for ``proc`` to end: the seconds from the act to its end. A
    ``proc`` still running when the wait gives up (or the test fails) is killed, by its pid."""
    try:
        start = time.monotonic()
        act()
        proc.wait(timeout=timeout)
        return time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# `make test` runs the files on three workers (pytest-xdist, `-n 3 --dist loadfile`, a file's
# tests all on one worker, so that its module fixtures start once): these files take longest
# (`--durations`), and a worker that starts one last would run it alone while the others idle.
# They go first, in this order; the rest follow in collection order.
LONGEST_FIRST = ("test_slurm.py", "test_reliability.py", "test_wire_bytes.py", "test_preemption.py",
                 "test_async_ps.py", "test_stopping.py", "test_bad_inputs.py", "test_sync_methods.py",
                 "test_compression.py", "test_convergence.py")


def pytest_collection_modifyitems(items):
    place = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: place.get(item.path.name, len(place)))  # stable: each file's own order stays


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With HVD_TEST_CPU_LOG=FILE, append each test's CPU seconds (this process and every process
    it started and waited for: launchers, ranks) to FILE: where the suite's CPU goes, which wall
    times under several workers do not show."""
    path = os.environ.get("HVD_TEST_CPU_LOG")
    if not path:
        yield
        return
    import resource

    def cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    start, began = cpu(), time.monotonic()
    yield
    with open(path, "a") as log:
        log.write(json.dumps({"test": item.nodeid, "cpu_s": round(cpu() - start, 2),
                              "wall_s": round(time.monotonic() - began, 2)}) + "\n")


# ----------------------------------------------------------------------------- jobs two files read
def shared_job(key: str, argv, tmp_path_factory, env: dict[str, str] | None = None) -> SharedRun:
    """``argv(logs)``, the whole command of a job whose run folder is ``logs/run``, run once per
    session for ``key`` (``shared``), in run_train's environment; it must exit 0."""
    def start() -> SharedRun:
        logs = tmp_path_factory.mktemp(f"job-{key}") / "logs"
        full = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(env or {}))
        proc = subprocess.run(argv(logs), cwd=ROOT, env=full, text=True, capture_output=True, timeout=300)
        if proc.returncode != 0:
            raise AssertionError(f"{key} exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\n"
                                 f"stderr:\n{proc.stderr[-4000:]}")
        return SharedRun(proc, logs / "run")
    return shared(key, start, tmp_path_factory)


# launch/mpirun.sh and launch/horovodrun.sh, each given a hostfile with a comment and a blank line
# (test_launch.py: the script reads it and 2 ranks train), each starting a training another file
# checks: mpirun.sh the run of test_comm_options.py's frozen blocks, horovodrun.sh the run of
# test_horovod_tuning.py's tuning keys. One job each instead of two (~10 CPU-s of start-up).
SCRIPT_HOSTFILE = "# one machine\n\nlocalhost slots=2\n"
SCRIPT_JOBS = {
    "launch/mpirun.sh": ["--config", TINY, "--freeze", "2", "--epochs", "1"],
    "launch/horovodrun.sh": ["--config", TINY, "--epochs", "1", "--max-steps-per-epoch", "4", "--no-tensorboard",
                             "--horovod-cycle-time-ms", "7", "--horovod-fusion-threshold-mb", "16",
                             "--horovod-autotune", "true"],
}


@pytest.fixture(scope="session")
def script_run(tmp_path_factory):
    """``script_run(script)``: ``script -np 2 -hostfile HOSTS`` (SCRIPT_HOSTFILE) of the trainer
    with SCRIPT_JOBS[script], run folder ``.../logs/run``; once per session (shared)."""
    def get(script: str) -> SharedRun:
        def argv(logs: Path) -> list[str]:
            hosts = logs.parent / "hosts"
            hosts.write_text(SCRIPT_HOSTFILE)
            return [str(ROOT / script), "-np", "2", "-hostfile", str(hosts), *SCRIPT_JOBS[script],
                    "--log-dir", str(logs), "--run-name", "run"]
        return shared_job(f"script-{Path(script).stem}", argv, tmp_path_factory)
    return get


# tests/test_sync_methods.py's training (2 ranks of smallcnn on the digits, 4 epochs of 5 steps in
# updates of 2 micro-batches, one thread per rank, freeze: auto with a threshold no relative change
# reaches: every block freezes at the start of epoch 2, so every method re-wraps the model mid-run),
# each sync method's run under mpirun shared with tests/test_autofreeze.py (every averaging method
# freezes alike) and tests/test_overlap.py (mpi-gather-scatter exposes all its time).
AUTO_FREEZE = ["--freeze", "auto", "--freeze-auto-threshold", "100"]
SYNC_FLAGS = ["--config", TINY, "--model", "smallcnn", "--epochs", "4", "--max-steps-per-epoch", "5",
              "--accumulation-steps", "2", *AUTO_FREEZE, "--threads-per-rank", "1", "--checkpoint-every", "0"]


@pytest.fixture(scope="session")
def sync_run(tmp_path_factory):
    """``sync_run(method)``: SYNC_FLAGS with ``--sync method`` by 2 ranks under mpirun, run folder
    ``.../logs/run``; once per session (shared), whichever test asks first."""
    def get(method: str) -> SharedRun:
        def argv(logs: Path) -> list[str]:
            return [*launch_argv("mpirun", 2), *SYNC_FLAGS, "--sync", method, "--log-dir", str(logs), "--run-name", "run"]
        return shared_job(f"sync-{method}", argv, tmp_path_factory)
    return get


# configs/tiny.yaml for one epoch in one process, the progress bar on and TensorBoard off: the run
# that tests/test_output.py reads the progress lines of and tests/test_tensorboard.py the run
# folder of (neither setting touches what the other checks).
ONE_EPOCH_FLAGS = ["--config", TINY, "--epochs", "1", "--progress", "true", "--no-tensorboard"]


@pytest.fixture(scope="session")
def one_epoch_run(tmp_path_factory) -> SharedRun:
    """ONE_EPOCH_FLAGS by one process, run folder ``.../logs/run``; once per session (shared)."""
    def start() -> SharedRun:
        logs = tmp_path_factory.mktemp("one-epoch") / "logs"
        proc = run_train([*ONE_EPOCH_FLAGS, "--log-dir", str(logs), "--run-name", "run"])
        return SharedRun(proc, logs / "run")
    return shared("one-epoch", start, tmp_path_factory)
