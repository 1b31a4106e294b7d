"""Launcher command lines across the cluster: horovodrun (MPI or Gloo controller, elastic) and
Open MPI's mpirun, one rank per host (or ``per_host``), to run on host 0, which reaches hosts 1.. over ssh through
the switch. The command lines themselves come from ``hvd_cifar.launch.commands``; this module adds the
cluster's hosts, key and interface.

Each function takes the cluster first; ``NetCluster`` offers them as its methods of the same names.
"""
from __future__ import annotations

import os
import subprocess
from typing import Sequence

from hvd_cifar.launch import hostfile as hostfiles
from hvd_cifar.launch import commands
from testbed.netcluster import jobs
from testbed.netcluster.layout import Layout
from testbed.netcluster.ssh import SSH_PORT
from testbed.netcluster.system import NIC, ClusterError


def slots(cluster: Layout, np: int, per_host: int = 1) -> list[tuple[str, int]]:
    """(address, ranks) of the hosts ``np`` ranks fill, ``per_host`` to a host, in order."""
    if per_host < 1 or not 1 <= np <= cluster.n_hosts * per_host:
        raise ClusterError(f"np: {np} ranks need 1..{cluster.n_hosts * max(per_host, 1)} "
                           f"({cluster.n_hosts} hosts, {per_host} rank(s) per host)")
    hosts = -(-np // per_host)
    return [(addr, min(per_host, np - i * per_host)) for i, addr in enumerate(cluster.hosts[:hosts])]


def hostfile(cluster: Layout, np: int, per_host: int = 1) -> str:
    """An Open MPI hostfile (``ADDR slots=N`` lines) for ``np`` ranks, validated."""
    path = os.path.join(cluster.tmpdir, f"hostfile-np{np}-per{per_host}")
    with open(path, "w") as f:
        f.write(hostfiles.mpi_hostfile(slots(cluster, np, per_host)))
    hostfiles.check_slots(hostfiles.parse(path), np, path)
    return path


def train_argv(cluster: Layout, train_args: Sequence[str]) -> list[str]:
    return [*commands.train_program(cluster.python), *train_args]


def _horovodrun_options(cluster: Layout) -> list[str]:
    return ["--network-interfaces", NIC,    # else it probes every interface over ssh first
            "-p", str(SSH_PORT), "--ssh-identity-file", cluster.key,
            "--disable-cache",              # else it writes ~/.horovod/cache.bin
            "--start-timeout", "60"]


def horovodrun_argv(cluster: Layout, np: int, train_args: Sequence[str], gloo: bool = False,
                    program: Sequence[str] | None = None, per_host: int = 1) -> list[str]:
    """horovodrun of ``np`` ranks, ``per_host`` to a host from host 0 on, to run on host 0;
    every rank runs ``program`` if given, else ``python -m hvd_cifar.train train_args``."""
    hosts = slots(cluster, np, per_host)
    options = _horovodrun_options(cluster)
    if not gloo:  # its mpirun already gets btl_tcp_if_include; keep the out-of-band channel on eth0 too
        options.append(f"--mpi-args=-mca oob_tcp_if_include {NIC}")
    return commands.horovodrun(np, program or train_argv(cluster, train_args),
                                hosts=hostfiles.horovod_hosts(hosts),
                                gloo=gloo, options=options, executable=cluster.tool("horovodrun"))


def elastic_argv(cluster: Layout, np: int, min_np: int, max_np: int, discovery_script: str,
                 train_args: Sequence[str]) -> list[str]:
    """horovodrun's elastic mode (Gloo), to run on host 0: starts ``np`` workers on the hosts
    ``discovery_script`` prints (``ADDR:SLOTS`` lines) and follows its output as it changes."""
    return commands.horovodrun(np, train_argv(cluster, train_args), elastic=(min_np, max_np, discovery_script),
                                options=_horovodrun_options(cluster), executable=cluster.tool("horovodrun"))


def mpirun_argv(cluster: Layout, np: int, train_args: Sequence[str], export: dict | None = None,
                program: Sequence[str] | None = None, per_host: int = 1) -> list[str]:
    """Open MPI's mpirun of ``np`` ranks, ``per_host`` to a host from host 0 on, to run on host 0;
    ``export``: environment variables set for every rank (``-x NAME=VALUE``); every rank
    runs ``program`` if given, else ``python -m hvd_cifar.train train_args``."""
    exported = [f"{name}={value}" for name, value in (export or {}).items()]
    mca = {"plm_rsh_args": f"-i {cluster.key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
           "btl": "tcp,self",  # rank-to-rank bytes over TCP only, never shared memory
           "btl_tcp_if_include": NIC, "oob_tcp_if_include": NIC}
    return commands.mpirun(np, program or train_argv(cluster, train_args), hostfile=hostfile(cluster, np, per_host),
                            oversubscribe=False, export=[*exported, "PATH"], mca=mca)


def run_horovodrun(cluster: Layout, np: int, train_args: Sequence[str], gloo: bool = False,
                   timeout: float = 600, capture: bool = True) -> subprocess.CompletedProcess:
    return jobs.exec(cluster, 0, horovodrun_argv(cluster, np, train_args, gloo), timeout=timeout, capture=capture)


def run_mpirun(cluster: Layout, np: int, train_args: Sequence[str], timeout: float = 600,
               capture: bool = True, export: dict | None = None) -> subprocess.CompletedProcess:
    return jobs.exec(cluster, 0, mpirun_argv(cluster, np, train_args, export), timeout=timeout, capture=capture)
