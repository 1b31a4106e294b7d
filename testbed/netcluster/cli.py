"""A cluster of real hosts on one machine: network namespaces joined by a shaped switch, each
host with its own address, hostname and sshd, so that horovodrun and mpirun launch over ssh
and every byte between ranks crosses a NIC whose counters can be read.

    python -m testbed.netcluster up --hosts 4 --rate 1gbit      # prints addresses; Ctrl-C tears down
    python -m testbed.netcluster run --hosts 2 --launcher horovodrun -- --config configs/tiny.yaml
    python -m testbed.netcluster run --hosts 4 --launcher mpirun -- --config configs/tiny.yaml
    python -m testbed.netcluster run --hosts 2 --launcher horovodrun --gloo -- --config configs/tiny.yaml
    python -m testbed.netcluster throughput --hosts 2 --rate 1gbit   # bulk TCP, host 1 -> host 0
    python -m testbed.netcluster down          # remove leftovers of harnesses that died (--all: every one)
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time

from testbed.netcluster import throughput
from testbed.netcluster.cleanup import cleanup_leftovers
from testbed.netcluster.cluster import NetCluster
from testbed.netcluster.shaping import DEFAULT_RATE, rate_or_none
from testbed.netcluster.system import ClusterError


def _print_cluster(cluster: NetCluster) -> None:
    rate = cluster.rate or "unshaped"
    print(f"{cluster.n_hosts} host(s), links {rate}, mtu {cluster.mtu}, temp dir {cluster.tmpdir}")
    for i, (addr, name) in enumerate(zip(cluster.hosts, cluster.hostnames)):
        print(f"  host {i}: {addr}  hostname {name}  (ip netns exec {cluster.namespaces[i]} ...)")
    print(f"ssh: {cluster.ssh} ADDR   (key {cluster.key})", flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m testbed.netcluster",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def cluster_args(p):
        p.add_argument("--hosts", type=int, default=2, help="hosts (network namespaces), 1..16")
        p.add_argument("--rate", default=DEFAULT_RATE, help=f"link rate, tc syntax, or 'none' (default {DEFAULT_RATE})")
        p.add_argument("--mtu", type=int, default=9000)

    cluster_args(sub.add_parser("up", help="start a cluster and keep it until Ctrl-C"))
    run_p = sub.add_parser("run", help="start a cluster, run one training job across it, tear down")
    cluster_args(run_p)
    run_p.add_argument("--launcher", choices=("horovodrun", "mpirun"), default="horovodrun")
    run_p.add_argument("--gloo", action="store_true", help="horovodrun with the Gloo controller")
    run_p.add_argument("--np", type=int, default=0, help="ranks (default: every slot of every host)")
    run_p.add_argument("--per-host", type=int, default=1, help="ranks per host (default 1)")
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
    np = args.np or cluster.n_hosts * args.per_host
    if args.launcher == "mpirun":
        command = cluster.mpirun_argv(np, train_args, per_host=args.per_host)
    else:
        command = cluster.horovodrun_argv(np, train_args, gloo=args.gloo, per_host=args.per_host)
    print(f"on host 0: {shlex.join(command)}", flush=True)
    before = [cluster.nic_counters(i) for i in range(cluster.n_hosts)]
    result = cluster.exec(0, command, timeout=args.timeout, capture=False)
    print(f"exit status {result.returncode}; NIC bytes during the job:\n{cluster.nic_table(before)}")
    return result.returncode


def _with_cluster(args: argparse.Namespace) -> int:
    rate = rate_or_none(args.rate)
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
    if argv and argv[0] == "_recv":  # the ends of NetCluster.throughput, run inside hosts
        throughput.recv(argv[1], int(argv[2]))
        return 0
    if argv and argv[0] == "_send":
        throughput.send(argv[1], int(argv[2]))
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
