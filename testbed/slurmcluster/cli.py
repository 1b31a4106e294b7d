"""A Slurm cluster on this machine for one command: up, COMMAND with SLURM_CONF set (so that
sbatch, squeue, scontrol and sacct -c reach it), down; COMMAND's exit status is the CLI's.

    python -m testbed.slurmcluster run --nodes 2 -- 'sbatch --wait launch/slurm.sbatch --config configs/tiny.yaml'
    python -m testbed.slurmcluster run --nodes 2 -- bash      # a shell on it; exit tears it down
    python -m testbed.slurmcluster run --nodes 2 --netcluster --rate 1gbit -- 'srun -N 2 hostname'
                                                   # nodes in a namespace cluster's hosts, links shaped
    python -m testbed.slurmcluster down          # stop what harnesses that died left running
"""
from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys

from hvd_cifar.launch.slurm import SlurmError
from testbed.netcluster.shaping import DEFAULT_RATE, rate_or_none
from testbed.netcluster.system import ClusterError
from testbed.slurmcluster.cleanup import cleanup_leftovers
from testbed.slurmcluster.cluster import SlurmCluster
from testbed.slurmcluster.daemons import die_with_parent


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m testbed.slurmcluster", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="start a cluster, run COMMAND on it, stop it")
    run_p.add_argument("--nodes", type=int, default=2, help="slurmd nodes, 1..16 (default 2)")
    run_p.add_argument("--cpus-per-node", type=int, default=2, help="CPUs each node offers (default 2)")
    run_p.add_argument("--keep", action="store_true", help="leave the temp dir (logs, completion log) behind")
    run_p.add_argument("--netcluster", action="store_true",
                       help="each node in a host of a namespace cluster (python -m testbed.netcluster)")
    run_p.add_argument("--rate", help=f"with --netcluster: link rate, tc syntax, or 'none' (default {DEFAULT_RATE})")
    run_p.add_argument("cmd", nargs=argparse.REMAINDER,
                       help="-- then COMMAND: one argument is a shell command line, several an argv")
    down_p = sub.add_parser("down", help="stop what harnesses that are no longer running left behind")
    down_p.add_argument("--all", action="store_true", help="also those of running harnesses")
    return parser


def _run(cluster: SlurmCluster, cmd: list[str]) -> int:
    argv = ["bash", "-c", cmd[0]] if len(cmd) == 1 else cmd
    print(f"slurmcluster: {len(cluster.nodes)} node(s) idle, SLURM_CONF={cluster.layout.conf}; "
          f"running {shlex.join(cmd)}", file=sys.stderr, flush=True)
    net = cluster.net
    if net:
        for i, node in enumerate(cluster.nodes):
            print(f"slurmcluster: node {node}: host {i} {net.hosts[i]} hostname {net.hostnames[i]}, "
                  f"links {net.rate or 'unshaped'}", file=sys.stderr)
        before = [net.nic_counters(i) for i in range(net.n_hosts)]
    # COMMAND gets SIGTERM if this harness dies (even by SIGKILL), as the daemons get SIGKILL
    proc = subprocess.Popen(argv, env=cluster.env(), preexec_fn=lambda: die_with_parent(signal.SIGTERM))
    try:
        status = proc.wait()
        if net:
            print(f"slurmcluster: NIC bytes during the command:\n{net.nic_table(before)}", file=sys.stderr)
        return status
    finally:
        if proc.poll() is None:  # we were stopped (a signal): the command goes too
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "down":
        removed = cleanup_leftovers(everything=args.all)
        print("\n".join(removed) if removed else "nothing to remove")
        return 0
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("hvd_cifar: error: run: no COMMAND after --", file=sys.stderr)
        return 2
    # --rate without --netcluster reaches SlurmCluster, which refuses it
    rate = rate_or_none(args.rate or DEFAULT_RATE) if args.netcluster else args.rate
    try:
        with SlurmCluster(args.nodes, cpus_per_node=args.cpus_per_node, keep_dir=args.keep,
                          netcluster=args.netcluster, rate=rate) as cluster:
            status = _run(cluster, cmd)
        if args.keep:
            print(f"slurmcluster: logs left in {cluster.layout.tmpdir}", file=sys.stderr)
        return status
    except (ClusterError, SlurmError) as exc:  # SlurmError: a Slurm command of the product's failed
        print(f"hvd_cifar: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
