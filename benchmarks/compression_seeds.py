"""Whether each communication scheme keeps its accuracy at its defaults, over seeds: none, fp16,
PowerSGD, top-k and local SGD (H = 4, which has no default), each model and number of ranks, one
run per seed, as a user runs them (``horovodrun -np N -H localhost:N python -m hvd_cifar.train
--dataset digits --model M --epochs 6 --seed S`` and the scheme's one flag); then the gradient
bytes per update after the warm-ups, analytic and on the wire.

    nice -n 10 .venv/bin/python benchmarks/compression_seeds.py      # as root (the bytes pass)
        [--models smallcnn vgg11] [--nps 2 4] [--seeds 0 1 2] [--schemes none fp16 ...]
        [--epochs 6] [--launcher horovodrun|mpirun] [--sync horovod|ddp] [--plan smallcnn:2,4:0,1,2 vgg11:4:0] [--bytes-nps 2 4] [--no-bytes]
        [--out logs/bench-compression_seeds] [--tag T] [--time-one] [--bytes-only]

Accuracy: rounds, one per seed; within a round every (model, np, scheme) in an order that
rotates from round to round (testbed.jobs.rotated), so that the machine's load drifts over all
alike. ``--plan`` replaces the full grid by model:nps:seeds entries (what fits the time). Bytes:
on the namespace cluster (testbed.netcluster, one rank per host, links 1 Gbit/s, horovodrun
--gloo), VGG-11, 2 epochs of 4 steps without the warm-ups (compression_warmup_steps 0,
topk_warmup_epochs 0): the trainer's analytic ``comm_bytes_per_sync`` and each host's eth0 tx per
update in the second epoch. ``--time-one`` times one accuracy run of each model at the largest np
and stops (the projection of the whole grid).

Writes the results file benchmarks/results/compression_seeds.json (``hvd_cifar.measure.results``: --tag,
--results; the run folders and logs go to logs/bench-compression_seeds/): per round (a seed) each
(model, np, scheme)'s final test accuracy and accuracy per epoch, and each scheme's points against
none's of the same seed and model and np; the bytes pass as round 1 of its own configurations,
with each scheme's x fewer bytes than none's, analytic and on eth0. A failed run is a failed round
with its reason. The verdicts (docs/COMM_OPTIONS.md) are computed from all rounds by the renderer.
"""
from __future__ import annotations

import argparse
import os
import sys

from hvd_cifar.launch.commands import ROOT, argv
from hvd_cifar.runfolder.reader import read_metrics
from testbed import jobs
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options

from compression import SCHEMES  # benchmarks/compression.py: each scheme's trainer flags at its defaults

BYTES_SCHEMES = ("none", "powersgd", "topk")
RUN_FLAGS = ["--dataset", "digits", "--checkpoint-every", "0", "--progress", "false", "--no-tensorboard"]
FIGURES = {
    "final_test_acc": Figure("final test acc", ".4f"),
    "points_vs_none": Figure("points vs none (same seed)", "+.2f"),
    "analytic_bytes_per_update": Figure("B/update (analytic)", ",.0f"),
    "eth0_tx_bytes_per_update": Figure("eth0 tx B/update", ",.0f"),
    "analytic_x_fewer": Figure("x fewer bytes than none (analytic)", ".1f"),
    "wire_x_fewer": Figure("x fewer bytes than none (eth0 tx)", ".1f"),
    "training_time_s": Figure("training time (s)", ".0f"),
}


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
    p.add_argument("--bytes-only", action="store_true", help="only the bytes pass")
    p.add_argument("--time-one", action="store_true", help="time one run per model and stop")
    p.add_argument("--out", default=os.path.join(ROOT, "logs", "bench-compression_seeds"),
                   help="run folders and logs (default logs/bench-compression_seeds)")
    jobs.add_options(p, timeout=1800)
    add_results_options(p)
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


def config(model: str, np: int, scheme: str) -> str:
    return f"{model} np={np} {scheme}"


def accuracy_run(args, runs: str, model: str, np: int, seed: int, scheme: str) -> tuple[dict, list[float]]:
    """One training run as a user starts it; its figures, and its test accuracy per epoch."""
    name = f"{model}-np{np}-{scheme}-seed{seed}"
    flags = [*RUN_FLAGS, "--sync", args.sync, "--model", model, "--epochs", str(args.epochs), "--seed", str(seed),
             *SCHEMES[scheme], "--log-dir", runs, "--run-name", name]
    jobs.run(name, argv(args.launcher, np) + flags, log=os.path.join(runs, f"{name}.log"), timeout=args.timeout)
    records = read_metrics(os.path.join(runs, name)).records
    last = records[-1]
    return ({"final_test_acc": last["test_acc"], "analytic_bytes_per_update": last["comm_bytes_per_sync"],
             "training_time_s": sum(r["epoch_time_s"] for r in records)}, [r["test_acc"] for r in records])


def accuracy_job(results: Results, args, runs: str, k: int, model: str, np: int, seed: int, scheme: str) -> None:
    """One accuracy run as job of round ``k``: its figures, seed and accuracy per epoch, or a failed round."""
    got = results.attempt(k, config(model, np, scheme), lambda: accuracy_run(args, runs, model, np, seed, scheme))
    if got is not None:
        figures, per_epoch = got
        results.add(k, config(model, np, scheme), figures, seed=seed, test_acc_per_epoch=per_epoch)


def bytes_run(cluster, args, out_dir: str, np: int, scheme: str) -> dict:
    """VGG-11 on the namespace cluster after the warm-ups: analytic and eth0 tx bytes per update
    in the second epoch."""
    flags = ["--dataset", "digits", "--model", "vgg11", "--epochs", "2", "--max-steps-per-epoch", "4",
             "--compression-warmup-steps", "0", "--topk-warmup-epochs", "0", "--no-tensorboard", *SCHEMES[scheme]]
    name = f"vgg11-np{np}-{scheme}"
    run_dir = jobs.cluster_training(cluster, np, flags, os.path.join(out_dir, "bytes"), name, label=f"bytes {name}",
                                    log=os.path.join(out_dir, "bytes", f"{name}.log"), timeout=args.timeout)
    second = read_metrics(run_dir).records[-1]
    return {"analytic_bytes_per_update": second["comm_bytes_per_rank"] / second["syncs"],
            "eth0_tx_bytes_per_update": sum(second["nic_tx_bytes"].values()) / len(second["nic_tx_bytes"]) / second["syncs"]}


def bytes_pass(results: Results, args, out_dir: str) -> None:
    from testbed.netcluster import NetCluster
    with NetCluster(n_hosts=max(args.bytes_nps), rate="1gbit") as cluster:
        for np in args.bytes_nps:
            for scheme in BYTES_SCHEMES:
                results.measure(1, config("vgg11", np, scheme) + " bytes", lambda: bytes_run(cluster, args, out_dir, np, scheme))
    for np in args.bytes_nps:
        for scheme in BYTES_SCHEMES[1:]:
            for figure, key in (("analytic_x_fewer", "analytic_bytes_per_update"), ("wire_x_fewer", "eth0_tx_bytes_per_update")):
                results.derive(f"vgg11 np={np} {scheme} / none bytes", figure, lambda r, n=np, s=scheme, k=key:
                               r[config("vgg11", n, "none") + " bytes"][k] / r[config("vgg11", n, s) + " bytes"][k],
                               rounds=[1])


@jobs.one_line_errors("compression_seeds")
def main(argv_: list[str] | None = None) -> int:
    argv_ = sys.argv[1:] if argv_ is None else argv_
    args = parse_args(argv_)
    runs_dir = os.path.join(args.out, "runs")
    os.makedirs(runs_dir, exist_ok=True)
    results = Results("compression_seeds", args, FIGURES, argv_)
    results.sample_noise = False  # its jobs run on a cluster's hosts, not as this process's children
    if args.time_one:
        for model in args.models:
            accuracy_job(results, args, runs_dir, 1, model, max(args.nps), args.seeds[0], "none")
        results.write()
        return 0
    cells = [] if args.bytes_only else planned(args)
    seeds = sorted({s for _, _, s in cells})
    for k, seed in enumerate(seeds):  # a round per seed, the order rotated from round to round
        order = jobs.rotated([(m, n, scheme) for m, n, s in cells if s == seed for scheme in args.schemes], k)
        for model, np, scheme in order:
            accuracy_job(results, args, runs_dir, k + 1, model, np, seed, scheme)
            results.write()  # so far: a stopped benchmark keeps the runs it finished
    for model, np in sorted({(m, n) for m, n, _ in cells}):
        for scheme in args.schemes:
            if scheme != "none":
                results.derive(f"{model} np={np} {scheme} / none", "points_vs_none", lambda r, m=model, n=np, s=scheme:
                               100 * (r[config(m, n, s)]["final_test_acc"] - r[config(m, n, "none")]["final_test_acc"]))
    if not args.no_bytes:
        bytes_pass(results, args, args.out)
    results.write()
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
