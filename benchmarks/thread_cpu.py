"""Where each method's CPU time goes, thread by thread: one training job per sync method under
mpirun on this machine, each rank's threads' CPU time read from /proc while it trains.

    .venv/bin/python benchmarks/thread_cpu.py [--np 2] [--model vgg11] [--batch-size 32]
        [--steps 10] [--epochs 3] [--repeats 1] [--out logs/bench-thread-cpu-YYYYmmdd-HHMMSS]
        [--tag TAG] [--results benchmarks/results]

A sampler reads every rank's /proc/PID/task/TID/stat (user + system time, the thread's name)
every 0.2 s. The window is the epochs after the first: from the sample when metrics.jsonl has
its first line to the rank's exit (so also the final evaluation and the rank's shutdown), each
thread at its latest figure (a thread that ended counts to its end). Per method, CPU seconds per trained image and rank of: the main
thread (the training loop: forward, backward, optimizer, and the MPI methods' collectives), the
busiest other thread (Horovod's background thread, DDP's reducer/Gloo threads, Open MPI's
progress thread), and every other thread together. Threads-per-rank is 1 (the compute runs on
the main thread), so what is not the main thread is the method's communication machinery.
Written to the results file benchmarks/results/thread_cpu.json (hvd_cifar.measure.results: every run, with
its busiest other thread's name, medians and spreads, and per round each method's total over
DDP's), whose table is printed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from hvd_cifar.launch import commands

from testbed import jobs, render_docs
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options
from hvd_cifar.runfolder.reader import read_metrics

METHODS = ("horovod", "ddp", "mpi-allreduce", "mpi-gather-scatter")
TICK = os.sysconf("SC_CLK_TCK")
FIGURES = {"main": Figure("main thread (CPU ms/image/rank)", ".2f", 1e-3),
           "busiest_other": Figure("busiest other thread", ".2f", 1e-3),
           "others": Figure("all other threads", ".2f", 1e-3), "total": Figure("total", ".2f", 1e-3),
           "images_per_s": Figure("img/s", ".1f"), "of_ddp": Figure("total x DDP's", ".3f")}


def threads(pid: int) -> dict[int, tuple[str, float]]:
    """tid -> (name, CPU seconds so far) of one process's threads; {} once it is gone."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / TICK)  # utime, stime
    return out


def one_job(args, out: str, method: str, round_: int) -> dict:
    name = f"{method}-r{round_}"
    run = os.path.join(out, "runs", name)
    flags = ["--sync", method, "--model", args.model, "--dataset", "synthetic", "--batch-size", str(args.batch_size),
             "--synthetic-size", str(args.batch_size * args.np * args.steps), "--epochs", str(args.epochs),
             "--max-steps-per-epoch", str(args.steps), "--threads-per-rank", "1", "--progress", "false",
             "--checkpoint-every", "0", "--seed", "0", "--log-dir", os.path.join(out, "runs"), "--run-name", name]
    argv = commands.argv("mpirun", args.np, program=[sys.executable, "-m", "hvd_cifar.train", *flags])
    first: dict[int, dict] = {}  # rank pid -> threads at the window's start
    last: dict[int, dict] = {}   # rank pid -> every thread's latest figure since (threads come and go)
    with open(os.path.join(out, f"{name}.log"), "w") as log:
        job = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=commands.job_env(OMP_NUM_THREADS="1"),
                               cwd=commands.ROOT, start_new_session=True)
        try:
            pids = []
            while job.poll() is None:
                pids = pids if len(pids) == args.np else jobs.rank_pids(job)
                done = len(read_metrics(run, missing_ok=True).records)
                snap = {pid: threads(pid) for pid in pids}
                if done >= 1 and not first:
                    first = snap
                elif first:
                    for pid, now in snap.items():
                        last.setdefault(pid, {}).update(now)
                time.sleep(0.2)
        finally:
            if job.poll() is None:
                commands.stop(job)
    if job.returncode != 0 or not first or not last:
        raise jobs.JobError(name, job.returncode, log.name, "no window sampled")
    records = read_metrics(run).records[1:]
    images = sum(r["images_per_s"] * r["epoch_time_s"] for r in records) / args.np  # per rank
    per_rank = []
    for pid in last:
        used = {tid: (name_, cpu - first[pid].get(tid, (name_, 0.0))[1]) for tid, (name_, cpu) in last[pid].items()}
        main = used.pop(pid)[1]
        others = sorted(used.values(), key=lambda v: -v[1])
        per_rank.append({"main": main / images, "busiest_other": others[0][1] / images if others else 0.0,
                         "busiest_name": others[0][0] if others else "-",
                         "others": sum(v[1] for v in others) / images})
    row = {"method": method, "round": round_, "images_per_s": statistics.mean(r["images_per_s"] for r in records)}
    for key in ("main", "busiest_other", "others"):
        row[key] = statistics.mean(r[key] for r in per_rank)
    row["busiest_name"] = per_rank[0]["busiest_name"]
    row["total"] = row["main"] + row["others"]
    return row


@jobs.one_line_errors("thread_cpu")
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    jobs.add_options(p, np=2, model="vgg11", batch_size=32, steps=10, epochs=3, repeats=1)
    p.add_argument("--out", default=time.strftime("logs/bench-thread-cpu-%Y%m%d-%H%M%S"))
    add_results_options(p)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = Results("thread_cpu", args, FIGURES)
    for k in range(1, args.repeats + 1):
        for method in jobs.rotated(METHODS, k - 1):
            r = results.attempt(k, method, lambda: one_job(args, args.out, method, k))
            if r is None:
                continue
            results.add(k, method, {key: r[key] for key in ("main", "busiest_other", "others", "total", "images_per_s")},
                        busiest_name=r["busiest_name"])
            print(f"round {k} {method}: main {r['main']:.4f}, others {r['others']:.4f} CPU s/image/rank", flush=True)
    for method in METHODS:
        results.derive(f"{method} / ddp", "of_ddp", lambda r, m=method: r[m]["total"] / r["ddp"]["total"])
    path = results.write()
    print(render_docs.render_block(os.path.basename(path), os.path.dirname(path)), end="")
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
