"""What recording Horovod's timeline (``comm_timeline: true``) costs per step: hvd_cifar.train under
horovodrun with it off and on, same model, batch, steps and np, interleaved.

    .venv/bin/python benchmarks/timeline_cost.py [--model vgg11] [--batch-size 8] [--np 2] [--steps 12] [--repeats 3]
        [--tag TAG] [--results benchmarks/results]

Each repeat runs off then on (the order alternates between repeats), synthetic data, 3 epochs;
the step time of each run is hvd_cifar.analysis.summary's steady-state figure (epochs after the first).
Writes the results file benchmarks/results/timeline_cost.json (hvd_cifar.measure.results: every run's step
time, medians and spreads, and per round on / off), then prints its table: a ratio whose spread
holds 1 is not resolved.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from hvd_cifar.launch import commands

from testbed import jobs, render_docs
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options
from hvd_cifar.analysis.summary import summarize
from hvd_cifar.runfolder.reader import load_run

ROOT = Path(__file__).resolve().parents[1]
FIGURES = {"step_time_s": Figure("step (ms)", ".1f", 1e-3), "ratio": Figure("on / off", ".3f")}


def train(args, logs: str, name: str, timeline: bool) -> float:
    threads = max(1, (os.cpu_count() or 1) // args.np)
    flags = ["--model", args.model, "--batch-size", str(args.batch_size), "--dataset", "synthetic",
             "--synthetic-size", str(args.batch_size * args.np * args.steps), "--epochs", "3",
             "--max-steps-per-epoch", str(args.steps), "--threads-per-rank", str(threads),
             "--progress", "false", "--log-dir", logs, "--run-name", name, "--comm-timeline", str(timeline).lower()]
    cmd = commands.argv("horovodrun", args.np, program=[sys.executable, "-m", "hvd_cifar.train", *flags])
    jobs.run(name, cmd, env=dict(os.environ), cwd=str(ROOT), timeout=1800)
    return summarize(load_run(os.path.join(logs, name)))["step_time_s"]


def measure(args, results: Results) -> None:
    """Step times with the timeline off and on, one job each per round, the order alternating."""
    with tempfile.TemporaryDirectory() as logs:
        for k in range(1, args.repeats + 1):
            for timeline in (False, True) if k % 2 else (True, False):
                config = f"timeline {'on' if timeline else 'off'}"
                results.measure(k, config, lambda: {"step_time_s": train(args, logs, f"r{k}-{config[9:]}", timeline)})


@jobs.one_line_errors("timeline_cost")
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    jobs.add_options(p, model="vgg11", batch_size=8, np=2, steps=12, repeats=3)
    add_results_options(p)
    args = p.parse_args()
    results = Results("timeline_cost", args, FIGURES)
    measure(args, results)
    results.derive("on / off", "ratio", lambda r: r["timeline on"]["step_time_s"] / r["timeline off"]["step_time_s"])
    path = results.write()
    print(render_docs.render_block(os.path.basename(path), os.path.dirname(path)), end="")
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
