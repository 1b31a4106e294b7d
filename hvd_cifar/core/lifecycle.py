"""A rank's life as a process: how it ends, and how one rank's fault ends the job.

Nothing here communicates; it ends processes (under MPI through MPI_Abort, when the launcher
was one: core.launcher), so the entry point can use it before any sync method exists and after
the last one has closed.
"""
from __future__ import annotations

import os
import sys

from hvd_cifar.core.launcher import launched_by_mpi

# What a collective raises on a rank whose peer died or stopped: the fault is elsewhere, and that
# rank's own message says what it was.
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Horovod has been shut down",
              "Broken pipe")


def lost_peer(exc: BaseException) -> bool:
    """Whether ``exc`` only says that another rank went away (so this rank need not report it)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & {"HorovodInternalError", "DistNetworkError"}:
        return True
    return isinstance(exc, RuntimeError) and any(text in str(exc) for text in _PEER_LOST)


def abort_job(code: int = 1) -> None:
    """End every rank of the job now. Under MPI, MPI_Abort takes the others down with this one;
    under horovodrun's Gloo launcher, the driver stops the job when one rank exits non-zero."""
    sys.stdout.flush()
    sys.stderr.flush()
    if launched_by_mpi():
        try:
            from mpi4py import MPI
            MPI.COMM_WORLD.Abort(code)
        except Exception:  # noqa: BLE001 - falling through to a hard exit is the point
            pass
    os._exit(code)


def exit_process(code: int, threads_left_running: bool = False) -> None:
    """End this process with ``code`` after a run, once every file is written and closed.

    Normally that is ``sys.exit``. ``threads_left_running`` is a sync method's own statement
    (``SyncMethod.leaves_threads_running``) that its close() leaves native threads behind: once
    a DistributedDataParallel wrapper has been built, torch keeps the Gloo process group, and its
    worker threads, alive past ``destroy_process_group``. A worker thread still letting go of its
    last collective's tensors when the interpreter starts shutting down is stopped by Python
    (``pthread_exit``) inside torch's non-throwing code, and the process aborts with SIGABRT
    after a run that succeeded (seen about once in 25 runs on 2 busy cores). So then skip the
    interpreter's shutdown: flush, finalize MPI if this process uses it, and exit directly."""
    if not threads_left_running:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    if "mpi4py.MPI" in sys.modules:
        from mpi4py import MPI
        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()
    os._exit(code)
