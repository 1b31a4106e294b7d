"""What recording Horovod's timeline (``comm_timeline: true``) costs per step: hvd_cifar.train under
horovodrun with it off and on, same model, batch, steps and np, interleaved.

    .venv/bin/python benchmarks/timeline_cost.py [--model vgg11] [--batch-size 8] [--np 2] [--steps 12] [--repeats 3]

Each repeat runs off then on (the order alternates between repeats), synthetic data, 3 epochs;
the step time of each run is hvd_cifar.analysis.summary's steady-state figure (epochs after the first).
Prints every pair, the medians, their difference per step and the spread of the off runs (a
difference inside that spread is not resolved).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from hvd_cifar.launch import commands

from testbed import jobs
from hvd_cifar.runfolder.reader import load_run
from hvd_cifar.analysis.summary import summarize

ROOT = Path(__file__).resolve().parents[1]


def train(args, logs: str, name: str, timeline: bool) -> float:
    threads = max(1, (os.cpu_count() or 1) // args.np)
    flags = ["--model", args.model, "--batch-size", str(args.batch_size), "--dataset", "synthetic",
             "--synthetic-size", str(args.batch_size * args.np * args.steps), "--epochs", "3",
             "--max-steps-per-epoch", str(args.steps), "--threads-per-rank", str(threads),
             "--progress", "false", "--log-dir", logs, "--run-name", name, "--comm-timeline", str(timeline).lower()]
    cmd = commands.argv("horovodrun", args.np, program=[sys.executable, "-m", "hvd_cifar.train", *flags])
    jobs.run(name, cmd, env=dict(os.environ), cwd=str(ROOT), timeout=1800)
    return summarize(load_run(os.path.join(logs, name)))["step_time_s"]


def measure(args) -> dict[bool, list[float]]:
    """Step times with the timeline off (False) and on (True), one per repeat each."""
    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as logs:
        for repeat in range(args.repeats):
            for timeline in (False, True) if repeat % 2 == 0 else (True, False):
                times[timeline].append(train(args, logs, f"r{repeat}-{'on' if timeline else 'off'}", timeline))
            print(f"repeat {repeat + 1}: off {times[False][-1] * 1e3:.1f} ms/step, on {times[True][-1] * 1e3:.1f} ms/step",
                  flush=True)
    return times


@jobs.one_line_errors("timeline_cost")
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    jobs.add_options(p, model="vgg11", batch_size=8, np=2, steps=12, repeats=3)
    args = p.parse_args()
    load = os.getloadavg()[0]
    times = measure(args)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"{args.model}, batch {args.batch_size}/rank, np {args.np}, {args.steps} steps/epoch; load average "
          f"{load:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"median off {off * 1e3:.1f} ms/step, on {on * 1e3:.1f} ms/step: {(on - off) * 1e3:+.1f} ms/step "
          f"({(on / off - 1) * 100:+.1f} %); off runs spread {(max(times[False]) - min(times[False])) * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
