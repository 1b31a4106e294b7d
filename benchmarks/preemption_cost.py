"""What the preemption agreement costs per step: 2-rank jobs with the per-update vote as shipped,
with a blocking vote, and with none, side by side, for each sync method.

    .venv/bin/python benchmarks/preemption_cost.py [--sync horovod mpi-allreduce ddp] [--model smallcnn]
                                                   [--steps 40] [--epochs 3] [--repeats 3]

After each optimizer update with more steps to come, the ranks agree whether to stop
(loop.TrainingState.after_update -> hvd_cifar.trainer.preemption.StopVote.ranks_asked). Variants, put in
place by a sitecustomize hook that also times every call on each rank:

* ``lagged`` (shipped): read the 1-element sum started after the update before, start the next
  one in the background (``sync.allreduce_sum_async``);
* ``blocking``: one blocking 1-element ``sync.allreduce_sum`` of the flag, read at once;
* ``none``: no vote at all (answers 0 without any collective).

Each repeat runs the same training once per variant under ``mpirun -np 2``, in an order that
rotates between repeats. Reported per method: the median over repeats of the steady-state step
time (hvd_cifar.analysis.summary.steady_mean of ``step_time_s``: the epochs after the first) per variant,
the difference of each vote from none (its cost per step), and the mean wall time of one call as
the ranks saw it (for the blocking vote this includes waiting for the slower rank, time the next
gradient allreduce would otherwise have waited).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Callable

from hvd_cifar.launch import commands

from testbed import jobs
from hvd_cifar.analysis.summary import steady_mean
from hvd_cifar.analysis.tabulate import Column, markdown_table

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("none", "blocking", "lagged")

# Every rank: the variant HOOK_VARIANT in StopVote.ranks_asked's place, each call timed; after
# each evaluation, this rank's count and seconds go to HOOK_OUT.rank<R>.
HOOK = """
import json, os, time
import torch
from hvd_cifar.core import lifecycle, stops
from hvd_cifar.trainer import loop, preemption

def blocking(vote):
    flag = torch.tensor([1.0 if stops.asked() else 0.0], dtype=torch.float64)
    return int(vote.sync.allreduce_sum(flag).item())

_variant = {"lagged": preemption.StopVote.ranks_asked, "blocking": blocking,
            "none": lambda vote: 0}[os.environ["HOOK_VARIANT"]]
_calls = [0, 0.0]
def ranks_asked(vote):
    start = time.perf_counter()
    asked = _variant(vote)
    _calls[0] += 1
    _calls[1] += time.perf_counter() - start
    return asked
preemption.StopVote.ranks_asked = ranks_asked

_evaluate = loop.evaluate
def evaluate(run):
    with open(f"{os.environ['HOOK_OUT']}.rank{lifecycle.launch_rank()}", "w") as f:
        json.dump({"calls": _calls[0], "seconds": _calls[1]}, f)
    return _evaluate(run)
loop.evaluate = evaluate
"""


def one_run(work: Path, name: str, sync: str, variant: str, args) -> dict:
    hook = work / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(HOOK)
    out = work / f"{name}.calls"
    env = commands.job_env(PYTHONPATH=f"{hook}:{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1",
                       HOOK_VARIANT=variant, HOOK_OUT=str(out))
    cmd = [*commands.argv("mpirun", 2), "--config", "configs/tiny.yaml", "--model", args.model, "--sync", sync,
           "--epochs", str(args.epochs), "--max-steps-per-epoch", str(args.steps), "--threads-per-rank", "1",
           "--log-dir", str(work), "--run-name", name]
    jobs.run(name, cmd, env=env, cwd=str(ROOT), timeout=1800)
    records = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines()]
    calls = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in (0, 1)]
    return {"step_time_s": steady_mean(records, "step_time_s"), "calls": calls[0]["calls"],
            "s_per_call": statistics.mean(c["seconds"] / max(c["calls"], 1) for c in calls)}


def ms(variant: str, key: str, spec: str) -> Callable[[dict], str]:
    """A cell: one variant's ``key`` (seconds) in ms."""
    return lambda r: format(r[variant][key] * 1e3, spec)


def cost(variant: str) -> Callable[[dict], str]:
    """A cell: what ``variant`` adds to the step over no vote, in ms and %."""
    def cell(r: dict) -> str:
        none, step = r["none"]["step_time_s"], r[variant]["step_time_s"]
        return f"{(step - none) * 1e3:+.2f} ({(step / none - 1) * 100:+.1f}%)"
    return cell


COLUMNS = [Column("sync", "sync")] + [Column(header, "", numeric=True, row_fmt=cell) for header, cell in (
    ("step, no vote (ms)", ms("none", "step_time_s", ".1f")),
    ("step, blocking vote (ms)", ms("blocking", "step_time_s", ".1f")),
    ("step, lagged vote (ms)", ms("lagged", "step_time_s", ".1f")),
    ("blocking: cost per step (ms, %)", cost("blocking")), ("lagged: cost per step (ms, %)", cost("lagged")),
    ("one blocking vote, as timed (ms)", ms("blocking", "s_per_call", ".3f")),
    ("one lagged vote, as timed (ms)", ms("lagged", "s_per_call", ".3f")))]


def table(rows: list[tuple[str, dict]]) -> str:
    return markdown_table(COLUMNS, [{"sync": sync, **m} for sync, m in rows]).rstrip("\n")


def measure(args) -> list[tuple[str, dict]]:
    """Every sync method's variants, ``args.repeats`` times each; per method, each variant's medians."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for sync in args.sync:
            runs = {v: [] for v in VARIANTS}
            for repeat in range(args.repeats):
                for variant in VARIANTS[repeat % 3:] + VARIANTS[:repeat % 3]:
                    name = f"{sync}-{variant}-{repeat}"
                    runs[variant].append(one_run(Path(tmp), name, sync, variant, args))
                    print(f"{name}: {json.dumps(runs[variant][-1])}", flush=True)
            rows.append((sync, {v: {k: statistics.median(r[k] for r in runs[v]) for k in ("step_time_s", "s_per_call")}
                                for v in VARIANTS}))
    return rows


@jobs.one_line_errors("preemption_cost")
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sync", nargs="+", default=["horovod", "mpi-allreduce", "ddp"])
    jobs.add_options(p, model="smallcnn", steps=40, epochs=3, repeats=3)
    args = p.parse_args()
    load_start = os.getloadavg()[0]
    rows = measure(args)
    print(f"\n{args.model}, 2 ranks (mpirun), {args.steps} steps x {args.epochs} epochs, median of {args.repeats}:\n")
    print(table(rows))
    print(f"\nload average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
