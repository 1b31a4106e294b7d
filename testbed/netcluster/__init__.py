"""A cluster of real hosts on one machine (network namespaces joined by a shaped switch, each
host with its own address, hostname and sshd), for multi-host horovodrun and mpirun jobs whose
bytes cross NICs that can be read. Needs root, iproute2, util-linux unshare, openssh-server.

    with NetCluster(n_hosts=2, rate="1gbit") as cluster:
        result = cluster.run_horovodrun(2, ["--config", "configs/tiny.yaml"])
        rx_bytes, tx_bytes = cluster.nic_counters(1)

The command line (``python -m testbed.netcluster up|run|throughput|down``) is cli.py. The rest:
cluster.py NetCluster, up and down, the namespaces and veths; layout.py its names and paths;
shaping.py tc; ssh.py sshd per host; jobs.py commands on a host; launch.py horovodrun/mpirun
command lines; throughput.py link measurement; cleanup.py teardown and leftovers; system.py
the shared error and ``ip`` calls.
"""
from testbed.netcluster.cleanup import cleanup_leftovers
from testbed.netcluster.cli import main
from testbed.netcluster.cluster import ROOT, NetCluster
from testbed.netcluster.shaping import parse_rate
from testbed.netcluster.system import NIC, PREFIX, ClusterError, list_namespaces, netns_pids

_netns_pids = netns_pids  # the name tests/test_elastic.py uses

__all__ = ["NIC", "PREFIX", "ROOT", "ClusterError", "NetCluster", "cleanup_leftovers",
           "list_namespaces", "main", "parse_rate"]
