"""One job per run folder.

Two jobs training into one run folder (a requeued job while a stale one still runs, or the
same ``--resume`` typed twice) would both write its checkpoints, metrics and events. So rank 0
holds a lock on ``RUN_DIR/run.lock`` for as long as its process trains there, and a second job
that finds the lock held stops with one line naming the host and process that hold it.

The lock is a POSIX record lock (``fcntl.lockf``): the kernel drops it when its holder dies,
however it dies, so a crashed job never blocks the next one, and NFS carries such locks
between hosts (its lock service releases those of a host that went down once the host's lease
runs out). The file itself only tells people who holds the lock: ``host H pid P since T``.
Where the file system cannot lock at all, the run goes on unguarded rather than not at all; a
folder where the lock file cannot even be opened is one no job can write, and the run's first
write there says so in its own line.
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import time

from hvd_cifar.core.files import RunError

LOCK_NAME = "run.lock"
_held: dict[str, int] = {}  # run folder -> open descriptor holding its lock (this process)


def hold(run_dir: str) -> None:
    """Take the run folder's lock for this process, or raise RunError naming its holder."""
    run_dir = os.path.abspath(run_dir)
    if run_dir in _held:
        return
    path = os.path.join(run_dir, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # less the umask
    except OSError:
        return  # a folder no one can write (read-only, no permission): its first write says so
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)  # (closing any descriptor of the file would drop a lock this process held)
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            raise RunError(f"run folder {run_dir} is in use by another job ({holder(run_dir)}): one job "
                           f"per run folder; wait for it to end, or stop it") from None
        return  # no locks on this file system (ENOLCK, EINVAL): unguarded
    stamp = f"host {socket.gethostname()} pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, stamp.encode(), 0)
    except OSError:
        pass  # the lock holds without its note (a full disk is met, and said, at the next write)
    _held[run_dir] = fd


def holder(run_dir: str) -> str:
    """Who holds the lock, as its file says ('holder unknown' when it says nothing yet)."""
    try:
        with open(os.path.join(run_dir, LOCK_NAME), encoding="utf-8", errors="replace") as f:
            return f.readline().strip() or "holder unknown"
    except OSError:
        return "holder unknown"


def release_all() -> None:
    """Let go of every run folder this process holds (at the end of a run in this process)."""
    while _held:
        _, fd = _held.popitem()
        os.close(fd)
