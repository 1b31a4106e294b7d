"""The scaling model's whole step checked on the namespace cluster: training steps predicted
from what np = 1 and a traced np = 2 run measured, then trained and compared, per link rate, sync
method and option; and where each traced step waited.

    .venv/bin/python benchmarks/step_validation.py [--rates 100mbit 1gbit none] [--nps 3 4]
        [--syncs horovod mpi-gather-scatter] [--traced horovod ddp] [--repeats 1] [--model vgg11]
        [--steps 4] [--out logs/bench-stepval-...]

As root (network namespaces). Per rate, on one testbed.netcluster cluster of max(--nps, 2) hosts
(one rank per host, one thread per rank, mpirun): the probe at np = 2 (α, β per transport) and an
np = 1 training run (the compute, made while the other hosts with a core to themselves run the
same training as load: the hosts share this machine, and at np = 2 every core computes); then --repeats rounds, each of: an np = 2 run with comm_timeline
per --traced method (Horovod's gives the hidden fraction), every --sync plain, with fp16 and with
4 accumulation steps at each --nps trained, and ``hvd_cifar.predict`` (``--shared-cores`` this
machine's cores: the hosts are namespaces of one machine) predicting each of those from the
probe, the np = 1 run and that round's traced Horovod run, put beside the trained one
(predict's --measured). With --nps 2 the np = 2 step is predicted from the overlap measured on
the cluster. Every job runs --epochs whole epochs of --steps steps per rank; step times are the
epochs after the first (hvd_cifar.report's rule). The traced runs' rows: per step, the allreduce
time hidden behind backward and exposed (comm_hidden_s, comm_exposed_s), and of the traced step
(trainer/steptrace.py) on rank 0 when the first allreduce began after backward began and the
last ended after backward ended. Writes OUT/step_validation.json and .md (the table), the runs,
probes and predictions; prints the table. Each row is a configuration of its round in the
results file benchmarks/results/step_validation.json (``hvd_cifar.measure.results``: --tag,
--results); a round whose job or prediction failed is a failed round with its reason, and the
rate's other rounds go on; a rate whose cluster, probe or np = 1 run failed, a failed first round.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import time

from hvd_cifar import predict
from hvd_cifar.analysis import steps
from hvd_cifar.runfolder.reader import load_run

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
    p.add_argument("--traced", nargs="+", default=["horovod"], choices=["horovod", "ddp"],
                   help="methods run at np=2 with comm_timeline each round (horovod's: the hidden fraction)")
    p.add_argument("--repeats", type=int, default=1, help="rounds per rate (traced and trained runs, interleaved)")
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
    if (min(args.nps) < 2 or args.epochs < 2 or ("accum4" in args.options and args.steps % 4)
            or "horovod" not in args.traced or args.repeats < 1):
        p.error("--nps from 2 (np 1 and a traced np 2 are the measurements), --epochs >= 2, --steps a multiple of 4 "
                "with accum4, --traced with horovod, --repeats >= 1")
    return args


def train_flags(name: str, sync: str, extra: list[str], args, runs: str, epochs: int = 0) -> list[str]:
    return ["--model", args.model, "--dataset", args.dataset, "--epochs", str(epochs or args.epochs),
            "--max-steps-per-epoch", str(args.steps), "--batch-size", str(args.batch_size), "--sync", sync,
            "--log-dir", runs, "--run-name", name, *jobs.CLUSTER_TRAIN_FLAGS, *extra]


def train(cluster, np: int, name: str, sync: str, extra: list[str], args, runs: str) -> str:
    """One training job across the first ``np`` hosts under mpirun; its run folder."""
    flags = train_flags(name, sync, extra, args, runs)
    jobs.run(name, lambda: cluster.run_mpirun(np, flags, timeout=args.timeout), log=os.path.join(runs, f"{name}.log"))
    return os.path.join(runs, name)


def train_alongside(cluster, name: str, args, runs: str) -> str:
    """The np=1 run that gives the compute, on host 0, while every other host that has a core of
    this machine to itself runs the same training as load (longer, stopped once the run is
    done): the hosts are namespaces of one machine, so at np = 2 a rank computes with every
    core busy (memory and caches shared), as it would not alone. Its run folder."""
    from testbed.netcluster import launch
    loads = []
    for host in range(1, min(os.cpu_count() or 1, len(cluster.namespaces))):
        flags = train_flags(f"{name}-load{host}", "horovod", [], args, os.path.join(runs, "load"), epochs=args.epochs + 3)
        log = open(os.path.join(runs, f"{name}-load{host}.log"), "w")
        loads.append((cluster.popen(host, launch.train_argv(cluster, flags), stdout=log, stderr=subprocess.STDOUT), log))
    try:
        return train(cluster, 1, name, "horovod", [], args, runs)
    finally:
        for p, log in loads:  # its own session: the load's process group, by its id
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            log.close()


def traced_row(rate: str, sync: str, run_dir: str) -> dict:
    """A traced run's figures: per step, allreduce hidden and exposed (its epochs after the
    first), and of rank 0's traced step in its last epoch, when the allreduce began and ended
    against backward."""
    run = load_run(run_dir)
    timed = run.metrics[1:] or run.metrics
    per_step = lambda key: 1e3 * sum(r[key] for r in timed) / sum(r["steps"] for r in timed)
    row = {"rate": rate, "method": sync, "np": 2, "traced": True, "hidden_ms": per_step("comm_hidden_s"),
           "exposed_ms": per_step("comm_exposed_s")}
    traced = steps.last_trace(run)
    if traced:
        first = steps.rank_row(traced[1]["ranks"][0])
        row.update({k: first[k] for k in ("first_after_backward_began_ms", "last_after_backward_ended_ms") if k in first})
    return row


def predicted_rows(rate: str, k: int, single: str, overlap: str, measured: list[str], probe_path: str, args) -> list[dict]:
    """Round ``k``'s predictions from the np=1 run, the probe and its traced Horovod run, each
    beside its trained run."""
    wanted = {(s, *OPTIONS[o][1], n) for s in args.syncs for o in args.options for n in args.nps}
    pred_args = predict.parse_args([single, "--probe", probe_path, "--np", *map(str, args.nps), "--sync", *args.syncs,
                                    "--compression", "fp16", "--accumulation-steps", "4", "--overlap-from", overlap,
                                    "--shared-cores", str(os.cpu_count() or 1), "--measured", *measured,
                                    "--out", os.path.join(args.out, f"predict-{rate}-r{k}")])
    rows, text = predict.run(pred_args)
    with open(os.path.join(args.out, f"predict-{rate}-r{k}.md"), "w") as f:
        f.write(text + "\n")
    rows = [{"rate": rate, "round": k, **r, "abs_error_pct": abs(r.get("error_pct", math.nan))} for r in rows
            if (r["method"], r["compression"], r["accumulation_steps"], r["np"]) in wanted and r["freeze"] == 0]
    unmatched = [r for r in rows if "measured_step_s" not in r]
    if len(rows) != len(wanted) or unmatched:
        raise RuntimeError(f"{rate}: {len(wanted)} trained configurations but {len(rows) - len(unmatched)} "
                           "predicted rows with a measured run beside them")
    return rows


def validate_rate(rate: str, args, results: Results) -> list[dict]:
    """Probe and measure np=1, then per round the traced np=2 runs, the trained ones and their
    predictions, each round kept in ``results`` apart (one that fails is a failed round; the
    others go on); the rows of every round that did not fail (each with its ``round``)."""
    from testbed.netcluster import NetCluster
    runs, rows = os.path.join(args.out, rate), []
    os.makedirs(runs, exist_ok=True)
    probe_path = os.path.join(args.out, f"probe-{rate}-np2.json")
    with NetCluster(max(*args.nps, 2), rate=None if rate == "none" else rate) as cluster:
        # the probe's message sizes as benchmarks/network_validation.py uses them by default
        jobs.probe(cluster, 2, probe_path, iters=args.probe_iters, timeout=args.timeout, max_bytes=args.probe_max_bytes)
        single = train_alongside(cluster, "np1", args, runs)
        for k in range(1, args.repeats + 1):
            rows += results.measure_rows(k, rate, lambda: one_round(cluster, rate, k, single, probe_path, args, runs), config)
    return rows


def one_round(cluster, rate: str, k: int, single: str, probe_path: str, args, runs: str) -> list[dict]:
    """Round ``k`` at ``rate``: the traced np=2 runs, the trained ones and their predictions."""
    tag = f"-r{k}" if args.repeats > 1 else ""
    traced = {sync: train(cluster, 2, f"np2-{sync}-timeline{tag}", sync, ["--comm-timeline", "true"], args, runs)
              for sync in args.traced}
    rows = [{**traced_row(rate, sync, path), "round": k} for sync, path in traced.items()]
    measured = [train(cluster, n, f"np{n}-{sync}-{option}{tag}", sync, OPTIONS[option][0], args, runs)
                for sync in args.syncs for option in args.options for n in args.nps]
    rows += predicted_rows(rate, k, single, traced["horovod"], measured, probe_path, args)
    print(f"{rate} round {k} of {args.repeats}: trained and predicted", file=sys.stderr, flush=True)
    return rows


def option_label(r: dict) -> str:
    return ("fp16" if r["compression"] == "fp16" else f"accum {r['accumulation_steps']}" if r["accumulation_steps"] > 1
            else "plain")


FIGURES = {"step_s": Figure("predicted step (ms)", ".1f", 1e-3),
           "measured_step_s": Figure("measured step (ms)", ".1f", 1e-3), "error_pct": Figure("error (%)", "+.1f"),
           "abs_error_pct": Figure("|error| (%)", ".1f"),
           "hidden_ms": Figure("allreduce hidden (ms/step)", ".1f"),
           "exposed_ms": Figure("allreduce exposed (ms/step)", ".1f"),
           "first_after_backward_began_ms": Figure("first allreduce began, after backward began (ms)", "+.1f"),
           "last_after_backward_ended_ms": Figure("last allreduce ended, after backward ended (ms)", "+.1f")}


def config(r: dict) -> str:
    """A row's name in the results file."""
    if r.get("traced"):
        return f"{r['rate']} {r['method']} np=2 traced"
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
    for rate in args.rates:  # a failed cluster, probe or np=1 run: a failed first round of the rate
        rows += results.attempt(1, rate, lambda: validate_rate(rate, args, results)) or []
    results.write()
    meta = span.end(cores=os.cpu_count(), args=vars(args))
    rows = [r for r in rows if not r.get("traced")]
    within = sum(abs(r["error_pct"]) <= 15 for r in rows)
    summary = f"{within} of {len(rows)} predicted steps within 15 % of the measured ones"
    jobs.write_results(args.out, "step_validation", {"meta": meta, "rows": rows}, f"{markdown_table(COLUMNS, rows)}\n{summary}")
    print(span.line())
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
