"""The scaling model's whole step checked on the namespace cluster: training steps at np = 3 and 4
predicted from what np = 1 and 2 measured, then trained and compared, per link rate, sync method
and option (issue 15, point 4).

    .venv/bin/python benchmarks/step_validation.py [--rates 100mbit 1gbit none] [--nps 3 4]
        [--syncs horovod mpi-gather-scatter] [--model vgg11] [--steps 4] [--out logs/bench-stepval-...]

As root (network namespaces). Per rate, on one testbed.netcluster cluster of max(--nps) hosts
(one rank per host, one thread per rank, mpirun): the probe at np = 2 (α, β per transport); an
np = 1 training run (the compute); an np = 2 Horovod run with comm_timeline (the hidden
fraction); then ``hvd_cifar.predict`` with ``--shared-cores`` set to this machine's cores (the
hosts are namespaces of one machine, so 3 and 4 ranks share its cores) predicts every --sync
plain, with fp16 and with 4 accumulation steps at each --nps, and each of those is trained and
put beside its prediction (predict's --measured). Every job runs --epochs whole epochs of --steps
steps per rank; step times are the epochs after the first (hvd_cifar.report's rule). Writes
OUT/step_validation.json and .md (the table), the runs, probes and predictions; prints the table.
Every row is also a configuration of round 1 in the results file
benchmarks/results/step_validation.json (``hvd_cifar.measure.results``: --tag, --results); a rate whose
cluster, job or prediction failed is a failed round with its reason.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from hvd_cifar import predict

from testbed import jobs
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options
from hvd_cifar.analysis.tabulate import Column, markdown_table, num
from hvd_cifar.launch.commands import ROOT

# option label -> (train flags, predict's scenario keys: compression, accumulation steps)
OPTIONS = {"plain": ([], ("none", 1)),
           "fp16": (["--compression", "fp16"], ("fp16", 1)),
           "accum4": (["--accumulation-steps", "4"], ("none", 4))}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", nargs="+", default=["100mbit", "1gbit", "none"], help="link rates, tc syntax; none: unshaped")
    p.add_argument("--nps", type=int, nargs="+", default=[3, 4], help="world sizes predicted and trained")
    p.add_argument("--syncs", nargs="+", default=["horovod", "mpi-gather-scatter"], choices=["horovod", "mpi-gather-scatter"])
    p.add_argument("--options", nargs="+", default=list(OPTIONS), choices=list(OPTIONS))
    p.add_argument("--model", default="vgg11")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2, help="the first is not timed")
    p.add_argument("--steps", type=int, default=4, help="steps per rank per epoch (a multiple of 4 for accum4)")
    p.add_argument("--probe-iters", type=int, default=3)
    p.add_argument("--probe-max-bytes", type=int, default=0, help="largest probe message (default: the probe's)")
    jobs.add_options(p, timeout=1200)
    add_results_options(p)
    p.add_argument("--out", default=os.path.join(ROOT, "logs", time.strftime("bench-stepval-%Y%m%d-%H%M%S")))
    args = p.parse_args(argv)
    if min(args.nps) < 3 or args.epochs < 2 or ("accum4" in args.options and args.steps % 4):
        p.error("--nps from 3 (np 1 and 2 are the measurements), --epochs >= 2, --steps a multiple of 4 with accum4")
    return args


def train(cluster, np: int, name: str, sync: str, extra: list[str], args, runs: str) -> str:
    """One training job across the first ``np`` hosts under mpirun; its run folder."""
    flags = ["--model", args.model, "--dataset", args.dataset, "--epochs", str(args.epochs),
             "--max-steps-per-epoch", str(args.steps), "--batch-size", str(args.batch_size), "--sync", sync,
             "--log-dir", runs, "--run-name", name, *jobs.CLUSTER_TRAIN_FLAGS, *extra]
    jobs.run(name, lambda: cluster.run_mpirun(np, flags, timeout=args.timeout), log=os.path.join(runs, f"{name}.log"))
    return os.path.join(runs, name)


def validate_rate(rate: str, args) -> list[dict]:
    """Probe, measure np=1 and 2, predict, train np=3/4; the predicted rows that were trained."""
    from testbed.netcluster import NetCluster
    runs, measured = os.path.join(args.out, rate), []
    os.makedirs(runs, exist_ok=True)
    probe_path = os.path.join(args.out, f"probe-{rate}-np2.json")
    with NetCluster(max(args.nps), rate=None if rate == "none" else rate) as cluster:
        # the probe's message sizes as benchmarks/network_validation.py uses them by default
        jobs.probe(cluster, 2, probe_path, iters=args.probe_iters, timeout=args.timeout, max_bytes=args.probe_max_bytes)
        single = train(cluster, 1, "np1", "horovod", [], args, runs)
        overlap = train(cluster, 2, "np2-horovod-timeline", "horovod", ["--comm-timeline", "true"], args, runs)
        for sync in args.syncs:
            for option in args.options:
                for n in args.nps:
                    measured.append(train(cluster, n, f"np{n}-{sync}-{option}", sync, OPTIONS[option][0], args, runs))
                print(f"{rate} {sync} {option}: trained", file=sys.stderr, flush=True)
    wanted = {(s, *OPTIONS[o][1], n) for s in args.syncs for o in args.options for n in args.nps}
    pred_args = predict.parse_args([single, "--probe", probe_path, "--np", *map(str, args.nps), "--sync", *args.syncs,
                                    "--compression", "fp16", "--accumulation-steps", "4", "--overlap-from", overlap,
                                    "--shared-cores", str(os.cpu_count() or 1), "--measured", *measured,
                                    "--out", os.path.join(args.out, f"predict-{rate}")])
    rows, text = predict.run(pred_args)
    with open(os.path.join(args.out, f"predict-{rate}.md"), "w") as f:
        f.write(text + "\n")
    rows = [{"rate": rate, **r} for r in rows
            if (r["method"], r["compression"], r["accumulation_steps"], r["np"]) in wanted and r["freeze"] == 0]
    unmatched = [r for r in rows if "measured_step_s" not in r]
    if len(rows) != len(wanted) or unmatched:
        raise RuntimeError(f"{rate}: {len(wanted)} trained configurations but {len(rows) - len(unmatched)} "
                           "predicted rows with a measured run beside them")
    return rows


def option_label(r: dict) -> str:
    return ("fp16" if r["compression"] == "fp16" else f"accum {r['accumulation_steps']}" if r["accumulation_steps"] > 1
            else "plain")


FIGURES = {"step_s": Figure("predicted step (ms)", ".1f", 1e-3),
           "measured_step_s": Figure("measured step (ms)", ".1f", 1e-3), "error_pct": Figure("error (%)", "+.1f")}


def config(r: dict) -> str:
    """A row's name in the results file."""
    return f"{r['rate']} {r['method']} {option_label(r)} np={r['np']}"


COLUMNS = [Column("rate", "rate"), Column("sync", "method"), Column("option", "compression", row_fmt=option_label),
           Column("np", "np", numeric=True), num("predicted step (ms)", "step_s", ".1f", 1e-3),
           num("measured step (ms)", "measured_step_s", ".1f", 1e-3), num("error (%)", "error_pct", "+.1f")]


@jobs.one_line_errors("hvd_cifar")
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    span, rows = jobs.Span(), []
    results = Results("step_validation", args, FIGURES, argv)
    results.sample_noise = False  # its jobs run on a cluster's hosts, not as this process's children
    for rate in args.rates:  # a failed job, cluster or prediction: a failed round with its first line
        rows += results.measure_rows(1, rate, lambda: validate_rate(rate, args), config)
    results.write()
    meta = span.end(cores=os.cpu_count(), args=vars(args))
    within = sum(abs(r["error_pct"]) <= 15 for r in rows)
    summary = f"{within} of {len(rows)} predicted steps within 15 % of the measured ones"
    jobs.write_results(args.out, "step_validation", {"meta": meta, "rows": rows}, f"{markdown_table(COLUMNS, rows)}\n{summary}")
    print(span.line())
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
