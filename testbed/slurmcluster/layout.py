"""Where a Slurm cluster on this machine keeps everything (one temp dir of its own: config,
spool, state, logs, munge key and socket) and the slurm.conf that ties it together: one
slurmctld and N slurmd in Slurm's multiple-slurmd mode, each on a port of its own, at the
addresses hosts.py gives (the loopback, or a namespace cluster's hosts)."""
from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from dataclasses import dataclass, field

from testbed.slurmcluster.hosts import Where

PREFIX = "hvds"            # temp dirs are /tmp/hvds-PID-XXXX (PID: the harness), for `down`
PARTITION = "batch"        # the default partition; its jobs are requeued when preempted
URGENT = "urgent"          # the same nodes, a higher PriorityTier: its jobs preempt batch's


def free_ports(n: int) -> list[int]:
    """``n`` TCP ports free on the loopback now (held open together, so all distinct)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


@dataclass
class Layout:
    """The cluster's names and paths; ``create`` makes the folders."""
    nodes: list[str]
    tmpdir: str = ""
    ports: list[int] = field(default_factory=list)   # slurmctld's, then one per node

    @classmethod
    def create(cls, n_nodes: int) -> "Layout":
        tmpdir = tempfile.mkdtemp(prefix=f"{PREFIX}-{os.getpid()}-")
        os.chmod(tmpdir, 0o755)  # munge's socket must be reachable: every folder above it executable
        layout = cls([f"n{i + 1}" for i in range(n_nodes)], tmpdir, free_ports(n_nodes + 1))
        for sub in ("munge", "state", "log", "run", *(f"spool/{n}" for n in layout.nodes),
                    *(f"tmp/{n}" for n in layout.nodes)):
            os.makedirs(layout.path(sub), mode=0o755, exist_ok=True)
        return layout

    def path(self, *parts: str) -> str:
        return os.path.join(self.tmpdir, *parts)

    @property
    def bin(self) -> str:
        return self.path("bin")        # client wrappers, when the cluster has any (hosts.py)

    @property
    def conf(self) -> str:
        return self.path("slurm.conf")

    @property
    def munge_socket(self) -> str:
        return self.path("munge", "munge.socket")

    @property
    def jobcomp(self) -> str:
        return self.path("jobcomp.txt")

    def log(self, daemon: str) -> str:
        return self.path("log", f"{daemon}.log")

    def env(self) -> dict[str, str]:
        """What a client (sbatch, squeue, scontrol, sacct -c) needs to reach this cluster."""
        return {**os.environ, "SLURM_CONF": self.conf}

    def slurm_conf(self, cpus_per_node: int, where: Where) -> str:
        nodes = ",".join(self.nodes)
        lines = [
            "# written by testbed.slurmcluster: a cluster on this machine",
            "ClusterName=hvds",
            f"SlurmctldHost={socket.gethostname()}({where.ctld_addr})",
            f"SlurmctldPort={self.ports[0]}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={self.path('state')}",
            f"SlurmdSpoolDir={self.path('spool', '%n')}",
            f"TmpFS={self.path('tmp', '%n')}",   # PMIx's sockets: one folder per node, or srun --mpi=pmix fails
            f"SlurmctldPidFile={self.path('run', 'slurmctld.pid')}",
            f"SlurmdPidFile={self.path('run', 'slurmd-%n.pid')}",
            f"SlurmctldLogFile={self.log('slurmctld')}", f"SlurmdLogFile={self.log('slurmd-%n')}",
            # No systemd, no cgroups here: processes are tracked by parentage, tasks are not bound.
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SlurmdParameters=config_overrides",  # the nodes share this machine's cores
            # No accounting database: sacct -c reads the completion log instead.
            "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/filetxt", f"JobCompLoc={self.jobcomp}",
            *where.conf_lines,
            "MpiDefault=none", "ReturnToService=2", "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=2,bf_interval=2",
            "PreemptType=preempt/partition_prio", "PreemptMode=REQUEUE",
            "SlurmdTimeout=60", "InactiveLimit=0", "KillWait=30", "MinJobAge=600",
        ]
        lines += [f"NodeName={n} NodeHostname={where.hostname(i, n)} NodeAddr={where.node_addr(i)} Port={port} "
                  f"CPUs={cpus_per_node} State=UNKNOWN" for i, (n, port) in enumerate(zip(self.nodes, self.ports[1:]))]
        lines += [f"PartitionName={PARTITION} Nodes={nodes} Default=YES PriorityTier=1 MaxTime=INFINITE "
                  "State=UP PreemptMode=REQUEUE GraceTime=0",
                  f"PartitionName={URGENT} Nodes={nodes} PriorityTier=2 MaxTime=INFINITE State=UP "
                  "PreemptMode=OFF"]
        return "\n".join(lines) + "\n"
