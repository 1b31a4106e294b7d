"""Where each method's CPU time goes, by the code that spends it: a system-wide `perf` profile of
one whole steady epoch of every sync method under mpirun on this machine.

    .venv/bin/python benchmarks/cpu_profile.py [--np 2] [--model vgg11] [--batch-size 32]
        [--steps 24] [--repeats 2] [--freq 499] [--out logs/bench-cpu-profile-YYYYmmdd-HHMMSS]
        [--tag TAG] [--results benchmarks/results]

Each job trains 2 epochs (synthetic data, 1 thread per rank, no checkpoints). `perf record -a`
starts when the first epoch's line reaches metrics.jsonl and stops when the second's does, so the
window is exactly epoch 2 (its steps and its evaluation). Every sample of a rank's process is
put in a category by the library and symbol it fell in, and on whether the rank's main thread
(the training loop) or another thread (Horovod's background thread, DDP's Gloo threads) took
it; samples / frequency / trained images = CPU milliseconds per trained image and rank. The
categories:

  compute           oneDNN's JIT kernels (anonymous code) and libtorch/libc10/libgomp: forward,
                    backward, optimizer, and the tensor copies some methods make (flatten/unflatten)
  MPI / Gloo        Open MPI's libraries (transport, reductions), Gloo
  Horovod           Horovod's C++ (negotiation, fusion, scaling)
  libc copies       memcpy/memmove (Horovod's fusion buffer)
  kernel copies     the kernel's data copies and page faults (Open MPI's single-copy shared memory)
  kernel sched      the rest of the kernel: scheduling, sched_yield, futexes, sleeps
  Python, other     the interpreter; everything else

Needs `perf` (Debian: linux-perf), and root (or kernel.perf_event_paranoid <= 0) for `-a`.
Written to the results file benchmarks/results/cpu_profile.json (hvd_cifar.measure.results: every run,
medians and spreads, per round each method's img/s over the best's), whose table is printed.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from hvd_cifar.launch import commands

from testbed import jobs, render_docs
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options
from hvd_cifar.runfolder.reader import read_metrics

METHODS = ("horovod", "mpi-allreduce", "mpi-gather-scatter", "ddp")
CATEGORIES = ("compute", "MPI / Gloo", "Horovod", "libc copies", "kernel copies", "kernel sched", "Python", "other")
KERNEL_COPIES = ("copy", "page", "pte", "get_user", "clear_")
# A run's row key -> (figure name in the results file, its header); CPU milliseconds per image and rank.
SHOWN = {"total": "total (CPU ms/image/rank)", "main compute": "main: compute", "main rest": "main: rest",
         "other total": "other threads", **{c: f"{c} (all threads)" for c in CATEGORIES}}


def figure_key(row_key: str) -> str:
    return re.sub(r"\W+", "_", row_key.lower()).strip("_")


FIGURES = {"images_per_s": Figure("img/s", ".1f"), "of_best": Figure("img/s x best", ".3f"),
           **{figure_key(k): Figure(header, ".2f") for k, header in SHOWN.items()}}
SAMPLE = re.compile(r"\s*(\d+)/(\d+)\s+\S+\s+(.*?)\s+\(([^()]*)\)\s*$")  # pid/tid ip symbol (dso)


def category(dso: str, symbol: str) -> str:
    name = os.path.basename(dso)
    if name.startswith("perf-") or name.startswith("[JIT]") or name.startswith(("libtorch", "libc10", "libgomp")):
        return "compute"
    if name.startswith(("mca_", "libmpi", "libopen-", "libevent", "libgloo")) or "gloo" in symbol.lower():
        return "MPI / Gloo"
    if name.startswith(("mpi_lib", "libhorovod", "libstdc++")):
        return "Horovod"
    if name == "libc.so.6" and "mem" in symbol:
        return "libc copies"
    if name == "[kernel.kallsyms]":
        return "kernel copies" if any(k in symbol for k in KERNEL_COPIES) else "kernel sched"
    if name.startswith("libpython"):
        return "Python"
    return "other"


def profile(data: str, ranks: set[int]) -> collections.Counter:
    """(main|other, category) -> samples of the ranks' processes in one perf.data."""
    script = subprocess.run(["perf", "script", "-i", data, "-F", "pid,tid,ip,sym,dso"], capture_output=True,
                            text=True, check=True).stdout
    counts: collections.Counter = collections.Counter()
    for line in script.splitlines():
        m = SAMPLE.match(line)
        if not m or int(m.group(1)) not in ranks:
            continue
        pid, tid, symbol, dso = m.groups()
        counts[("main" if pid == tid else "other", category(dso, symbol))] += 1
    return counts


def wait_for_lines(job: subprocess.Popen, run: str, n: int, label: str, log: str) -> None:
    while len(read_metrics(run, missing_ok=True).records) < n:
        if job.poll() is not None:
            raise jobs.JobError(label, job.returncode, log, "it ended before epoch " + str(n))
        time.sleep(0.05)


def one_job(args, method: str, round_: int) -> dict:
    name = f"{method}-r{round_ + 1}"
    runs, log = os.path.join(args.out, "runs"), os.path.join(args.out, f"{name}.log")
    run = os.path.join(runs, name)
    flags = ["--sync", method, "--model", args.model, "--dataset", "synthetic", "--batch-size", str(args.batch_size),
             "--synthetic-size", str(args.batch_size * args.np * args.steps), "--epochs", "2",
             "--max-steps-per-epoch", str(args.steps), "--threads-per-rank", "1", "--progress", "false",
             "--warmup-epochs", "0", "--checkpoint-every", "0", "--seed", "0", "--log-dir", runs, "--run-name", name]
    argv = commands.argv("mpirun", args.np, program=[sys.executable, "-m", "hvd_cifar.train", *flags])
    data = os.path.join(args.out, f"{name}.perf.data")
    with open(log, "w") as out:
        job = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=commands.job_env(OMP_NUM_THREADS="1"),
                               cwd=commands.ROOT, start_new_session=True)
        perf = None
        try:
            wait_for_lines(job, run, 1, name, log)
            ranks = set(jobs.rank_pids(job))
            if len(ranks) != args.np:
                raise jobs.JobError(name, None, log, f"found {len(ranks)} rank processes, not {args.np}")
            perf = subprocess.Popen(["perf", "record", "-a", "-F", str(args.freq), "-o", data],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_for_lines(job, run, 2, name, log)
            perf.send_signal(signal.SIGINT)
            perf.wait(timeout=60)
            if job.wait(timeout=args.timeout) != 0:
                raise jobs.JobError(name, job.returncode, log, "")
        finally:
            if perf is not None and perf.poll() is None:
                perf.kill()
            if job.poll() is None:
                commands.stop(job)
    epoch2 = read_metrics(run).records[1]
    images = args.batch_size * epoch2["steps"]  # per rank
    counts = profile(data, ranks)
    os.remove(data)  # tens of MB each; the counts are kept
    ms = 1000.0 / args.freq / images / args.np   # samples -> CPU ms per trained image and rank
    row = {"method": method, "round": round_ + 1, "images_per_s": epoch2["images_per_s"],
           "samples": {f"{role}/{cat}": n for (role, cat), n in counts.items()}}
    for cat in CATEGORIES:
        row[cat] = ms * (counts[("main", cat)] + counts[("other", cat)])
    row["main compute"] = ms * counts[("main", "compute")]
    row["main rest"] = ms * sum(n for (role, cat), n in counts.items() if role == "main" and cat != "compute")
    row["other total"] = ms * sum(n for (role, _), n in counts.items() if role == "other")
    row["total"] = ms * sum(counts.values())
    return row


@jobs.one_line_errors("cpu_profile")
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    jobs.add_options(p, np=2, model="vgg11", batch_size=32, steps=24, repeats=2, timeout=900)
    p.add_argument("--freq", type=int, default=499, help="perf samples per second per CPU (default 499)")
    p.add_argument("--out", default=time.strftime("logs/bench-cpu-profile-%Y%m%d-%H%M%S"))
    add_results_options(p)
    args = p.parse_args()
    if shutil.which("perf") is None:
        raise RuntimeError("perf not found (Debian: apt-get install linux-perf)")
    os.makedirs(args.out, exist_ok=True)
    results = Results("cpu_profile", args, FIGURES)
    for k in range(1, args.repeats + 1):
        for method in jobs.rotated(METHODS, k - 1):
            r = results.attempt(k, method, lambda: one_job(args, method, k - 1))
            if r is None:
                continue
            results.add(k, method, {"images_per_s": r["images_per_s"], **{figure_key(key): r[key] for key in SHOWN}})
            print(f"round {k} {method}: {r['images_per_s']:.1f} img/s, {r['total']:.2f} CPU ms/image/rank "
                  f"(main compute {r['main compute']:.2f}, main rest {r['main rest']:.2f}, "
                  f"other threads {r['other total']:.2f})", flush=True)
    for method in METHODS:
        results.derive(f"{method} / best", "of_best", lambda r, m=method: r[m]["images_per_s"] / max(
            r[n]["images_per_s"] for n in METHODS))
    path = results.write()
    print(render_docs.render_block(os.path.basename(path), os.path.dirname(path)), end="")
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
