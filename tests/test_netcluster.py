"""The network-namespace cluster: clean teardown, real multi-host horovodrun and mpirun jobs
whose gradient bytes show up on the hosts' NICs, and link shaping that holds its rate.

    .venv/bin/python -m pytest -q tests/test_netcluster.py      # as root; about 2 minutes
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import NEEDS_NETNS
from testbed.netcluster import NetCluster, list_namespaces


pytestmark = [
    *NEEDS_NETNS,
]

TRAIN = ["--config", "configs/tiny.yaml", "--threads-per-rank", "1"]  # 2 cores: one thread per rank


def _root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip() for line in out.splitlines()}


def _sshd_pids(tmpdir: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", f"sshd .*{tmpdir}"], capture_output=True, text=True).stdout.split()


def _assert_gone(names: list[str], tmpdir: str, links_before: set[str]) -> None:
    assert not set(names) & set(list_namespaces())
    assert not _sshd_pids(tmpdir)
    assert not os.path.exists(tmpdir)
    assert _root_links() <= links_before  # nothing added to the root namespace


def test_up_down_leaves_nothing_behind():
    links_before = _root_links()
    with NetCluster(n_hosts=2, rate=None) as cluster:
        names = [*cluster.namespaces, cluster.switch_ns]
        tmpdir = cluster.tmpdir
        assert set(names) <= set(list_namespaces())
        assert len(_sshd_pids(tmpdir)) == 2
        assert _root_links() <= links_before  # veths and bridge live only in the namespaces
        # host 0 reaches host 1 over ssh; each host has its own hostname, resolvable to its address
        hello = cluster.exec(0, ["ssh", cluster.hosts[1], "hostname; getent hosts $(hostname)"], check=True)
        assert hello.stdout.split()[:2] == [cluster.hostnames[1], cluster.hosts[1]]
    _assert_gone(names, tmpdir, links_before)

    with pytest.raises(RuntimeError, match="inside the with-block"):
        with NetCluster(n_hosts=2) as cluster:
            names = [*cluster.namespaces, cluster.switch_ns]
            tmpdir = cluster.tmpdir
            job = cluster.popen(1, ["sleep", "300"])  # a job still running when the block fails
            raise RuntimeError("inside the with-block")
    _assert_gone(names, tmpdir, links_before)
    assert job.poll() is not None


def _check_run(result, run_dir: str, cluster: NetCluster, np: int, before, after) -> None:
    assert result.returncode == 0, result.stdout[-4000:]
    with open(os.path.join(run_dir, "meta.json")) as f:
        meta = json.load(f)
    assert meta["world_size"] == np
    assert meta["hostnames"] == cluster.hostnames[:np]  # one rank on each host
    # across hosts Horovod's allreduce is Gloo's under either controller, on the cluster's interface
    assert {k: meta["comm_settings"].get(k) for k in ("HOROVOD_CPU_OPERATIONS", "HOROVOD_GLOO_IFACE")} == \
        {"HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": "eth0"}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    gradient_bytes = sum(r["comm_bytes_per_rank"] for r in records)  # what one rank sends
    assert gradient_bytes > 0
    for i in range(np):
        rx = after[i][0] - before[i][0]
        tx = after[i][1] - before[i][1]
        # Each host's NIC carried at least its rank's allreduce traffic, in and out.
        assert tx >= gradient_bytes, f"host {i}: eth0 sent {tx} B < {gradient_bytes} B of gradients"
        assert rx >= gradient_bytes, f"host {i}: eth0 received {rx} B < {gradient_bytes} B of gradients"


@pytest.mark.slow
@pytest.mark.parametrize("gloo", [False, True], ids=["mpi", "gloo"])
def test_horovodrun_across_two_hosts(tmp_path, gloo):
    with NetCluster(n_hosts=2, rate="1gbit") as cluster:
        before = [cluster.nic_counters(i) for i in range(2)]
        result = cluster.run_horovodrun(2, [*TRAIN, "--log-dir", str(tmp_path), "--run-name", "hvd2"],
                                        gloo=gloo, timeout=300)
        after = [cluster.nic_counters(i) for i in range(2)]
        _check_run(result, str(tmp_path / "hvd2"), cluster, 2, before, after)


@pytest.mark.slow
def test_mpirun_across_four_hosts(tmp_path):
    with NetCluster(n_hosts=4, rate="1gbit") as cluster:
        before = [cluster.nic_counters(i) for i in range(4)]
        result = cluster.run_mpirun(4, [*TRAIN, "--log-dir", str(tmp_path), "--run-name", "mpi4"], timeout=300)
        after = [cluster.nic_counters(i) for i in range(4)]
        _check_run(result, str(tmp_path / "mpi4"), cluster, 4, before, after)


def test_shaped_links_hold_their_rate():
    with NetCluster(n_hosts=3, rate="1gbit") as cluster:
        one = cluster.throughput([1], 0, 50_000_000)
        # TCP's payload tops out near 0.95 Gbit/s on a 1 Gbit/s link; the shaper lets no more
        # through (the upper bound: its rate and burst, whatever the load), and a loaded host only
        # sends less, so the lower bound sits far enough below to hold under the suite's load.
        assert 0.6e9 <= one <= 1.1e9, f"one sender at 1gbit: {one / 1e9:.3f} Gbit/s"
        # Two senders into one host: its receiving side is the bottleneck, as on a switch.
        both = cluster.throughput([1, 2], 0, 25_000_000)
        assert both <= 1.1e9, f"two senders into one 1gbit host: {both / 1e9:.3f} Gbit/s"
        cluster.shape(None)
        fast = cluster.throughput([1], 0, 50_000_000)
        assert fast >= 2e9, f"unshaped link: {fast / 1e9:.3f} Gbit/s, expected far above 1"


def test_ranks_fill_hosts_per_host_at_a_time(tmp_path):
    """np ranks, per_host to a host from host 0 on: the hostfile, horovodrun's -H and mpirun's
    command line agree; more ranks than slots is one ClusterError (no cluster needs to be up)."""
    from testbed.netcluster import launch
    from testbed.netcluster.layout import Layout
    from testbed.netcluster.system import ClusterError

    layout = Layout(3, "/venv/bin/python", str(tmp_path))
    layout.hosts, layout.tmpdir = ["10.9.0.1", "10.9.0.2", "10.9.0.3"], str(tmp_path)
    assert launch.slots(layout, 4, 2) == [("10.9.0.1", 2), ("10.9.0.2", 2)]
    assert launch.slots(layout, 5, 2) == [("10.9.0.1", 2), ("10.9.0.2", 2), ("10.9.0.3", 1)]
    assert launch.slots(layout, 2) == [("10.9.0.1", 1), ("10.9.0.2", 1)]
    with open(launch.hostfile(layout, 3, 2)) as f:
        assert f.read() == "10.9.0.1 slots=2\n10.9.0.2 slots=1\n"
    argv = launch.horovodrun_argv(layout, 4, [], per_host=2)
    assert argv[argv.index("-H") + 1] == "10.9.0.1:2,10.9.0.2:2"
    argv = launch.mpirun_argv(layout, 4, [], per_host=2)
    with open(argv[argv.index("--hostfile") + 1]) as f:
        assert f.read() == "10.9.0.1 slots=2\n10.9.0.2 slots=2\n"
    for np, per_host in ((7, 2), (4, 1), (0, 1)):
        with pytest.raises(ClusterError, match=f"np: {np} ranks need"):
            launch.slots(layout, np, per_host)
