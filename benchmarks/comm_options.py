"""Communication options side by side on the namespace cluster: bytes each rank puts on its
1 Gbit/s link per epoch (analytic and measured at the NIC), epoch time and test accuracy, for
fp32 / fp16 allreduce, gradient accumulation and layer freezing, at 2 and 4 ranks.

    .venv/bin/python benchmarks/comm_options.py          # as root; about 13 minutes on 2 cores
        [--np 2 4] [--options fp32 fp16 k=4 fp16+k=4 "freeze 2" "freeze 6"] [--rate 1gbit]
        [--bytes-model vgg11] [--bytes-steps 4] [--bytes-epochs 3] [--bytes-batch-size 8]
        [--acc-model smallcnn] [--acc-epochs 8] [--acc-batch-size 32]
        [--out logs/bench-comm-options-YYYYmmdd-HHMMSS]

One cluster of max(np) hosts (``hvd_cifar.netcluster``, one rank per host, links shaped to
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
carries the tail of the initial weight broadcast). Each job's run folder lands in
OUT/runs/PASS/NAME and its output in OUT/logs/PASS-NAME.log; the table is made from the runs'
metrics.jsonl alone, written to OUT/comm_options.json and OUT/comm_options.md, then printed.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

from hvd_cifar import jobs
from hvd_cifar.launchers import ROOT
from hvd_cifar.models import build_model
from hvd_cifar.netcluster import NetCluster
from hvd_cifar.runs import load_run
from hvd_cifar.summary import steady_epochs, steady_mean, steady_nic_mean
from hvd_cifar.tables import Column, markdown_table, num

OPTIONS = {  # name -> trainer flags
    "fp32": [],
    "fp16": ["--fp16-allreduce", "true"],
    "k=4": ["--accumulation-steps", "4"],
    "fp16+k=4": ["--fp16-allreduce", "true", "--accumulation-steps", "4"],
    "freeze 2": ["--freeze", "2"],
    "freeze 6": ["--freeze", "6"],
}
COMMON = ["--dataset", "digits"]


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
    jobs.add_options(p, timeout=900)
    return p.parse_args(argv)


def slug(option: str, np: int) -> str:
    return f"{re.sub(r'[^a-z0-9]+', '-', option.lower()).strip('-')}-np{np}"


def run_job(cluster: NetCluster, pass_name: str, option: str, np: int, flags: list[str], args) -> str:
    """One training job; its run folder."""
    name = slug(option, np)
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


def byte_columns(acc_model: str) -> list[Column]:
    """The bytes pass's columns, then the accuracy pass's two (``acc``: its row, if it ran)."""
    def ratio(key):
        return lambda r: f"{r[key] / r['analytic_bytes']:.4f}"

    def acc(key, spec):
        return lambda r: format(r["acc"][key], spec) if r.get("acc") else "n/a"

    return [Column("option", "option"), Column("np", "np", numeric=True),
            Column("syncs/epoch", "syncs", numeric=True, row_fmt=lambda r: f"{r['syncs']:g}"),
            num("analytic MB/epoch/rank", "analytic_bytes", ".2f", 1e6), num("measured tx MB", "tx_bytes", ".2f", 1e6),
            num("measured rx MB", "rx_bytes", ".2f", 1e6),
            Column("tx / analytic", "tx_bytes", numeric=True, row_fmt=ratio("tx_bytes")),
            Column("rx / analytic", "rx_bytes", numeric=True, row_fmt=ratio("rx_bytes")),
            Column("worst host tx, rx / analytic", "worst_tx_ratio", numeric=True,
                   row_fmt=lambda r: f"{r['worst_tx_ratio']:.4f}, {r['worst_rx_ratio']:.4f}"),
            num("epoch time (s)", "epoch_time_s", ".2f"), num("sync time (s)", "sync_time_s", ".2f"),
            Column(f"{acc_model} epoch time (s)", "acc", numeric=True, row_fmt=acc("epoch_time_s", ".2f")),
            Column(f"{acc_model} test acc", "acc", numeric=True, row_fmt=acc("test_acc", ".4f"))]


def markdown(results: dict, args) -> str:
    byte_rows, acc_rows = results["bytes"], results["accuracy"]
    rows = [{**b, "acc": acc_rows.get(key)} for key, b in byte_rows.items()]
    lines = [f"Bytes pass: {args.bytes_model}, {args.bytes_steps} steps/epoch x {args.bytes_epochs} epochs, "
             f"batch {args.bytes_batch_size}/rank. Accuracy pass: {args.acc_model}, {args.acc_epochs} whole "
             f"epochs, batch {args.acc_batch_size}/rank. Links {args.rate}; horovodrun --gloo.", "",
             markdown_table(byte_columns(args.acc_model), rows).rstrip("\n")]
    lines += ["", "Ratios (bytes pass, measured = mean of the hosts' eth0 tx per epoch):", ""]
    for np in args.np:
        base = byte_rows.get(slug("fp32", np))
        if not base:
            continue
        for option, label in (("fp16", "fp16 / fp32 bytes"), ("k=4", "k=4 / k=1 bytes"),
                              ("fp16+k=4", "fp16+k=4 / fp32 bytes")):
            row = byte_rows.get(slug(option, np))
            if row:
                lines.append(f"- np={np} {label}: measured {row['tx_bytes'] / base['tx_bytes']:.4f}, "
                             f"analytic {row['analytic_bytes'] / base['analytic_bytes']:.4f}")
        for key, row in byte_rows.items():
            if row["np"] == np and row["frozen_blocks"]:
                share = 1 - row["trainable_params"] / base["trainable_params"]
                saving = 1 - row["tx_bytes"] / base["tx_bytes"]
                lines.append(f"- np={np} {row['option']}: measured saving {saving:.4f} vs frozen-parameter "
                             f"share {share:.4f} ({base['trainable_params'] - row['trainable_params']:,} of "
                             f"{base['trainable_params']:,} parameters); saving / share {saving / share:.3f}")
    return "\n".join(lines)


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

    results = {"machine": jobs.machine(), "args": vars(args), "bytes": {}, "accuracy": {}}
    with NetCluster(n_hosts=max(args.np), rate=args.rate) as cluster:
        for np in args.np:
            for option in args.options:
                run_dir = run_job(cluster, "bytes", option, np, bytes_flags, args)
                results["bytes"][slug(option, np)] = {"option": option, **summarize(run_dir)}
        for np in args.np if args.acc_epochs else []:
            for option in filter(fits_acc, args.options):
                run_dir = run_job(cluster, "accuracy", option, np, acc_flags, args)
                results["accuracy"][slug(option, np)] = {"option": option, **summarize(run_dir)}
    jobs.write_results(args.out, "comm_options", results, markdown(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
