"""Whether each communication scheme keeps its accuracy at its defaults, over seeds: none, fp16,
PowerSGD, top-k and local SGD (H = 4, which has no default), each model and number of ranks, one
run per seed, as a user runs them (``horovodrun -np N -H localhost:N python -m hvd_cifar.train
--dataset digits --model M --epochs 6 --seed S`` and the scheme's one flag); then the gradient
bytes per update after the warm-ups, analytic and on the wire.

    nice -n 10 .venv/bin/python benchmarks/compression_seeds.py      # as root (the bytes pass)
        [--models smallcnn vgg11] [--nps 2 4] [--seeds 0 1 2] [--schemes none fp16 ...]
        [--epochs 6] [--launcher horovodrun|mpirun] [--sync horovod|ddp] [--plan smallcnn:2,4:0,1,2 vgg11:4:0] [--bytes-nps 2 4] [--no-bytes]
        [--out benchmarks/results/compression-seeds-YYYYmmdd-HHMMSS.json] [--time-one] [--bytes-only]

Accuracy: rounds, one per seed; within a round every (model, np, scheme) in an order that
rotates from round to round (testbed.jobs.rotated), so that the machine's load drifts over all
alike. ``--plan`` replaces the full grid by model:nps:seeds entries (what fits the time). Bytes:
on the namespace cluster (testbed.netcluster, one rank per host, links 1 Gbit/s, horovodrun
--gloo), VGG-11, 2 epochs of 4 steps without the warm-ups (compression_warmup_steps 0,
topk_warmup_epochs 0): the trainer's analytic ``comm_bytes_per_sync`` and each host's eth0 tx per
update in the second epoch. ``--time-one`` times one accuracy run of each model at the largest np
and stops (the projection of the whole grid).

Writes ONE JSON file (its run folders and logs go to logs/bench-STEM/): the command line, the commit, the UTC start and end, the machine (CPU
model, cores, load average before and after), every run's raw figures (test accuracy per epoch,
final, bytes) and per scheme, model and np the mean, min and max over the seeds, with each
scheme's mean against none's. The verdicts are computed from all rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from hvd_cifar.core.files import write_json
from hvd_cifar.launch.commands import ROOT, argv
from hvd_cifar.runfolder.reader import read_metrics
from testbed import jobs

from compression import SCHEMES  # benchmarks/compression.py: each scheme's trainer flags at its defaults

BYTES_SCHEMES = ("none", "powersgd", "topk")
RUN_FLAGS = ["--dataset", "digits", "--checkpoint-every", "0", "--progress", "false", "--no-tensorboard"]
ACCURACY_POINTS = 1.0  # a scheme keeps its accuracy: mean final test accuracy within this of none's
BYTES_FACTOR = 50      # PowerSGD and top-k after the warm-up: at least this many times fewer bytes than none


def parse_args(argv_: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["smallcnn", "vgg11"])
    p.add_argument("--nps", nargs="+", type=int, default=[2, 4])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=list(SCHEMES))
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--launcher", default="horovodrun", choices=["horovodrun", "mpirun"])
    p.add_argument("--sync", default="horovod", choices=["horovod", "ddp"])
    p.add_argument("--plan", nargs="+", default=[], metavar="MODEL:NPS:SEEDS",
                   help="instead of models x nps x seeds: e.g. smallcnn:2,4:0,1,2 vgg11:4:0")
    p.add_argument("--bytes-nps", nargs="*", type=int, default=[2, 4], help="ranks of the bytes pass (horovodrun --gloo)")
    p.add_argument("--no-bytes", action="store_true", help="skip the bytes pass")
    p.add_argument("--bytes-only", action="store_true",
                   help="only the bytes pass, added to the results file --out names (its accuracy runs kept)")
    p.add_argument("--time-one", action="store_true", help="time one run per model and stop")
    p.add_argument("--note", default="", help="a line of fact kept in the results file's notes")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", time.strftime(
        "compression-seeds-%Y%m%d-%H%M%S.json", time.gmtime())))
    jobs.add_options(p, timeout=1800)
    return p.parse_args(argv_)


def planned(args) -> list[tuple[str, int, int]]:
    """(model, np, seed) of every accuracy cell."""
    if not args.plan:
        return [(m, n, s) for m in args.models for n in args.nps for s in args.seeds]
    cells = []
    for entry in args.plan:
        model, nps, seeds = entry.split(":")
        cells += [(model, int(n), int(s)) for n in nps.split(",") for s in seeds.split(",")]
    return cells


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    return {**jobs.machine(), "cpu_model": cpu, "cores": os.cpu_count()}


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def accuracy_run(args, runs: str, model: str, np: int, seed: int, scheme: str) -> dict:
    name = f"{model}-np{np}-{scheme}-seed{seed}"
    flags = [*RUN_FLAGS, "--sync", args.sync, "--model", model, "--epochs", str(args.epochs), "--seed", str(seed), *SCHEMES[scheme],
             "--log-dir", runs, "--run-name", name]
    done = jobs.run(name, argv(args.launcher, np) + flags, log=os.path.join(runs, f"{name}.log"), timeout=args.timeout)
    print(f"{name}: {done.seconds:.0f} s", file=sys.stderr, flush=True)
    records = read_metrics(os.path.join(runs, name)).records
    last = records[-1]
    return {"model": model, "np": np, "seed": seed, "scheme": scheme, "wall_s": round(done.seconds, 1),
            "test_acc_per_epoch": [r["test_acc"] for r in records], "final_test_acc": last["test_acc"],
            "analytic_bytes_per_update": last["comm_bytes_per_sync"],
            "analytic_bytes_per_update_last_epoch": last["comm_bytes_per_rank"] / last["syncs"],
            "training_time_s": round(sum(r["epoch_time_s"] for r in records), 2)}


def bytes_runs(args, out_dir: str) -> list[dict]:
    """VGG-11 on the namespace cluster after the warm-ups: analytic and eth0 bytes per update."""
    from testbed.netcluster import NetCluster
    flags = ["--dataset", "digits", "--model", "vgg11", "--epochs", "2", "--max-steps-per-epoch", "4",
             "--compression-warmup-steps", "0", "--topk-warmup-epochs", "0", "--no-tensorboard"]
    rows = []
    with NetCluster(n_hosts=max(args.bytes_nps), rate="1gbit") as cluster:
        for np in args.bytes_nps:
            for scheme in BYTES_SCHEMES:
                name = f"vgg11-np{np}-{scheme}"
                run_dir = jobs.cluster_training(cluster, np, [*flags, *SCHEMES[scheme]], os.path.join(out_dir, "bytes"),
                                                name, label=f"bytes {name}", log=os.path.join(out_dir, "bytes", f"{name}.log"),
                                                timeout=args.timeout)
                second = read_metrics(run_dir).records[-1]
                tx = sum(second["nic_tx_bytes"].values()) / len(second["nic_tx_bytes"]) / second["syncs"]
                rows.append({"model": "vgg11", "np": np, "scheme": scheme,
                             "analytic_bytes_per_update": second["comm_bytes_per_sync"],
                             "analytic_bytes_per_update_epoch2": second["comm_bytes_per_rank"] / second["syncs"],
                             "eth0_tx_bytes_per_update": tx})
    return rows


def summarise(runs: list[dict]) -> list[dict]:
    """Per model, np and scheme: mean, min and max of the final accuracy over the seeds, and the
    difference of the mean from none's (points)."""
    cells = {}
    for r in runs:
        cells.setdefault((r["model"], r["np"], r["scheme"]), []).append(r)
    rows = []
    for (model, np, scheme), group in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1], list(SCHEMES).index(kv[0][2]))):
        finals = [r["final_test_acc"] for r in group]
        base = [r["final_test_acc"] for r in cells.get((model, np, "none"), [])]
        mean = statistics.fmean(finals)
        row = {"model": model, "np": np, "scheme": scheme, "seeds": sorted(r["seed"] for r in group),
               "mean": mean, "min": min(finals), "max": max(finals),
               "analytic_bytes_per_update": group[0]["analytic_bytes_per_update"]}
        if base:
            row["points_vs_none"] = 100 * (mean - statistics.fmean(base))
            row["within_1_point"] = row["points_vs_none"] >= -ACCURACY_POINTS
        rows.append(row)
    return rows


def bytes_verdicts(rows: list[dict]) -> list[dict]:
    verdicts = []
    for np in sorted({r["np"] for r in rows}):
        base = next(r for r in rows if r["np"] == np and r["scheme"] == "none")
        for r in rows:
            if r["np"] == np and r["scheme"] != "none":
                analytic = base["analytic_bytes_per_update"] / r["analytic_bytes_per_update"]
                wire = base["eth0_tx_bytes_per_update"] / r["eth0_tx_bytes_per_update"]
                verdicts.append({"np": np, "scheme": r["scheme"], "analytic_x_fewer": analytic, "wire_x_fewer": wire,
                                 "at_least_50x": analytic >= BYTES_FACTOR and wire >= BYTES_FACTOR})
    return verdicts


def markdown(results: dict) -> str:
    lines = ["| model | np | scheme | seeds | mean final acc | min | max | vs none (points) | B/update (analytic) |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in results["summary"]:
        vs = f"{r['points_vs_none']:+.2f}" if "points_vs_none" in r else "-"
        lines.append(f"| {r['model']} | {r['np']} | {r['scheme']} | {','.join(map(str, r['seeds']))} | {r['mean']:.4f} | "
                     f"{r['min']:.4f} | {r['max']:.4f} | {vs} | {r['analytic_bytes_per_update']:,} |")
    if results.get("bytes_verdicts"):
        lines += ["", "| np | scheme | x fewer bytes than none (analytic) | (eth0 tx) |", "|---:|---|---:|---:|"]
        lines += [f"| {v['np']} | {v['scheme']} | {v['analytic_x_fewer']:.1f} | {v['wire_x_fewer']:.1f} |"
                  for v in results["bytes_verdicts"]]
    return "\n".join(lines)


@jobs.one_line_errors("compression_seeds")
def main(argv_: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv_ is None else argv_)
    stem = os.path.splitext(os.path.basename(args.out))[0]
    out_dir = os.path.join(ROOT, "logs", f"bench-{stem}")  # the run folders and logs (not in git)
    runs_dir = os.path.join(out_dir, "runs")
    os.makedirs(runs_dir, exist_ok=True)
    span = jobs.Span()
    results = {"command": [sys.executable, *sys.argv], "commit": commit(), "machine": machine(), "runs": []}
    if args.bytes_only and os.path.exists(args.out):  # an earlier invocation's accuracy rounds, these bytes beside them
        with open(args.out) as f:
            results = {**json.load(f), "bytes_command": results["command"], "bytes_commit": results["commit"]}
    if args.note:
        results.setdefault("notes", []).append(args.note)
    if args.time_one:
        for model in args.models:
            results["runs"].append(accuracy_run(args, runs_dir, model, max(args.nps), args.seeds[0], "none"))
        results["meta"] = span.end()
        write_json(args.out, results)
        print(results["runs"])
        return 0
    cells = [] if args.bytes_only else planned(args)
    for k, seed in enumerate(sorted({s for _, _, s in cells})):
        order = jobs.rotated([(m, n, scheme) for m, n, s in cells if s == seed for scheme in args.schemes], k)
        for model, np, scheme in order:
            results["runs"].append(accuracy_run(args, runs_dir, model, np, seed, scheme))
            results["summary"], results["meta"] = summarise(results["runs"]), span.end()
            write_json(args.out, results)  # so far: a stopped benchmark keeps its runs
    if not args.no_bytes:
        results["bytes"] = bytes_runs(args, out_dir)
        results["bytes_verdicts"] = bytes_verdicts(results["bytes"])
    results["summary"] = summarise(results["runs"])
    results["bytes_meta" if args.bytes_only else "meta"] = span.end()
    write_json(args.out, results)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
