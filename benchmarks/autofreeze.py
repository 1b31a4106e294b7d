"""freeze: auto against no freezing, side by side on the namespace cluster: final test accuracy,
and the gradient bytes each rank sent over the whole run, analytic (metrics.jsonl) and measured
at each host's NIC.

    .venv/bin/python benchmarks/autofreeze.py          # as root; about 10 minutes on 2 shared cores
        [--np 2] [--model vgg11] [--epochs 6] [--threshold 0.02] [--rate 1gbit]
        [--repeats 1] [--out logs/bench-autofreeze-YYYYmmdd-HHMMSS] [--tag TAG] [--results benchmarks/results]

Two jobs, ``freeze: 0`` and ``freeze: auto`` (``--freeze-auto-threshold``), on one cluster of
--np hosts (``testbed.netcluster``: one rank per host, links shaped to --rate), each
``horovodrun --gloo`` on digits with every other key at its default (batch 32 per rank, the
model's lr, one epoch of warm-up, onecycle). Bytes over the run are sums over all epochs, the
first included: what a run costs, not a steady state. --repeats rounds, the two in an order that
alternates. Each job's run folder lands in OUT/runs/NAME-rK and its output in OUT/logs/; the
figures are made from the runs' metrics.jsonl and events.jsonl alone and written to the results
file benchmarks/results/autofreeze.json (hvd_cifar.measure.results: every round, medians and spreads, per
round auto's bytes over none's and its accuracy against none's; each auto run's freezes kept
with its round), whose table is printed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from testbed import jobs, render_docs
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options
from hvd_cifar.core.config import Config
from hvd_cifar.launch.commands import ROOT
from testbed.netcluster import NetCluster
from hvd_cifar.analysis.summary import run_bytes
from hvd_cifar.runfolder.reader import load_run

FIGURES = {"test_acc": Figure("final test acc", ".4f"), "bytes": Figure("analytic MB/rank over the run", ".1f", 1e6),
           "nic_tx_bytes": Figure("eth0 tx MB/rank over the run", ".1f", 1e6),
           "training_time_s": Figure("training time (s)", ".1f"),
           "saved_fraction": Figure("saved (its own record)", ".4f"),
           "of_none": Figure("eth0 tx x none's", ".4f"), "points": Figure("accuracy - none's (points)", "+.2f")}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2, help="ranks, one per host")
    p.add_argument("--model", default="vgg11")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--threshold", type=float, default=Config.freeze_auto_threshold,
                   help="freeze_auto_threshold of the auto job (default: the config's)")
    p.add_argument("--rate", default="1gbit", help="link rate, tc syntax")
    p.add_argument("--out", default=os.path.join(ROOT, "logs", time.strftime("bench-autofreeze-%Y%m%d-%H%M%S")))
    jobs.add_options(p, timeout=1800, repeats=1)
    add_results_options(p)
    return p.parse_args(argv)


def run_job(cluster: NetCluster, name: str, flags: list[str], args) -> str:
    """One training job; its run folder."""
    return jobs.cluster_training(cluster, args.np, ["--dataset", "digits", "--model", args.model, "--epochs",
                                                    str(args.epochs), *flags], os.path.join(args.out, "runs"), name,
                                 label=name, log=os.path.join(args.out, "logs", f"{name}.log"), timeout=args.timeout)


def summarize(run_dir: str) -> dict:
    """One job's row: bytes over the run from hvd_cifar.report, the freezes from events.jsonl."""
    run = load_run(run_dir)
    events_path = os.path.join(run_dir, "events.jsonl")
    events = [json.loads(line) for line in open(events_path)] if os.path.exists(events_path) else []
    return {**run_bytes(run.metrics),
            "test_acc": run.metrics[-1]["test_acc"],
            "test_acc_per_epoch": [r["test_acc"] for r in run.metrics],
            "frozen_blocks_per_epoch": [r["frozen_blocks"] for r in run.metrics],
            "training_time_s": sum(r["epoch_time_s"] for r in run.metrics),
            "freezes": [{k: e[k] for k in ("epoch", "frozen_blocks", "trainable_params", "block_grad_norm_change")}
                        for e in events if e.get("event") == "freeze"]}


@jobs.one_line_errors("autofreeze")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    results = Results("autofreeze", args, FIGURES, argv)
    results.sample_noise = False  # its jobs run on a cluster's hosts, not as this process's children
    variants = {"none": ["--freeze", "0"], "auto": ["--freeze", "auto", "--freeze-auto-threshold", str(args.threshold)]}
    with NetCluster(n_hosts=args.np, rate=args.rate) as cluster:
        for k in range(1, args.repeats + 1):
            for name in jobs.rotated(list(variants), k - 1):
                row = results.attempt(k, f"freeze {name}", lambda: summarize(
                    run_job(cluster, f"{name}-r{k}", variants[name], args)))
                if row is None:
                    continue
                keys = ("test_acc", "bytes", "nic_tx_bytes", "training_time_s") + (("saved_fraction",) if name == "auto" else ())
                results.add(k, f"freeze {name}", {key: row[key] for key in keys}, freezes=row["freezes"],
                            frozen_blocks_per_epoch=row["frozen_blocks_per_epoch"])
    results.derive("auto / none", "of_none", lambda r: r["freeze auto"]["nic_tx_bytes"] / r["freeze none"]["nic_tx_bytes"])
    results.derive("auto - none", "points", lambda r: 100 * (r["freeze auto"]["test_acc"] - r["freeze none"]["test_acc"]))
    path = results.write()
    print(render_docs.render_block(os.path.basename(path), os.path.dirname(path)), end="")
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
