"""Taking a cluster down, and what a harness that died left behind (``python -m
testbed.netcluster down``): stopping processes, deleting namespaces, temp dirs and the /run
folders a harness made, the lock that serialises harnesses, and the signals that must not cut a
teardown short (SIGTERM and SIGHUP unwind ``with NetCluster(...)``; all three wait for teardown)."""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from typing import Sequence

from testbed.netcluster.system import PREFIX, list_namespaces, netns_pids, run

NETNS_DIR = "/run/netns"
SSHD_DIR = "/run/sshd"           # sshd's privilege-separation chroot; must exist
_NAME = re.compile(rf"^{PREFIX}-(?P<pid>\d+)-(?P<n>\d+)(-|$)")


@contextlib.contextmanager
def global_lock():
    """Serialise set-up and teardown across harness instances (subnet choice, shared /run
    folders). flock on /run itself: nothing to create, nothing to leave behind."""
    fd = os.open("/run", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def signals_deferred():
    """Teardown must finish: Ctrl-C or SIGTERM arriving meanwhile is delivered afterwards."""
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through `with NetCluster(...)`, which tears down


def exit_on_signals() -> dict[int, object]:
    """SIGTERM and SIGHUP raise SystemExit where nothing handles them yet (main thread only);
    returns the handlers replaced, for ``restore_signals``."""
    old: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) == signal.SIG_DFL:
                old[sig] = signal.signal(sig, _raise_exit)
    return old


def restore_signals(old: dict[int, object]) -> None:
    for sig, handler in old.items():
        if signal.getsignal(sig) is _raise_exit:
            signal.signal(sig, handler)
    old.clear()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state == "Z":
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # our own child: reap it
        return False
    return True


def kill(pids: Sequence[int], grace_s: float = 3.0) -> None:
    """SIGTERM, then SIGKILL what is still there after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        pids = [p for p in pids if _alive(p)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = [p for p in pids if _alive(p)]
        if not pids:
            return


def claim_run_dirs() -> list[str]:
    """Make sshd's /run folder; returns the /run folders that did not exist before (``ip netns
    add`` makes /run/netns), for ``remove_run_dirs``. Caller holds the global lock."""
    created = [d for d in (NETNS_DIR, SSHD_DIR) if not os.path.isdir(d)]
    os.makedirs(SSHD_DIR, mode=0o755, exist_ok=True)
    return created


def remove_run_dirs(created: Sequence[str]) -> None:
    """Remove /run/netns and /run/sshd if this harness created them and no harness (nor any
    other namespace, for /run/netns) uses them now. Caller holds the global lock."""
    left = list_namespaces()
    if SSHD_DIR in created and not any(ns.startswith(PREFIX + "-") for ns in left):
        with contextlib.suppress(OSError):
            os.rmdir(SSHD_DIR)
    if NETNS_DIR in created and not left and os.path.isdir(NETNS_DIR) and not os.listdir(NETNS_DIR):
        run(["umount", NETNS_DIR], check=False)  # `ip netns add` made it a mount point
        with contextlib.suppress(OSError):
            os.rmdir(NETNS_DIR)


def remove_cluster(namespaces: Sequence[str], daemons: Sequence[subprocess.Popen],
                   created_run_dirs: Sequence[str], tmpdir: str) -> None:
    """Kill every process in ``namespaces`` and the ``daemons``, delete the namespaces (their
    veths and bridge go with them), the /run folders made for them and ``tmpdir``."""
    existing = set(list_namespaces())
    kill([pid for ns in namespaces if ns in existing for pid in netns_pids(ns)] + [p.pid for p in daemons])
    for p in daemons:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=2)
    with global_lock():
        for ns in namespaces:
            if ns in existing:
                run(["ip", "netns", "del", ns], check=False)
        remove_run_dirs(created_run_dirs)
    if tmpdir:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_leftovers(everything: bool = False) -> list[str]:
    """Remove namespaces (with their processes) and temp dirs named ``hvdc-PID-N...`` whose
    harness process PID is gone (all of them with ``everything``). Returns what was removed."""
    removed = []
    with global_lock():
        for ns in list_namespaces():
            match = _NAME.match(ns)
            if match and (everything or not _pid_alive(int(match["pid"]))):
                kill(netns_pids(ns))
                run(["ip", "netns", "del", ns], check=False)
                removed.append(f"namespace {ns}")
    for entry in sorted(os.listdir("/tmp")):
        match = _NAME.match(entry)
        path = os.path.join("/tmp", entry)
        if match and os.path.isdir(path) and (everything or not _pid_alive(int(match["pid"]))):
            stray = run(["pgrep", "-f", path], check=False).stdout.split()
            kill([int(p) for p in stray if int(p) != os.getpid()])
            shutil.rmtree(path, ignore_errors=True)
            removed.append(f"temp dir {path}")
    return removed
