"""Running commands on the cluster's hosts. Every process of host i runs in its network
namespace plus a private UTS and mount namespace (``ip netns exec NS unshare --uts --mount sh -c
'hostname H; mount --bind HOSTS /etc/hosts; exec ...'``), so ``gethostname()`` differs per host
and resolves, through the harness's hosts file, to the host's own eth0 address, as on a real
cluster. (Horovod's Gloo process sets bind to the address of the hostname; with a hostname that
resolves to 127.0.0.1 a cross-host Gloo job fails, with one that does not resolve hvd.init()
segfaults.) The file system, /tmp and the venv are shared, so the same absolute python path and
project root work everywhere.

Each function takes the cluster first; ``NetCluster`` offers them as its methods of the same names.
"""
from __future__ import annotations

import os
import shlex
import subprocess
from typing import Sequence

from testbed.netcluster.cleanup import kill
from testbed.netcluster.layout import Layout
from testbed.netcluster.system import NIC, ClusterError, netns_pids, run

# Runs as `sh -c ENTER hvdc-enter HOSTNAME HOSTS_FILE ARGV...` inside a fresh UTS and mount
# namespace: the host's own hostname, resolving via its own /etc/hosts, then the command.
ENTER = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'


def host_argv(cluster: Layout, host_index: int, argv: Sequence[str]) -> list[str]:
    """``argv`` wrapped to run inside host ``host_index``'s namespaces."""
    ns = cluster.namespaces[host_index]
    return ["ip", "netns", "exec", ns, "unshare", "--uts", "--mount", "--propagation", "private",
            "/bin/sh", "-c", ENTER, "hvdc-enter", cluster.hostnames[host_index], cluster.hosts_file, *argv]


def environment(cluster: Layout, env: dict | None = None) -> dict:
    """This process's environment, the harness's ssh and the python's bin first on PATH,
    plus ``env``."""
    base = dict(os.environ)
    base["PATH"] = os.pathsep.join([os.path.dirname(cluster.ssh), os.path.dirname(cluster.python),
                                    base.get("PATH", "/usr/bin:/bin")])
    base.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", "120")  # 30 s default is short on a busy machine
    base.update(env or {})
    return base


def popen(cluster: Layout, host_index: int, argv: Sequence[str], env: dict | None = None,
          cwd: str | None = None, **kwargs) -> subprocess.Popen:
    """Start ``argv`` on host ``host_index`` in its own session (so that Ctrl-C reaches only
    the harness, which then stops it in order)."""
    if not cluster.is_up:
        raise ClusterError("the cluster is not up")
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen(host_argv(cluster, host_index, argv), env=environment(cluster, env),
                            cwd=cwd or cluster.root, start_new_session=True, text=True, **kwargs)


def exec(cluster: Layout, host_index: int, argv: Sequence[str], env: dict | None = None,
         timeout: float = 60, capture: bool = True, check: bool = False) -> subprocess.CompletedProcess:
    """Run ``argv`` on a host and wait. ``stdout`` holds stdout and stderr together when
    ``capture``; otherwise they go to this process's. On timeout every job process on the
    cluster is killed (sshd stays) and ``subprocess.TimeoutExpired`` is raised."""
    out = subprocess.PIPE if capture else None
    p = popen(cluster, host_index, argv, env=env, stdout=out, stderr=subprocess.STDOUT if capture else None)
    try:
        stdout, _ = p.communicate(timeout=timeout)
    except BaseException:  # timeout or Ctrl-C: stop the job everywhere, keep the cluster
        kill_jobs(cluster, extra=[p.pid])
        p.wait()
        raise
    if check and p.returncode != 0:
        raise ClusterError(f"host {host_index}: `{shlex.join(argv)}` exited {p.returncode}: "
                           f"{(stdout or '').strip()[-2000:]}")
    return subprocess.CompletedProcess(list(argv), p.returncode, stdout)


def kill_jobs(cluster: Layout, extra: Sequence[int] = ()) -> None:
    """Kill every process on the hosts except the sshd listeners."""
    keep = {p.pid for p in cluster.sshd}
    kill([pid for ns in cluster.namespaces for pid in netns_pids(ns) if pid not in keep] + list(extra))


def nic_counters(cluster: Layout, host_index: int) -> tuple[int, int]:
    """(rx_bytes, tx_bytes) of the host's eth0 since the cluster came up: Ethernet frames
    (14-byte header + IP + TCP + payload), everything the host sent or received."""
    stats = f"/sys/class/net/{NIC}/statistics"
    result = run(["ip", "netns", "exec", cluster.namespaces[host_index], "cat",
                  f"{stats}/rx_bytes", f"{stats}/tx_bytes"])
    rx, tx = (int(v) for v in result.stdout.split())
    return rx, tx


def nic_table(cluster: Layout, before: Sequence[tuple[int, int]]) -> str:
    """One line per host: the bytes its eth0 sent and received since ``before`` (``nic_counters``
    of every host, taken earlier)."""
    rows = []
    for i, (rx0, tx0) in enumerate(before):
        rx, tx = nic_counters(cluster, i)
        rows.append(f"  host {i} {cluster.hosts[i]}: {NIC} tx {tx - tx0:,} B  rx {rx - rx0:,} B")
    return "\n".join(rows)
