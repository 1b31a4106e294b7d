"""Slurm against mpirun on the same hosts: one training config, launched
once as ``sbatch launch/slurm.sbatch`` (srun --mpi=pmix, one task per node) and once as
``launch/mpirun.sh`` (one rank per host, over ssh), on the same 2 hosts of a namespace cluster
whose links run at --rate: a Slurm cluster with ``netcluster=True`` (testbed.slurmcluster),
whose hosts mpirun.sh reaches too. The two alternate, the first launcher changing each round.
Written to the results file benchmarks/results/slurm_vs_mpirun.json (hvd_cifar.measure.results): each
job's final test accuracy, steady-state img/s (hvd_cifar.analysis.summary: the epochs after the
first) and wall seconds, medians and spreads, and per round Slurm's img/s over mpirun's; a failed
job is a failed round with its reason. Its table is printed.

    .venv/bin/python benchmarks/slurm_vs_mpirun.py [--config configs/demo.yaml] [--rate 1gbit]
        [--repeats 3] [--epochs N] [--steps N] [--out logs/slurm-vs-mpirun-YYYYmmdd-HHMMSS]
        [--tag TAG] [--results benchmarks/results]

As root, with Slurm installed (scripts/install.sh). Every job gets the namespace cluster's
trainer flags (testbed.jobs.CLUSTER_TRAIN_FLAGS: seed 0, one thread per rank, no checkpoints,
bytes counted on eth0); the Slurm jobs ask for --cpus-per-task=1 to match.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from testbed import jobs, render_docs
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options
from hvd_cifar.runfolder.reader import load_run
from testbed.slurmcluster import SlurmCluster
from hvd_cifar.analysis.summary import summarize

LAUNCHERS = ("slurm", "mpirun")
NODES = 2
# wall seconds: sbatch --wait polls with growing intervals, so a Slurm job's end is seen late
FIGURES = {"test_acc": Figure("final test acc", ".4f"), "images_per_s": Figure("img/s", ".1f"),
           "seconds": Figure("wall (s)", ".0f"), "ratio": Figure("Slurm / mpirun (img/s)", ".3f")}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/demo.yaml", help="the trainer's config (default configs/demo.yaml)")
    p.add_argument("--rate", default="1gbit", help="link rate, tc syntax (default 1gbit)")
    p.add_argument("--epochs", type=int, default=0, help="epochs per job (default: the config's)")
    p.add_argument("--steps", type=int, default=0, help="steps per epoch per rank (default: the config's)")
    jobs.add_options(p, repeats=3, timeout=1800)
    add_results_options(p)
    p.add_argument("--out", default=time.strftime("logs/slurm-vs-mpirun-%Y%m%d-%H%M%S"))
    return p.parse_args(argv)


def train_flags(args, name: str) -> list[str]:
    runs = os.path.abspath(os.path.join(args.out, "runs"))
    flags = ["--config", args.config, *jobs.CLUSTER_TRAIN_FLAGS, "--log-dir", runs, "--run-name", name]
    flags += ["--epochs", str(args.epochs)] if args.epochs else []
    return flags + (["--max-steps-per-epoch", str(args.steps)] if args.steps else [])


def run_job(cluster: SlurmCluster, launcher: str, name: str, args) -> dict:
    """One training job on the cluster's hosts; its row (accuracy, img/s) from its run folder."""
    log = os.path.abspath(os.path.join(args.out, "logs", f"{name}.log"))   # the job's output
    if launcher == "slurm":   # sbatch --wait: exits with the job's status
        argv = ["sbatch", "--wait", f"-N{NODES}", "--ntasks-per-node=1", "--cpus-per-task=1", f"--output={log}",
                "launch/slurm.sbatch", *train_flags(args, name)]
        done = jobs.run(name, argv, log=log.replace(".log", ".sbatch.log"), env={**cluster.env(), "PYTHONUNBUFFERED": "1"},
                        timeout=args.timeout)
    else:                     # on host 0, as on any cluster's first host
        net = cluster.net
        argv = ["launch/mpirun.sh", "-np", str(NODES), "-hostfile", net.hostfile(NODES), *train_flags(args, name)]
        done = jobs.run(name, lambda: net.exec(0, argv, timeout=args.timeout), log=log)
    row = summarize(load_run(os.path.join(args.out, "runs", name)))
    print(f"{name}: {done.seconds:.0f} s, test acc {row['final_test_acc']:.4f}, {row['images_per_s']:.1f} img/s",
          file=sys.stderr, flush=True)
    return {"launcher": launcher, "run": name, "seconds": done.seconds, "test_acc": row["final_test_acc"],
            "images_per_s": row["images_per_s"]}


@jobs.one_line_errors("slurm_vs_mpirun")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    results = Results("slurm_vs_mpirun", args, FIGURES, argv)
    results.sample_noise = False  # its jobs run on a cluster's hosts, not as this process's children
    with SlurmCluster(nodes=NODES, cpus_per_node=1, netcluster=True, rate=args.rate) as cluster:
        for k in range(1, args.repeats + 1):
            for launcher in jobs.rotated(LAUNCHERS, k - 1):
                results.measure(k, launcher, lambda: {key: value for key, value in run_job(
                    cluster, launcher, f"{launcher}-{k}", args).items() if key in FIGURES})
    results.derive("slurm / mpirun", "ratio", lambda r: r["slurm"]["images_per_s"] / r["mpirun"]["images_per_s"])
    path = results.write()
    print(render_docs.render_block(os.path.basename(path), os.path.dirname(path)), end="")
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
