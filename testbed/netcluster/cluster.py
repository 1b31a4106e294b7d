"""The cluster itself: making the namespaces and their links (``up``) and removing them (``down``).

Switch: namespace NAME-sw holds a bridge ``br0`` with an address of its own, 10.250.K.254/24
(``switch_addr``: for a service every host reaches, such as Slurm's controller; nothing runs
there unless asked). Host i is namespace NAME-hi with a veth pair:
``eth0`` inside the host (address 10.250.K.(i+1)/24), port ``pi`` on the bridge. The pair is
created from inside the switch namespace straight into the host's, so nothing ever appears in the
root namespace. IPv6 is off in every namespace (no chatter on eth0). Links are then shaped
(shaping.py) and each host gets its sshd (ssh.py).

Network rules this harness keeps: traffic goes only to addresses it creates inside its own
namespaces (and loopback). It never adds addresses or routes to the root namespace, never sets
a default route and never touches the root namespace's interfaces. Each instance has a unique
name prefix ``hvdc-PID-N`` (namespaces, hostnames, temp dir /tmp/hvdc-PID-N-*) and its own
subnet 10.250.K.0/24, K unused by the root namespace and other harnesses. Teardown (on leaving
the ``with`` block, on exceptions, Ctrl-C, SIGTERM/SIGHUP and at interpreter exit) kills every
process in its namespaces, deletes the namespaces (the veths and bridge go with them) and the
temp dir (cleanup.py). ``down`` on the command line removes what a killed harness left behind.
"""
from __future__ import annotations

import atexit
import itertools
import os
import re
import shutil
import sys
import tempfile
from typing import Sequence

from testbed.netcluster import cleanup, jobs, launch, ssh
from testbed.netcluster.layout import Layout
from testbed.netcluster.shaping import DEFAULT_RATE, parse_rate, shape_links
from testbed.netcluster.system import NIC, PREFIX, ClusterError, list_namespaces, run
from testbed.netcluster.throughput import measure

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the project root
TOOLS = ("ip", "tc", "unshare", "ssh-keygen", ssh.SSHD, ssh.SSH)


def _used_subnets() -> set[int]:
    """Third octets K of 10.250.K.x already in use by the root namespace or another harness."""
    texts = [run(["ip", "-4", "-o", "addr"], check=False).stdout,
             run(["ip", "-4", "route"], check=False).stdout]
    texts += [run(["ip", "-n", ns, "-4", "-o", "addr"], check=False).stdout
              for ns in list_namespaces() if ns.startswith(PREFIX + "-")]
    return {int(k) for text in texts for k in re.findall(r"\b10\.250\.(\d+)\.\d+", text)}


def _free_addresses(n_hosts: int) -> tuple[list[str], str]:
    """10.250.K.1.. for ``n_hosts`` hosts and 10.250.K.254 for the switch, K the first unused
    subnet from one this process's id picks. Caller holds the global lock."""
    used = _used_subnets()
    subnet = next((k for k in itertools.chain(range(1 + os.getpid() % 250, 255), range(1, 255))
                   if k not in used), None)
    if subnet is None:
        raise ClusterError("no free subnet 10.250.K.0/24 left (see `ip -all netns`)")
    return [f"10.250.{subnet}.{i + 1}" for i in range(n_hosts)], f"10.250.{subnet}.254"


def _make_network(switch_ns: str, namespaces: Sequence[str], addresses: Sequence[str], switch_addr: str,
                  mtu: int) -> None:
    """The switch namespace with its bridge (and its address), and one namespace per host linked to it."""
    ipv6_off = ["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1"]
    sw = switch_ns
    run(["ip", "netns", "add", sw])
    run(["ip", "netns", "exec", sw, *ipv6_off], check=False)  # before any interface exists
    run(["ip", "-n", sw, "link", "set", "lo", "up"])
    run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
    for i, (ns, addr) in enumerate(zip(namespaces, addresses)):
        run(["ip", "netns", "add", ns])
        run(["ip", "netns", "exec", ns, *ipv6_off], check=False)
        run(["ip", "-n", sw, "link", "add", f"p{i}", "mtu", str(mtu), "type", "veth",
             "peer", "name", NIC, "mtu", str(mtu), "netns", ns])
        run(["ip", "-n", sw, "link", "set", f"p{i}", "master", "br0", "up"])
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", NIC])
        run(["ip", "-n", ns, "link", "set", NIC, "up"])
    run(["ip", "-n", sw, "addr", "add", f"{switch_addr}/24", "dev", "br0"])
    run(["ip", "-n", sw, "link", "set", "br0", "mtu", str(mtu), "up"])


class NetCluster(Layout):
    """``n_hosts`` hosts on one bridge: ``up`` makes them, ``down`` removes them, and a ``with``
    block does both; see the module docstring. What runs on the hosts lives in the modules named
    below, each function offered here as a method of the same name."""

    def __init__(self, n_hosts: int = 2, rate: str | None = DEFAULT_RATE, mtu: int = 9000,
                 python: str = sys.executable, root: str = ROOT):
        if not 1 <= n_hosts <= 16:
            raise ClusterError(f"n_hosts: {n_hosts} is outside 1..16")
        if not 1280 <= mtu <= 65000:
            raise ClusterError(f"mtu: {mtu} is outside 1280..65000")
        if rate:
            parse_rate(rate)  # a rate it cannot read fails here, before anything is set up
        self.rate, self.mtu = rate, mtu
        super().__init__(n_hosts, python, root)
        self._created_run_dirs: list[str] = []
        self._old_handlers: dict[int, object] = {}

    def __enter__(self) -> "NetCluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> "NetCluster":
        if self.tmpdir or self.torn_down:
            raise ClusterError("a NetCluster comes up once; make a new one")
        if os.geteuid() != 0:
            raise ClusterError("network namespaces need root")
        for tool in TOOLS:
            if not shutil.which(tool):
                raise ClusterError(f"{tool} not found (scripts/install.sh installs iproute2, "
                                   f"openssh-server, openssh-client)")
        atexit.register(self.down)
        self._old_handlers = cleanup.exit_on_signals()
        try:
            self.tmpdir = tempfile.mkdtemp(prefix=self.name + "-", dir="/tmp")
            with cleanup.global_lock():
                self._created_run_dirs = cleanup.claim_run_dirs()
                self.hosts, self.switch_addr = _free_addresses(self.n_hosts)
                _make_network(self.switch_ns, self.namespaces, self.hosts, self.switch_addr, self.mtu)
                self.shape(self.rate)
            ssh.write_files(self)
            ssh.start_sshd(self)
            ssh.wait_for_ssh(self)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Idempotent teardown; every step runs even if an earlier one failed."""
        if self.torn_down:
            return
        self.torn_down = True
        with cleanup.signals_deferred():
            try:
                cleanup.remove_cluster([*self.namespaces, self.switch_ns], self.sshd,
                                       self._created_run_dirs, self.tmpdir)
            finally:
                atexit.unregister(self.down)
                cleanup.restore_signals(self._old_handlers)

    def shape(self, rate: str | None) -> None:
        """Set every host link to ``rate`` in both directions (None: unshaped, veth speed)."""
        bits = parse_rate(rate) if rate else None
        shape_links(self.switch_ns, self.namespaces, self.mtu, bits)
        self.rate = rate

    # --- running things on a host: jobs.py -------------------------------------------------
    host_argv = jobs.host_argv
    environment = jobs.environment
    popen = jobs.popen
    exec = jobs.exec
    kill_jobs = jobs.kill_jobs
    nic_counters = jobs.nic_counters
    nic_table = jobs.nic_table

    # --- launcher command lines, run on host 0: launch.py ----------------------------------
    hostfile = launch.hostfile
    train_argv = launch.train_argv
    horovodrun_argv = launch.horovodrun_argv
    elastic_argv = launch.elastic_argv
    mpirun_argv = launch.mpirun_argv
    run_horovodrun = launch.run_horovodrun
    run_mpirun = launch.run_mpirun

    # --- measuring the links: throughput.py ------------------------------------------------
    throughput = measure
