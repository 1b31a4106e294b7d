"""Stop requests: SIGTERM or SIGUSR1 (what Slurm's ``--signal`` and preemption send) recorded as a
flag that the training loop reads at an update boundary (hvd_cifar/trainer/preemption.py says how
the ranks agree to stop there). No torch, no I/O: the handler only records the signal.

One stop may reach a rank more than once: ``pkill -USR1 -f hvd_cifar.train`` signals mpirun, which
passes the signal on, and the ranks themselves. So a stop signal within STOP_REPEAT_WINDOW_S of
the first is the same stop and changes nothing. One that comes later ends the process at once,
by the signal's default action, even while the rank waits inside a collective (the kernel acts,
not Python). Under Slurm every later stop signal is ignored instead: Slurm sends one preemption
or requeue more than once, and ends a job that does not stop with SIGKILL after KillWait anyway.
"""
from __future__ import annotations

import ctypes
import os
import signal
import threading

from hvd_cifar.core import launcher

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)   # what Slurm's --signal and preemption send
# Seconds after the first stop signal during which another is the same stop (a launcher passing
# on the signal its ranks also got arrives within milliseconds; a person's "now" comes later).
STOP_REPEAT_WINDOW_S = 2.0

_asked = {"signal": 0}  # set by the handler: the number of the first stop signal, 0 = none


def _handler(signum, frame) -> None:
    """Record the stop; further stop signals are ignored for STOP_REPEAT_WINDOW_S (for good under
    Slurm), then take their default action (the process ends at once). Nothing else: no I/O, no
    collective, no exception in the middle of a step."""
    _asked["signal"] = signum
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if not launcher.slurm_facts():
        timer = threading.Timer(STOP_REPEAT_WINDOW_S, _default_action_again)
        timer.daemon = True
        try:
            timer.start()
        except RuntimeError:  # the interpreter is shutting down: the process ends anyway
            pass


def _default_action_again() -> None:
    """From the window's timer thread, where Python may not set a handler: the stop signals back
    to their default action through libc, each one still ignored as the handler left it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.argtypes, libc.signal.restype = (ctypes.c_int, ctypes.c_void_p), ctypes.c_void_p
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_IGN:
            libc.signal(int(sig), None)  # NULL is SIG_DFL


def install() -> None:
    """Catch the stop signals from here on (call from the main thread)."""
    _asked["signal"] = 0
    for sig in STOP_SIGNALS:
        signal.signal(sig, _handler)


def asked() -> int:
    """The stop signal this process got (0: none)."""
    return _asked["signal"]


def end_if_asked() -> None:
    """End this process now, by the stop signal's default action, if one came. Where the ranks
    share no update boundary to agree on (mpi-async-ps), a stop cannot be a pause at one, so it
    ends the rank."""
    if asked():
        signal.signal(asked(), signal.SIG_DFL)
        os.kill(os.getpid(), asked())
