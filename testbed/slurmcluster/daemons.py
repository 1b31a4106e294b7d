"""The daemons of a Slurm cluster on this machine, started from Debian's packages in the
foreground (so that their process ids are ours): munged, slurmctld, and one slurmd per node,
where hosts.py puts them, each slurmd in a UTS namespace of its own so that every node has its
own hostname (Open MPI's shared-memory transport crashes when ranks of two nodes share one). Everything a node starts
(slurmstepd, the job's tasks) stays in its namespace: ``node_pids`` finds it there."""
from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import shutil
import signal
import subprocess

from hvd_cifar.launch import slurm
from testbed.netcluster.system import ClusterError
from testbed.slurmcluster.hosts import Where
from testbed.slurmcluster.layout import Layout

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "unshare")


class SlurmError(ClusterError, slurm.SlurmError):
    """Starting or using the Slurm cluster failed; the message says which step and why."""


def missing_programs() -> list[str]:
    """The programs this needs that are not installed (scripts/install.sh installs them)."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [p for p in PROGRAMS if not shutil.which(p, path=path)]


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In a child before exec: the kernel sends ``sig`` when the harness dies, even by SIGKILL
    (the flag survives exec; the processes a daemon forks do not inherit it: ``down`` finds those)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def _start(argv: list[str], layout: Layout, name: str) -> subprocess.Popen:
    out = open(layout.path("log", f"{name}.out"), "ab")
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=layout.env(), cwd=layout.tmpdir, start_new_session=True,
                                preexec_fn=die_with_parent)
    finally:
        out.close()


def start_munged(layout: Layout) -> subprocess.Popen:
    """munged with a fresh key; its socket, pid, seed and log files in the cluster's munge/."""
    key = layout.path("munge", "munge.key")
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(1024))
    return _start(["munged", "--foreground", "--force", f"--socket={layout.munge_socket}", f"--key-file={key}",
                   f"--pid-file={layout.path('munge', 'munged.pid')}",
                   f"--seed-file={layout.path('munge', 'munged.seed')}",
                   f"--log-file={layout.log('munged')}"], layout, "munged")


def start_slurmctld(layout: Layout, where: Where) -> subprocess.Popen:
    # -i: start without the state of an earlier controller (there is none: a fresh folder)
    return _start(where.ctld_argv(["slurmctld", "-D", "-i", "-f", layout.conf]), layout, "slurmctld")


def start_slurmd(layout: Layout, where: Where, index: int) -> subprocess.Popen:
    """slurmd for node ``index`` (multiple-slurmd mode: -N) where ``where`` puts it, in a UTS
    namespace of its own; the wrappers exec, so the Popen's pid is slurmd's."""
    node = layout.nodes[index]
    argv = where.slurmd_argv(index, node, ["slurmd", "-D", "-N", node, "-f", layout.conf])
    return _start(argv, layout, f"slurmd-{node}")


def uts_namespace(pid: int) -> str:
    """The UTS namespace a process is in (``uts:[INODE]``), "" if it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/uts")
    except OSError:
        return ""


def node_pids(namespaces: set[str]) -> list[int]:
    """Every process in one of ``namespaces`` (UTS namespaces of the cluster's nodes): the
    slurmd, its slurmstepds and the tasks of the jobs they run."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and uts_namespace(int(entry)) in namespaces:
            found.append(int(entry))
    return found


def log_tail(layout: Layout, name: str, lines: int = 3) -> str:
    """The last lines of a daemon's log (its own log file, else what it printed)."""
    for path in (layout.log(name), layout.path("log", f"{name}.out")):
        try:
            with open(path, errors="replace") as f:
                text = f.read().strip().splitlines()
        except OSError:
            continue
        if text:
            return " | ".join(text[-lines:])
    return "no log"


def step_pids(namespaces: set[str], job_id: str) -> list[int]:
    """The slurmstepd processes of a job in ``namespaces`` (titled ``slurmstepd: [JOB.STEP]``)."""
    return [pid for pid in node_pids(namespaces) if cmdline(pid).startswith(f"slurmstepd: [{job_id}.")]


def cmdline(pid: int) -> str:
    """A process's command line (or title), arguments joined by spaces; "" if it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill_all(pids: list[int]) -> list[int]:
    """SIGKILL to each, as a crash would end them; the pids."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def clear_step_files(layout: Layout, node: str) -> None:
    """What a killed step leaves on its node and a restarted slurmd does not clear: its PMIx
    socket and folder in the spool (``stepd.slurm.pmix.J.S``, ``pmix.J.S``; a real node's disk
    keeps them over a reboot), where a step of the same job and number (a requeued run's: step
    ids start again at 0) cannot make them again ("Address already in use", "File exists") and
    fails to launch; and its TmpFS, which a reboot clears."""
    for stale in glob.glob(layout.path("spool", node, "*pmix.*")) + glob.glob(layout.path("tmp", node, "*")):
        if os.path.isdir(stale) and not os.path.islink(stale):
            shutil.rmtree(stale)
        else:
            os.unlink(stale)
