"""Where a Slurm cluster's daemons run and how its clients reach slurmctld. Two places, one
interface (``SlurmCluster`` reads only this):

* ``Loopback``: everything on this machine's loopback; each slurmd in a UTS namespace of its own,
  with the node's name as hostname.
* ``OnNetCluster``: the nodes are the hosts of a namespace cluster (``testbed.netcluster``):
  node i's slurmd runs inside host i (its network namespace, hostname and /etc/hosts), at that
  host's address, so that a job's ranks talk over the shaped links and the hosts' NIC counters see
  the bytes. slurmctld runs in the switch's namespace at the switch's own address, which every
  host reaches over its link. munged stays in this namespace: its socket is a file, shared.
  Slurm's client commands (sbatch, squeue, ...) must run in a namespace that reaches slurmctld:
  ``env()`` puts wrappers first on PATH that enter the switch's namespace when called from the
  harness's own, and run the real command anywhere else (inside a host: srun in a batch script).
  No address or route is added outside the cluster's namespaces.
"""
from __future__ import annotations

import os
import shlex
import shutil
from typing import Sequence

from testbed.netcluster import NetCluster
from testbed.netcluster.cleanup import NETNS_DIR
from testbed.netcluster.system import ClusterError

# Slurm's client commands that talk to slurmctld (wrapped in OnNetCluster; those not installed are skipped)
CLIENTS = ("sbatch", "srun", "salloc", "sattach", "sbcast", "scancel", "scontrol", "sdiag", "sinfo",
           "sprio", "squeue", "sstat", "sacct")


class Loopback:
    """Every daemon on the loopback (the cluster as it was first built)."""
    ctld_addr = "127.0.0.1"
    net = None
    # slurmctld binds to its hostname's address (127.0.0.1 here), not to every address of this machine
    conf_lines = ("CommunicationParameters=NoCtldInAddrAny",)

    def up(self, bin_dir: str) -> None:
        pass

    def down(self) -> None:
        pass

    def node_addr(self, index: int) -> str:
        return "127.0.0.1"

    def hostname(self, index: int, node: str) -> str:
        return node

    def ctld_argv(self, argv: Sequence[str]) -> list[str]:
        return list(argv)

    def slurmd_argv(self, index: int, node: str, argv: Sequence[str]) -> list[str]:
        # unshare and sh exec, so the process's pid is slurmd's
        return ["unshare", "--uts", "--", "sh", "-c", f"hostname {shlex.quote(node)} && exec {shlex.join(argv)}"]

    def env(self, env: dict[str, str]) -> dict[str, str]:
        return env


class OnNetCluster:
    """The nodes in the hosts of a NetCluster of ``n_hosts`` hosts, links at ``rate`` (None: unshaped)."""

    # slurmctld binds to every address of the switch's namespace (its loopback and the switch
    # address): with NoCtldInAddrAny it would bind to the address its hostname has outside, 127.0.0.1
    conf_lines = ()

    def __init__(self, n_hosts: int, rate: str | None):
        self.net = NetCluster(n_hosts, rate=rate)
        self.bin_dir = ""

    def up(self, bin_dir: str) -> None:
        self.net.up()
        self.bin_dir = bin_dir
        self._write_clients()

    def down(self) -> None:
        self.net.down()

    @property
    def ctld_addr(self) -> str:
        return self.net.switch_addr

    def node_addr(self, index: int) -> str:
        return self.net.hosts[index]

    def hostname(self, index: int, node: str) -> str:
        return self.net.hostnames[index]

    def _enter_switch(self) -> list[str]:
        return ["nsenter", f"--net={os.path.join(NETNS_DIR, self.net.switch_ns)}", "--"]

    def ctld_argv(self, argv: Sequence[str]) -> list[str]:
        return [*self._enter_switch(), *argv]  # nsenter execs: the process's pid is slurmctld's

    def slurmd_argv(self, index: int, node: str, argv: Sequence[str]) -> list[str]:
        # `ip netns exec` mounts a fresh /sys, without the cgroup file system under /sys/fs/cgroup,
        # and slurmd will not start without one ("No filesystem mounted on /sys/fs/cgroup"), even
        # though it makes no cgroups here (proctrack/linuxproc, task/none): an empty tmpfs, as
        # cgroup v1 puts there, in the host's own mount namespace. sh execs: the pid is slurmd's.
        return self.net.host_argv(index, ["sh", "-c", 'mount -t tmpfs cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd && mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd && exec "$@"',
                                          "slurmd-enter", *argv])

    def _write_clients(self) -> None:
        """One wrapper per client command in ``bin_dir``: from the harness's network namespace into
        the switch's; from any other (a host's), the command itself."""
        here = os.readlink("/proc/self/ns/net")
        os.makedirs(self.bin_dir, exist_ok=True)
        for name in CLIENTS:
            real = shutil.which(name)
            if not real:
                continue
            path = os.path.join(self.bin_dir, name)
            with open(path, "w") as f:
                f.write(f'#!/bin/sh\n[ "$(readlink /proc/self/ns/net)" = {shlex.quote(here)} ] && '
                        f'exec {shlex.join(self._enter_switch())} {real} "$@"\nexec {real} "$@"\n')
            os.chmod(path, 0o755)

    def env(self, env: dict[str, str]) -> dict[str, str]:
        return {**env, "PATH": os.pathsep.join([self.bin_dir, env.get("PATH", "/usr/bin:/bin")])}


Where = Loopback | OnNetCluster


def place(n_nodes: int, netcluster: bool, rate: str | None) -> Where:
    """The nodes on the loopback, or in a namespace cluster's hosts with links at ``rate``."""
    if rate and not netcluster:
        raise ClusterError(f"--rate {rate}: only the namespace cluster's links are shaped (--netcluster)")
    return OnNetCluster(n_nodes, rate) if netcluster else Loopback()
