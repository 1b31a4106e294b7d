"""How hard the generated data set is, at full size, and what its CIFAR-format path costs: a linear
model on the pixels, the small CNN and VGG-11 at np = 2 with every other key at its default, one
round per seed.

    .venv/bin/python benchmarks/data_difficulty.py [--models smallcnn vgg11] [--epochs 6]
        [--vgg-epochs 6] [--seeds 200 201] [--train 50000] [--test 10000] [--out logs/bench-data]

Per round (a seed), in an order that rotates from round to round: ridge regression to one-hot
labels on the raw pixels (the linear baseline; the data set's seed is shapes_seed 0 in every
round, the run's seed changes), then each model trained under horovodrun -np 2 on this machine.
Before the rounds: the seconds to generate and write the data set (its first use) and to read it
back (every later use). Figures: final test accuracy; each rank's peak memory; the binomial
standard error of an accuracy on the test set. Written to benchmarks/results/data_difficulty.json
(hvd_cifar.measure.results, the seeds and their role named); docs/DATA.md renders its tables.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import numpy as np

from hvd_cifar.launch import commands
from hvd_cifar.runfolder.reader import read_metrics
from hvd_cifar.workload import data
from testbed import jobs, render_docs
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options

FIGURES = {
    "final_acc": Figure("final test acc", ".4f"),
    "standard_error_points": Figure("its binomial standard error (points)", ".2f"),
    "rss_peak_mb": Figure("peak memory per rank (MB)", ".0f"),
    "seconds": Figure("seconds", ".1f"),
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["smallcnn", "vgg11"])
    p.add_argument("--epochs", type=int, default=6, help="epochs of the small CNN (default 6, as the benchmarks)")
    p.add_argument("--vgg-epochs", type=int, default=6, help="epochs of VGG-11 (default 6)")
    p.add_argument("--seeds", type=int, nargs="+", default=[200, 201])
    p.add_argument("--train", type=int, default=50_000)
    p.add_argument("--test", type=int, default=10_000)
    p.add_argument("--out", default=os.path.join("logs", time.strftime("bench-data-%Y%m%d-%H%M%S")))
    p.add_argument("--timeout", type=int, default=3600)
    add_results_options(p)
    return p.parse_args(argv)


def linear(ds, seed: int) -> float:
    """Ridge regression to one-hot labels on the pixels (in [-0.5, 0.5], plus a bias)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(ds.train_labels))
    x = ds.train_images.numpy()[order].reshape(len(order), -1).astype(np.float32) / 255 - 0.5
    y = ds.train_labels.numpy()[order]
    f = np.c_[x, np.ones(len(x), np.float32)]
    gram = f.T @ f + 30.0 * np.eye(f.shape[1], dtype=np.float32)
    weights = np.linalg.solve(gram.astype(np.float64), (f.T @ np.eye(10, dtype=np.float32)[y]).astype(np.float64))
    xt = ds.test_images.numpy().reshape(len(ds.test_labels), -1).astype(np.float32) / 255 - 0.5
    scores = np.c_[xt, np.ones(len(xt), np.float32)] @ weights
    return float((scores.argmax(1) == ds.test_labels.numpy()).mean())


def train(model: str, seed: int, k: int, args) -> dict:
    runs = os.path.join(args.out, "runs")
    name = f"{model}-s{seed}"
    epochs = args.vgg_epochs if model.startswith("vgg") else args.epochs
    cmd = [*commands.argv("horovodrun", 2), "--dataset", "shapes", "--shapes-train", str(args.train),
           "--shapes-test", str(args.test), "--data-dir", os.path.join(args.out, "data"), "--model", model,
           "--epochs", str(epochs), "--seed", str(seed), "--no-progress", "--no-tensorboard",
           "--log-dir", runs, "--run-name", name]
    jobs.run(f"{model} seed {seed}", cmd, log=os.path.join(args.out, f"{name}.log"), timeout=args.timeout)
    records = read_metrics(os.path.join(runs, name)).records
    acc = records[-1]["test_acc"]
    return {"final_acc": acc, "standard_error_points": 100 * (acc * (1 - acc) / args.test) ** 0.5,
            "rss_peak_mb": max(max(r["rss_peak_bytes"].values()) for r in records) / 1e6}


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    results = Results("data_difficulty", args, FIGURES, argv)
    results.seeds(args.seeds)
    folder = os.path.join(args.out, "data")
    shutil.rmtree(folder, ignore_errors=True)
    start = time.perf_counter()
    ds = data.load("shapes", folder, shapes_sizes=(args.train, args.test, 0))
    results.add(0, "generate and write (first use)", {"seconds": time.perf_counter() - start})
    start = time.perf_counter()
    ds = data.load("shapes", folder, shapes_sizes=(args.train, args.test, 0))
    results.add(0, "read (every later use)", {"seconds": time.perf_counter() - start})
    for k, seed in enumerate(args.seeds, 1):
        cases = ["linear", *args.models]
        for case in jobs.rotated(cases, k - 1):
            if case == "linear":
                results.measure(k, "linear model on pixels", lambda: {"final_acc": linear(ds, seed)})
            else:
                results.measure(k, f"{case} np 2", lambda m=case: train(m, seed, k, args))
    path = results.write()
    text = render_docs.render_block(os.path.basename(path), os.path.dirname(path))
    jobs.write_results(args.out, "data_difficulty", results.data, text)
    print(text)
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
