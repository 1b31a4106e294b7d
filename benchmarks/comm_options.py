"""Communication options side by side on the namespace cluster: bytes each rank puts on its
1 Gbit/s link per epoch (analytic and measured at the NIC), epoch time and test accuracy, for
fp32 / fp16 allreduce, gradient accumulation and layer freezing, at 2 and 4 ranks.

    .venv/bin/python benchmarks/comm_options.py          # as root; about 13 minutes on 2 cores
        [--np 2 4] [--options fp32 fp16 k=4 fp16+k=4 "freeze 2" "freeze 6"] [--rate 1gbit]
        [--bytes-model vgg11] [--bytes-steps 4] [--bytes-epochs 3] [--bytes-batch-size 8]
        [--acc-model smallcnn] [--acc-epochs 8] [--acc-batch-size 32] [--repeats 1]
        [--out logs/bench-comm-options-YYYYmmdd-HHMMSS] [--tag TAG] [--results benchmarks/results]

One cluster of max(np) hosts (``testbed.netcluster``, one rank per host, links shaped to
--rate), every job ``horovodrun --gloo`` (Gloo's allreduce is a ring, so the analytic figure
2(N-1)/N x payload is what should cross the wire; see tests/test_wire_bytes.py). Two passes:

  bytes pass     --bytes-model (vgg11: 36.9 MB of fp32 gradients, far above the control
                 traffic) for --bytes-steps steps per epoch: bytes per epoch per rank,
                 analytic (metrics.jsonl comm_bytes_per_rank) and measured (the host's eth0
                 tx/rx counters around the epoch's training steps), and the epoch time.
  accuracy pass  --acc-model (smallcnn: seconds per epoch on a CPU) for --acc-epochs whole
                 epochs on digits: epoch time and the test accuracy after the last epoch.
                 Options that freeze more blocks than this model has are left out of it.

Per-epoch numbers are means over the epochs after the first (the first pays for warm-up and
carries the tail of the initial weight broadcast). --repeats rounds of every job, the options in
a rotated order each round. Each job's run folder lands in OUT/runs/PASS/NAME-rK and its output
in OUT/logs/PASS-NAME-rK.log; the figures are made from the runs' metrics.jsonl alone and written
to the results file benchmarks/results/comm_options.json (hvd_cifar.measure.results: every round, medians,
spreads, and per round each option's measured bytes over fp32's at the same np; a failed job is
a failed round with its reason); the tables, rendered from it, are printed and left in
OUT/comm_options.md.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

from testbed import jobs, render_docs
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options
from hvd_cifar.launch.commands import ROOT
from hvd_cifar.workload.models import build_model
from testbed.netcluster import NetCluster
from hvd_cifar.analysis.summary import steady_epochs, steady_mean, steady_nic_mean
from hvd_cifar.runfolder.reader import load_run

OPTIONS = {  # name -> trainer flags
    "fp32": [],
    "fp16": ["--compression", "fp16"],
    "k=4": ["--accumulation-steps", "4"],
    "fp16+k=4": ["--compression", "fp16", "--accumulation-steps", "4"],
    "freeze 2": ["--freeze", "2"],
    "freeze 6": ["--freeze", "6"],
}
COMMON = ["--dataset", "digits"]
FIGURES = {
    "syncs": Figure("syncs/epoch", ".0f"),
    "analytic_bytes": Figure("analytic MB/epoch/rank", ".2f", 1e6),
    "tx_bytes": Figure("eth0 tx MB/epoch (mean of hosts)", ".2f", 1e6),
    "rx_bytes": Figure("eth0 rx MB/epoch (mean of hosts)", ".2f", 1e6),
    "tx_over_analytic": Figure("tx / analytic", ".4f"),
    "epoch_time_s": Figure("epoch (s)", ".2f"),
    "sync_time_s": Figure("sync (s/epoch)", ".2f"),
    "test_acc": Figure("final test acc", ".4f"),
    "of_fp32": Figure("tx bytes x fp32's", ".4f"),
    "frozen_share": Figure("frozen share of parameters", ".4f"),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, nargs="+", default=[2, 4], help="ranks per job, one per host")
    p.add_argument("--options", nargs="+", default=list(OPTIONS), choices=list(OPTIONS))
    p.add_argument("--rate", default="1gbit", help="link rate, tc syntax")
    p.add_argument("--bytes-model", default="vgg11")
    p.add_argument("--bytes-steps", type=int, default=4, help="steps per epoch (a multiple of 4: k=4 syncs whole)")
    p.add_argument("--bytes-epochs", type=int, default=3)
    p.add_argument("--bytes-batch-size", type=int, default=8, help="images per rank per step")
    p.add_argument("--acc-model", default="smallcnn")
    p.add_argument("--acc-epochs", type=int, default=8, help="whole epochs; 0 skips the accuracy pass")
    p.add_argument("--acc-batch-size", type=int, default=32, help="images per rank per step")
    p.add_argument("--lr", type=float, default=0.05, help="for one rank; the trainer scales it by np x k")
    p.add_argument("--out", default=os.path.join(ROOT, "logs", time.strftime("bench-comm-options-%Y%m%d-%H%M%S")))
    jobs.add_options(p, timeout=900, repeats=1)
    add_results_options(p)
    return p.parse_args(argv)


def slug(option: str, np: int) -> str:
    return f"{re.sub(r'[^a-z0-9]+', '-', option.lower()).strip('-')}-np{np}"


def run_job(cluster: NetCluster, pass_name: str, option: str, np: int, flags: list[str], args, k: int) -> str:
    """One training job (round ``k``); its run folder."""
    name = f"{slug(option, np)}-r{k}"
    return jobs.cluster_training(cluster, np, [*COMMON, *flags, *OPTIONS[option], "--lr", str(args.lr)],
                                 os.path.join(args.out, "runs", pass_name), name, label=f"{pass_name} {option} np={np}",
                                 log=os.path.join(args.out, "logs", f"{pass_name}-{name}.log"), timeout=args.timeout)


def summarize(run_dir: str) -> dict:
    """The row of one job; steady-state means (epochs after the first) from hvd_cifar.report."""
    records = load_run(run_dir).metrics
    timed = steady_epochs(records)

    def worst(direction):  # the host-epoch furthest from the analytic figure
        return max((r[f"nic_{direction}_bytes"][h] / r["comm_bytes_per_rank"] for r in timed
                    for h in r[f"nic_{direction}_bytes"]), key=lambda x: abs(x - 1))

    return {
        "np": records[-1]["world_size"],
        "trainable_params": records[-1]["trainable_params"],
        "frozen_blocks": records[-1]["frozen_blocks"],
        "steps": records[-1]["steps"],
        "syncs": steady_mean(records, "syncs"),
        "analytic_bytes": steady_mean(records, "comm_bytes_per_rank"),
        "tx_bytes": steady_nic_mean(records, "tx"),
        "rx_bytes": steady_nic_mean(records, "rx"),
        "worst_tx_ratio": worst("tx"),
        "worst_rx_ratio": worst("rx"),
        "epoch_time_s": steady_mean(records, "epoch_time_s"),
        "sync_time_s": steady_mean(records, "sync_time_s"),
        "test_acc": records[-1]["test_acc"],
        "epochs": len(records),
        "timed_epochs": len(timed),
    }


def figures(row: dict, pass_name: str, params: int) -> dict:
    """A job's figures; ``params``: the model's parameters, frozen or not."""
    if pass_name == "accuracy":
        return {"epoch_time_s": row["epoch_time_s"], "test_acc": row["test_acc"]}
    return {**{k: row[k] for k in ("syncs", "analytic_bytes", "tx_bytes", "rx_bytes", "epoch_time_s", "sync_time_s")},
            "tx_over_analytic": row["tx_bytes"] / row["analytic_bytes"],
            "frozen_share": 1 - row["trainable_params"] / params}


def run_pass(cluster: NetCluster, results: Results, pass_name: str, options: list[str], flags: list[str], args) -> None:
    """Every option at every np, --repeats rounds, the options rotated each round."""
    params = sum(p.numel() for p in build_model(args.acc_model if pass_name == "accuracy" else args.bytes_model,
                                                 10).parameters())
    for k in range(1, args.repeats + 1):
        for np in args.np:
            for option in jobs.rotated(options, k - 1):
                config = f"{option} np={np}" + (" accuracy" if pass_name == "accuracy" else "")
                results.measure(k, config, lambda: figures(
                    summarize(run_job(cluster, pass_name, option, np, flags, args, k)), pass_name, params))


def derive_savings(results: Results, args) -> None:
    """Per round, each option's measured tx bytes over fp32's at the same np."""
    for np in args.np:
        for option in args.options:
            if option != "fp32":
                results.derive(f"{option} / fp32 np={np}", "of_fp32", lambda r, o=option, n=np:
                               r[f"{o} np={n}"]["tx_bytes"] / r[f"fp32 np={n}"]["tx_bytes"])


@jobs.one_line_errors("comm_options")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.bytes_steps % 4:
        print("comm_options: --bytes-steps must be a multiple of 4", file=sys.stderr)
        return 2
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    bytes_flags = ["--model", args.bytes_model, "--epochs", str(args.bytes_epochs), "--warmup-epochs", "0",
                   "--max-steps-per-epoch", str(args.bytes_steps), "--batch-size", str(args.bytes_batch_size)]
    acc_flags = ["--model", args.acc_model, "--epochs", str(args.acc_epochs), "--max-steps-per-epoch", "0",
                 "--batch-size", str(args.acc_batch_size)]
    acc_depth = len(build_model(args.acc_model, 10).feature_blocks)

    def fits_acc(option: str) -> bool:
        flags = OPTIONS[option]
        return "--freeze" not in flags or int(flags[flags.index("--freeze") + 1]) < acc_depth

    results = Results("comm_options", args, FIGURES, argv)
    results.sample_noise = False  # its jobs run on a cluster's hosts, not as this process's children
    with NetCluster(n_hosts=max(args.np), rate=args.rate) as cluster:
        run_pass(cluster, results, "bytes", args.options, bytes_flags, args)
        if args.acc_epochs:
            run_pass(cluster, results, "accuracy", list(filter(fits_acc, args.options)), acc_flags, args)
    if "fp32" in args.options:
        derive_savings(results, args)
    path = results.write()
    name, folder = os.path.basename(path), os.path.dirname(path)
    text = "\n\n".join(render_docs.render_block(f"{name} {spec}", folder) for spec in
                        ('match="np=[0-9]+$"', 'match="fp32 np="', 'match=accuracy'))
    jobs.write_results(args.out, "comm_options", results.data, text)
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
