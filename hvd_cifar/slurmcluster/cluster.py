"""SlurmCluster: munged, slurmctld and N slurmd nodes on this machine, on the loopback or in the
hosts of a namespace cluster with shaped links (hosts.py), up until every node is idle, and down again by process id, also when the code using it fails half-way (a
context manager, an atexit hook, and SIGTERM/SIGHUP turned into an unwinding SystemExit:
netcluster.cleanup's, shared)."""
from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import signal
import subprocess
import time

from hvd_cifar.netcluster.cleanup import exit_on_signals, kill, restore_signals, signals_deferred
from hvd_cifar.slurmcluster import cleanup, daemons, hosts, jobs
from hvd_cifar.slurmcluster.daemons import SlurmError
from hvd_cifar.slurmcluster.layout import Layout


class SlurmCluster:
    """``with SlurmCluster(nodes=2) as cluster:`` then Slurm's commands with ``env=cluster.env()``
    (or the helpers in ``hvd_cifar.slurmcluster.jobs``). ``keep_dir``: leave the temp dir (logs,
    completion log) in place after ``down``, for a look at what happened. ``netcluster``: the nodes
    are the hosts of a NetCluster (``self.net``), links at ``rate`` (tc syntax; None: unshaped)."""

    def __init__(self, nodes: int = 2, cpus_per_node: int = 2, ready_timeout_s: float = 60,
                 keep_dir: bool = False, netcluster: bool = False, rate: str | None = None):
        if not 1 <= nodes <= 16:
            raise SlurmError(f"--nodes {nodes}: 1 to 16 nodes")
        self.hosts = hosts.place(nodes, netcluster, rate)
        self.net = self.hosts.net
        self.n_nodes, self.cpus_per_node = nodes, cpus_per_node
        self.ready_timeout_s, self.keep_dir = ready_timeout_s, keep_dir
        self.layout: Layout | None = None
        self.daemons: dict[str, subprocess.Popen] = {}
        self.namespaces: set[str] = set()   # the nodes' UTS namespaces
        self._old_signals: dict = {}
        self._up = False

    def __enter__(self) -> "SlurmCluster":
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    @property
    def nodes(self) -> list[str]:
        return self.layout.nodes if self.layout else []

    def env(self) -> dict[str, str]:
        """This process's environment with SLURM_CONF (and PATH: hosts.py) leading to the cluster."""
        return self.hosts.env(self.layout.env())

    def up(self) -> None:
        missing = daemons.missing_programs()
        if missing:
            raise SlurmError(f"not installed: {', '.join(missing)} (bash scripts/install.sh installs "
                             "slurm-wlm and munge)")
        if os.geteuid() != 0:
            raise SlurmError("the daemons run as root here: run as root")
        self._up = True
        self._old_signals = exit_on_signals()
        atexit.register(self.down)
        try:
            self._start()
        except BaseException:
            self.down()
            raise

    def _start(self) -> None:
        self.layout = layout = Layout.create(self.n_nodes)
        self.hosts.up(layout.bin)
        with open(layout.conf, "w") as f:
            f.write(layout.slurm_conf(self.cpus_per_node, self.hosts))
        self.daemons["munged"] = daemons.start_munged(layout)
        self._wait("munged", lambda: os.path.exists(layout.munge_socket), 10)
        self.daemons["slurmctld"] = daemons.start_slurmctld(layout, self.hosts)
        for node in layout.nodes:
            self._start_node(node)
        self._wait("slurmctld", self._all_idle, self.ready_timeout_s)

    def _start_node(self, node: str) -> None:
        """The node's slurmd, in a UTS namespace of its own, recorded for cleanup."""
        proc = self.daemons[f"slurmd-{node}"] = daemons.start_slurmd(self.layout, self.hosts, self.nodes.index(node))
        own = daemons.uts_namespace(os.getpid())
        self._wait(f"slurmd-{node}", lambda: daemons.uts_namespace(proc.pid) not in ("", own), 10)
        self.namespaces.add(daemons.uts_namespace(proc.pid))
        cleanup.record(self.layout.tmpdir, [p.pid for p in self.daemons.values()], self.namespaces)

    def kill_node(self, node: str) -> list[int]:
        """The node lost whole, as in a crash: SIGKILL to every process in its UTS namespace
        (its slurmd, slurmstepds and job tasks); their pids."""
        namespace = daemons.uts_namespace(self.daemons[f"slurmd-{node}"].pid)
        if not namespace:
            raise SlurmError(f"{node}: its slurmd is not running")
        victims = daemons.node_pids({namespace})
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return victims

    def restart_node(self, node: str, timeout_s: float = 60) -> None:
        """A node back after ``kill_node``: its slurmd started again, until Slurm has it idle
        (``ReturnToService=2``: a node that was down returns when it registers)."""
        self.daemons[f"slurmd-{node}"].wait(timeout=10)
        # A killed step's PMIx socket and folder stay in the node's spool (as on a real node's
        # disk, which a reboot does not clear): a step of the same id there cannot make them
        # again ("Address already in use", "File exists"), so the job's next run, whose step ids
        # start again at 0, would fail to launch on it. A reboot would clear its TmpFS.
        for stale in glob.glob(self.layout.path("spool", node, "*pmix.*")) + glob.glob(self.layout.path("tmp", node, "*")):
            shutil.rmtree(stale) if os.path.isdir(stale) and not os.path.islink(stale) else os.unlink(stale)
        self._start_node(node)
        self._wait(f"slurmd-{node}", lambda: self.node_states().get(node) == "idle", timeout_s)

    def _wait(self, what: str, ready, timeout_s: float) -> None:
        """Poll ``ready()`` until true; a daemon that died or a timeout is a SlurmError naming
        the daemon and the last lines of its log."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [name for name, p in self.daemons.items() if p.poll() is not None]
            if dead:
                raise SlurmError(f"{dead[0]} exited ({self.daemons[dead[0]].returncode}): "
                                 f"{daemons.log_tail(self.layout, dead[0])}")
            if time.monotonic() > deadline:
                raise SlurmError(f"{what} not ready after {timeout_s:.0f} s: {self.node_states() or ''} "
                                 f"{daemons.log_tail(self.layout, what)}")
            time.sleep(0.2)

    def stepds(self, job_id: str) -> list[int]:
        """The slurmstepd processes of a job still on the nodes (titled ``slurmstepd: [JOB.STEP]``)."""
        found = []
        for pid in daemons.node_pids(self.namespaces):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    title = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if title.startswith(f"slurmstepd: [{job_id}."):
                found.append(pid)
        return found

    def start_now(self, job_id: str, timeout_s: float = 120) -> None:
        """Let a requeued job start at once (``jobs.start_now``), but only once nothing of its
        previous run can still reach it: every slurmstepd of that run has exited, and
        slurmctld holds no message to a node that it will try again (``jobs.agent_queue``).

        Slurm holds a requeued job ~120 s for this. A message about the old run names the job
        and step only, not the run; handled once the next run has begun, it ends that run.
        Seen here: a slurmstepd's report of its end (REQUEST_COMPLETE_BATCH_SCRIPT, _JOB_STEP)
        handled late on a loaded machine, or timed out and sent again 15 s later (the batch
        script's exit 4 from the first run: the job FAILED); and slurmctld's order to end a
        step whose rank was lost (srun --kill-on-bad-exit): slurmd answers it only when the
        surviving ranks are gone, which takes KillWait (30 s: they ignore SIGTERM while blocked
        in a collective), so it times out after MessageTimeout (10 s) and slurmctld sends it
        again 60 s later, then ending the new run's step of the same number (docs/SLURM.md)."""
        began = time.monotonic()
        deadline = began + timeout_s
        while (left := self.stepds(job_id)) or jobs.agent_queue(self.env()):
            if time.monotonic() > deadline:
                raise SlurmError(f"job {job_id}: its previous run's slurmstepd(s) {left} still running, or "
                                 f"slurmctld still has messages to send again, after {timeout_s:.0f} s")
            time.sleep(0.3)
        # A run started in the second of the requeue is refused ("Killing non-startable batch
        # JobId=J: Job credential revoked": the requeue revokes the job's credentials up to
        # that second). The job was requeued before this call: 1.1 s after it is a later second.
        time.sleep(max(0.0, began + 1.1 - time.monotonic()))
        jobs.start_now(job_id, self.env())

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo says it (idle, allocated, down, ...); {} if slurmctld does not answer."""
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env(), capture_output=True,
                              text=True, timeout=30)
        if proc.returncode != 0:
            return {}
        return dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)

    def _all_idle(self) -> bool:
        states = self.node_states()
        return sorted(states) == sorted(self.nodes) and all(s == "idle" for s in states.values())

    def down(self) -> None:
        """Stop everything this cluster started, by process id: the nodes' processes (slurmd,
        slurmstepd, job tasks: everything in the nodes' UTS namespaces), then slurmctld and
        munged; SIGTERM, then SIGKILL after a few seconds (slurmd may ignore SIGTERM while it
        retries registering). Then the namespace cluster, if any, and the temp dir. Safe to call twice."""
        if not self._up:
            return
        self._up = False
        with signals_deferred():
            node_procs = [p.pid for name, p in self.daemons.items() if name.startswith("slurmd-")]
            kill(sorted(set(node_procs + daemons.node_pids(self.namespaces))), grace_s=3.0)
            kill([p.pid for name, p in self.daemons.items() if not name.startswith("slurmd-")], grace_s=3.0)
            for proc in self.daemons.values():
                try:
                    proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
            self.hosts.down()
            if self.layout and not self.keep_dir:
                shutil.rmtree(self.layout.tmpdir, ignore_errors=True)
        restore_signals(self._old_signals)
        atexit.unregister(self.down)
