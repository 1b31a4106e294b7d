"""A Slurm cluster whose nodes are the hosts of a namespace cluster (``SlurmCluster(netcluster=True)``,
``python -m testbed.slurmcluster run --netcluster --rate``): one srun --mpi=pmix task per host,
each on its host's hostname and address, and the bytes of their allreduce on the hosts' NICs, at
the links' rate; everything gone afterwards, also when the code using it fails with a job running.

    .venv/bin/python -m pytest -q tests/test_slurm_netcluster.py      # as root; about 15 s
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import NEEDS_NETNS, ROOT
from testbed.netcluster import list_namespaces
from testbed.slurmcluster import SlurmCluster
from test_slurm import alive, needs_slurm

pytestmark = NEEDS_NETNS

ALLREDUCE_BYTES = 5_000_000
RATE, RATE_BITS_PER_S = "200mbit", 200e6   # slow enough that the shaping shows in the allreduce's time
TASK = [sys.executable, str(ROOT / "tests" / "slurm_net_task.py"), str(ALLREDUCE_BYTES)]
SRUN = ["srun", "-N", "2", "--ntasks-per-node=1"]


@needs_slurm
def test_nodes_in_the_namespace_hosts_talk_over_the_shaped_links():
    with pytest.raises(RuntimeError, match="half-way"):
        with SlurmCluster(nodes=2, netcluster=True, rate=RATE) as cluster:
            net, env = cluster.net, cluster.env()
            names, tmpdir = [*net.namespaces, net.switch_ns], cluster.layout.tmpdir
            daemons = [p.pid for p in cluster.daemons.values()]
            before = [net.nic_counters(i) for i in range(2)]
            # srun from this test's own namespace: its wrapper on env's PATH enters the switch's
            step = subprocess.run([*SRUN, "--mpi=pmix", *TASK], env=env, cwd=ROOT, capture_output=True, text=True,
                                  timeout=60)
            after = [net.nic_counters(i) for i in range(2)]
            assert step.returncode == 0, step.stderr
            tasks = sorted((json.loads(line) for line in step.stdout.splitlines()), key=lambda t: t["rank"])
            assert [(t["node"], t["hostname"], t["addr"]) for t in tasks] == list(zip(cluster.nodes, net.hostnames, net.hosts))
            assert all(t["sum_ok"] and t["size"] == 2 for t in tasks)
            # each rank sends and receives at least its NBYTES (ring or halving alike), so its
            # host's link carried them, at no more than the rate
            for i, task in enumerate(tasks):
                rx, tx = (after[i][k] - before[i][k] for k in (0, 1))
                assert min(rx, tx) >= ALLREDUCE_BYTES, f"host {i}: eth0 rx {rx} B, tx {tx} B"
                assert task["seconds"] >= 0.9 * ALLREDUCE_BYTES * 8 / RATE_BITS_PER_S, task
            # a job left running when the code using the cluster fails
            job = subprocess.Popen([*SRUN, "sh", "-c", "echo $$; exec sleep 300"], env=env, stdout=subprocess.PIPE,
                                   text=True)
            task_pids = [int(job.stdout.readline()) for _ in range(2)]  # both tasks running
            raise RuntimeError("half-way")
    job.wait(timeout=30)
    assert not [pid for pid in [*task_pids, *daemons] if alive(pid)]
    assert not set(names) & set(list_namespaces()) and not os.path.exists(tmpdir)


@needs_slurm
def test_the_cli_runs_the_command_on_the_namespace_cluster_and_passes_on_its_status():
    cli = [sys.executable, "-m", "testbed.slurmcluster", "run", "--nodes", "2"]
    proc = subprocess.run([*cli, "--netcluster", "--rate", "1gbit", "--", "srun -N 2 hostname; exit 3"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    hosts = [line.split("hostname ")[1].split(",")[0] for line in proc.stderr.splitlines() if ": node n" in line]
    assert len(hosts) == 2 and sorted(proc.stdout.split()) == sorted(hosts), proc.stderr
    assert "links 1gbit" in proc.stderr and "NIC bytes during the command" in proc.stderr
    proc = subprocess.run([*cli, "--rate", "1gbit", "--", "true"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "--netcluster" in proc.stderr, proc.stderr
