"""What one cluster is made of, by name and place: its namespaces and hostnames (fixed when it is
made), its hosts' addresses and temp dir (once up), and the files in that dir. Every module of
the package reads a Layout; only ``NetCluster.up`` and ``down`` (cluster.py) change one."""
from __future__ import annotations

import itertools
import os
import subprocess

from testbed.netcluster.system import PREFIX

_instances = itertools.count()


class Layout:
    """``n_hosts`` hosts by name and place. Host indexes are 0-based: host 0 runs the launchers
    and rank 0, hosts 1.. are reached over ssh."""

    def __init__(self, n_hosts: int, python: str, root: str):
        self.n_hosts = n_hosts
        self.python = python      # absolute path; the same file on every host (shared disk)
        self.root = root          # working directory of every launched command
        self.name = f"{PREFIX}-{os.getpid()}-{next(_instances)}"
        self.switch_ns = f"{self.name}-sw"
        self.namespaces = [f"{self.name}-h{i}" for i in range(n_hosts)]
        self.hostnames = list(self.namespaces)  # a host's hostname is its namespace's name
        self.hosts: list[str] = []              # eth0 addresses, known once up
        self.switch_addr = ""                   # the switch's own address on br0, known once up
        self.tmpdir = ""                        # made by up, removed by down
        self.sshd: list[subprocess.Popen] = []  # one listener per host; kill_jobs spares them
        self.torn_down = False

    @property
    def is_up(self) -> bool:
        return bool(self.tmpdir) and not self.torn_down

    @property
    def key(self) -> str:
        return os.path.join(self.tmpdir, "id_ed25519")          # client key, authorized on every host

    @property
    def host_key(self) -> str:
        return os.path.join(self.tmpdir, "ssh_host_ed25519_key")

    @property
    def ssh(self) -> str:
        return os.path.join(self.tmpdir, "bin", "ssh")          # the wrapper, first on PATH

    @property
    def hosts_file(self) -> str:
        return os.path.join(self.tmpdir, "hosts")               # every host's /etc/hosts

    def tool(self, name: str) -> str:
        """A console script next to the cluster's python (horovodrun)."""
        return os.path.join(os.path.dirname(self.python), name)
