"""Do the defaults train soundly at every world size? Each case is one real training run on the
offline digits data set with every key at its default (the model, ranks and the one option named
are all that change), whole epochs, under horovodrun on this machine.

    .venv/bin/python benchmarks/convergence.py [--models vgg11 smallcnn resnet18] [--epochs 6]
        [--cases np1 np2 np4 np2-acc4 np2-fp16] [--out logs/bench-convergence-YYYYmmdd-HHMMSS]

Prints, and writes to OUT/convergence.md and OUT/convergence.json, one row per (model, case):
the final test accuracy, the epoch that first reached 95 %, the best accuracy, and whether the
row passes (final >= 95 %); then per model the spread of the final accuracies at np = 1, 2, 4
(target: within 2 points). Run folders: OUT/runs/MODEL-CASE. A case that exits non-zero (e.g.
the divergence guard's status 3) is a failed row with its one line of stderr.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

from hvd_cifar import jobs, launchers, runlog
from hvd_cifar.tables import Column, markdown_table

TARGET = 0.95
CASES = {  # name: (ranks, extra flags)
    "np1": (1, []),
    "np2": (2, []),
    "np4": (4, []),
    "np2-acc4": (2, ["--accumulation-steps", "4"]),
    "np2-fp16": (2, ["--fp16-allreduce"]),
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["vgg11", "smallcnn", "resnet18"])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--out", default=os.path.join("logs", time.strftime("bench-convergence-%Y%m%d-%H%M%S")))
    return p.parse_args(argv)


def run_case(model: str, case: str, args) -> dict:
    np_, extra = CASES[case]
    name = f"{model}-{case}"
    flags = ["--dataset", "digits", "--model", model, "--epochs", str(args.epochs), "--progress", "false",
             "--log-dir", os.path.join(args.out, "runs"), "--run-name", name, *extra]
    cmd = [*launchers.argv("single" if np_ == 1 else "horovodrun", np_), *flags]
    done = jobs.run(name, cmd, log=os.path.join(args.out, f"{name}.log"), check=False)
    records = [r for r in runlog.read_metrics(os.path.join(args.out, "runs", name))] if done.code == 0 else []
    accs = [r["test_acc"] for r in records]
    first = next((i + 1 for i, a in enumerate(accs) if a >= TARGET), None)
    error = "" if done.code == 0 else next(
        (line for line in done.stderr.splitlines() if "hvd_cifar:" in line), done.stderr.strip()[-200:])
    return {"model": model, "case": case, "np": np_, "exit": done.code, "wall_s": round(done.seconds, 1),
            "accuracy_per_epoch": accs, "final": accs[-1] if accs else None, "best": max(accs) if accs else None,
            "epochs_to_95": first, "passed": bool(accs) and accs[-1] >= TARGET, "error": error}


COLUMNS = [
    Column("model", "model"), Column("case", "case"),
    Column("final test acc", "final", row_fmt=lambda r: f"exit {r['exit']}" if r["final"] is None else f"{r['final']:.4f}"),
    Column("best", "best", row_fmt=lambda r: "" if r["best"] is None else f"{r['best']:.4f}"),
    Column("first epoch >= 95 %", "epochs_to_95", row_fmt=lambda r: str(r["epochs_to_95"] or "never")),
    Column("accuracy per epoch", "accuracy_per_epoch",
           row_fmt=lambda r: " ".join(f"{a:.3f}" for a in r["accuracy_per_epoch"]) or r["error"]),
    Column("wall (s)", "wall_s"), Column("pass", "passed", row_fmt=lambda r: "yes" if r["passed"] else "NO")]


def table(rows: list[dict]) -> str:
    return markdown_table(COLUMNS, rows).rstrip("\n")


def spreads(rows: list[dict]) -> str:
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        finals = [r["final"] for r in rows if r["model"] == model and r["case"] in ("np1", "np2", "np4")]
        if len(finals) == 3 and None not in finals:
            spread = (max(finals) - min(finals)) * 100
            lines.append(f"{model}: final accuracies at np = 1, 2, 4 span {spread:.1f} points "
                         f"({'within' if spread <= 2 else 'NOT within'} 2)")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    rows = []
    for model in args.models:
        for case in args.cases:
            rows.append(run_case(model, case, args))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    head = (f"Convergence with every key at its default: digits, {args.epochs} epochs, horovodrun on "
            f"{platform.node()} ({os.cpu_count()} cores), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.")
    text = "\n\n".join([head, table(rows), spreads(rows)])
    print()
    jobs.write_results(args.out, "convergence", rows, text)
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
