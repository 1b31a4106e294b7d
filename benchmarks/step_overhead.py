"""hvd_cifar's step time vs a bare Horovod loop, same model, batch, steps and np, interleaved.

    .venv/bin/python benchmarks/step_overhead.py [--model vgg11] [--batch-size 32] [--np 2] [--steps 10] [--repeats 3]
    .venv/bin/python benchmarks/step_overhead.py --plain --batch-size 64     # np = 1 against plain PyTorch

Each repeat runs the bare loop (benchmarks/bare_horovod.py) and hvd_cifar.train (synthetic data,
augmentation on) back to back under horovodrun, and takes the mean step time of the epochs after
the first from each (hvd_cifar: its 2 epochs' metrics.jsonl, summarised by hvd_cifar.report, so
the second epoch's). Prints every pair, the medians and their ratio (target: hvd_cifar / bare <= 1.05).

``--plain`` (np = 1, issue 24 point 1): one process each, no launcher, as a new user runs them:
the yardstick is a plain PyTorch loop (``bare_horovod.py --plain``: no Horovod at all) and
hvd_cifar.train keeps ``sync: horovod``; the threads are the machine's 2 cores (target: the
trainer's speed >= 0.97x the plain loop's, i.e. the ratio of step times <= 1.03).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from hvd_cifar.launch import commands

from testbed import jobs
from hvd_cifar.runfolder.reader import load_run
from hvd_cifar.analysis.summary import summarize
from hvd_cifar.analysis.tabulate import Column, markdown_table, num

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def horovodrun(np: int, argv: list[str], plain: bool = False) -> str:
    """``argv`` under horovodrun -np ``np``, or (``plain``) as one process with no launcher."""
    cmd = [PY, *argv] if plain else commands.argv("horovodrun", np, program=[PY, *argv])
    # Both loops get the MPI setting hvd_cifar.sync applies to itself (ranks yield instead of
    # busy-polling while they wait), so that the comparison is of the loops alone.
    env = commands.job_env(OMPI_MCA_mpi_yield_when_idle="1")
    return jobs.run(" ".join(argv[:2]), cmd, env=env, cwd=str(ROOT), timeout=1200).stdout


def measure(args) -> tuple[list[float], list[float]]:
    """Step times, one per repeat: the bare loop's, hvd_cifar.train's."""
    threads = max(1, 2 // args.np)
    common = ["--model", args.model, "--batch-size", str(args.batch_size)]
    bare_times, ours_times = [], []
    with tempfile.TemporaryDirectory() as logs:
        for repeat in range(args.repeats):
            out = horovodrun(args.np, ["benchmarks/bare_horovod.py", *common, "--steps", str(args.steps),
                                       "--threads", str(threads), *(["--plain"] if args.plain else [])], args.plain)
            line = next(l for l in out.splitlines() if "step_time_s" in l)
            bare = json.JSONDecoder().raw_decode(line[line.index("{"):])[0]["step_time_s"]
            run = f"r{repeat}"
            horovodrun(args.np, ["-m", "hvd_cifar.train", *common, "--dataset", "synthetic",
                                 "--synthetic-size", str(args.batch_size * args.np * args.steps),
                                 "--epochs", "2", "--max-steps-per-epoch", str(args.steps),
                                 "--threads-per-rank", str(threads), "--progress", "false",
                                 "--log-dir", logs, "--run-name", run], args.plain)
            ours = summarize(load_run(str(Path(logs) / run)))["step_time_s"]  # the 2nd epoch's
            bare_times.append(bare)
            ours_times.append(ours)
            print(f"repeat {repeat}: bare {bare * 1e3:.1f} ms/step, hvd_cifar {ours * 1e3:.1f} ms/step, "
                  f"ratio {ours / bare:.3f}", flush=True)
    return bare_times, ours_times


@jobs.one_line_errors("step_overhead")
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    jobs.add_options(parser, model="vgg11", batch_size=32, np=2, steps=10, repeats=3)
    parser.add_argument("--plain", action="store_true",
                        help="np = 1, one process each, against a plain PyTorch loop (no Horovod)")
    args = parser.parse_args()
    if args.plain:
        args.np = 1
    bare_times, ours_times = measure(args)
    bare, ours = statistics.median(bare_times), statistics.median(ours_times)
    yardstick = "plain PyTorch loop" if args.plain else "bare Horovod loop"
    rows = [{"loop": yardstick, "step_time_s": bare}, {"loop": "hvd_cifar.train", "step_time_s": ours}]
    print("\n" + markdown_table([Column("loop", "loop"), num("median step time (ms)", "step_time_s", ".1f", 1e-3)],
                                rows), end="")
    print(f"ratio hvd_cifar/bare: {ours / bare:.3f}  ({args.model}, batch {args.batch_size}/rank, "
          f"np={args.np}, {args.steps} steps/epoch, {args.repeats} repeats)")
    print(f"speed hvd_cifar/{yardstick}: {bare / ours:.3f}x (median of the pairs: "
          f"{statistics.median(b / o for b, o in zip(bare_times, ours_times)):.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
