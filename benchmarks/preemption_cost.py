"""What the preemption agreement costs per step: 2-rank jobs with the per-update vote as shipped,
with a blocking vote, and with none, side by side, for each sync method.

    .venv/bin/python benchmarks/preemption_cost.py [--sync horovod mpi-allreduce ddp] [--model smallcnn]
                                                   [--steps 40] [--epochs 3] [--repeats 3]
                                                   [--tag TAG] [--results benchmarks/results]

After each optimizer update with more steps to come, the ranks agree whether to stop
(loop.TrainingState.after_update -> hvd_cifar.trainer.preemption.StopVote.ranks_asked). Variants, put in
place by a sitecustomize hook that also times every call on each rank:

* ``lagged`` (shipped): read the 1-element sum started after the update before, start the next
  one in the background (``sync.allreduce_sum_async``);
* ``blocking``: one blocking 1-element ``sync.allreduce_sum`` of the flag, read at once;
* ``none``: no vote at all (answers 0 without any collective).

Each round runs the same training once per variant under ``mpirun -np 2``, in an order that
rotates between rounds. Written to the results file benchmarks/results/preemption_cost.json
(hvd_cifar.measure.results): per method and variant, every round's steady-state step time
(hvd_cifar.analysis.summary.steady_mean of ``step_time_s``: the epochs after the first) and the
mean wall time of one vote as the ranks saw it (for the blocking vote this includes waiting for
the slower rank, time the next gradient allreduce would otherwise have waited), with medians and
spreads, and per round each vote's step time over no vote's; then its table is printed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from hvd_cifar.launch import commands

from testbed import jobs, render_docs
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options
from hvd_cifar.analysis.summary import steady_mean

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("none", "blocking", "lagged")
FIGURES = {"step_time_s": Figure("step (ms)", ".1f", 1e-3), "s_per_call": Figure("one vote, as timed (ms)", ".3f", 1e-3),
           "of_none": Figure("step x no vote's", ".3f")}

# Every rank: the variant HOOK_VARIANT in StopVote.ranks_asked's place, each call timed; after
# each evaluation, this rank's count and seconds go to HOOK_OUT.rank<R>.
HOOK = """
import json, os, time
import torch
from hvd_cifar.core import launcher, stops
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
    with open(f"{os.environ['HOOK_OUT']}.rank{launcher.launch_rank()}", "w") as f:
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


def measure(args, results: Results) -> None:
    """Every sync method's variants, ``args.repeats`` rounds, the variants rotated each round."""
    with tempfile.TemporaryDirectory() as tmp:
        for sync in args.sync:
            for k in range(1, args.repeats + 1):
                for variant in jobs.rotated(VARIANTS, k - 1):
                    config = f"{sync} {variant}"
                    run = results.attempt(k, config, lambda: one_run(Path(tmp), f"{sync}-{variant}-{k}", sync,
                                                                     variant, args))
                    if run is None:
                        continue
                    results.add(k, config, {"step_time_s": run["step_time_s"], "s_per_call": run["s_per_call"]},
                                calls=run["calls"])
                    print(f"{config} round {k}: {json.dumps(run)}", flush=True)
            for variant in ("blocking", "lagged"):
                results.derive(f"{sync} {variant} / none", "of_none", lambda r, s=sync, v=variant:
                               r[f"{s} {v}"]["step_time_s"] / r[f"{s} none"]["step_time_s"])


@jobs.one_line_errors("preemption_cost")
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sync", nargs="+", default=["horovod", "mpi-allreduce", "ddp"])
    jobs.add_options(p, model="smallcnn", steps=40, epochs=3, repeats=3)
    add_results_options(p)
    args = p.parse_args()
    results = Results("preemption_cost", args, FIGURES)
    measure(args, results)
    path = results.write()
    print(render_docs.render_block(os.path.basename(path), os.path.dirname(path)), end="")
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
