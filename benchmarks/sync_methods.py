"""The four gradient synchronisation methods side by side: one training job per method, the same
model, data, seed, ranks and steps, launched the same way, on this machine.

    .venv/bin/python benchmarks/sync_methods.py [--np 2] [--launcher mpirun|horovodrun]
        [--model vgg11] [--dataset digits] [--epochs 2] [--steps 0] [--batch-size 32] [--lr 0.01]
        [--repeats 2] [--out logs/bench-sync-methods-YYYYmmdd-HHMMSS]

Each job is ``python -m hvd_cifar.train --sync METHOD ...`` under the launcher; its run folder
lands in OUT/runs/METHOD-rK and its output in OUT/METHOD-rK.log. The methods run one after
another, ``--repeats`` rounds, each round in a rotated order, and each method's row is its
fastest round: on a shared machine, other work only ever slows a run down. The table is made
from the runs' metrics.jsonl alone, over the epochs after the first (the first pays for
warm-up), printed and written to OUT/sync_methods.md (all rounds: OUT/sync_methods.json):

  step time    wall-clock seconds per training step (forward, backward, sync, optimizer, data)
  sync time    seconds per step in the loop's sync phase, synchronize(): all of the MPI methods'
               communication; what Horovod has not finished during backward; ~0 for DDP, whose
               allreduce runs inside backward (hence the backward column)
  img/s        training images per second, all ranks together
  bytes/step   bytes one rank sends per step, analytic (the busiest rank for gather-scatter)
  accuracy     test accuracy after the last epoch
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
METHODS = ("horovod", "mpi-allreduce", "mpi-gather-scatter", "ddp")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2, help="ranks per job")
    p.add_argument("--launcher", choices=("mpirun", "horovodrun"), default="mpirun")
    p.add_argument("--model", default="vgg11")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--epochs", type=int, default=2, help="the first is warm-up, left out of the timings")
    p.add_argument("--steps", type=int, default=0, help="steps per epoch; 0 = whole epochs")
    p.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    p.add_argument("--lr", type=float, default=0.01, help="for one rank; the trainer scales it by np")
    p.add_argument("--out", default=os.path.join(ROOT, "logs", time.strftime("bench-sync-methods-%Y%m%d-%H%M%S")))
    p.add_argument("--repeats", type=int, default=2, help="rounds of all methods; the fastest counts")
    p.add_argument("--timeout", type=int, default=1200, help="seconds per job")
    return p.parse_args(argv)


def launcher(args) -> list[str]:
    if args.launcher == "horovodrun":
        return [os.path.join(os.path.dirname(PYTHON), "horovodrun"), "-np", str(args.np),
                "-H", f"localhost:{args.np}"]
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", *root, "--oversubscribe", "-np", str(args.np), "-bind-to", "none", "-map-by", "slot"]


def run_job(method: str, name: str, args) -> str:
    """One training job; its run folder. Raises RuntimeError with the log's path if it fails."""
    runs = os.path.join(args.out, "runs")
    flags = ["--model", args.model, "--dataset", args.dataset, "--epochs", str(args.epochs),
             "--max-steps-per-epoch", str(args.steps), "--batch-size", str(args.batch_size),
             "--lr", str(args.lr), "--warmup-epochs", "0", "--seed", "0", "--checkpoint-every", "0",
             "--no-progress", "--sync", method, "--log-dir", runs, "--run-name", name]
    cmd = [*launcher(args), PYTHON, "-m", "hvd_cifar.train", *flags]
    log_path = os.path.join(args.out, f"{name}.log")
    with open(log_path, "w") as log:
        code = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
    if code != 0:
        raise RuntimeError(f"{method}: exit status {code}; see {log_path}")
    return os.path.join(runs, name)


def summarize(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    timed = records[1:] or records  # epochs after the first, unless there is only one
    steps = sum(r["steps"] for r in timed)
    train_s = sum(r["epoch_time_s"] for r in timed)
    images = sum(r["images_per_s"] * r["epoch_time_s"] for r in timed)
    return {
        "method": records[-1]["sync"],
        "run": os.path.basename(run_dir),
        "step_time_s": train_s / steps,
        "sync_time_s": sum(r["sync_time_s"] for r in timed) / steps,
        "backward_time_s": sum(r["backward_time_s"] for r in timed) / steps,
        "images_per_s": images / train_s,
        "comm_bytes_per_step": sum(r["comm_bytes_per_rank"] for r in timed) / steps,
        "test_acc": records[-1]["test_acc"],
        "timed_epochs": len(timed),
        "steps": steps,
    }


def markdown(rows: list[dict]) -> str:
    lines = ["| method | step time (s) | sync time (s/step) | backward (s/step) | img/s "
             "| bytes/step/rank (MB) | final test acc |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['step_time_s']:.3f} | {r['sync_time_s']:.4f} | "
                     f"{r['backward_time_s']:.3f} | {r['images_per_s']:.1f} | "
                     f"{r['comm_bytes_per_step'] / 1e6:.2f} | {r['test_acc']:.4f} |")
    by_method = {r["method"]: r for r in rows}
    if "horovod" in by_method and "ddp" in by_method:
        ratio = by_method["horovod"]["step_time_s"] / by_method["ddp"]["step_time_s"]
        lines += ["", f"Horovod step time / DDP step time: {ratio:.2f}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.out, exist_ok=True)
    rounds = []
    for k in range(args.repeats):
        for method in METHODS[k % len(METHODS):] + METHODS[:k % len(METHODS)]:
            start = time.perf_counter()
            run_dir = run_job(method, f"{method}-r{k + 1}", args)
            print(f"{method} round {k + 1}: done in {time.perf_counter() - start:.0f} s, {run_dir}",
                  file=sys.stderr, flush=True)
            rounds.append(summarize(run_dir))
    with open(os.path.join(args.out, "sync_methods.json"), "w") as f:
        json.dump(rounds, f, indent=2)
    rows = [min((r for r in rounds if r["method"] == m), key=lambda r: r["step_time_s"]) for m in METHODS]
    table = markdown(rows)
    with open(os.path.join(args.out, "sync_methods.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
