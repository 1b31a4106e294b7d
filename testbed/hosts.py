"""Your own hosts in the namespace cluster's place, for the benchmarks that take --hostfile: the
same ``run_horovodrun`` / ``shape`` / ``with`` as testbed.netcluster.NetCluster, the jobs started
by launch/horovodrun.sh -hostfile FILE from this machine (the hostfile's first host, with the
run folders on a file system every host shares), the links as they are.

    with Hosts("my-hosts") as cluster:
        jobs.cluster_training(cluster, 4, [*Hosts.FLAGS, ...], runs, name, label=..., log=..., timeout=900)
"""
from __future__ import annotations

import subprocess

from hvd_cifar.launch import commands


class Hosts:
    # After testbed.jobs.CLUSTER_TRAIN_FLAGS, which they override: the busiest interface and the
    # trainer's own choice of threads, as on any real cluster.
    FLAGS = ("--nic", "auto", "--threads-per-rank", "0")

    def __init__(self, hostfile: str):
        self.hostfile = hostfile

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def shape(self, rate: str) -> None:
        """The links are the hosts' own: nothing to shape."""

    def run_horovodrun(self, np: int, train: list[str], gloo: bool = True, timeout: float | None = None):
        argv = [*commands.script("horovodrun", np, self.hostfile, ["--gloo"] if gloo else []), *train]
        return subprocess.run(argv, cwd=commands.ROOT, env=commands.job_env(), text=True, capture_output=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
