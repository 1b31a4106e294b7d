"""The four gradient synchronisation methods side by side: one training job per method, the same
model, data, seed, ranks and steps, launched the same way; at np=2 (or each of several --np) on
this machine and, with --cluster, at one rank per host on the namespace cluster with shaped links.

    .venv/bin/python benchmarks/sync_methods.py --np 1 2 4 --dataset synthetic --steps 10 --repeats 3 --cluster 4
        # issue 24's comparison: every method at np 1, 2, 4 here and np 4 on the cluster; per np,
        # img/s, CPU s/image/rank and each method's img/s over the fastest's, fastest rounds and medians

    .venv/bin/python benchmarks/sync_methods.py [--np 2 [4 ...]] [--launcher mpirun|horovodrun]
        [--model vgg11] [--dataset digits] [--epochs 2] [--steps 0] [--batch-size 32] [--lr 0.01]
        [--repeats 2] [--out logs/bench-sync-methods-YYYYmmdd-HHMMSS]
        [--cluster 4 [--rate 1gbit] [--cluster-model vgg11] [--cluster-epochs 2]
         [--cluster-steps 4] [--cluster-batch-size 8] [--cluster-repeats 2]
         [--cluster-cycle-time-ms 25] [--cluster-only]]
        [--side-by-side 3,4 [--side-model vgg11] [--side-epochs 4]]

    .venv/bin/python benchmarks/sync_methods.py --cluster 4 --rate 1gbit   # as root: both tables

Two passes, each one job per method per round, ``--repeats`` rounds each in a rotated order,
each method's row its fastest round (on a shared machine, other work only ever slows a run down):

  local pass    ``python -m hvd_cifar.train --sync METHOD ...`` under --launcher with --np ranks
                on this machine; run folders OUT/runs/METHOD-rK, output OUT/METHOD-rK.log.
  cluster pass  with --cluster N: one ``hvd_cifar.netcluster`` cluster of N hosts (network
                namespaces, links shaped to --rate in both directions), one rank per host, every
                job under mpirun across the hosts (the one launcher all four methods accept;
                rank-to-rank bytes over TCP on eth0 only), one torch thread per rank, NIC counters
                of each host's eth0 recorded around each epoch's training steps (--nic eth0).
                One more row, horovod-cycle-25ms: Horovod with HOROVOD_CYCLE_TIME=25 (its
                negotiation cycle; default 1 ms), which the 2 shared cores favour.
                Defaults: vgg11 (36.9 MB of fp32 gradients per step, so the links matter),
                4 steps of 8 images per rank per epoch, 2 epochs. Run folders
                OUT/runs/METHOD-npN-rK, output OUT/METHOD-npN-rK.log.

The tables are made from the runs' metrics.jsonl alone, over the epochs after the first (the
first pays for warm-up), written to OUT/sync_methods.json (every round) and OUT/sync_methods.md,
then printed:

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
import os
import statistics
import sys
import time
from typing import Callable

from hvd_cifar import jobs, launchers
from hvd_cifar.launchers import ROOT
from hvd_cifar.netcluster import NetCluster
from hvd_cifar.runs import load_run
from hvd_cifar.summary import steady_epochs, steady_per_step, summarize as summarize_run
from hvd_cifar.tables import Column, markdown_table, num

METHODS = ("horovod", "mpi-allreduce", "mpi-gather-scatter", "ddp")
# The side-by-side pass (--side-by-side): synchronous gather/scatter, ring allreduce (Horovod) and
# DDP beside the asynchronous parameter server, as parameter-server write-ups compare them.
SIDE_BY_SIDE = ("mpi-gather-scatter", "horovod", "ddp", "mpi-async-ps")
# The cluster pass adds Horovod with a longer negotiation cycle (HOROVOD_CYCLE_TIME, horovodrun's
# --cycle-time-ms): its background thread coordinates with every other rank once per cycle,
# 1000 times a second by default, which on hosts with fewer cores than busy threads takes CPU
# from the training threads. Row label -> (sync method, environment for every rank).
TUNED = "horovod-cycle-{ms}ms"
# The targets: Horovod step time <= 1.00x DDP's; on the shaped links, Horovod's epoch
# time <= 0.5x gather-scatter's.
TARGET_HOROVOD_OVER_DDP_STEP = 1.00
TARGET_HOROVOD_OVER_GATHER_SCATTER_EPOCH = 0.50
# Issue 24: on one host Horovod's img/s >= 0.97x the best other method's (medians), and its CPU
# seconds per image <= 1.1x DDP's.
TARGET_HOROVOD_OF_BEST = 0.97
TARGET_HOROVOD_CPU_OVER_DDP = 1.10


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
    p.add_argument("--repeats", type=int, default=2, help="local pass: rounds of all methods; the fastest counts")
    p.add_argument("--cluster", type=int, default=0, metavar="N",
                   help="also run every method at np=N, one rank per host of an N-host namespace cluster (root)")
    p.add_argument("--cluster-only", action="store_true", help="skip the local pass")
    p.add_argument("--rate", default="1gbit", help="cluster link rate, tc syntax, both directions")
    p.add_argument("--cluster-model", default="vgg11")
    p.add_argument("--cluster-epochs", type=int, default=2, help="the first is warm-up, left out of the timings")
    p.add_argument("--cluster-steps", type=int, default=4, help="steps per epoch")
    p.add_argument("--cluster-batch-size", type=int, default=8, help="images per rank per step")
    p.add_argument("--cluster-repeats", type=int, default=2, help="rounds of all methods; the fastest counts")
    p.add_argument("--cluster-cycle-time-ms", type=float, default=25.0,
                   help="cluster pass: also run horovod with HOROVOD_CYCLE_TIME set to this (0: don't)")
    p.add_argument("--side-by-side", default="", metavar="N,N",
                   help="also train each of SIDE_BY_SIDE for whole epochs at every default (lr, warm-up) at "
                        "np=N, one rank per host of an N-host cluster (root): epoch time and accuracy per epoch")
    p.add_argument("--side-model", default="vgg11", help="side-by-side pass")
    p.add_argument("--side-epochs", type=int, default=4, help="side-by-side pass: whole epochs per job")
    p.add_argument("--out", default=os.path.join(ROOT, "logs", time.strftime("bench-sync-methods-%Y%m%d-%H%M%S")))
    jobs.add_options(p, timeout=1200)
    args = p.parse_args(argv)
    args.side_by_side = [int(n) for n in args.side_by_side.split(",") if n.strip()]
    if args.cluster_only and not args.cluster and not args.side_by_side:
        p.error("--cluster-only needs --cluster N or --side-by-side N,N")
    if args.cluster and not 2 <= args.cluster <= 16:
        p.error(f"--cluster: {args.cluster} hosts is outside 2..16")
    return args


def train_flags(method: str, name: str, runs: str, model: str, epochs: int, steps: int, batch_size: int,
                args) -> list[str]:
    return ["--model", model, "--dataset", args.dataset, "--epochs", str(epochs),
            "--max-steps-per-epoch", str(steps), "--batch-size", str(batch_size),
            "--lr", str(args.lr), "--warmup-epochs", "0", "--seed", "0", "--checkpoint-every", "0",
            "--no-progress", "--sync", method, "--log-dir", runs, "--run-name", name]


def run_local(method: str, name: str, args, np: int) -> str:
    """One training job of ``np`` ranks on this machine; its run folder. Raises RuntimeError naming
    the log if it fails. One rank runs as one process, no launcher, as a user runs it."""
    runs = os.path.join(args.out, "runs")
    flags = train_flags(method, name, runs, args.model, args.epochs, args.steps, args.batch_size, args)
    cmd = [*launchers.argv("single" if np == 1 else args.launcher, np), *flags]
    jobs.run(method, cmd, log=os.path.join(args.out, f"{name}.log"), timeout=args.timeout)
    return os.path.join(runs, name)


def cluster_variants(args) -> dict[str, tuple[str, dict]]:
    """Row label -> (sync method, environment for every rank) for the cluster pass."""
    variants = {m: (m, {}) for m in METHODS}
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
        "step_time_s": summary["step_time_s"],
        "sync_time_s": summary["sync_time_per_step_s"],
        "backward_time_s": steady_per_step(records, "backward_time_s"),
        "images_per_s": summary["images_per_s"],
        "cpu_s_per_image": summary["cpu_s_per_image"],
        "comm_bytes_per_step": summary["bytes_per_step_per_rank"],
        "nic_tx_bytes_per_step": {h: sum(r["nic_tx_bytes"][h] for r in timed) / steps for h in hosts},
        "nic_rx_bytes_per_step": {h: sum(r["nic_rx_bytes"][h] for r in timed) / steps for h in hosts},
        "test_acc": records[-1]["test_acc"],
        "timed_epochs": len(timed),
        "steps": steps,
    }


def run_local_pass(args) -> list[dict]:
    """Every method at every --np, ``repeats`` rounds; within a round the sizes follow each other
    and each size's methods rotate, so that no size or method always runs first (interleaved)."""
    rounds = []
    for k in range(args.repeats):
        for np in args.np:
            for method in jobs.rotated(METHODS, k):
                start = time.perf_counter()
                run_dir = run_local(method, f"{method}-np{np}-r{k + 1}", args, np)
                print(f"{method} np={np} round {k + 1}: done in {time.perf_counter() - start:.0f} s, {run_dir}",
                      file=sys.stderr, flush=True)
                rounds.append(summarize(run_dir, method))
    return rounds


def run_rounds(run_one, repeats: int, suffix: str, labels: tuple[str, ...] = METHODS) -> list[dict]:
    """Every method (row label) ``repeats`` times, each round in a rotated order; a summary per job."""
    rounds = []
    for k in range(repeats):
        for method in jobs.rotated(labels, k):
            start = time.perf_counter()
            run_dir = run_one(method, f"{method}{suffix}-r{k + 1}")
            print(f"{method}{suffix} round {k + 1}: done in {time.perf_counter() - start:.0f} s, {run_dir}",
                  file=sys.stderr, flush=True)
            rounds.append(summarize(run_dir, method))
    return rounds


def fastest(rounds: list[dict]) -> list[dict]:
    """Each method's fastest round, with its img/s over the fastest method's (``of_fastest``)."""
    labels = list(dict.fromkeys(r["method"] for r in rounds))
    rows = [min((r for r in rounds if r["method"] == m), key=lambda r: r["step_time_s"]) for m in sorted(
        labels, key=lambda m: (m not in METHODS, METHODS.index(m) if m in METHODS else 0, m))]
    best = max(r["images_per_s"] for r in rows)
    return [{**r, "of_fastest": r["images_per_s"] / best} for r in rows]


def medians(rounds: list[dict]) -> list[dict]:
    """Each method's median img/s and CPU s/image over its rounds, with the median img/s over the
    best median (``of_fastest``): the figure the issue's "fastest or level" reads."""
    labels = [r["method"] for r in fastest(rounds)]
    rows = []
    for m in labels:
        mine = [r for r in rounds if r["method"] == m]
        rows.append({"method": m, "images_per_s": statistics.median(r["images_per_s"] for r in mine),
                     "cpu_s_per_image": statistics.median(r["cpu_s_per_image"] for r in mine),
                     "samples": " ".join(f"{r['images_per_s']:.1f}" for r in mine)})
    best = max(r["images_per_s"] for r in rows)
    return [{**r, "of_fastest": r["images_per_s"] / best} for r in rows]


def ratio_line(label: str, value: float, target: float) -> str:
    verdict = "met" if value <= target else "not met"
    return f"{label}: {value:.2f} (target <= {target:.2f}: {verdict})"


def mb_per_host(key: str) -> Callable[[dict], str]:
    """A cell: the hosts' bytes per step, in MB, in rank order."""
    return lambda r: " / ".join(f"{v / 1e6:.1f}" for v in r[key].values())


STEP_COLUMNS = [num("step time (s)", "step_time_s", ".3f"), num("sync time (s/step)", "sync_time_s", ".4f"),
                num("backward (s/step)", "backward_time_s", ".3f"), num("img/s", "images_per_s", ".1f")]
LOCAL_COLUMNS = [Column("method", "method"), *STEP_COLUMNS, num("x fastest (img/s)", "of_fastest", ".3f"),
                 num("CPU s/image/rank", "cpu_s_per_image", ".4f"),
                 num("bytes/step/rank (MB)", "comm_bytes_per_step", ".2f", 1e6), num("final test acc", "test_acc", ".4f")]
MEDIAN_COLUMNS = [Column("method", "method"), num("median img/s", "images_per_s", ".1f"),
                  num("x fastest (medians)", "of_fastest", ".3f"), num("median CPU s/image/rank", "cpu_s_per_image", ".4f"),
                  Column("img/s per round", "samples")]
CLUSTER_COLUMNS = [
    Column("method", "method"), num("epoch time (s)", "epoch_time_s", ".2f"), STEP_COLUMNS[0],
    num("sync time (s/step)", "sync_time_s", ".3f"), *STEP_COLUMNS[2:],
    num("CPU s/image/rank", "cpu_s_per_image", ".4f"), num("bytes/step/rank, analytic (MB)", "comm_bytes_per_step", ".2f", 1e6),
    Column("NIC tx MB/step, host 0 / 1 / ...", "nic_tx_bytes_per_step", numeric=True,
           row_fmt=mb_per_host("nic_tx_bytes_per_step")),
    Column("NIC rx MB/step, host 0 / 1 / ...", "nic_rx_bytes_per_step", numeric=True,
           row_fmt=mb_per_host("nic_rx_bytes_per_step")),
    num("final test acc", "test_acc", ".4f")]


def local_table(rounds: list[dict], np: int) -> str:
    """The fastest round of each method, then the medians over the rounds; Horovod's ratios."""
    rows, middle = fastest(rounds), medians(rounds)
    by_method, by_median = {r["method"]: r for r in rows}, {r["method"]: r for r in middle}
    ratio = by_method["horovod"]["step_time_s"] / by_method["ddp"]["step_time_s"]
    cpu = by_median["horovod"]["cpu_s_per_image"] / by_median["ddp"]["cpu_s_per_image"]
    others = max(r["images_per_s"] for r in middle if r["method"] != "horovod")
    return "\n".join([markdown_table(LOCAL_COLUMNS, rows), markdown_table(MEDIAN_COLUMNS, middle), ratio_line(
        f"np={np}: Horovod step time / DDP step time (fastest rounds)", ratio, TARGET_HOROVOD_OVER_DDP_STEP),
        f"np={np}: Horovod median img/s / best other method's: {by_median['horovod']['images_per_s'] / others:.3f} "
        f"(target >= {TARGET_HOROVOD_OF_BEST:.2f}); Horovod CPU s/image / DDP's (medians): {cpu:.3f} "
        f"(target <= {TARGET_HOROVOD_CPU_OVER_DDP:.2f})"])


def cluster_table(rows: list[dict], np: int) -> str:
    by_method = {r["method"]: r for r in rows}
    lines = [markdown_table(CLUSTER_COLUMNS, rows).rstrip("\n"), ""]
    for label, r in by_method.items():
        if label in METHODS and label != "horovod":
            continue
        # Horovod, and each tuned Horovod row: the same two ratios
        lines += [ratio_line(f"np={np}: {'Horovod' if label == 'horovod' else label} step time / DDP step time",
                             r["step_time_s"] / by_method["ddp"]["step_time_s"], TARGET_HOROVOD_OVER_DDP_STEP),
                  ratio_line(f"np={np}: {'Horovod' if label == 'horovod' else label} epoch time / mpi-gather-scatter "
                             f"epoch time", r["epoch_time_s"] / by_method["mpi-gather-scatter"]["epoch_time_s"],
                             TARGET_HOROVOD_OVER_GATHER_SCATTER_EPOCH)]
    return "\n".join(lines)


def run_side_by_side(args) -> list[dict]:
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
    results = {"machine": {**jobs.machine(), "load_at_start": os.getloadavg()},
               "args": vars(args), "local": [], "cluster": []}
    tables = []
    if not args.cluster_only:
        results["local"] = run_local_pass(args)
        for np in args.np:
            launcher = "one process, no launcher" if np == 1 else args.launcher
            tables.append(f"np={np}, this machine, {launcher}: {args.model}, {args.steps or 'all'} steps/epoch x "
                          f"{args.epochs} epochs, batch {args.batch_size}/rank, {args.repeats} rounds\n\n"
                          + local_table([r for r in results["local"] if r["np"] == np], np))
    if args.cluster:
        with NetCluster(n_hosts=args.cluster, rate=args.rate) as cluster:
            results["cluster"] = run_rounds(lambda label, name: run_on_cluster(cluster, label, name, args),
                                            args.cluster_repeats, f"-np{args.cluster}",
                                            tuple(cluster_variants(args)))
        tables.append(f"np={args.cluster}, namespace cluster (one rank per host, links {args.rate}), mpirun: "
                      f"{args.cluster_model}, {args.cluster_steps} steps/epoch x {args.cluster_epochs} epochs, "
                      f"batch {args.cluster_batch_size}/rank\n\n"
                      + cluster_table(fastest(results["cluster"]), args.cluster))
    if args.side_by_side:
        results["side_by_side"] = run_side_by_side(args)
        tables.append(f"side by side: namespace cluster (one rank per host, links {args.rate}), mpirun: "
                      f"{args.side_model} on {args.dataset}, {args.side_epochs} whole epochs at every default "
                      f"(batch 32/rank, the model's lr), one job each\n\n" + side_table(results["side_by_side"]))
    results["machine"]["load_at_end"] = os.getloadavg()
    jobs.write_results(args.out, "sync_methods", results, "\n\n".join(tables))  # data first, tables second
    return 0


if __name__ == "__main__":
    sys.exit(main())
