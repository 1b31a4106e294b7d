"""Does a communication scheme get a run to its accuracy sooner on a given link? Each scheme at
its defaults against uncompressed Horovod on the namespace cluster, the same seed for every scheme
of a round, at several link rates: the wall time to a test-accuracy target and the final accuracy.

    .venv/bin/python benchmarks/time_to_accuracy.py     # as root; about 50 minutes on 2 shared cores
        [--np 2] [--model smallcnn] [--schemes none fp16 powersgd topk localsgd]
        [--rates 1gbit 100mbit 20mbit] [--epochs 6] [--target-acc 0.95] [--repeats 5]
        [--out logs/bench-time_to_accuracy-YYYYmmdd-HHMMSS] [--tag TAG] [--results benchmarks/results]

One cluster of --np hosts (``testbed.netcluster``: one rank and one core per host, links shaped
with tc), every job ``horovodrun --gloo`` on digits with --epochs whole epochs and
``--target-acc``, every other key at its default (each scheme's flags: benchmarks/compression.py's
SCHEMES). Round k trains with seed 100 + k: within it every rate (in an order that rotates from
round to round) and at each rate every scheme (rotated too), so that the machine's load drifts
over all alike and each scheme pairs with ``none`` of its own seed and rate.

Per job (config ``SCHEME RATE``): the final test accuracy, the epochs and the wall time to the
target (the trainer's ``time_to_target_s``: training and evaluation up to the first epoch at or
above it), and the run's training time. Per round, rate and scheme: its time to the target over
none's (``time_of_none``; a round where one of the two never reached it cannot be paired and says
so) and its final accuracy minus none's in points. docs/COMM_OPTIONS.md renders the verdict per
link from all rounds (pays: the paired ratio's 95 % interval wholly below 1; does not pay: wholly
above; unresolved) and a plot of the time to the target against the link rate.

Written to the results file benchmarks/results/time_to_accuracy.json (hvd_cifar.measure.results:
every round, written again after each); run folders in OUT/runs/RATE/SCHEME-rK, outputs in
OUT/logs/; the tables, rendered from it, are printed and left in OUT/time_to_accuracy.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from hvd_cifar.launch.commands import ROOT
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options
from testbed import jobs, render_docs
from testbed.netcluster import NetCluster

from compression import SCHEMES, accuracy_row  # benchmarks/compression.py: each scheme's flags at its defaults

SEED_BASE = 100  # round k trains with seed SEED_BASE + k
FIGURES = {
    "test_acc": Figure("final test acc", ".4f"),
    "epochs_to_target": Figure("epochs to target", ".0f"),
    "time_to_target_s": Figure("time to target (s)", ".1f"),
    "training_time_s": Figure("training time (s)", ".1f"),
    "time_of_none": Figure("time to target x none's", ".3f"),
    "points_vs_none": Figure("final acc - none's (points)", "+.2f"),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2, help="ranks, one per host")
    p.add_argument("--model", default="smallcnn")
    p.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=list(SCHEMES))
    p.add_argument("--rates", nargs="+", default=["1gbit", "100mbit", "20mbit"], help="link rates, tc syntax")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--target-acc", type=float, default=0.95)
    p.add_argument("--out", default=os.path.join(ROOT, "logs", time.strftime("bench-time_to_accuracy-%Y%m%d-%H%M%S")))
    jobs.add_options(p, timeout=1800, repeats=5)
    add_results_options(p)
    args = p.parse_args(argv)
    if "none" not in args.schemes:
        p.error("--schemes: needs none (every scheme is paired with it)")
    return args


def train(cluster: NetCluster, rate: str, name: str, k: int, args) -> dict:
    """One job at ``rate``: its figures."""
    flags = ["--dataset", "digits", "--model", args.model, "--epochs", str(args.epochs), "--target-acc",
             str(args.target_acc), "--seed", str(SEED_BASE + k), *SCHEMES[name]]
    run_dir = jobs.cluster_training(cluster, args.np, flags, os.path.join(args.out, "runs", rate), f"{name}-r{k}",
                                    label=f"{name} {rate}", log=os.path.join(args.out, "logs", f"{rate}-{name}-r{k}.log"),
                                    timeout=args.timeout)
    row = accuracy_row(run_dir)
    return {key: row[key] for key in ("test_acc", "epochs_to_target", "time_to_target_s", "training_time_s")
            if isinstance(row.get(key), (int, float)) and row[key] == row[key]}


def run_round(cluster: NetCluster, results: Results, k: int, args) -> None:
    for rate in jobs.rotated(args.rates, k - 1):
        cluster.shape(rate)
        for name in jobs.rotated(args.schemes, k - 1):
            results.measure(k, f"{name} {rate}", lambda: train(cluster, rate, name, k, args))
        results.write()


def reached(figures: dict, config: str) -> float:
    """``config``'s time to the target in a round, or why there is none."""
    if "time_to_target_s" not in figures:
        raise ValueError(f"{config} did not reach the target")
    return figures["time_to_target_s"]


def derive(results: Results, args) -> None:
    """Per rate and scheme, each round's time to the target and final accuracy against none's."""
    for rate in args.rates:
        for name in args.schemes:
            if name == "none":
                continue
            mine, none = f"{name} {rate}", f"none {rate}"
            results.derive(f"{name} / none {rate}", "time_of_none",
                           lambda r, a=mine, b=none: reached(r[a], a) / reached(r[b], b))
            results.derive(f"{name} / none {rate}", "points_vs_none",
                           lambda r, a=mine, b=none: 100 * (r[a]["test_acc"] - r[b]["test_acc"]))


@jobs.one_line_errors("time_to_accuracy")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    results = Results("time_to_accuracy", args, FIGURES, argv)
    results.sample_noise = False  # its jobs run on a cluster's hosts, not as this process's children
    results.plan(jobs=args.repeats * len(args.rates) * len(args.schemes), rounds=args.repeats)
    with NetCluster(n_hosts=args.np, rate=args.rates[0]) as cluster:
        for k in range(1, args.repeats + 1):
            run_round(cluster, results, k, args)
    derive(results, args)
    path = results.write()
    name, folder = os.path.basename(path), os.path.dirname(path)
    pairs = " ".join(f'pair="{s} {rate}|none {rate}"' for rate in args.rates for s in args.schemes if s != "none")
    specs = [f'match=" [0-9.]+[kmg]?bit$"', f"show=paired ratio=true figure=time_to_target_s target=1 "
             f"better=lower verdicts=pays,does_not_pay {pairs}"]
    jobs.write_results(args.out, "time_to_accuracy", results.data,
                       "\n\n".join(render_docs.render_block(f"{name} {spec}", folder) for spec in specs))
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
