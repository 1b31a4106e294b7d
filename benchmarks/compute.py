"""Compute at the machine's rate: hvd_cifar at np = 1 with compute: auto against a plain PyTorch loop
in every setting the processor runs well, side by side, interleaved.

    .venv/bin/python benchmarks/compute.py [--models vgg11 resnet18] [--batch-size 64] [--steps 12]
        [--epochs 3] [--repeats 3] [--no-compile] [--out logs/bench-compute-YYYYmmdd-HHMMSS] [--tag T]

Per model, one round runs, in an order that rotates from round to round (testbed.jobs.rotated):
the plain loop (benchmarks/bare_horovod.py --plain: the same model, optimizer, batch and threads,
random batches already in memory) in each candidate setting this processor has
(hvd_cifar.trainer.compute.device_candidates: fp32 and, where the CPU has native bf16, bf16, each
NCHW and channels-last), the plain loop under torch.compile in fp32 and in the fastest setting of
the previous rounds, and hvd_cifar itself (python -m hvd_cifar.train, synthetic data, every key at
its default: compute: auto). Figures: images per second (the plain loop's from the median step
after its first epoch; hvd_cifar's from its epochs after the first), the setting hvd_cifar chose,
the compile's first epoch against a steady one, and the seconds hvd_cifar spent timing its
candidates (each hvd_cifar job starts with an empty cache of choices). Paired within each round: hvd_cifar against the
plain loop's fp32 NCHW, and against the plain setting that is fastest by its median over all
rounds. Written to benchmarks/results/compute.json (hvd_cifar.measure.results); the docs' tables
(docs/BENCHMARKS.md, "Compute") are rendered from it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from hvd_cifar.launch import commands
from hvd_cifar.runfolder.reader import load_run
from hvd_cifar.trainer.compute import device_candidates
from testbed import jobs, render_docs
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HVD = "hvd_cifar auto"
FIGURES = {
    "images_per_s": Figure("img/s", ".1f"),
    "first_epoch_s": Figure("first epoch (s)", ".2f"),
    "choice_s": Figure("hvd_cifar: timing the candidates (s)", ".2f"),
    "compile_extra_s": Figure("compile: first epoch over a steady one (s)", ".2f"),
    "of_plain_fp32": Figure("x plain fp32 NCHW (img/s)", ".3f"),
    "of_fastest_plain": Figure("x fastest plain setting (img/s)", ".3f"),
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["vgg11", "resnet18"])
    p.add_argument("--no-compile", dest="compile", action="store_false", help="leave torch.compile out")
    p.add_argument("--out", default=os.path.join("logs", time.strftime("bench-compute-%Y%m%d-%H%M%S")))
    jobs.add_options(p, batch_size=64, steps=12, epochs=3, repeats=3, timeout=1800)
    add_results_options(p)
    return p.parse_args(argv)


def plain(model: str, setting: str, args, log: str, compiled: bool = False) -> dict:
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "bare_horovod.py"), "--plain", "--model", model,
           "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--epochs", str(args.epochs),
           "--threads", str(torch.get_num_threads()), "--compute", setting, *(["--compile"] if compiled else [])]
    done = jobs.run(f"plain {setting}", cmd, log=log, timeout=args.timeout)
    line = json.loads(next(x for x in done.stdout.splitlines() if "median_step_time_s" in x))
    figures = {"images_per_s": args.batch_size / line["median_step_time_s"], "first_epoch_s": line["first_epoch_s"]}
    if compiled:
        figures["compile_extra_s"] = line["first_epoch_s"] - line["median_step_time_s"] * args.steps
    return figures


def hvd_cifar(model: str, name: str, args) -> tuple[dict, str]:
    runs = os.path.join(args.out, "runs")
    cmd = [*commands.argv("single", 1), "--dataset", "synthetic", "--synthetic-size", str(args.batch_size * args.steps),
           "--model", model, "--batch-size", str(args.batch_size), "--epochs", str(args.epochs),
           "--warmup-epochs", "0", "--checkpoint-every", "0", "--no-progress", "--no-tensorboard",
           "--log-dir", runs, "--run-name", name]
    # A cache of its own per job: every round times the candidates, so the choice and its cost
    # are measured each time (a user's later runs take the cached choice: hvd_cifar/trainer/compute.py).
    cache = os.path.join(args.out, "cache", name)
    jobs.run(HVD, cmd, log=os.path.join(args.out, f"{name}.log"), timeout=args.timeout,
             env=commands.job_env(HVD_CIFAR_CACHE_DIR=cache))
    run = load_run(os.path.join(runs, name))
    steady = run.metrics[1:] or run.metrics
    images = sum(r["images_per_s"] * r["epoch_time_s"] for r in steady)
    with open(os.path.join(runs, name, "meta.json")) as f:
        choice = json.load(f)["compute_choice"]
    return {"images_per_s": images / sum(r["epoch_time_s"] for r in steady),
            "choice_s": choice.get("timing_s", 0.0)}, choice["setting"]


def fastest(results: Results, model: str, settings: list[str]) -> str:
    """The plain setting with the highest median img/s over the rounds so far."""
    medians = {}
    for s in settings:
        values = [r["figures"]["images_per_s"] for r in results.data["rounds"]
                  if r["config"] == f"{model} plain {s}" and r["ok"]]
        if values:
            medians[s] = statistics.median(values)
    return max(medians, key=medians.get) if medians else settings[0]


def one_round(model: str, k: int, settings: list[str], args, results: Results) -> None:
    best = fastest(results, model, settings)
    jobs_ = [*[(f"plain {s}", s, False) for s in settings],
             *([("plain compiled fp32", "fp32", True)] + ([(f"plain compiled {best}", best, True)] if best != "fp32" else [])
               if args.compile else []),
             (HVD, None, False)]
    for label, setting, compiled in jobs.rotated(jobs_, k - 1):
        config = f"{model} {label}"
        # Each job with the machine's noise around it (steal, other processes' CPU), marked when disturbed.
        if setting is None:
            done = results.attempt(k, config, lambda: hvd_cifar(model, f"{model}-r{k}", args))
            if done is not None:
                figures, chosen = done
                results.add(k, config, figures, chosen=chosen, **results.noise)
        else:
            log = os.path.join(args.out, f"{model}-{label.replace(' ', '-')}-r{k}.log")
            results.measure(k, config, lambda: plain(model, setting, args, log, compiled))


def derive(results: Results, model: str, settings: list[str]) -> None:
    """Paired within each round: hvd_cifar's img/s over the plain fp32 NCHW loop's, and over the
    plain setting fastest by its median over every round. That setting's rounds are also kept as
    ``MODEL plain fastest`` (which setting it is: the file's ``fastest_plain``), so that a table
    can pair against it on every processor, whichever setting wins there."""
    best = fastest(results, model, settings)
    results.data.setdefault("fastest_plain", {})[model] = best
    results.derive(f"{model} plain fastest", "images_per_s", lambda r: r[f"{model} plain {best}"]["images_per_s"])
    results.derive(f"{model} hvd_cifar / plain fp32", "of_plain_fp32",
                   lambda r: r[f"{model} {HVD}"]["images_per_s"] / r[f"{model} plain fp32"]["images_per_s"])
    results.derive(f"{model} hvd_cifar / plain {best}", "of_fastest_plain",
                   lambda r: r[f"{model} {HVD}"]["images_per_s"] / r[f"{model} plain {best}"]["images_per_s"])


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    settings = device_candidates(torch.device("cpu"))
    results = Results("compute", args, FIGURES, argv)
    results.data["candidates"] = settings
    for k in range(1, args.repeats + 1):
        for model in args.models:
            one_round(model, k, settings, args, results)
    for model in args.models:
        derive(results, model, settings)
    path = results.write()
    text = render_docs.render_block(os.path.basename(path), os.path.dirname(path))
    jobs.write_results(args.out, "compute", results.data, text)
    print(text)
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
