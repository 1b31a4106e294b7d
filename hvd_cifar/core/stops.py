"""Stop requests: SIGTERM or SIGUSR1 (what Slurm's ``--signal`` and preemption send) recorded as a
flag that the training loop reads at an update boundary (hvd_cifar/trainer/preemption.py says how
the ranks agree to stop there). No torch, no I/O: the handler only records the signal.
"""
from __future__ import annotations

import os
import signal

from hvd_cifar.core import launcher

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)   # what Slurm's --signal and preemption send

_asked = {"signal": 0}  # set by the handler: the number of the first stop signal, 0 = none
_after_first = {"action": signal.SIG_DFL}  # what a later stop signal does: end (SIG_IGN under Slurm)


def _handler(signum, frame) -> None:
    """Record the stop and hand the next stop signal back to its default action (the process
    ends at once); nothing else: no I/O, no collective, no exception in the middle of a step."""
    _asked["signal"] = signum
    for sig in STOP_SIGNALS:
        signal.signal(sig, _after_first["action"])


def install() -> None:
    """Catch the stop signals from here on (call from the main thread)."""
    _asked["signal"] = 0
    _after_first["action"] = signal.SIG_IGN if launcher.slurm_facts() else signal.SIG_DFL
    for sig in STOP_SIGNALS:
        signal.signal(sig, _handler)


def asked() -> int:
    """The stop signal this process got (0: none)."""
    return _asked["signal"]


def end_if_asked() -> None:
    """End this process now, by the stop signal's default action (which the handler has already
    handed the signal back to), if one came. Where the ranks share no update boundary to agree
    on (mpi-async-ps), a stop cannot be a pause at one, so it ends the rank."""
    if asked():
        os.kill(os.getpid(), asked())
