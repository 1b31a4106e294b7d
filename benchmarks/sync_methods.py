"""The four gradient synchronisation methods side by side: one training job per method, the same
model, data, seed, ranks and steps, launched the same way; at np=2 (or each of several --np) on
this machine (or on the hosts of --hostfile) and, with --cluster, at one rank per host on the
namespace cluster with shaped links. At np=1 a plain PyTorch loop (benchmarks/bare_horovod.py
--plain: no Horovod, no launcher) runs beside them as the yardstick.

    .venv/bin/python benchmarks/sync_methods.py --np 1 2 4 --dataset synthetic --steps 8 --repeats 3
        # what `make bench` runs: every method at np 1, 2, 4 here, beside the plain loop
    .venv/bin/python benchmarks/sync_methods.py --hostfile my-hosts --np 1 2 4 8 --dataset synthetic --steps 8
        # the same table for your own machines (launch/mpirun.sh -hostfile; np=1 runs here)

    .venv/bin/python benchmarks/sync_methods.py [--np 2 [4 ...]] [--launcher mpirun|horovodrun]
        [--model vgg11] [--dataset digits] [--epochs 2] [--steps 0] [--batch-size 32] [--lr 0.01]
        [--repeats 2] [--hostfile FILE] [--no-plain] [--out logs/bench-sync-methods-YYYYmmdd-HHMMSS]
        [--resolve TARGET [--budget MINUTES]] [--tag TAG] [--results benchmarks/results]
        [--cluster 4 [--rate 1gbit] [--cluster-model vgg11] [--cluster-epochs 2]
         [--cluster-steps 4] [--cluster-batch-size 8] [--cluster-repeats 2]
         [--cluster-cycle-time-ms 25] [--cluster-only]]
        [--side-by-side 3,4 [--side-model vgg11] [--side-epochs 4]]

    .venv/bin/python benchmarks/sync_methods.py --cluster 4 --rate 1gbit   # as root: both tables

Two passes, each one job per method per round, ``--repeats`` rounds each in a rotated order
(interleaved: no method always runs first). Every round is kept; the tables give each figure's
median over the rounds and its spread (min-max):

  local pass    ``python -m hvd_cifar.train --sync METHOD ...`` under --launcher with --np ranks
                on this machine; run folders OUT/runs/METHOD-rK, output OUT/METHOD-rK.log.
  cluster pass  with --cluster N: one ``testbed.netcluster`` cluster of N hosts (network
                namespaces, links shaped to --rate in both directions), one rank per host, every
                job under mpirun across the hosts (the one launcher all four methods accept;
                rank-to-rank bytes over TCP on eth0 only), one torch thread per rank, NIC counters
                of each host's eth0 recorded around each epoch's training steps (--nic eth0).
                One more row, horovod-cycle-25ms: Horovod with HOROVOD_CYCLE_TIME=25 (its
                negotiation cycle; default 1 ms), which the 2 shared cores favour.
                Defaults: vgg11 (36.9 MB of fp32 gradients per step, so the links matter),
                4 steps of 8 images per rank per epoch, 2 epochs. Run folders
                OUT/runs/cluster-METHOD-npN-rK, output OUT/cluster-METHOD-npN-rK.log.

--resolve TARGET: after a pass's --repeats (--cluster-repeats) rounds, while the 95 % interval of
Horovod's img/s over some other method's (paired within the round, every --np) holds TARGET
(e.g. 0.97), one more round of that pass (every row, rotated), until each such ratio is met or not
met, MAX_ROUNDS rounds, or the next round (at the mean round so far) would end after --budget
minutes from the pass's first round. The results file keeps, per pass, the target, the budget, the
rounds, why they stopped and each ratio's verdict; each decision is printed as it is taken.

The figures are made from the runs' metrics.jsonl alone, over the epochs after the first (the
first pays for warm-up), written to the results file benchmarks/results/sync_methods.json (with
--tag: sync_methods-TAG.json; hvd_cifar.measure.results), every round's and their medians and spreads, and
per round the ratios the targets read (Horovod's img/s over each other method's, paired within the
round, and over the best other method's, the one with the highest median over all rounds; its CPU per
image over DDP's, hvd_cifar's np=1 img/s over the plain loop's); the tables, rendered from it by
testbed.render_docs, are printed and left in OUT/sync_methods.md. A job that fails is a failed
round in the file, with its reason:

  epoch time   wall-clock seconds of an epoch's training steps (no evaluation)
  step time    wall-clock seconds per training step (forward, backward, sync, optimizer, data)
  sync time    seconds per step in the loop's sync phase, synchronize(): all of the MPI methods'
               communication; what Horovod has not finished during backward; ~0 for DDP, whose
               allreduce runs inside backward (hence the backward column)
  img/s        training images per second, all ranks together
  bytes/step   bytes one rank sends per step, analytic (the busiest rank for gather-scatter)
  NIC tx, rx   cluster pass: bytes per step each host's eth0 sent and received, measured
               (Ethernet frames: gradients plus headers and control traffic), hosts in rank order
  accuracy     test accuracy after the last epoch

With --side-by-side N,N (root): a third pass, the parameter-server comparison. For each N, one
cluster of N hosts as above, and one job of each SIDE_BY_SIDE method (gather/scatter, Horovod's
ring allreduce, DDP, the asynchronous parameter server, whose first rank serves and the others
train) for --side-epochs whole epochs at the trainer's defaults (batch 32 per rank, the model's
lr, warm-up): epoch time (mean after the first), test accuracy after every epoch and, for the
parameter server, staleness and server updates per second. Run folders OUT/runs/side-METHOD-npN.

    .venv/bin/python benchmarks/sync_methods.py --cluster-only --side-by-side 3,4
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from hvd_cifar.launch import commands

from testbed import jobs, render_docs
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options
from hvd_cifar.measure.stats import Interval, best_other, judge, ratio_interval
from hvd_cifar.measure.rounds import left_words
from hvd_cifar.launch.commands import ROOT
from testbed.netcluster import NetCluster
from hvd_cifar.analysis.summary import steady_epochs, steady_per_step, summarize as summarize_run
from hvd_cifar.analysis.tabulate import Column, markdown_table, num
from hvd_cifar.runfolder.reader import load_run

METHODS = ("horovod", "mpi-allreduce", "mpi-gather-scatter", "ddp")
# The side-by-side pass (--side-by-side): synchronous gather/scatter, ring allreduce (Horovod) and
# DDP beside the asynchronous parameter server, as parameter-server write-ups compare them.
SIDE_BY_SIDE = ("mpi-gather-scatter", "horovod", "ddp", "mpi-async-ps")
# The cluster pass adds Horovod with a longer negotiation cycle (HOROVOD_CYCLE_TIME, horovodrun's
# --cycle-time-ms): its background thread coordinates with every other rank once per cycle,
# 1000 times a second by default, which on hosts with fewer cores than busy threads takes CPU
# from the training threads. Row label -> (sync method, environment for every rank).
TUNED = "horovod-cycle-{ms}ms"
PLAIN = "plain PyTorch loop"
# With --mpi-operations: Horovod with Open MPI's allreduce, which polls while it waits, beside
# hvd_cifar's choice (Gloo's where the ranks span hosts: sync/horovod.py, use_gloo_operations).
MPI_OPS = "horovod-mpi-operations"
MAX_ROUNDS = 40  # --resolve adds rounds up to this many, whatever the budget
FIGURES = {
    "images_per_s": Figure("img/s", ".1f"),
    "step_time_s": Figure("step (ms)", ".0f", 1e-3),
    "sync_time_s": Figure("sync (ms/step)", ".1f", 1e-3),
    "backward_time_s": Figure("backward (ms/step)", ".0f", 1e-3),
    "cpu_s_per_image": Figure("CPU ms/image/rank", ".2f", 1e-3),
    "comm_bytes_per_step": Figure("MB/step/rank (analytic)", ".1f", 1e6),
    "nic_tx_bytes_per_step": Figure("eth0 tx MB/step (mean of hosts)", ".1f", 1e6),
    "epoch_time_s": Figure("epoch (s)", ".2f"),
    "test_acc": Figure("final test acc", ".4f"),
    "of_method": Figure("x the other method (img/s)", ".3f"),
    "of_best": Figure("x best other method (img/s)", ".3f"),
    "of_ddp": Figure("x DDP", ".3f"),
    "of_plain": Figure("x plain loop (img/s)", ".3f"),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, nargs="+", default=[2],
                   help="ranks per job in the local pass; several (1 2 4): one table each, rounds interleaved")
    p.add_argument("--launcher", choices=("mpirun", "horovodrun"), default="mpirun", help="local pass")
    p.add_argument("--model", default="vgg11", help="local pass")
    p.add_argument("--dataset", default="digits", help="both passes")
    p.add_argument("--epochs", type=int, default=2, help="local pass; the first is warm-up, left out of the timings")
    p.add_argument("--steps", type=int, default=0, help="local pass: steps per epoch; 0 = whole epochs")
    p.add_argument("--batch-size", type=int, default=32, help="local pass: images per rank per step")
    p.add_argument("--lr", type=float, default=0.01, help="both passes, for one rank; the trainer scales it by np")
    p.add_argument("--repeats", type=int, default=2, help="local pass: rounds of all methods, all kept")
    p.add_argument("--compute", default="fp32", choices=["fp32", "bf16-channels-last", "bf16", "fp32-channels-last"],
                   help="precision and layout of every job and of the plain loop alike (default fp32: NCHW)")
    p.add_argument("--hostfile", default="", help="local pass: np > 1 under launch/LAUNCHER.sh -hostfile FILE "
                   "(your own hosts; run from the first, with the run folders on a shared file system)")
    p.add_argument("--no-plain", dest="plain", action="store_false",
                   help="at np=1, leave out the plain PyTorch loop (benchmarks/bare_horovod.py --plain)")
    p.add_argument("--cluster", type=int, default=0, metavar="N",
                   help="also run every method at np=N, one rank per host of an N-host namespace cluster (root)")
    p.add_argument("--cluster-only", action="store_true", help="skip the local pass")
    p.add_argument("--rate", default="1gbit", help="cluster link rate, tc syntax, both directions")
    p.add_argument("--cluster-model", default="vgg11")
    p.add_argument("--cluster-epochs", type=int, default=2, help="the first is warm-up, left out of the timings")
    p.add_argument("--cluster-steps", type=int, default=4, help="steps per epoch")
    p.add_argument("--cluster-batch-size", type=int, default=8, help="images per rank per step")
    p.add_argument("--cluster-repeats", type=int, default=2, help="rounds of all methods, all kept")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                   help="the methods both passes run (Horovod always among them: the ratios are its)")
    p.add_argument("--mpi-operations", action="store_true",
                   help="both passes: one more row, Horovod with Open MPI's allreduce (HOROVOD_CPU_OPERATIONS=mpi) "
                        "instead of Gloo's, hvd_cifar's default (at np > 1)")
    p.add_argument("--cluster-cycle-time-ms", type=float, default=25.0,
                   help="cluster pass: also run horovod with HOROVOD_CYCLE_TIME set to this (0: don't)")
    p.add_argument("--side-by-side", default="", metavar="N,N",
                   help="also train each of SIDE_BY_SIDE for whole epochs at every default (lr, warm-up) at "
                        "np=N, one rank per host of an N-host cluster (root): epoch time and accuracy per epoch")
    p.add_argument("--side-model", default="vgg11", help="side-by-side pass")
    p.add_argument("--side-epochs", type=int, default=4, help="side-by-side pass: whole epochs per job")
    p.add_argument("--resolve", type=float, default=0.0, metavar="TARGET",
                   help="more rounds of a pass while the 95 %% interval of Horovod's img/s over another method's "
                        "holds TARGET (a ratio, e.g. 0.97), until met or not met, or --budget ends (default: off)")
    p.add_argument("--budget", type=float, default=60.0, metavar="MINUTES",
                   help="with --resolve: no round starts that would end after this many minutes from the "
                        "pass's first round (default 60)")
    p.add_argument("--out", default=os.path.join(ROOT, "logs", time.strftime("bench-sync-methods-%Y%m%d-%H%M%S")))
    jobs.add_options(p, timeout=1200)
    add_results_options(p)
    args = p.parse_args(argv)
    args.side_by_side = [int(n) for n in args.side_by_side.split(",") if n.strip()]
    if args.cluster_only and not args.cluster and not args.side_by_side:
        p.error("--cluster-only needs --cluster N or --side-by-side N,N")
    if args.cluster and not 2 <= args.cluster <= 16:
        p.error(f"--cluster: {args.cluster} hosts is outside 2..16")
    if "horovod" not in args.methods:
        p.error("--methods: Horovod must be one of them (the ratios are its)")
    if args.resolve < 0 or not math.isfinite(args.resolve) or args.budget <= 0:
        p.error(f"--resolve {args.resolve:g} --budget {args.budget:g}: a ratio >= 0 and minutes > 0")
    if args.resolve and len(args.methods) < 2:
        p.error("--resolve: needs a method besides horovod among --methods (the ratios are Horovod's over them)")
    return args


def train_flags(method: str, name: str, runs: str, model: str, epochs: int, steps: int, batch_size: int,
                args) -> list[str]:
    return ["--model", model, "--dataset", args.dataset, "--epochs", str(epochs),
            "--max-steps-per-epoch", str(steps), "--batch-size", str(batch_size),
            "--lr", str(args.lr), "--warmup-epochs", "0", "--seed", "0", "--checkpoint-every", "0",
            "--no-progress", "--sync", method, "--compute", args.compute, "--log-dir", runs, "--run-name", name]


def run_local(method: str, name: str, args, np: int) -> str:
    """One training job of ``np`` ranks on this machine; its run folder. Raises RuntimeError naming
    the log if it fails. One rank runs as one process, no launcher, as a user runs it."""
    runs = os.path.join(args.out, "runs")
    method, extra = cluster_variants(args).get(method, (method, {}))  # a label of both passes: its method, its env
    env = dict(commands.job_env(), **extra) if extra else None
    flags = train_flags(method, name, runs, args.model, args.epochs, args.steps, args.batch_size, args)
    if np > 1 and args.hostfile:
        cmd = [*commands.script(args.launcher, np, args.hostfile), *flags]
    else:
        cmd = [*commands.argv("single" if np == 1 else args.launcher, np), *flags]
    jobs.run(method, cmd, log=os.path.join(args.out, f"{name}.log"), timeout=args.timeout, env=env)
    return os.path.join(runs, name)


def cluster_variants(args) -> dict[str, tuple[str, dict]]:
    """Row label -> (sync method, environment for every rank), for the cluster pass and (the
    labels it runs too) the local one."""
    variants = {m: (m, {}) for m in args.methods}
    if args.mpi_operations:
        variants[MPI_OPS] = ("horovod", {"HOROVOD_CPU_OPERATIONS": "mpi"})
    if args.cluster_cycle_time_ms:
        ms = f"{args.cluster_cycle_time_ms:g}"
        variants[TUNED.format(ms=ms)] = ("horovod", {"HOROVOD_CYCLE_TIME": ms})
    return variants


def run_on_cluster(cluster: NetCluster, label: str, name: str, args) -> str:
    """One training job across the cluster's hosts, one rank each, under mpirun; its run folder."""
    method, export = cluster_variants(args)[label]
    runs = os.path.join(args.out, "runs")
    flags = [*train_flags(method, name, runs, args.cluster_model, args.cluster_epochs, args.cluster_steps,
                          args.cluster_batch_size, args), *jobs.CLUSTER_TRAIN_FLAGS]
    jobs.run(f"{label} np={cluster.n_hosts}", lambda: cluster.run_mpirun(cluster.n_hosts, flags, timeout=args.timeout,
                                                                         export=export),
             log=os.path.join(args.out, f"{name}.log"))
    return os.path.join(runs, name)


def summarize(run_dir: str, label: str) -> dict:
    """The row of one job; steady-state numbers (epochs after the first) from hvd_cifar.report."""
    run = load_run(run_dir)
    records, summary = run.metrics, summarize_run(run)
    timed = steady_epochs(records)
    steps = sum(r["steps"] for r in timed)
    hosts = list(records[-1]["nic_tx_bytes"])  # rank order (one entry per host)
    return {
        "method": label,
        "sync": records[-1]["sync"],
        "np": records[-1]["world_size"],
        "run": os.path.basename(run_dir),
        "epoch_time_s": summary["mean_epoch_time_s"],
        # a job's step time: the median of its per-step times after the warm-up epoch (rank 0's),
        # and img/s from it; the epoch's mean where the trainer recorded no median
        "step_time_s": median_step(summary),
        "sync_time_s": summary["sync_time_per_step_s"],
        "backward_time_s": steady_per_step(records, "backward_time_s"),
        "images_per_s": (records[-1]["world_size"] * records[-1]["batch_size"] / median_step(summary)
                         if records[-1]["sync"] != "mpi-async-ps" else summary["images_per_s"]),
        "cpu_s_per_image": summary["cpu_s_per_image"],
        "comm_bytes_per_step": summary["bytes_per_step_per_rank"],
        "nic_tx_bytes_per_step": {h: sum(r["nic_tx_bytes"][h] for r in timed) / steps for h in hosts},
        "nic_rx_bytes_per_step": {h: sum(r["nic_rx_bytes"][h] for r in timed) / steps for h in hosts},
        "test_acc": records[-1]["test_acc"],
        "timed_epochs": len(timed),
        "steps": steps,
    }


def median_step(summary: dict) -> float:
    median = summary.get("step_time_median_s", math.nan)
    return summary["step_time_s"] if math.isnan(median) else median


def run_plain(name: str, args) -> dict:
    """The plain PyTorch loop at np=1 (no Horovod, no launcher): the same model, batch, steps,
    precision and memory layout (--compute), random batches held in memory as the synthetic data
    set is, the trainer's threads (the machine's cores); its figures from its median step time
    over the epochs after the first, as the trainer's."""
    steps = args.steps or 20
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "bare_horovod.py"), "--plain", "--model", args.model,
           "--batch-size", str(args.batch_size), "--steps", str(steps), "--epochs", str(args.epochs),
           "--threads", str(os.cpu_count()), "--compute", args.compute]
    done = jobs.run(PLAIN, cmd, log=os.path.join(args.out, f"{name}.log"), timeout=args.timeout)
    line = next(l for l in done.stdout.splitlines() if "step_time_s" in l)
    step = json.loads(line[line.index("{"):])["median_step_time_s"]
    return {"step_time_s": step, "images_per_s": args.batch_size / step}


def local_figures(run_dir: str) -> dict:
    row = summarize(run_dir, "")
    return {k: row[k] for k in ("images_per_s", "step_time_s", "sync_time_s", "backward_time_s", "cpu_s_per_image",
                                "comm_bytes_per_step")}


def run_local_pass(args, results: Results) -> None:
    """Every method at every --np (and the plain loop at np=1), ``repeats`` rounds (more with
    --resolve); within a round the sizes follow each other and each size's jobs rotate, so that
    none always runs first."""
    labels = {np: [*args.methods, *([PLAIN] if np == 1 and args.plain else []),
                   *([MPI_OPS] if np > 1 and args.mpi_operations else [])] for np in args.np}

    def one_round(k: int) -> None:
        for np in args.np:
            for method in jobs.rotated(labels[np], k - 1):
                name = f"{method.replace(' ', '-')}-np{np}-r{k}"
                measure = (lambda: run_plain(name, args)) if method == PLAIN else \
                    (lambda: local_figures(run_local(method, name, args, np)))
                results.measure(k, f"{method} np={np}", measure)
    run_rounds(args, results, "local", one_round, args.repeats, sum(map(len, labels.values())),
               [pair for np in args.np for pair in horovod_pairs(args.methods, np)])
    for np in args.np:
        derive_ratios(results, args.methods, np, mpi_operations=np > 1 and args.mpi_operations)


def horovod_pairs(methods, np: int, suffix: str = "") -> list[tuple[str, str]]:
    """(Horovod's configuration, another method's) at ``np``: the ratios --resolve judges."""
    return [(f"horovod np={np}{suffix}", f"{m} np={np}{suffix}") for m in methods if m != "horovod"]


# ----------------------------------------------------------------------------- --resolve
def run_rounds(args, results: Results, name: str, one_round, repeats: int, per_round: int,
               pairs: list[tuple[str, str]], clock=time.perf_counter) -> None:
    """Rounds 1..``repeats`` of the pass ``name`` (``one_round(k)``: its ``per_round`` jobs),
    then, with --resolve, more while ``decide`` says so; the record of them in the results file."""
    results.plan(jobs=repeats * per_round, rounds=repeats)
    began = clock()
    for k in range(1, repeats + 1):
        one_round(k)
    if not args.resolve:
        return
    k = repeats
    while True:
        decision = decide(paired_ratios(results.data["rounds"], pairs), args.resolve, k, clock() - began,
                          (clock() - began) / k, args.budget)
        print(f"sync_methods ({name} pass): {decision['sentence']}", file=sys.stderr, flush=True)
        if not decision["more"]:
            break
        k += 1
        results.plan(jobs=(decision["planned"] - k + 1) * per_round, rounds=decision["planned"])
        one_round(k)
    found = paired_ratios(results.data["rounds"], pairs)
    results.data.setdefault("resolve", []).append(
        {"pass": name, "target": args.resolve, "budget_min": args.budget, "rounds": k,
         "stopped": decision["stopped"], "sentence": decision["sentence"],
         "verdicts": {f"{a} / {b}": judge(iv, ">=", args.resolve) for (a, b), iv in found.items()}})


def paired_ratios(rounds: list[dict], pairs: list[tuple[str, str]]) -> dict[tuple[str, str], Interval]:
    """Per pair (A, B): A's img/s over B's, paired within the round (the rounds where both
    ran), with its 95 % interval (stats.ratio_interval); a pair with no such round is left out."""
    rates: dict[int, dict[str, float]] = {}
    for r in rounds:
        if r["ok"] and not r.get("derived") and r["figures"].get("images_per_s", 0) > 0:
            rates.setdefault(r["round"], {})[r["config"]] = r["figures"]["images_per_s"]
    found = {}
    for a, b in pairs:
        both = [(mine[a], mine[b]) for _, mine in sorted(rates.items()) if a in mine and b in mine]
        if both:
            found[(a, b)] = ratio_interval([x for x, _ in both], [y for _, y in both])
    return found


def rounds_to_judge(iv: Interval, target: float) -> int:
    """How many rounds in all the observed spread suggests would move the ratio's interval off
    ``target`` (met or not met; it narrows as 1/√n); 0 when it is off already, -1 when it cannot
    be estimated (one round, or the centre on the target). (Not in hvd_cifar.measure.stats: the
    training runs load that module, and a change there would stale every results file.)"""
    if judge(iv, ">=", target) != "unresolved":
        return 0
    distance = abs(math.log(iv.centre / target))
    if distance == 0 or not math.isfinite(iv.half_width):
        return -1
    return max(iv.n + 1, math.ceil(iv.n * (iv.half_width / distance) ** 2))


def needing(left: dict[tuple[str, str], Interval], target: float) -> str:
    """``horovod np=2 / ddp np=2 would need about 24 rounds in all``, one clause per ratio."""
    words = []
    for (a, b), iv in left.items():
        needed = rounds_to_judge(iv, target)
        about = f"about {needed} rounds in all" if needed > 0 else "more rounds than its spread can tell"
        words.append(f"{a} / {b} ({iv.centre:.3f}, {iv.low:.3f}-{iv.high:.3f}) "
                     f"{'would need ' if not words else ''}{about}")
    return ", ".join(words)


def decide(found: dict[tuple[str, str], Interval], target: float, k: int, elapsed_s: float, round_s: float,
           budget_min: float) -> dict:
    """After round ``k`` of a pass: whether to run another (some ratio's interval holds
    ``target``), or why the rounds stop (``stopped``: resolved, max rounds, budget), with its
    ``sentence``. ``round_s``: the mean seconds of one round so far."""
    left = {pair: iv for pair, iv in found.items() if judge(iv, ">=", target) == "unresolved"}
    if not left:
        return {"more": False, "stopped": "resolved",
                "sentence": f"every ratio met or not met against {target:g} after {k} rounds"}
    if k >= MAX_ROUNDS:
        return {"more": False, "stopped": "max rounds",
                "sentence": f"{MAX_ROUNDS} rounds, the most --resolve runs, ended it; {needing(left, target)}"}
    if elapsed_s + round_s > budget_min * 60:  # the next round, at the mean round's length, would overrun
        return {"more": False, "stopped": "budget",
                "sentence": f"the budget of {budget_min:g} min ran out after {k} rounds; {needing(left, target)}"}
    needed = [rounds_to_judge(iv, target) for iv in left.values()]
    fit = k + max(1, math.floor((budget_min * 60 - elapsed_s) / round_s)) if round_s > 0 else MAX_ROUNDS
    planned = min(MAX_ROUNDS, fit, max(k + 1, *needed))
    return {"more": True, "stopped": "", "planned": planned,
            "sentence": f"{len(left)} of {len(found)} ratios hold {target:g} after {k} rounds "
                        f"({needing(left, target)}); round {k + 1} next, {round_s / 60:.1f} min a round: "
                        f"{left_words((planned - k) * round_s)} if it takes the {planned} rounds planned"}


def derive_ratios(results: Results, methods, np: int, suffix: str = "", mpi_operations: bool = False) -> None:
    """Per round: Horovod's img/s over each other method's, paired within the round; over the
    best other method, the one with the highest median img/s over all rounds (not each round's
    fastest: the maximum of noisy figures is high, which biases the ratio low); its CPU per image
    over DDP's; at np=1, its img/s over the plain loop's; with ``mpi_operations``, Horovod's with
    Open MPI's allreduce over Horovod's as hvd_cifar runs it."""
    def key(method):
        return f"{method} np={np}{suffix}"

    def rate(r, method):
        return r[key(method)]["images_per_s"]
    for method in [m for m in methods if m != "horovod"]:
        results.derive(f"horovod vs {method} np={np}{suffix}", "of_method",
                       lambda r, m=method: rate(r, "horovod") / rate(r, m))
    by_round = [{c: r["figures"]["images_per_s"] for c in map(key, methods) for r in results.data["rounds"]
                 if r["config"] == c and r["ok"] and r["round"] == k} for k in rounds_of(results)]
    by_round = [r for r in by_round if key("horovod") in r]
    if by_round and len(by_round[0]) > 1:
        best = best_other(by_round, key("horovod")).removesuffix(f" np={np}{suffix}")
        results.derive(f"horovod / best other ({best}) np={np}{suffix}", "of_best",
                       lambda r: rate(r, "horovod") / rate(r, best))
    if "ddp" in methods:
        results.derive(f"horovod / ddp np={np}{suffix}", "of_ddp",
                       lambda r: r[key("horovod")]["cpu_s_per_image"] / r[key("ddp")]["cpu_s_per_image"])
    if np == 1 and not suffix and f"{PLAIN} np=1" in {r["config"] for r in results.data["rounds"]}:
        results.derive("horovod / plain loop np=1", "of_plain",
                       lambda r: rate(r, "horovod") / r[f"{PLAIN} np=1"]["images_per_s"])
    if mpi_operations:
        results.derive(f"{MPI_OPS} vs horovod np={np}{suffix}", "of_method",
                       lambda r: rate(r, MPI_OPS) / rate(r, "horovod"))


def rounds_of(results: Results) -> list[int]:
    return sorted({r["round"] for r in results.data["rounds"]})


def run_cluster_pass(cluster: NetCluster, args, results: Results) -> None:
    """Every cluster variant, ``cluster_repeats`` rounds in a rotated order (more with
    --resolve). The ranks run in the cluster's namespaces, not as this process's children: no
    noise sampling."""
    suffix = f" cluster {args.rate}"
    results.sample_noise = False
    labels = tuple(cluster_variants(args))

    def one_round(k: int) -> None:
        for label in jobs.rotated(labels, k - 1):
            def measure(label=label):
                row = summarize(run_on_cluster(cluster, label, f"cluster-{label}-np{args.cluster}-r{k}", args), label)
                tx = row["nic_tx_bytes_per_step"]
                return {**{key: row[key] for key in ("epoch_time_s", "step_time_s", "sync_time_s", "backward_time_s",
                                                      "images_per_s", "cpu_s_per_image", "comm_bytes_per_step")},
                        "nic_tx_bytes_per_step": sum(tx.values()) / len(tx)}
            results.measure(k, f"{label} np={args.cluster}{suffix}", measure)
    run_rounds(args, results, f"cluster {args.rate}", one_round, args.cluster_repeats, len(labels),
               horovod_pairs(args.methods, args.cluster, suffix))
    derive_ratios(results, args.methods, args.cluster, suffix, mpi_operations=args.mpi_operations)
    results.sample_noise = True


def run_side_by_side(args, results: Results) -> list[dict]:
    """Each SIDE_BY_SIDE method at each --side-by-side size, one job each, one rank per host of a
    cluster of that size, whole epochs at every default; one summary per job."""
    rows = []
    for np in args.side_by_side:
        with NetCluster(n_hosts=np, rate=args.rate) as cluster:
            for method in SIDE_BY_SIDE:
                name = f"side-{method}-np{np}"
                flags = ["--model", args.side_model, "--dataset", args.dataset, "--epochs", str(args.side_epochs),
                         "--sync", method, "--log-dir", os.path.join(args.out, "runs"), "--run-name", name,
                         *jobs.CLUSTER_TRAIN_FLAGS]
                done = jobs.run(name, lambda: cluster.run_mpirun(np, flags, timeout=args.timeout),
                                log=os.path.join(args.out, f"{name}.log"))
                print(f"{name}: done in {done.seconds:.0f} s", file=sys.stderr, flush=True)
                rows.append(side_summary(os.path.join(args.out, "runs", name), method))
                results.add(1, f"{method} np={np} side by side",
                            {"epoch_time_s": rows[-1]["epoch_time_s"], "test_acc": rows[-1]["test_acc"][-1]})
    return rows


def side_summary(run_dir: str, method: str) -> dict:
    """One job of the side-by-side pass: epoch time after the first epoch, accuracy per epoch and,
    for the parameter server, its staleness and update rate (means over the epochs; max of max)."""
    records = load_run(run_dir).metrics
    timed = steady_epochs(records)
    row = {"method": method, "np": records[-1]["world_size"], "run": os.path.basename(run_dir),
           "workers": records[-1]["world_size"] - records[-1].get("ps_servers", 0),
           "epoch_time_s": sum(r["epoch_time_s"] for r in timed) / len(timed),
           "test_acc": [r["test_acc"] for r in records]}
    if "staleness_mean" in records[-1]:
        row.update(staleness_mean=sum(r["staleness_mean"] for r in records) / len(records),
                   staleness_max=max(r["staleness_max"] for r in records),
                   server_updates_per_s=sum(r["server_updates_per_s"] for r in timed) / len(timed))
    return row


def side_table(rows: list[dict]) -> str:
    epochs = len(rows[0]["test_acc"])
    columns = [Column("method", "method"), Column("np", "np", numeric=True), Column("ranks that train", "workers", numeric=True),
               num("epoch time (s)", "epoch_time_s", ".2f"),
               Column("test acc after epoch " + " / ".join(str(e + 1) for e in range(epochs)), "test_acc",
                      row_fmt=lambda r: " / ".join(f"{a:.4f}" for a in r["test_acc"])),
               Column("staleness mean / max", "staleness_mean",
                      row_fmt=lambda r: f"{r['staleness_mean']:.2f} / {r['staleness_max']}" if "staleness_mean" in r else ""),
               Column("server updates/s", "server_updates_per_s", numeric=True,
                      row_fmt=lambda r: f"{r['server_updates_per_s']:.1f}" if "server_updates_per_s" in r else "")]
    return markdown_table(columns, rows).rstrip("\n")


@jobs.one_line_errors("sync_methods")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.out, exist_ok=True)
    results = Results("sync_methods", args, FIGURES, argv)
    specs = []
    if not args.cluster_only:
        run_local_pass(args, results)
        specs += [f'match="np={np}$" figures=images_per_s,step_time_s,sync_time_s,backward_time_s,cpu_s_per_image,'
                  f'comm_bytes_per_step,of_method,of_best,of_ddp,of_plain' for np in args.np]
    if args.cluster:
        with NetCluster(n_hosts=args.cluster, rate=args.rate) as cluster:
            run_cluster_pass(cluster, args, results)
        specs.append('match="cluster"')
    side = run_side_by_side(args, results) if args.side_by_side else []
    path = results.write()
    tables = [render_docs.render_block(f"{os.path.basename(path)} {spec}", os.path.dirname(path)) for spec in specs]
    tables += [f"--resolve, {record['pass']} pass: {record['sentence']}." for record in results.data.get("resolve", [])]
    if side:
        tables.append(f"side by side: namespace cluster (one rank per host, links {args.rate}), mpirun: "
                      f"{args.side_model} on {args.dataset}, {args.side_epochs} whole epochs at every default "
                      f"(batch 32/rank, the model's lr), one job each\n\n" + side_table(side))
    jobs.write_results(args.out, "sync_methods", results.data, "\n\n".join(tables))
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
