"""SlurmCluster: munged, slurmctld and N slurmd nodes on this machine, on the loopback or in the
hosts of a namespace cluster with shaped links (hosts.py), up until every node is idle, and down again by process id, also when the code using it fails half-way (a
context manager, an atexit hook, and SIGTERM/SIGHUP turned into an unwinding SystemExit:
netcluster.cleanup's, shared)."""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import time

from testbed.netcluster.cleanup import exit_on_signals, kill, restore_signals, signals_deferred
from testbed.slurmcluster import cleanup, daemons, hosts, jobs
from testbed.slurmcluster.daemons import SlurmError
from testbed.slurmcluster.layout import Layout


class SlurmCluster:
    """``with SlurmCluster(nodes=2) as cluster:`` then Slurm's commands with ``env=cluster.env()``
    (or the helpers in ``testbed.slurmcluster.jobs``). ``keep_dir``: leave the temp dir (logs,
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
        return daemons.kill_all(daemons.node_pids({namespace}))

    def restart_node(self, node: str, timeout_s: float = 60) -> None:
        """A node back after ``kill_node``: its slurmd started again, until Slurm has it idle
        (``ReturnToService=2``: a node that was down returns when it registers)."""
        self.daemons[f"slurmd-{node}"].wait(timeout=10)
        daemons.clear_step_files(self.layout, node)  # as a reboot would
        self._start_node(node)
        self._wait(f"slurmd-{node}", lambda: jobs.node_states(self.env()).get(node) == "idle", timeout_s)

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
                raise SlurmError(f"{what} not ready after {timeout_s:.0f} s: {jobs.node_states(self.env()) or ''} "
                                 f"{daemons.log_tail(self.layout, what)}")
            time.sleep(0.2)

    def start_now(self, job_id: str, timeout_s: float = 120) -> None:
        """Let a requeued job start at once (``jobs.start_now``), but only once nothing of its
        previous run can still reach it: every slurmstepd of that run has exited, and
        slurmctld holds no message to a node that it will try again (``jobs.agent_queue``).
        Slurm holds a requeued job ~120 s for this: a late message about the old run names the
        job and step only, and ends the next run (docs/SLURM.md, "Why a requeued run was
        cancelled")."""
        began = time.monotonic()
        deadline = began + timeout_s
        while (left := daemons.step_pids(self.namespaces, job_id)) or jobs.agent_queue(self.env()):
            if time.monotonic() > deadline:
                raise SlurmError(f"job {job_id}: its previous run's slurmstepd(s) {left} still running, or "
                                 f"slurmctld still has messages to send again, after {timeout_s:.0f} s")
            time.sleep(0.3)
        # A run started in the second of the requeue is refused ("Killing non-startable batch
        # JobId=J: Job credential revoked": the requeue revokes the job's credentials up to
        # that second). The job was requeued before this call: 1.1 s after it is a later second.
        time.sleep(max(0.0, began + 1.1 - time.monotonic()))
        jobs.start_now(job_id, self.env())

    def _all_idle(self) -> bool:
        states = jobs.node_states(self.env())
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
