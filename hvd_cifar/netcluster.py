"""A cluster of real hosts on one machine: network namespaces joined by a shaped switch, each
host with its own address, hostname and sshd, so that horovodrun and mpirun launch over ssh
and every byte between ranks crosses a NIC whose counters can be read.

    python -m hvd_cifar.netcluster up --hosts 4 --rate 1gbit      # prints addresses; Ctrl-C tears down
    python -m hvd_cifar.netcluster run --hosts 2 --launcher horovodrun -- --config configs/tiny.yaml
    python -m hvd_cifar.netcluster run --hosts 4 --launcher mpirun -- --config configs/tiny.yaml
    python -m hvd_cifar.netcluster run --hosts 2 --launcher horovodrun --gloo -- --config configs/tiny.yaml
    python -m hvd_cifar.netcluster throughput --hosts 2 --rate 1gbit   # bulk TCP, host 1 -> host 0
    python -m hvd_cifar.netcluster down          # remove leftovers of harnesses that died (--all: every one)

    with NetCluster(n_hosts=2, rate="1gbit") as cluster:
        result = cluster.run_horovodrun(2, ["--config", "configs/tiny.yaml"])
        rx_bytes, tx_bytes = cluster.nic_counters(1)

How it works (needs root, iproute2, util-linux unshare and Debian's openssh-server):
  * Switch: namespace NAME-sw holds a bridge ``br0``. Host i is namespace NAME-hi with a veth
    pair: ``eth0`` inside the host (address 10.250.K.(i+1)/24), port ``pi`` on the bridge.
    The pair is created from inside the switch namespace straight into the host's, so nothing
    ever appears in the root namespace. IPv6 is off in every namespace (no chatter on eth0).
  * Shaping: with ``rate`` set, a ``tbf`` qdisc sits on both ends of each host's link
    (eth0 egress = what the host sends, port egress = what it receives), so each host has a
    full-duplex link of that rate, like a 1 GbE NIC on a switch. tbf counts Ethernet frames.
  * Hosts: every process of host i runs in its netns plus a private UTS and mount namespace
    (``ip netns exec NS unshare --uts --mount sh -c 'hostname H; mount --bind HOSTS /etc/hosts; exec ...'``),
    so ``gethostname()`` differs per host and resolves, through the harness's hosts file, to
    the host's own eth0 address, as on a real cluster. (Horovod's Gloo process sets bind to the
    address of the hostname; with a hostname that resolves to 127.0.0.1 a cross-host Gloo job
    fails, with one that does not resolve hvd.init() segfaults.) The file system, /tmp and the
    venv are shared, so the same absolute python path and project root work everywhere.
  * ssh: one sshd per host (/usr/sbin/sshd -D with its own config in the temp dir: host key,
    AuthorizedKeysFile, PidFile, UsePAM no, StrictModes no, root by key only), started through
    the same entry as above, so ssh sessions land in the host's namespaces. Clients use
    ``TMP/bin/ssh``, first on the cluster's PATH: ``/usr/bin/ssh -F TMP/ssh_config``, which
    names the harness's key and neither checks nor records host keys, so horovodrun's and
    mpirun's own ssh command lines work without touching ~/.ssh. (ssh reads the home directory
    from the password database, not $HOME, hence a wrapper rather than a temporary HOME.)
  * Launchers run inside host 0; hosts 1.. are reached over ssh through the switch.

Network rules this harness keeps: traffic goes only to addresses it creates inside its own
namespaces (and loopback). It never adds addresses or routes to the root namespace, never sets
a default route and never touches the root namespace's interfaces. Each instance has a unique
name prefix ``hvdc-PID-N`` (namespaces, hostnames, temp dir /tmp/hvdc-PID-N-*) and its own
subnet 10.250.K.0/24, K unused by the root namespace and other harnesses. Teardown (on leaving
the ``with`` block, on exceptions, Ctrl-C, SIGTERM/SIGHUP and at interpreter exit) kills every
process in its namespaces, deletes the namespaces (the veths and bridge go with them) and the
temp dir. ``down`` removes what a killed harness left behind.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import itertools
import json
import os
import re
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Sequence

from hvd_cifar import hostfile, launchers

PREFIX = "hvdc"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project root
NETNS_DIR = "/run/netns"
SSHD_DIR = "/run/sshd"           # sshd's privilege-separation chroot; must exist
SSHD = "/usr/sbin/sshd"           # sshd refuses to start unless run by absolute path
SSH = "/usr/bin/ssh"
SSH_PORT = 22
NIC = "eth0"
THROUGHPUT_PORT = 5201
TBF_LATENCY = "10ms"              # longest a packet may wait in the shaper's queue
_NAME = re.compile(rf"^{PREFIX}-(?P<pid>\d+)-(?P<n>\d+)(-|$)")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?)bit\s*$", re.IGNORECASE)
_instances = itertools.count()

# Runs as `sh -c ENTER hvdc-enter HOSTNAME HOSTS_FILE ARGV...` inside a fresh UTS and mount
# namespace: the host's own hostname, resolving via its own /etc/hosts, then the command.
ENTER = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'


class ClusterError(RuntimeError):
    """Setting up or using the cluster failed; the message says which step and why."""


def parse_rate(rate: str) -> int:
    """tc-style rate ('1gbit', '100mbit', '2.5gbit') -> bits per second (SI prefixes, as tc)."""
    match = _RATE.match(rate)
    if not match:
        raise ClusterError(f"rate: cannot parse {rate!r} (expected e.g. '1gbit', '100mbit')")
    bits = float(match[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match[2].lower()]
    if bits < 1e5:
        raise ClusterError(f"rate: {rate!r} is below 100kbit")
    return int(bits)


def _run(argv: Sequence[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=timeout)
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise ClusterError(f"`{shlex.join(argv)}` failed ({result.returncode}): "
                           f"{detail[-1] if detail else 'no output'}")
    return result


@contextlib.contextmanager
def _global_lock():
    """Serialise set-up and teardown across harness instances (subnet choice, shared /run
    folders). flock on /run itself: nothing to create, nothing to leave behind."""
    fd = os.open("/run", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def _signals_deferred():
    """Teardown must finish: Ctrl-C or SIGTERM arriving meanwhile is delivered afterwards."""
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through `with NetCluster(...)`, which tears down


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


def _kill(pids: Sequence[int], grace_s: float = 3.0) -> None:
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


def _netns_pids(ns: str) -> list[int]:
    result = _run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in result.stdout.split() if p.isdigit()] if result.returncode == 0 else []


def list_namespaces() -> list[str]:
    result = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in result.stdout.splitlines() if line.strip()]


def _used_subnets() -> set[int]:
    """Third octets K of 10.250.K.x already in use by the root namespace or another harness."""
    texts = [_run(["ip", "-4", "-o", "addr"], check=False).stdout,
             _run(["ip", "-4", "route"], check=False).stdout]
    texts += [_run(["ip", "-n", ns, "-4", "-o", "addr"], check=False).stdout
              for ns in list_namespaces() if ns.startswith(PREFIX + "-")]
    return {int(k) for text in texts for k in re.findall(r"\b10\.250\.(\d+)\.\d+", text)}


class NetCluster:
    """``n_hosts`` hosts on one bridge; see the module docstring. Host indexes are 0-based:
    host 0 runs the launchers and rank 0, hosts 1.. are reached over ssh."""

    def __init__(self, n_hosts: int = 2, rate: str | None = "1gbit", mtu: int = 9000,
                 python: str = sys.executable, root: str = ROOT):
        if not 1 <= n_hosts <= 16:
            raise ClusterError(f"n_hosts: {n_hosts} is outside 1..16")
        if not 1280 <= mtu <= 65000:
            raise ClusterError(f"mtu: {mtu} is outside 1280..65000")
        self.rate_bits_per_s = parse_rate(rate) if rate else None
        self.rate, self.mtu, self.n_hosts = rate, mtu, n_hosts
        self.python = python      # absolute path; the same file on every host (shared disk)
        self.root = root          # working directory of every launched command
        self.name = f"{PREFIX}-{os.getpid()}-{next(_instances)}"
        self.switch_ns = f"{self.name}-sw"
        self.namespaces = [f"{self.name}-h{i}" for i in range(n_hosts)]
        self.hostnames = list(self.namespaces)  # a host's hostname is its namespace's name
        self.hosts: list[str] = []              # eth0 addresses, known once up
        self.tmpdir = ""
        self._sshd: list[subprocess.Popen] = []
        self._created_run_dirs: list[str] = []
        self._old_handlers: dict[int, object] = {}
        self._torn_down = False

    # --- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> "NetCluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> "NetCluster":
        if self.tmpdir or self._torn_down:
            raise ClusterError("a NetCluster comes up once; make a new one")
        if os.geteuid() != 0:
            raise ClusterError("network namespaces need root")
        for tool in ("ip", "tc", "unshare", "ssh-keygen", SSHD, SSH):
            if not shutil.which(tool):
                raise ClusterError(f"{tool} not found (scripts/install.sh installs iproute2, "
                                   f"openssh-server, openssh-client)")
        atexit.register(self.down)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(sig) == signal.SIG_DFL:
                    self._old_handlers[sig] = signal.signal(sig, _raise_exit)
        try:
            self.tmpdir = tempfile.mkdtemp(prefix=self.name + "-", dir="/tmp")
            with _global_lock():
                self._created_run_dirs = [d for d in (NETNS_DIR, SSHD_DIR) if not os.path.isdir(d)]
                os.makedirs(SSHD_DIR, mode=0o755, exist_ok=True)
                used = _used_subnets()
                subnet = next((k for k in itertools.chain(range(1 + os.getpid() % 250, 255), range(1, 255))
                               if k not in used), None)
                if subnet is None:
                    raise ClusterError("no free subnet 10.250.K.0/24 left (see `ip -all netns`)")
                self.hosts = [f"10.250.{subnet}.{i + 1}" for i in range(self.n_hosts)]
                self._make_network()
            self._write_ssh_files()
            self._start_sshd()
            self._wait_for_ssh()
        except BaseException:
            self.down()
            raise
        return self

    def _make_network(self) -> None:
        ipv6_off = ["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                    "net.ipv6.conf.default.disable_ipv6=1"]
        sw = self.switch_ns
        _run(["ip", "netns", "add", sw])
        _run(["ip", "netns", "exec", sw, *ipv6_off], check=False)  # before any interface exists
        _run(["ip", "-n", sw, "link", "set", "lo", "up"])
        _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        for i, (ns, addr) in enumerate(zip(self.namespaces, self.hosts)):
            _run(["ip", "netns", "add", ns])
            _run(["ip", "netns", "exec", ns, *ipv6_off], check=False)
            _run(["ip", "-n", sw, "link", "add", f"p{i}", "mtu", str(self.mtu), "type", "veth",
                  "peer", "name", NIC, "mtu", str(self.mtu), "netns", ns])
            _run(["ip", "-n", sw, "link", "set", f"p{i}", "master", "br0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", NIC])
            _run(["ip", "-n", ns, "link", "set", NIC, "up"])
        _run(["ip", "-n", sw, "link", "set", "br0", "mtu", str(self.mtu), "up"])
        self.shape(self.rate)

    def shape(self, rate: str | None) -> None:
        """Set every host link to ``rate`` in both directions (None: unshaped, veth speed)."""
        bits = parse_rate(rate) if rate else None
        # tbf needs a bucket of at least one frame and about a timer tick's worth of bytes.
        burst = max(bits // 8 // 1000, 2 * (self.mtu + 14)) if bits else 0
        for i, ns in enumerate(self.namespaces):
            for where, dev in ((ns, NIC), (self.switch_ns, f"p{i}")):
                if bits:
                    _run(["tc", "-n", where, "qdisc", "replace", "dev", dev, "root", "tbf",
                          "rate", f"{bits}bit", "burst", str(burst), "latency", TBF_LATENCY])
                else:
                    _run(["tc", "-n", where, "qdisc", "del", "dev", dev, "root"], check=False)
        self.rate, self.rate_bits_per_s = rate, bits

    def _write_ssh_files(self) -> None:
        t = self.tmpdir
        for key, comment in ((self.host_key, "hvdc host"), (self.key, "hvdc client")):
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", key])
        shutil.copyfile(self.key + ".pub", os.path.join(t, "authorized_keys"))
        with open(os.path.join(t, "hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n::1 localhost\n")
            f.writelines(f"{addr} {name}\n" for addr, name in zip(self.hosts, self.hostnames))
        with open(os.path.join(t, "ssh_config"), "w") as f:
            f.write(f"Host *\n  IdentityFile {self.key}\n  IdentitiesOnly yes\n"
                    f"  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
                    f"  GlobalKnownHostsFile /dev/null\n  BatchMode yes\n  LogLevel ERROR\n"
                    f"  ConnectTimeout 10\n")
        os.makedirs(os.path.join(t, "bin"))
        with open(self.ssh, "w") as f:
            f.write(f'#!/bin/sh\nexec {SSH} -F {t}/ssh_config "$@"\n')
        os.chmod(self.ssh, 0o755)
        for i, addr in enumerate(self.hosts):
            with open(os.path.join(t, f"sshd-h{i}.conf"), "w") as f:
                f.write(f"ListenAddress {addr}:{SSH_PORT}\nHostKey {self.host_key}\n"
                        f"PidFile {t}/sshd-h{i}.pid\nAuthorizedKeysFile {t}/authorized_keys\n"
                        f"PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                        f"KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                        f"PrintMotd no\nLogLevel ERROR\nMaxStartups 64:30:128\n")

    def _start_sshd(self) -> None:
        for i in range(self.n_hosts):
            with open(os.path.join(self.tmpdir, f"sshd-h{i}.log"), "w") as log:
                # -D: stays in the foreground, so this Popen's pid is sshd's (ip, unshare and sh exec).
                self._sshd.append(self.popen(i, [SSHD, "-D", "-e", "-f", f"{self.tmpdir}/sshd-h{i}.conf"],
                                             stdout=log, stderr=subprocess.STDOUT))

    def _wait_for_ssh(self, timeout_s: float = 20.0) -> None:
        """Until host 0 can ssh to every host (itself included) and each answers its hostname."""
        pending = set(range(self.n_hosts))
        deadline = time.monotonic() + timeout_s
        last = ""
        while pending:
            for i, p in enumerate(self._sshd):
                if p.poll() is not None:
                    with open(os.path.join(self.tmpdir, f"sshd-h{i}.log")) as f:
                        raise ClusterError(f"sshd on host {i} exited ({p.returncode}): {f.read().strip()}")
            probes = {i: self.popen(0, ["ssh", self.hosts[i], "hostname"], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT) for i in pending}
            for i, p in probes.items():
                out = p.communicate(timeout=30)[0].strip()
                if p.returncode == 0 and out == self.hostnames[i]:
                    pending.discard(i)
                else:
                    last = f"host {i}: {out or p.returncode}"
            if pending and time.monotonic() > deadline:
                raise ClusterError(f"ssh to hosts {sorted(pending)} did not work in "
                                   f"{timeout_s:.0f} s ({last})")
            if pending:
                time.sleep(0.2)

    def down(self) -> None:
        """Idempotent teardown; every step runs even if an earlier one failed."""
        if self._torn_down:
            return
        self._torn_down = True
        with _signals_deferred():
            try:
                mine = [*self.namespaces, self.switch_ns]
                existing = set(list_namespaces())
                _kill([pid for ns in mine if ns in existing for pid in _netns_pids(ns)]
                      + [p.pid for p in self._sshd])
                for p in self._sshd:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(timeout=2)
                with _global_lock():
                    for ns in mine:
                        if ns in existing:
                            _run(["ip", "netns", "del", ns], check=False)
                    _remove_run_dirs(self._created_run_dirs)
                if self.tmpdir:
                    shutil.rmtree(self.tmpdir, ignore_errors=True)
            finally:
                atexit.unregister(self.down)
                for sig, handler in self._old_handlers.items():
                    if signal.getsignal(sig) is _raise_exit:
                        signal.signal(sig, handler)
                self._old_handlers.clear()

    # --- paths ----------------------------------------------------------------------------
    @property
    def key(self) -> str:
        return os.path.join(self.tmpdir, "id_ed25519")          # client key, authorized on every host

    @property
    def host_key(self) -> str:
        return os.path.join(self.tmpdir, "ssh_host_ed25519_key")

    @property
    def ssh(self) -> str:
        return os.path.join(self.tmpdir, "bin", "ssh")          # the wrapper, first on PATH

    def tool(self, name: str) -> str:
        """A console script next to the cluster's python (horovodrun)."""
        return os.path.join(os.path.dirname(self.python), name)

    # --- running things on a host -----------------------------------------------------------
    def host_argv(self, host_index: int, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside host ``host_index``'s namespaces."""
        ns = self.namespaces[host_index]
        return ["ip", "netns", "exec", ns, "unshare", "--uts", "--mount", "--propagation", "private",
                "/bin/sh", "-c", ENTER, "hvdc-enter", self.hostnames[host_index],
                os.path.join(self.tmpdir, "hosts"), *argv]

    def environment(self, env: dict | None = None) -> dict:
        """This process's environment, the harness's ssh and the python's bin first on PATH,
        plus ``env``."""
        base = dict(os.environ)
        base["PATH"] = os.pathsep.join([os.path.dirname(self.ssh), os.path.dirname(self.python),
                                        base.get("PATH", "/usr/bin:/bin")])
        base.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", "120")  # 30 s default is short on a busy machine
        base.update(env or {})
        return base

    def popen(self, host_index: int, argv: Sequence[str], env: dict | None = None,
              cwd: str | None = None, **kwargs) -> subprocess.Popen:
        """Start ``argv`` on host ``host_index`` in its own session (so that Ctrl-C reaches only
        the harness, which then stops it in order)."""
        if not self.tmpdir or self._torn_down:
            raise ClusterError("the cluster is not up")
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen(self.host_argv(host_index, argv), env=self.environment(env),
                                cwd=cwd or self.root, start_new_session=True, text=True, **kwargs)

    def exec(self, host_index: int, argv: Sequence[str], env: dict | None = None,
             timeout: float = 60, capture: bool = True, check: bool = False) -> subprocess.CompletedProcess:
        """Run ``argv`` on a host and wait. ``stdout`` holds stdout and stderr together when
        ``capture``; otherwise they go to this process's. On timeout every job process on the
        cluster is killed (sshd stays) and ``subprocess.TimeoutExpired`` is raised."""
        out = subprocess.PIPE if capture else None
        p = self.popen(host_index, argv, env=env, stdout=out, stderr=subprocess.STDOUT if capture else None)
        try:
            stdout, _ = p.communicate(timeout=timeout)
        except BaseException:  # timeout or Ctrl-C: stop the job everywhere, keep the cluster
            self.kill_jobs(extra=[p.pid])
            p.wait()
            raise
        if check and p.returncode != 0:
            raise ClusterError(f"host {host_index}: `{shlex.join(argv)}` exited {p.returncode}: "
                               f"{(stdout or '').strip()[-2000:]}")
        return subprocess.CompletedProcess(list(argv), p.returncode, stdout)

    def kill_jobs(self, extra: Sequence[int] = ()) -> None:
        """Kill every process on the hosts except the sshd listeners."""
        keep = {p.pid for p in self._sshd}
        _kill([pid for ns in self.namespaces for pid in _netns_pids(ns) if pid not in keep] + list(extra))

    def nic_counters(self, host_index: int) -> tuple[int, int]:
        """(rx_bytes, tx_bytes) of the host's eth0 since the cluster came up: Ethernet frames
        (14-byte header + IP + TCP + payload), everything the host sent or received."""
        stats = f"/sys/class/net/{NIC}/statistics"
        result = _run(["ip", "netns", "exec", self.namespaces[host_index], "cat",
                       f"{stats}/rx_bytes", f"{stats}/tx_bytes"])
        rx, tx = (int(v) for v in result.stdout.split())
        return rx, tx

    # --- launchers ------------------------------------------------------------------------
    def hostfile(self, np: int) -> str:
        """An Open MPI hostfile (``ADDR slots=1`` lines) for the first ``np`` hosts, validated."""
        self._check_np(np)
        path = os.path.join(self.tmpdir, f"hostfile-np{np}")
        with open(path, "w") as f:
            f.write(hostfile.mpi_hostfile([(addr, 1) for addr in self.hosts[:np]]))
        hostfile.check_slots(hostfile.parse(path), np, path)
        return path

    def _check_np(self, np: int) -> None:
        if not 1 <= np <= self.n_hosts:
            raise ClusterError(f"np: {np} ranks need 1..{self.n_hosts} (one rank per host)")

    def train_argv(self, train_args: Sequence[str]) -> list[str]:
        return [*launchers.train_program(self.python), *train_args]

    def _horovodrun_options(self) -> list[str]:
        return ["--network-interfaces", NIC,    # else it probes every interface over ssh first
                "-p", str(SSH_PORT), "--ssh-identity-file", self.key,
                "--disable-cache",              # else it writes ~/.horovod/cache.bin
                "--start-timeout", "60"]

    def horovodrun_argv(self, np: int, train_args: Sequence[str], gloo: bool = False,
                        program: Sequence[str] | None = None) -> list[str]:
        """horovodrun across the first ``np`` hosts, one rank each, to run on host 0; every rank
        runs ``program`` if given, else ``python -m hvd_cifar.train train_args``."""
        self._check_np(np)
        options = self._horovodrun_options()
        if not gloo:  # its mpirun already gets btl_tcp_if_include; keep the out-of-band channel on eth0 too
            options.append(f"--mpi-args=-mca oob_tcp_if_include {NIC}")
        return launchers.horovodrun(np, program or self.train_argv(train_args),
                                    hosts=hostfile.horovod_hosts([(addr, 1) for addr in self.hosts[:np]]),
                                    gloo=gloo, options=options, executable=self.tool("horovodrun"))

    def elastic_argv(self, np: int, min_np: int, max_np: int, discovery_script: str,
                     train_args: Sequence[str]) -> list[str]:
        """horovodrun's elastic mode (Gloo), to run on host 0: starts ``np`` workers on the hosts
        ``discovery_script`` prints (``ADDR:SLOTS`` lines) and follows its output as it changes."""
        return launchers.horovodrun(np, self.train_argv(train_args), elastic=(min_np, max_np, discovery_script),
                                    options=self._horovodrun_options(), executable=self.tool("horovodrun"))

    def mpirun_argv(self, np: int, train_args: Sequence[str], export: dict | None = None,
                    program: Sequence[str] | None = None) -> list[str]:
        """Open MPI's mpirun across the first ``np`` hosts, one rank each, to run on host 0;
        ``export``: environment variables set for every rank (``-x NAME=VALUE``); every rank
        runs ``program`` if given, else ``python -m hvd_cifar.train train_args``."""
        exported = [f"{name}={value}" for name, value in (export or {}).items()]
        mca = {"plm_rsh_args": f"-i {self.key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
               "btl": "tcp,self",  # rank-to-rank bytes over TCP only, never shared memory
               "btl_tcp_if_include": NIC, "oob_tcp_if_include": NIC}
        return launchers.mpirun(np, program or self.train_argv(train_args), hostfile=self.hostfile(np),
                                oversubscribe=False, export=[*exported, "PATH"], mca=mca)

    def run_horovodrun(self, np: int, train_args: Sequence[str], gloo: bool = False,
                       timeout: float = 600, capture: bool = True) -> subprocess.CompletedProcess:
        return self.exec(0, self.horovodrun_argv(np, train_args, gloo), timeout=timeout, capture=capture)

    def run_mpirun(self, np: int, train_args: Sequence[str], timeout: float = 600,
                   capture: bool = True, export: dict | None = None) -> subprocess.CompletedProcess:
        return self.exec(0, self.mpirun_argv(np, train_args, export), timeout=timeout, capture=capture)

    # --- measuring the links ----------------------------------------------------------------
    def throughput(self, senders: Sequence[int], receiver: int, bytes_per_sender: int = 50_000_000,
                   timeout: float = 120) -> float:
        """Bits per second of TCP payload that host ``receiver`` took in while every host in
        ``senders`` sent it ``bytes_per_sender`` at once (first byte to last EOF)."""
        me = [self.python, "-m", "hvd_cifar.netcluster"]
        addr = self.hosts[receiver]
        recv = self.popen(receiver, [*me, "_recv", addr, str(len(senders))], stdout=subprocess.PIPE)
        try:
            if recv.stdout.readline().strip() != "ready":
                raise ClusterError(f"throughput receiver on host {receiver} did not start")
            sends = [self.popen(s, [*me, "_send", addr, str(bytes_per_sender)]) for s in senders]
            out, _ = recv.communicate(timeout=timeout)
            for p in sends:
                p.wait(timeout=timeout)
        except BaseException:
            self.kill_jobs(extra=[recv.pid])
            raise
        result = json.loads(out)
        if result["bytes"] != bytes_per_sender * len(senders):
            raise ClusterError(f"throughput: received {result['bytes']} of "
                               f"{bytes_per_sender * len(senders)} bytes")
        return result["bytes"] * 8 / result["seconds"]


def _remove_run_dirs(created: Sequence[str]) -> None:
    """Remove /run/netns and /run/sshd if this harness created them and no harness (nor any
    other namespace, for /run/netns) uses them now. Caller holds the global lock."""
    left = list_namespaces()
    if SSHD_DIR in created and not any(ns.startswith(PREFIX + "-") for ns in left):
        with contextlib.suppress(OSError):
            os.rmdir(SSHD_DIR)
    if NETNS_DIR in created and not left and os.path.isdir(NETNS_DIR) and not os.listdir(NETNS_DIR):
        _run(["umount", NETNS_DIR], check=False)  # `ip netns add` made it a mount point
        with contextlib.suppress(OSError):
            os.rmdir(NETNS_DIR)


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
    with _global_lock():
        for ns in list_namespaces():
            match = _NAME.match(ns)
            if match and (everything or not _pid_alive(int(match["pid"]))):
                _kill(_netns_pids(ns))
                _run(["ip", "netns", "del", ns], check=False)
                removed.append(f"namespace {ns}")
    for entry in sorted(os.listdir("/tmp")):
        match = _NAME.match(entry)
        path = os.path.join("/tmp", entry)
        if match and os.path.isdir(path) and (everything or not _pid_alive(int(match["pid"]))):
            stray = _run(["pgrep", "-f", path], check=False).stdout.split()
            _kill([int(p) for p in stray if int(p) != os.getpid()])
            shutil.rmtree(path, ignore_errors=True)
            removed.append(f"temp dir {path}")
    return removed


# --- bulk transfer endpoints, run inside hosts by NetCluster.throughput ---------------------
def _recv(addr: str, count: int) -> None:
    server = socket.create_server((addr, THROUGHPUT_PORT), backlog=count)
    print("ready", flush=True)
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ)
    accepted = finished = received = 0
    first = last = 0.0
    while finished < count:
        for key, _ in sel.select():
            if key.fileobj is server:
                conn, _ = server.accept()
                sel.register(conn, selectors.EVENT_READ)
                accepted += 1
                if accepted == count:
                    sel.unregister(server)
                continue
            data = key.fileobj.recv(1 << 20)
            if not first:
                first = time.perf_counter()
            if data:
                received += len(data)
            else:
                sel.unregister(key.fileobj)
                key.fileobj.close()
                finished += 1
                last = time.perf_counter()
    print(json.dumps({"bytes": received, "seconds": last - first}), flush=True)


def _send(addr: str, nbytes: int) -> None:
    chunk = b"\0" * (1 << 20)
    with socket.create_connection((addr, THROUGHPUT_PORT), timeout=60) as conn:
        view = memoryview(chunk)
        while nbytes > 0:
            n = min(nbytes, len(chunk))
            conn.sendall(view[:n])
            nbytes -= n


# --- command line -----------------------------------------------------------------------------
def _print_cluster(cluster: NetCluster) -> None:
    rate = cluster.rate or "unshaped"
    print(f"{cluster.n_hosts} host(s), links {rate}, mtu {cluster.mtu}, temp dir {cluster.tmpdir}")
    for i, (addr, name) in enumerate(zip(cluster.hosts, cluster.hostnames)):
        print(f"  host {i}: {addr}  hostname {name}  (ip netns exec {cluster.namespaces[i]} ...)")
    print(f"ssh: {cluster.ssh} ADDR   (key {cluster.key})", flush=True)


def _nic_table(cluster: NetCluster, before: list[tuple[int, int]]) -> str:
    rows = []
    for i, (rx0, tx0) in enumerate(before):
        rx, tx = cluster.nic_counters(i)
        rows.append(f"  host {i} {cluster.hosts[i]}: eth0 tx {tx - tx0:,} B  rx {rx - rx0:,} B")
    return "\n".join(rows)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hvd_cifar.netcluster",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def cluster_args(p):
        p.add_argument("--hosts", type=int, default=2, help="hosts (network namespaces), 1..16")
        p.add_argument("--rate", default="1gbit", help="link rate, tc syntax, or 'none' (default 1gbit)")
        p.add_argument("--mtu", type=int, default=9000)

    cluster_args(sub.add_parser("up", help="start a cluster and keep it until Ctrl-C"))
    run_p = sub.add_parser("run", help="start a cluster, run one training job across it, tear down")
    cluster_args(run_p)
    run_p.add_argument("--launcher", choices=("horovodrun", "mpirun"), default="horovodrun")
    run_p.add_argument("--gloo", action="store_true", help="horovodrun with the Gloo controller")
    run_p.add_argument("--np", type=int, default=0, help="ranks, one per host (default: all hosts)")
    run_p.add_argument("--timeout", type=float, default=3600, help="seconds")
    run_p.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then python -m hvd_cifar.train flags")
    tp = sub.add_parser("throughput", help="bulk TCP transfer host 1 -> host 0, in Gbit/s")
    cluster_args(tp)
    tp.add_argument("--megabytes", type=int, default=50)
    down_p = sub.add_parser("down", help="remove leftovers of harnesses that are no longer running")
    down_p.add_argument("--all", action="store_true", help="also those of running harnesses")
    return parser


def _throughput(cluster: NetCluster, megabytes: int) -> int:
    if cluster.n_hosts < 2:
        raise ClusterError("throughput needs at least 2 hosts")
    bits = cluster.throughput([1], 0, megabytes * 1_000_000)
    print(f"host 1 -> host 0: {megabytes} MB at {bits / 1e9:.3f} Gbit/s")
    return 0


def _train(cluster: NetCluster, args: argparse.Namespace) -> int:
    """One training job across the cluster, its output passed through; the NIC bytes after it."""
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    np = args.np or cluster.n_hosts
    if args.launcher == "mpirun":
        command = cluster.mpirun_argv(np, train_args)
    else:
        command = cluster.horovodrun_argv(np, train_args, gloo=args.gloo)
    print(f"on host 0: {shlex.join(command)}", flush=True)
    before = [cluster.nic_counters(i) for i in range(cluster.n_hosts)]
    result = cluster.exec(0, command, timeout=args.timeout, capture=False)
    print(f"exit status {result.returncode}; NIC bytes during the job:\n{_nic_table(cluster, before)}")
    return result.returncode


def _with_cluster(args: argparse.Namespace) -> int:
    rate = None if args.rate.lower() == "none" else args.rate
    with NetCluster(args.hosts, rate=rate, mtu=args.mtu) as cluster:
        _print_cluster(cluster)
        if args.command == "up":
            print("up; Ctrl-C tears it down", flush=True)
            while True:
                time.sleep(3600)
        if args.command == "throughput":
            return _throughput(cluster, args.megabytes)
        return _train(cluster, args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_recv":
        _recv(argv[1], int(argv[2]))
        return 0
    if argv and argv[0] == "_send":
        _send(argv[1], int(argv[2]))
        return 0
    args = _parser().parse_args(argv)
    if args.command == "down":
        removed = cleanup_leftovers(everything=args.all)
        print("\n".join(removed) if removed else "nothing to remove")
        return 0
    try:
        return _with_cluster(args)
    except ClusterError as exc:
        print(f"hvd_cifar: error: {exc}", file=sys.stderr)
        return 2
    except subprocess.TimeoutExpired as exc:
        print(f"hvd_cifar: error: the job ran past {exc.timeout:.0f} s and was killed", file=sys.stderr)
        return 124
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
