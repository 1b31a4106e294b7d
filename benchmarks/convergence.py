"""Time to accuracy, and do the defaults train soundly at every world size? Each case is one real
training run with every key at its default (the model, ranks and the one option named are all
that change), whole epochs, under horovodrun on this machine, on the offline digits data set or
the generated CIFAR-shaped set (--dataset shapes, full size unless --shapes-train says less).

    .venv/bin/python benchmarks/convergence.py [--models vgg11 smallcnn resnet18] [--epochs 6]
        [--cases np1 np2 np4 np2-acc4 np2-fp16 np2-freeze2 np4-warm0.25 np4-sqrt ...] [--repeats 1]
        [--seeds 100 101 102 103 104] [--dataset digits|shapes] [--target 0.95]
        [--out logs/bench-convergence-YYYYmmdd-HHMMSS] [--tag TAG] [--results benchmarks/results]

Per case: the final and best test accuracy, the epoch that first reached the target (default 95 %
on digits, 80 % on shapes), the wall time to it (the trainer's ``time_to_target_s`` in eval.json:
training and evaluation time up to that epoch), img/s over the epochs after the first, and
whether the case passes (final >= target);
per round and model the spread of the final accuracies at np = 1, 2, 4 (target: within 2
points). --repeats rounds, the cases in a rotated order each round. Written to the results file
benchmarks/results/convergence.json (hvd_cifar.measure.results, written again after every round; a case that exits non-zero, e.g. the
divergence guard's status 3, is a failed round with its one line of stderr). With --seeds, round
k runs every case at the k-th seed (--repeats is the number of seeds), so cases pair by seed; the tables,
rendered from it, are printed and left in OUT/convergence.md. Run folders: OUT/runs/MODEL-CASE-rK.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from hvd_cifar.analysis.summary import summarize, time_to_target
from hvd_cifar.core.config import MODEL_LR
from hvd_cifar.launch import commands
from hvd_cifar.runfolder.reader import load_run

from testbed import jobs, render_docs
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options
from hvd_cifar.measure.rounds import Disturbance

TARGETS = {"digits": 0.95, "shapes": 0.80}  # --target's default per data set
CASES = {  # name: (ranks, extra flags)
    "np1": (1, []),
    "np2": (2, []),
    "np4": (4, []),
    "np2-acc4": (2, ["--accumulation-steps", "4"]),
    "np2-fp16": (2, ["--compression", "fp16"]),
    "np4-fp16": (4, ["--compression", "fp16"]),
    "np2-powersgd": (2, ["--compression", "powersgd"]),
    "np4-powersgd": (4, ["--compression", "powersgd"]),
    "np2-topk": (2, ["--compression", "topk"]),
    "np4-topk": (4, ["--compression", "topk"]),
    # The asynchronous parameter server: 1 server and 2 workers, against np2's 2 workers:
    "np3-async-ps": (3, ["--sync", "mpi-async-ps"]),
    "np2-freezeauto": (2, ["--freeze", "auto"]),
    # Two passes of half the batch per update, the same images per update as np2: at the default
    # lr (the schedule scales it by ranks x accumulation steps: twice np2's peak), and at half the
    # model's default (so that the peak is np2's):
    "np2-acc2": (2, ["--accumulation-steps", "2", "--batch-size", "16"]),
    "np2-acc2-lr": (2, ["--accumulation-steps", "2", "--batch-size", "16", "--lr", "{half_lr}"]),
    # freeze: auto's threshold, to choose it on tuning seeds:
    "np2-freezeauto-t0.1": (2, ["--freeze", "auto", "--freeze-auto-threshold", "0.1"]),
    "np2-freezeauto-t0.05": (2, ["--freeze", "auto", "--freeze-auto-threshold", "0.05"]),
    "np2-freezeauto-t0.02": (2, ["--freeze", "auto", "--freeze-auto-threshold", "0.02"]),
    "np2-freeze2": (2, ["--freeze", "2"]),
    # The small CNN's lr (per rank at batch 32), to choose it on tuning seeds, and freeze: auto's
    # threshold at the rate chosen:
    "np1-lr0.05": (1, ["--lr", "0.05"]),  # the small CNN's earlier default, beside a new one
    "np2-lr0.05": (2, ["--lr", "0.05"]),
    "np4-lr0.05": (4, ["--lr", "0.05"]),
    "np1-lr0.1": (1, ["--lr", "0.1"]),
    "np2-lr0.1": (2, ["--lr", "0.1"]),
    "np4-lr0.1": (4, ["--lr", "0.1"]),
    "np2-lr0.2": (2, ["--lr", "0.2"]),
    "np2-lr0.1-freezeauto-t0.05": (2, ["--lr", "0.1", "--freeze", "auto", "--freeze-auto-threshold", "0.05"]),
    "np2-lr0.1-freezeauto-t0.02": (2, ["--lr", "0.1", "--freeze", "auto", "--freeze-auto-threshold", "0.02"]),
    # Alternatives to the default warm-up and scaling, to judge the defaults against over seeds:
    "np1-warm0.25": (1, ["--warmup-epochs", "0.25"]),
    "np2-warm0.25": (2, ["--warmup-epochs", "0.25"]),
    "np4-warm0.25": (4, ["--warmup-epochs", "0.25"]),
    "np2-sqrt": (2, ["--lr-scaling", "sqrt"]),
    "np4-sqrt": (4, ["--lr-scaling", "sqrt"]),
    # fp32 NCHW, against the default compute: auto (the setting it chose is kept with each round):
    "np1-fp32": (1, ["--compute", "fp32"]),
    "np2-fp32": (2, ["--compute", "fp32"]),
    "np4-fp32": (4, ["--compute", "fp32"]),
}
DEFAULT_CASES = ["np1", "np2", "np4", "np2-acc4", "np2-fp16"]
FIGURES = {
    "final_acc": Figure("final test acc", ".4f"),
    "best_acc": Figure("best test acc", ".4f"),
    "epochs_to_target": Figure("epochs to target", ".0f"),
    "time_to_target_s": Figure("time to target (s)", ".1f"),
    "images_per_s": Figure("img/s", ".1f"),
    "passed": Figure("final >= target (1 = yes)", ".0f"),
    "spread_points": Figure("final acc spread at np 1, 2, 4 (points)", ".2f"),
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["vgg11", "smallcnn", "resnet18"])
    p.add_argument("--cases", nargs="+", default=DEFAULT_CASES, choices=list(CASES))
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--dataset", choices=sorted(TARGETS), default="digits")
    p.add_argument("--target", type=float, default=0.0, help="test accuracy to time (default: per data set)")
    p.add_argument("--shapes-train", type=int, default=50_000, help="shapes: training images (default: full size)")
    p.add_argument("--out", default=os.path.join("logs", time.strftime("bench-convergence-%Y%m%d-%H%M%S")))
    p.add_argument("--seeds", type=int, nargs="+", default=[],
                   help="one round per seed, every case at that seed (default: --repeats rounds at seed 0)")
    jobs.add_options(p, repeats=1, timeout=2400)
    add_results_options(p)
    args = p.parse_args(argv)
    if args.seeds:
        args.repeats = len(args.seeds)
    args.target = args.target or TARGETS[args.dataset]
    return args


def run_case(model: str, case: str, k: int, args, results: Results) -> None:
    """One case of round ``k``, into ``results``: its figures, or a failed round with its line."""
    np_, extra = CASES[case]
    extra = [a.format(half_lr=MODEL_LR[model] / 2) for a in extra]  # {half_lr}: half the model's default rate
    name = f"{model}-{case}-r{k}"
    flags = ["--dataset", args.dataset, "--model", model, "--epochs", str(args.epochs), "--progress", "false",
             "--target-acc", str(args.target), "--log-dir", os.path.join(args.out, "runs"), "--run-name", name,
             "--no-tensorboard", *extra]
    if args.dataset == "shapes":  # generated once into OUT/data, read back by every later run
        flags += ["--data-dir", os.path.join(args.out, "data"), "--shapes-train", str(args.shapes_train)]
    if args.seeds:
        flags += ["--seed", str(args.seeds[k - 1])]
    cmd = [*commands.argv("single" if np_ == 1 else "horovodrun", np_), *flags]
    with Disturbance() as noise:  # the machine around the run: its time to target is only as good as that
        done = jobs.run(name, cmd, log=os.path.join(args.out, f"{name}.log"), timeout=args.timeout, check=False)
    config = f"{model} {case}"
    if done.code != 0:
        error = next((line for line in done.stderr.splitlines() if "hvd_cifar:" in line), done.stderr.strip()[-200:])
        results.fail(k, config, f"exit {done.code}: {error}")
        print(f"{config} round {k}: failed: exit {done.code}: {error} ({results.progress.step(k)})",
              file=sys.stderr, flush=True)
        return
    run = load_run(os.path.join(args.out, "runs", name))
    accs = [r["test_acc"] for r in run.metrics]
    reached = time_to_target(run)
    figures = {"final_acc": accs[-1], "best_acc": max(accs), "images_per_s": summarize(run)["images_per_s"],
               "passed": float(accs[-1] >= args.target)}
    if reached.get("epochs_to_target") is not None:
        figures.update(epochs_to_target=reached["epochs_to_target"], time_to_target_s=reached["time_to_target_s"])
    with open(os.path.join(args.out, "runs", name, "meta.json")) as f:
        compute = json.load(f).get("compute_choice", {}).get("setting")
    results.add(k, config, figures, accuracy_per_epoch=accs, wall_s=round(done.seconds, 1), compute=compute,
                **noise.figures, **({"disturbed": True} if noise.disturbed else {}),
                **({"seed": args.seeds[k - 1]} if args.seeds else {}))
    print(f"{config} round {k}: final {accs[-1]:.4f} in {done.seconds:.0f} s; {results.progress.step(k)}",
          file=sys.stderr, flush=True)


def derive_spreads(results: Results, models: list[str]) -> None:
    """Per round and model, the span of the final accuracies at np = 1, 2, 4, in points."""
    for model in models:
        results.derive(f"{model} np 1-2-4", "spread_points", lambda r, m=model: 100 * (
            max(r[f"{m} {c}"]["final_acc"] for c in ("np1", "np2", "np4"))
            - min(r[f"{m} {c}"]["final_acc"] for c in ("np1", "np2", "np4"))))


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    results = Results("convergence", args, FIGURES, argv)
    results.plan(jobs=args.repeats * len(args.models) * len(args.cases), rounds=args.repeats)
    if args.seeds:
        results.seeds(args.seeds)
    for k in range(1, args.repeats + 1):
        for model in args.models:
            for case in jobs.rotated(args.cases, k - 1):
                run_case(model, case, k, args, results)
        results.write()  # every finished round is kept, should a later one be cut off
    if {"np1", "np2", "np4"} <= set(args.cases):
        derive_spreads(results, args.models)
    path = results.write()
    text = render_docs.render_block(os.path.basename(path), os.path.dirname(path))
    jobs.write_results(args.out, "convergence", results.data, text)
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
