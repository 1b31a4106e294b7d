"""The launcher command lines, in one place: every horovodrun or mpirun argv that the tests, the
benchmarks, ``hvd_cifar.bench`` and ``testbed.netcluster`` start is built here.

    argv("mpirun", 2)       # mpirun [--allow-run-as-root] --oversubscribe -np 2 -bind-to none
                            #        -map-by slot PYTHON -m hvd_cifar.train
    argv("horovodrun-gloo", 2, program=[PYTHON, "worker.py"])
    horovodrun(4, program, hosts="10.0.0.1:1,10.0.0.2:1", gloo=False, options=["-p", "22"])
    mpirun(4, program, hostfile="hosts", oversubscribe=False, mca={"btl": "tcp,self"})

    python -m hvd_cifar.launch.commands mpirun-flags   # Horovod's Open MPI flags, one per line
                                                 # (what launch/mpirun.sh hands to mpirun)
    python -m hvd_cifar.launch.commands exec mpirun ...  # mpirun ..., stopped when its parent dies

Launchers by name: ``single`` (no launcher, one process), ``horovodrun`` (on this machine,
``-H localhost:N``), ``horovodrun-gloo`` (the same with Horovod's Gloo controller) and ``mpirun``
(Open MPI on this machine). Arguments are lists, never shell strings.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from typing import Mapping, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the project root
LAUNCHERS = ("single", "horovodrun", "horovodrun-gloo", "mpirun")

# The flags Horovod's documentation gives for Open MPI (docs/mpi.rst, "Running Horovod with Open MPI"):
MAP_FLAGS = ("-bind-to", "none", "-map-by", "slot")  # each rank uses its threads, not one pinned core
EXPORTED = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "NCCL_DEBUG", "HOROVOD_TIMELINE")  # -x: to remote ranks
TRANSPORT_FLAGS = ("-mca", "pml", "ob1", "-mca", "btl", "^openib")  # TCP and shared memory, no InfiniBand verbs

PR_SET_PDEATHSIG = 1               # <linux/prctl.h>
PARENT_VAR = "HVD_CIFAR_LAUNCH_PARENT"  # the launch scripts' $PPID: who started the launcher


def train_program(python: str = sys.executable) -> list[str]:
    """What every rank runs by default: the trainer."""
    return [python, "-m", "hvd_cifar.train"]


def horovodrun_path(python: str = sys.executable) -> str:
    """The horovodrun beside ``python`` (the venv's own), else the one on PATH."""
    beside = os.path.join(os.path.dirname(python), "horovodrun")
    return beside if os.access(beside, os.X_OK) else "horovodrun"


def as_root() -> list[str]:
    """Open MPI refuses to start as root without this flag."""
    return ["--allow-run-as-root"] if os.geteuid() == 0 else []


def recommended_mpirun_flags(env: Mapping[str, str] = os.environ) -> list[str]:
    """Horovod's Open MPI flags, as launch/mpirun.sh gives them to every job: the variables of
    EXPORTED that ``env`` (mpirun's environment) sets (mpirun warns of every one it lacks)."""
    exported = [arg for name in EXPORTED if name in env for arg in ("-x", name)]
    return [*MAP_FLAGS, *exported, *TRANSPORT_FLAGS]


def horovodrun(np: int, program: Sequence[str], *, hosts: str | None = None, gloo: bool | None = None,
               elastic: tuple[int, int, str] | None = None, options: Sequence[str] = (),
               executable: str | None = None) -> list[str]:
    """horovodrun starting ``np`` ranks of ``program``.

    hosts: ``-H``'s ``HOST:SLOTS,...`` (default ``localhost:np``). gloo: True for ``--gloo``,
    False for ``--mpi``, None for horovodrun's own choice. elastic: ``(min_np, max_np,
    discovery_script)``, Horovod's elastic mode, whose hosts come from the script instead of -H.
    options: more horovodrun flags. executable: the horovodrun (default: the venv's).
    """
    cmd = [executable or horovodrun_path(), "-np", str(np)]
    if elastic:
        min_np, max_np, discovery_script = elastic
        cmd += ["--min-np", str(min_np), "--max-np", str(max_np), "--host-discovery-script", discovery_script]
    else:
        cmd += ["-H", hosts or f"localhost:{np}"]
    if gloo is not None:
        cmd.append("--gloo" if gloo else "--mpi")
    return [*cmd, *options, *program]


def mpirun(np: int, program: Sequence[str], *, hostfile: str | None = None, oversubscribe: bool = True,
           export: Sequence[str] = (), mca: Mapping[str, str] | None = None,
           options: Sequence[str] = ()) -> list[str]:
    """Open MPI's mpirun starting ``np`` ranks of ``program``, bound to no core.

    hostfile: an Open MPI hostfile (default: this machine). oversubscribe: allow more ranks than
    cores (on by default: one machine is often asked for more). export: ``-x`` arguments (``NAME``
    or ``NAME=VALUE``). mca: ``-mca KEY VALUE`` parameters. options: more mpirun flags.
    """
    cmd = ["mpirun", *as_root(), *(["--oversubscribe"] if oversubscribe else []), "-np", str(np)]
    if hostfile:
        cmd += ["--hostfile", hostfile]
    cmd += MAP_FLAGS
    cmd += [arg for name in export for arg in ("-x", name)]
    cmd += [arg for key, value in (mca or {}).items() for arg in ("-mca", key, value)]
    return [*cmd, *options, *program]


def argv(launcher: str, np: int, program: Sequence[str] | None = None, **options) -> list[str]:
    """The whole command that starts ``np`` ranks of ``program`` (default: the trainer, whose
    flags then follow) with the launcher named ``launcher`` on this machine. ``options`` go to
    horovodrun() or mpirun()."""
    program = train_program() if program is None else list(program)
    if launcher == "single":
        return program
    if launcher == "horovodrun":
        return horovodrun(np, program, **options)
    if launcher == "horovodrun-gloo":
        return horovodrun(np, program, gloo=True, **options)
    if launcher == "mpirun":
        return mpirun(np, program, **options)
    raise ValueError(f"unknown launcher {launcher!r} (one of {', '.join(LAUNCHERS)})")


def script(launcher: str, np: int, hostfile: str, options: Sequence[str] = ()) -> list[str]:
    """``launch/horovodrun.sh`` or ``launch/mpirun.sh`` (``launcher``) with a hostfile, which the
    script checks first; the trainer's flags follow."""
    return [os.path.join(ROOT, "launch", f"{launcher}.sh"), "-np", str(np), "-hostfile", hostfile, *options]


def die_with_parent(parent: int | None = None) -> None:
    """Have the kernel send this process SIGTERM when its parent dies, also after it execs
    another program (the flag survives execve). A launcher whose starter is gone (a killed
    supervisor, a closed session, a scheduler's step) then stops its job instead of running on
    with nobody to stop it: mpirun and horovodrun's driver both stop their ranks on SIGTERM.

    ``parent``: the pid that started this process, when a script knows it (``$PPID``); if that
    parent died before this call, the kernel never sends the signal, so this process sends it
    to itself. Linux only (elsewhere nothing happens). The kernel watches the parent *thread*:
    a program that starts a launcher from a thread that then ends stops the launcher too."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        return  # best effort: without it the job is only as safe as before
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def parent_from_env() -> int | None:
    """The launch script's parent (``PARENT_VAR``), taken out of the environment so that the
    ranks, which inherit it, never read a pid that means nothing to them."""
    value = os.environ.pop(PARENT_VAR, "")
    return int(value) if value.isdigit() else None


def exec_guarded(command: Sequence[str]) -> None:
    """Become ``command`` (exec: signals sent to this pid reach it), stopped when the parent dies."""
    die_with_parent(parent_from_env())
    os.execvp(command[0], list(command))


USAGE = "usage: python -m hvd_cifar.launch.commands mpirun-flags | exec PROGRAM [ARGS...]"


def main(argv_: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv_ is None else argv_
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE)
        print("  mpirun-flags            the Open MPI flags every hvd_cifar launch adds, one per line")
        print("  exec PROGRAM [ARGS...]  run PROGRAM in this process, stopped when the launching parent dies")
        return 0
    if args[:1] == ["exec"] and len(args) > 1:
        try:
            exec_guarded(args[1:])
        except OSError as exc:  # e.g. no mpirun on PATH
            print(f"hvd_cifar: error: cannot run {args[1]} ({exc.strerror})", file=sys.stderr)
            return 127
    if args != ["mpirun-flags"]:
        print(USAGE, file=sys.stderr)
        return 2
    sys.stdout.write("".join(flag + "\n" for flag in recommended_mpirun_flags()))
    return 0


# ----------------------------------------------------------------------------- a launched job's process
STOP_GRACE_S = 10.0  # from SIGTERM to SIGKILL when a job outlives its timeout


def job_env(**extra: str) -> dict:
    """This process's environment for a job, with unbuffered Python output and ``extra``."""
    return dict(os.environ, PYTHONUNBUFFERED="1", **extra)


def start(argv: Sequence[str], **popen_options) -> subprocess.Popen:
    """Start a job (a launcher and the ranks it starts) in its own session, so that ``stop``
    reaches all of it, and stopped by the kernel if this process dies without stopping it
    (SIGKILL, a crash): ``die_with_parent``, set in the child before it execs."""
    return subprocess.Popen(list(argv), start_new_session=True, preexec_fn=die_with_parent, **popen_options)


class Terminated(SystemExit):
    """SIGTERM or SIGHUP, raised where this process was: the ``except BaseException`` around a
    job's wait stops the job on the way out, and the process exits 128 + the signal's number."""


@contextlib.contextmanager
def terminate_raises():
    """While inside, SIGTERM and SIGHUP raise ``Terminated`` in the main thread instead of ending
    the process on the spot (Python's default for them), which would leave a job started in its
    own session running with nobody to stop it. Elsewhere than the main thread: no change."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum, frame):
        raise Terminated(128 + signum)

    previous = {signum: signal.signal(signum, raise_terminated) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def stop(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to the job's process group (its launcher and every rank it started), SIGKILL to
    what is left after ``grace_s``."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
            return


if __name__ == "__main__":
    sys.exit(main())
