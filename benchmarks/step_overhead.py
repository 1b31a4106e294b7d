"""hvd_cifar's step time vs a bare Horovod loop, same model, batch, steps and np, interleaved.

    .venv/bin/python benchmarks/step_overhead.py [--model vgg11] [--batch-size 32] [--np 2] [--steps 10] [--repeats 3]
    .venv/bin/python benchmarks/step_overhead.py --plain --batch-size 64     # np = 1 against plain PyTorch
        [--tag TAG] [--results benchmarks/results]

Each repeat runs the bare loop (benchmarks/bare_horovod.py) and hvd_cifar.train (synthetic data,
augmentation on) back to back under horovodrun, and takes the mean step time of the epochs after
the first from each (hvd_cifar: its 2 epochs' metrics.jsonl, summarised by hvd_cifar.report, so
the second epoch's). Writes the results file benchmarks/results/step_overhead.json (with --plain:
step_overhead-plain.json unless --tag names another; hvd_cifar.measure.results: every run's step time,
medians, spreads, and per round hvd_cifar / bare; target <= 1.05), then prints its table.

``--plain`` (np = 1): one process each, no launcher, as a new user runs them:
the yardstick is a plain PyTorch loop (``bare_horovod.py --plain``: no Horovod at all) and
hvd_cifar.train keeps ``sync: horovod``; the threads are the machine's 2 cores (target: the
trainer's speed >= 0.97x the plain loop's, i.e. the ratio of step times <= 1.03).
"""
from __future__ import annotations

import argparse
import json
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
PY = sys.executable
FIGURES = {"step_time_s": Figure("step (ms)", ".1f", 1e-3), "ratio": Figure("hvd_cifar / yardstick (step time)", ".3f")}


def horovodrun(np: int, argv: list[str], plain: bool = False) -> str:
    """``argv`` under horovodrun -np ``np``, or (``plain``) as one process with no launcher."""
    cmd = [PY, *argv] if plain else commands.argv("horovodrun", np, program=[PY, *argv])
    # Both loops get the MPI setting hvd_cifar.sync applies to itself (ranks yield instead of
    # busy-polling while they wait), so that the comparison is of the loops alone.
    env = commands.job_env(OMPI_MCA_mpi_yield_when_idle="1")
    return jobs.run(" ".join(argv[:2]), cmd, env=env, cwd=str(ROOT), timeout=1200).stdout


def measure(args, results: Results, yardstick: str) -> None:
    """One pair per round: the bare loop's step time, then hvd_cifar.train's."""
    threads = max(1, 2 // args.np)
    common = ["--model", args.model, "--batch-size", str(args.batch_size)]
    with tempfile.TemporaryDirectory() as logs:
        for k in range(1, args.repeats + 1):
            def bare() -> dict:
                out = horovodrun(args.np, ["benchmarks/bare_horovod.py", *common, "--steps", str(args.steps),
                                           "--threads", str(threads), *(["--plain"] if args.plain else [])], args.plain)
                line = next(l for l in out.splitlines() if "step_time_s" in l)
                return {"step_time_s": json.JSONDecoder().raw_decode(line[line.index("{"):])[0]["step_time_s"]}

            def ours(run: str = f"r{k}") -> dict:
                horovodrun(args.np, ["-m", "hvd_cifar.train", *common, "--dataset", "synthetic",
                                     "--synthetic-size", str(args.batch_size * args.np * args.steps),
                                     "--epochs", "2", "--max-steps-per-epoch", str(args.steps),
                                     "--threads-per-rank", str(threads), "--progress", "false",
                                     "--log-dir", logs, "--run-name", run], args.plain)
                return {"step_time_s": summarize(load_run(str(Path(logs) / run)))["step_time_s"]}  # the 2nd epoch's

            results.measure(k, yardstick, bare)
            results.measure(k, "hvd_cifar.train", ours)


@jobs.one_line_errors("step_overhead")
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    jobs.add_options(parser, model="vgg11", batch_size=32, np=2, steps=10, repeats=3)
    parser.add_argument("--plain", action="store_true",
                        help="np = 1, one process each, against a plain PyTorch loop (no Horovod)")
    add_results_options(parser)
    args = parser.parse_args()
    if args.plain:
        args.np = 1
        args.tag = args.tag or "plain"
    yardstick = "plain PyTorch loop" if args.plain else "bare Horovod loop"
    results = Results("step_overhead", args, FIGURES)
    measure(args, results, yardstick)
    results.derive("hvd_cifar / yardstick", "ratio",
                   lambda r: r["hvd_cifar.train"]["step_time_s"] / r[yardstick]["step_time_s"])
    path = results.write()
    print(render_docs.render_block(os.path.basename(path), os.path.dirname(path)), end="")
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
