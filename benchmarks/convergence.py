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
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hvd_cifar import launchers, runlog  # noqa: E402

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
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    wall = time.perf_counter() - start
    with open(os.path.join(args.out, f"{name}.log"), "w") as f:
        f.write(proc.stdout + proc.stderr)
    records = [r for r in runlog.read_metrics(os.path.join(args.out, "runs", name))] if proc.returncode == 0 else []
    accs = [r["test_acc"] for r in records]
    first = next((i + 1 for i, a in enumerate(accs) if a >= TARGET), None)
    error = "" if proc.returncode == 0 else next(
        (line for line in proc.stderr.splitlines() if "hvd_cifar:" in line), proc.stderr.strip()[-200:])
    return {"model": model, "case": case, "np": np_, "exit": proc.returncode, "wall_s": round(wall, 1),
            "accuracy_per_epoch": accs, "final": accs[-1] if accs else None, "best": max(accs) if accs else None,
            "epochs_to_95": first, "passed": bool(accs) and accs[-1] >= TARGET, "error": error}


def table(rows: list[dict]) -> str:
    out = ["| model | case | final test acc | best | first epoch >= 95 % | accuracy per epoch | wall (s) | pass |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        per_epoch = " ".join(f"{a:.3f}" for a in r["accuracy_per_epoch"]) or r["error"]
        final = f"{r['final']:.4f}" if r["final"] is not None else f"exit {r['exit']}"
        best = f"{r['best']:.4f}" if r["best"] is not None else ""
        out.append(f"| {r['model']} | {r['case']} | {final} | {best} | {r['epochs_to_95'] or 'never'} | "
                   f"{per_epoch} | {r['wall_s']} | {'yes' if r['passed'] else 'NO'} |")
    return "\n".join(out)


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
    text = "\n\n".join([head, table(rows), spreads(rows)]) + "\n"
    with open(os.path.join(args.out, "convergence.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "convergence.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("\n" + text)
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
