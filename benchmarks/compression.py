"""Gradient compression side by side on the namespace cluster (issue 25, point 3): each scheme at
its defaults against uncompressed training, for accuracy and time to 95 % on digits, and for the
gradient bytes each rank sends per update, analytic and on the wire, at two link rates; then
``python -m hvd_cifar.predict --compression ...`` against the measured steps.

    .venv/bin/python benchmarks/compression.py      # as root; about 30 minutes on 2 shared cores
        [--np 4] [--schemes none fp16 powersgd topk localsgd] [--model vgg11]
        [--acc-epochs 6] [--acc-rate 1gbit] [--target-acc 0.95]
        [--rates 1gbit 100mbit] [--bytes-steps 4] [--bytes-epochs 2]
        [--extra NAME "FLAGS"] [--out logs/bench-compression-YYYYmmdd-HHMMSS] [--render]

One cluster of --np hosts (``hvd_cifar.netcluster``: one rank per host, links shaped with tc),
every job ``horovodrun --gloo`` on digits, seed 0, every key not named here at its default (batch
32 per rank, the model's lr, onecycle; PowerSGD r = 2, top-k f = 0.01, 20 warm-up updates; local
SGD averages every 4 updates, which has no default). Three jobs per scheme, run scheme after
scheme (so that the machine's load drifts over every scheme alike; the tables give ratios to
``none``):

  accuracy   --acc-epochs whole epochs at --acc-rate with --target-acc: final test accuracy, the
             epoch and wall time at which it reached the target, bytes over the run (analytic and
             eth0, mean over the hosts).
  bytes      at each of --rates: --bytes-steps steps per epoch for --bytes-epochs epochs, without
             the schemes' warm-up (compression_warmup_steps 0): bytes per update and per epoch,
             analytic and on the wire, and the step time, over the epochs after the first.
  predict    per rate, the model (docs/SCALING.md) from the ``none`` bytes run at np, --bandwidth
             the rate, --shared-cores this machine's cores, each scheme asked for, the bytes runs
             as --measured: predicted step against measured, per scheme.

``--extra NAME "FLAGS"`` adds an accuracy job (e.g. a scheme at a setting that closes a gap).
Run folders land in OUT/runs/PASS/NAME, outputs in OUT/logs/, the predictions in
OUT/predict-RATE/; the tables are made from the runs' files alone, written to
OUT/compression.json and OUT/compression.md, then printed: from every run folder in OUT, so that
``--schemes --extra ...`` with an earlier run's --out adds jobs to its tables. ``--render``
makes them again without training (the prediction rerun on the current code).
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time

from hvd_cifar import jobs
from hvd_cifar.compress import cost
from hvd_cifar.launchers import ROOT
from hvd_cifar.netcluster import NetCluster
from hvd_cifar.runs import load_run
from hvd_cifar.summary import run_bytes, steady_mean, steady_nic_mean, time_to_target
from hvd_cifar.tables import Column, markdown_table, num, spaced

SCHEMES = {  # name -> trainer flags: each scheme at its defaults
    "none": [],
    "fp16": ["--compression", "fp16"],
    "powersgd": ["--compression", "powersgd"],
    "topk": ["--compression", "topk"],
    "localsgd": ["--local-sgd-steps", "4"],
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=4, help="ranks, one per host")
    p.add_argument("--schemes", nargs="*", default=list(SCHEMES), choices=list(SCHEMES),
                   help="schemes to train (none: only --extra, added to OUT's earlier runs)")
    p.add_argument("--model", default="vgg11")
    p.add_argument("--acc-epochs", type=int, default=6, help="whole epochs; 0 skips the accuracy pass")
    p.add_argument("--acc-rate", default="1gbit", help="link rate of the accuracy pass, tc syntax")
    p.add_argument("--target-acc", type=float, default=0.95)
    p.add_argument("--rates", nargs="*", default=["1gbit", "100mbit"], help="link rates of the bytes pass")
    p.add_argument("--bytes-steps", type=int, default=4, help="steps per epoch (a multiple of local SGD's 4)")
    p.add_argument("--bytes-epochs", type=int, default=2)
    p.add_argument("--extra", nargs=2, action="append", default=[], metavar=("NAME", "FLAGS"),
                   help="another accuracy job: its name and trainer flags in one string")
    p.add_argument("--out", default=os.path.join(ROOT, "logs", time.strftime("bench-compression-%Y%m%d-%H%M%S")))
    p.add_argument("--render", action="store_true", help="no training: the tables from OUT's run folders")
    jobs.add_options(p, timeout=900)
    return p.parse_args(argv)


def run_job(cluster: NetCluster, pass_name: str, name: str, flags: list[str], args) -> str:
    """One training job; its run folder."""
    return jobs.cluster_training(cluster, args.np, ["--dataset", "digits", "--model", args.model, *flags],
                                 os.path.join(args.out, "runs", pass_name), name, label=f"{pass_name} {name}",
                                 log=os.path.join(args.out, "logs", f"{pass_name}-{name}.log"), timeout=args.timeout)


def scheme_label(config: dict) -> str:
    """A run's scheme as predict's compression column names it (fp16 kept apart from none)."""
    return cost.label(config.get("compression", "none"), int(config.get("local_sgd_steps") or 1),
                      int(config.get("powersgd_rank") or 2), float(config.get("topk_fraction") or 0.01))


def accuracy_row(run_dir: str) -> dict:
    run = load_run(run_dir)
    return {"scheme": scheme_label(run.config), **run_bytes(run.metrics), **time_to_target(run),
            "test_acc": run.metrics[-1]["test_acc"], "test_acc_per_epoch": [r["test_acc"] for r in run.metrics],
            "training_time_s": sum(r["epoch_time_s"] for r in run.metrics), "path": run_dir}


def bytes_row(run_dir: str) -> dict:
    """Steady-state means (the epochs after the first) per epoch; NIC bytes mean over the hosts."""
    run = load_run(run_dir)
    return {"scheme": scheme_label(run.config), "bytes_per_update": run.metrics[-1]["comm_bytes_per_sync"],
            "analytic_bytes": steady_mean(run.metrics, "comm_bytes_per_rank"),
            "tx_bytes": steady_nic_mean(run.metrics, "tx"), "rx_bytes": steady_nic_mean(run.metrics, "rx"),
            "syncs": steady_mean(run.metrics, "syncs"),
            "step_s": steady_mean(run.metrics, "epoch_time_s") / steady_mean(run.metrics, "steps"),
            "sync_s": steady_mean(run.metrics, "sync_time_s") / steady_mean(run.metrics, "syncs"), "path": run_dir}


def check_predictions(rows: dict, rate: str, args) -> dict:
    """predict from the ``none`` run at ``rate`` with every other scheme asked for, the runs as
    --measured; scheme label -> (predicted, measured step s, error %)."""
    out = os.path.join(args.out, f"predict-{rate}")
    asked = [s for s in ("fp16", "powersgd", "topk") if s in rows]
    argv = [sys.executable, "-m", "hvd_cifar.predict", rows["none"]["path"], "--bandwidth", rate,
            "--shared-cores", str(os.cpu_count()), "--np", str(args.np), "--out", out,
            *(["--compression", *asked] if asked else []),
            *(["--local-sgd-steps", "4"] if "localsgd" in rows else []),
            "--measured", *[row["path"] for row in rows.values()]]
    jobs.run(f"predict at {rate}", argv, log=os.path.join(args.out, "logs", f"predict-{rate}.log"), timeout=600)
    with open(os.path.join(out, "predict.csv")) as f:
        predicted = [r for r in csv.DictReader(f) if r["measured_step_s"]]
    return {("fp16" if r["fp16_allreduce"] == "true" else r["compression"]):
            {"predicted_step_s": float(r["step_s"]), "measured_step_s": float(r["measured_step_s"]),
             "error_pct": float(r["error_pct"])} for r in predicted}


def against(key: str, base: dict, header: str) -> Column:
    """A row's ``key`` over the ``none`` row's."""
    return Column(header, key, numeric=True, row_fmt=lambda r: f"{r[key] / base[key]:.3f}" if r.get(key) and base.get(key) else "-")


def accuracy_table(rows: list[dict], base: dict) -> str:
    columns = [Column("scheme", "scheme"), num("final test acc", "test_acc", ".4f"),
               Column("vs none (points)", "test_acc", numeric=True,
                      row_fmt=lambda r: f"{100 * (r['test_acc'] - base['test_acc']):+.2f}"),
               spaced("test_acc_per_epoch", ".4f"), num("epochs to target", "epochs_to_target", ".0f"),
               num("time to target (s)", "time_to_target_s", ".1f"), against("time_to_target_s", base, "time to target / none's"),
               num("analytic MB/rank over the run", "bytes", ".1f", 1e6),
               num("eth0 tx MB/rank over the run", "nic_tx_bytes", ".1f", 1e6),
               against("nic_tx_bytes", base, "tx / none's"), num("training time (s)", "training_time_s", ".1f")]
    return markdown_table(columns, rows)


def bytes_table(rows: list[dict], base: dict) -> str:
    columns = [Column("scheme", "scheme"), num("analytic B/update/rank", "bytes_per_update", ",.0f"),
               num("analytic MB/epoch/rank", "analytic_bytes", ".3f", 1e6), num("eth0 tx MB/epoch", "tx_bytes", ".3f", 1e6),
               num("eth0 rx MB/epoch", "rx_bytes", ".3f", 1e6),
               Column("tx / analytic", "tx_bytes", numeric=True, row_fmt=lambda r: f"{r['tx_bytes'] / r['analytic_bytes']:.4f}"),
               against("tx_bytes", base, "tx / none's"), num("step (ms)", "step_s", ".0f", 1e-3),
               against("step_s", base, "step / none's"), num("sync (ms/update)", "sync_s", ".0f", 1e-3),
               num("predicted step (ms)", "predicted_step_s", ".0f", 1e-3), num("prediction error (%)", "error_pct", "+.1f")]
    return markdown_table(columns, rows)


def markdown(results: dict, args) -> str:
    lines = [f"{args.model} on digits, np={args.np} (horovodrun --gloo, one rank per host of the namespace "
             f"cluster), every key at its default but the scheme's; local SGD H=4. Bytes per rank; eth0: "
             f"mean over the hosts."]
    acc = results["accuracy"]
    if acc:
        lines += ["", f"Accuracy: {args.acc_epochs} whole epochs at {args.acc_rate}, target {args.target_acc}.", "",
                  accuracy_table(list(acc.values()), acc["none"]).rstrip("\n")]
    for rate, rows in results["bytes"].items():
        predicted = results["predictions"].get(rate, {})
        table_rows = [{**row, **predicted.get(row["scheme"], {})} for row in rows.values()]
        lines += ["", f"Bytes at {rate}: {args.bytes_steps} steps/epoch x {args.bytes_epochs} epochs, no "
                  f"warm-up (compression_warmup_steps 0), means over the epochs after the first; predicted: "
                  f"python -m hvd_cifar.predict from the none run, --bandwidth {rate} --shared-cores "
                  f"{os.cpu_count()}.", "", bytes_table(table_rows, rows["none"]).rstrip("\n")]
    return "\n".join(lines)


def train_all(args) -> None:
    """Every job, scheme after scheme, into OUT/runs/PASS/NAME."""
    acc_flags = ["--epochs", str(args.acc_epochs), "--target-acc", str(args.target_acc)]
    bytes_flags = ["--epochs", str(args.bytes_epochs), "--max-steps-per-epoch", str(args.bytes_steps),
                   "--compression-warmup-steps", "0"]
    with NetCluster(n_hosts=args.np, rate=args.acc_rate) as cluster:
        for name in args.schemes:
            if args.acc_epochs:
                cluster.shape(args.acc_rate)
                run_job(cluster, "accuracy", name, [*acc_flags, *SCHEMES[name]], args)
            for rate in args.rates:
                cluster.shape(rate)
                run_job(cluster, f"bytes-{rate}", name, [*bytes_flags, *SCHEMES[name]], args)
        for name, flags in args.extra:
            cluster.shape(args.acc_rate)
            run_job(cluster, "accuracy", name.replace(" ", "-"), [*acc_flags, *flags.split()], args)


def found_folders(args) -> dict:
    """The run folders in OUT, this run's and any an earlier run of this script left there: the
    schemes in SCHEMES' order, then the extras."""
    def under(pass_name):
        root = os.path.join(args.out, "runs", pass_name)
        names = sorted(os.listdir(root), key=lambda n: (list(SCHEMES).index(n) if n in SCHEMES else len(SCHEMES), n)) \
            if os.path.isdir(root) else []
        return {name: os.path.join(root, name) for name in names}
    return {"accuracy": under("accuracy"), "bytes": {rate: under(f"bytes-{rate}") for rate in args.rates}}


@jobs.one_line_errors("compression")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    span = jobs.Span()
    if not args.render:
        train_all(args)
    folders = found_folders(args)
    results = {"machine": jobs.machine(), "args": vars(args),
               "accuracy": {name: accuracy_row(path) for name, path in folders["accuracy"].items()},
               "bytes": {rate: {name: bytes_row(path) for name, path in runs.items()}
                         for rate, runs in folders["bytes"].items() if "none" in runs}}
    results["predictions"] = {rate: check_predictions(rows, rate, args) for rate, rows in results["bytes"].items()}
    results["meta"] = span.end()
    jobs.write_results(args.out, "compression", results, markdown(results, args) + f"\n\nRun: {span.line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
