"""freeze: auto against no freezing, side by side on the namespace cluster: final test accuracy,
and the gradient bytes each rank sent over the whole run, analytic (metrics.jsonl) and measured
at each host's NIC.

    .venv/bin/python benchmarks/autofreeze.py          # as root; about 10 minutes on 2 shared cores
        [--np 2] [--model vgg11] [--epochs 6] [--threshold 0.2] [--rate 1gbit]
        [--out logs/bench-autofreeze-YYYYmmdd-HHMMSS]

Two jobs, ``freeze: 0`` and ``freeze: auto`` (``--freeze-auto-threshold``), on one cluster of
--np hosts (``testbed.netcluster``: one rank per host, links shaped to --rate), each
``horovodrun --gloo`` on digits with every other key at its default (batch 32 per rank, the
model's lr, one epoch of warm-up, onecycle). Bytes over the run are sums over all epochs, the
first included: what a run costs, not a steady state. Each job's run folder lands in
OUT/runs/NAME and its output in OUT/logs/NAME.log; the table is made from the runs'
metrics.jsonl and events.jsonl alone, written to OUT/autofreeze.json and OUT/autofreeze.md,
then printed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from testbed import jobs
from hvd_cifar.launch.commands import ROOT
from testbed.netcluster import NetCluster
from hvd_cifar.runfolder.reader import load_run
from hvd_cifar.analysis.summary import run_bytes
from hvd_cifar.analysis.tabulate import Column, markdown_table, num, spaced


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2, help="ranks, one per host")
    p.add_argument("--model", default="vgg11")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--threshold", type=float, default=0.2, help="freeze_auto_threshold of the auto job")
    p.add_argument("--rate", default="1gbit", help="link rate, tc syntax")
    p.add_argument("--out", default=os.path.join(ROOT, "logs", time.strftime("bench-autofreeze-%Y%m%d-%H%M%S")))
    jobs.add_options(p, timeout=1800)
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


COLUMNS = [Column("freeze", "freeze"), num("final test acc", "test_acc", ".4f"), spaced("test_acc_per_epoch", ".4f"),
           spaced("frozen_blocks_per_epoch", "d"), num("analytic MB", "bytes", ".1f", 1e6),
           num("measured tx MB", "nic_tx_bytes", ".1f", 1e6), num("measured rx MB", "nic_rx_bytes", ".1f", 1e6),
           num("training time (s)", "training_time_s", ".1f")]


def markdown(results: dict, args) -> str:
    none, auto = results["none"], results["auto"]
    lines = [f"{args.model} on digits, {args.epochs} epochs, np={args.np} (horovodrun --gloo, links {args.rate}); "
             f"auto: freeze_auto_threshold {args.threshold}. Bytes are per rank over the whole run; "
             f"measured = eth0 counters, mean over the hosts.", "",
             markdown_table(COLUMNS, [{"freeze": "none", **none}, {"freeze": "auto", **auto}]).rstrip("\n")]
    lines += ["", f"- accuracy, auto - none: {100 * (auto['test_acc'] - none['test_acc']):+.2f} points",
              f"- bytes saved by auto: analytic {1 - auto['bytes'] / none['bytes']:.4f}, "
              f"measured tx {1 - auto['nic_tx_bytes'] / none['nic_tx_bytes']:.4f}, "
              f"rx {1 - auto['nic_rx_bytes'] / none['nic_rx_bytes']:.4f}",
              f"- auto's own record of its saving (summary.run_bytes, against its model unfrozen): "
              f"{auto['saved_fraction']:.4f}"]
    for event in auto["freezes"]:
        changes = ", ".join("-" if c is None else f"{c:.3f}" for c in event["block_grad_norm_change"])
        lines.append(f"- freeze at the start of epoch {event['epoch']}: {event['frozen_blocks']} blocks, "
                     f"{event['trainable_params']:,} trainable parameters; changes per block: {changes}")
    return "\n".join(lines)


@jobs.one_line_errors("autofreeze")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    results = {"machine": jobs.machine(), "args": vars(args)}
    variants = {"none": ["--freeze", "0"], "auto": ["--freeze", "auto", "--freeze-auto-threshold", str(args.threshold)]}
    with NetCluster(n_hosts=args.np, rate=args.rate) as cluster:
        for name, flags in variants.items():
            results[name] = summarize(run_job(cluster, name, flags, args))
    jobs.write_results(args.out, "autofreeze", results, markdown(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
