"""A scaling sweep in one command: train every combination of the options given, each as its
own launched job, and tabulate and plot how throughput scales with the number of processes.

    python -m hvd_cifar.bench --np 1 2 --fp16-allreduce false true --accumulation-steps 1 4 \\
        --batch-size 32 --model smallcnn --steps 10
    python -m hvd_cifar.bench --np 1 2 4 --launcher mpirun --hostfile hostfiles/example-cluster \\
        --model vgg11 --dataset cifar10 --steps 50 --extra "--data-dir /shared/data"
    python -m hvd_cifar.bench --np 1 2 4 --slurm --sbatch "--cpus-per-task 4" --model vgg11 --steps 50
    python -m hvd_cifar.bench --np 1 2 --dry-run          # print the commands, run nothing

Time to accuracy (whole epochs, --steps 0), with options tried at one world size only (--also):

    python -m hvd_cifar.bench --model vgg11 --dataset digits --batch-size 32 --epochs 6 --steps 0 \
        --target-acc 0.95 --np 1 2 4 --sync horovod ddp mpi-gather-scatter \
        --also "--np 2 --sync horovod --fp16-allreduce true" --also "--np 2 --sync horovod --accumulation-steps 4"

Options taking several values (--np, --sync, --model, --batch-size, --fp16-allreduce,
--accumulation-steps, --freeze) span a cartesian product. Each --also "OPTIONS" adds another
product: these options as given there, the others as in the main sweep; a configuration asked
for twice runs once. Each configuration is one run of ``python -m hvd_cifar.train`` with
``--max-steps-per-epoch STEPS`` (0: whole epochs) and ``--target-acc``, launched by
  horovodrun:  .venv/bin/horovodrun -np N -H localhost:N python -m hvd_cifar.train ...
               (with --hostfile: launch/horovodrun.sh -np N -hostfile FILE ...)
  mpirun:      mpirun --oversubscribe -np N -bind-to none -map-by slot python -m hvd_cifar.train ...
               (with --hostfile: launch/mpirun.sh -np N -hostfile FILE --oversubscribe ...)
  --slurm:     sbatch --nodes=ceil(N/K) --ntasks=N --ntasks-per-node=K [--sbatch OPTIONS] \\
                      launch/slurm.sbatch ...        (K: --tasks-per-node, default 1)
               one job at a time: submitted, then watched until it ends (scontrol show job)
np=1 runs are launched the same way as the others, so that they differ in the count alone.

Rounds: every configuration once per round, --repeats rounds (default 3; or one per --seeds
seed), each round's order rotated one further; --resolve MARGIN adds rounds until every img/s
comparison's 95 % interval is clear of 1 +- MARGIN, or --budget minutes. Everything goes under
--out (default logs/bench-YYYYmmdd-HHMMSS):
  runs/NAME-rK/       the run folders (metrics.jsonl, ...)
  logs/NAME-rK.stdout.txt, logs/NAME-rK.stderr.txt   each job's output
  scaling.md, scaling.csv, scaling.png  per configuration the median over its rounds and its
                      95 % interval, the comparisons in words (analysis.sweep), the plot
  runs.csv, bench.json                  every job, every round (measure.results)
Numbers are made by ``hvd_cifar.report`` (means over epochs after the first when there are two
or more; speedup from img/s against np=1 of the same configuration in the same round; time to
--target-acc from each run's eval.json, and its speedup against np=1 when both reached it). A
job that fails (non-zero exit, a Slurm job that ends otherwise or that sbatch refuses, or no end
within --timeout seconds: then the job is stopped or cancelled) is a failed round with its
stderr tail in scaling.md; the sweep goes on. Exit status: 0 when every job ran, 1 when some
failed, 2 for bad options, 130 when interrupted.
"""
from __future__ import annotations

import argparse
import datetime as dt
import itertools
import os
import shlex
import sys
import time

from hvd_cifar.analysis.summary import add_speedup
from hvd_cifar.analysis.sweep import (
    by_configuration,
    collect,
    comparisons,
    first_error,
    target_note,
    unresolved,
)
from hvd_cifar.analysis.sweep_outputs import FIGURES, write_outputs
from hvd_cifar.analysis.tabulate import OneLineParser
from hvd_cifar.core import config as config_mod
from hvd_cifar.core.argtypes import (
    boolean,
    fraction,
    freeze_value,
    margin,
    non_negative,
    positive,
)
from hvd_cifar.core.errors import ConfigError
from hvd_cifar.launch.runners import LocalRunner, SlurmRunner
from hvd_cifar.measure.results import Figure, Results
from hvd_cifar.measure.rounds import Disturbance, rotated

# Swept options: (bench flag / row key, trainer flag)
SWEEP = (("model", "--model"), ("sync", "--sync"), ("batch_size", "--batch-size"),
         ("fp16_allreduce", "--fp16-allreduce"), ("accumulation_steps", "--accumulation-steps"),
         ("freeze", "--freeze"), ("world_size", None))
# Trainer keys the bench sets itself; --extra may not override them or the table would lie.
OWNED_KEYS = ("model", "sync", "batch_size", "fp16_allreduce", "accumulation_steps", "freeze",
              "dataset", "epochs", "max_steps_per_epoch", "target_acc", "log_dir", "run_name", "resume",
              "progress")
# A configuration's identity (a job's row keys); comparisons pair jobs of the same identity.
KEYS = ("model", "sync", "batch_size", "fp16_allreduce", "accumulation_steps", "freeze", "world_size", "dataset")
MAX_ROUNDS = 50  # --resolve adds rounds up to this many, whatever the budget


class BenchError(RuntimeError):
    """A bad option; the message is one line naming it."""


# ----------------------------------------------------------------------------- options
def add_sweep_options(p: argparse.ArgumentParser, defaults: bool) -> None:
    """The options whose values span a cartesian product; an --also sweep's have no defaults
    (what it leaves out, it takes from the main sweep)."""
    d = (lambda v: v) if defaults else (lambda v: None)
    p.add_argument("--np", nargs="+", type=positive, default=d([1, 2]), help="process counts (default: 1 2)")
    p.add_argument("--sync", nargs="+", choices=config_mod.SYNC_METHODS, default=d(["horovod"]))
    p.add_argument("--model", nargs="+", choices=config_mod.MODELS, default=d(["smallcnn"]))
    p.add_argument("--batch-size", nargs="+", type=positive, default=d([32]), help="images per rank per step")
    p.add_argument("--fp16-allreduce", nargs="+", type=boolean, default=d([False]))
    p.add_argument("--accumulation-steps", nargs="+", type=positive, default=d([1]))
    p.add_argument("--freeze", nargs="+", type=freeze_value, default=d([0]),
                   help="leading frozen blocks, or auto (freeze_auto_threshold from --extra)")


class AlsoParser(argparse.ArgumentParser):
    """The options of one --also sweep; a mistake is a BenchError naming --also."""

    def error(self, message: str):
        raise BenchError(f"--also: {message}")


def sweep_values(options: argparse.Namespace) -> dict[str, list]:
    """One sweep's values by row key, in SWEEP's order (world_size last: np varies fastest)."""
    return {key: getattr(options, "np" if key == "world_size" else key) for key, _ in SWEEP}


def also_sweep(main: dict[str, list], text: str) -> dict[str, list]:
    """An --also "OPTIONS" sweep: the options given there, the rest from the main sweep."""
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise BenchError(f"--also: cannot split {text!r} ({exc})") from None
    parser = AlsoParser(prog="--also", add_help=False)
    add_sweep_options(parser, defaults=False)
    given = sweep_values(parser.parse_args(tokens))
    sweep = {key: values if values is not None else main[key] for key, values in given.items()}
    sweep["world_size"] = sorted(set(sweep["world_size"]))
    return sweep


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(prog="python -m hvd_cifar.bench", description=__doc__.split("\n\n")[0],
                      epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sweep_options(p, defaults=True)
    p.add_argument("--also", action="append", default=[], metavar='"OPTIONS"',
                   help='one more sweep, e.g. "--np 2 --fp16-allreduce true": the sweep options given '
                        'there, the others as in the main sweep (repeatable)')
    p.add_argument("--dataset", choices=config_mod.DATASETS, default="synthetic",
                   help="default: synthetic (CIFAR-shaped random images, offline)")
    p.add_argument("--steps", type=non_negative, default=10,
                   help="training steps per epoch per rank (default 10; 0: whole epochs)")
    p.add_argument("--target-acc", type=fraction, default=0.0,
                   help="test accuracy whose time and epochs to reach go in the table (e.g. 0.95; default 0: none)")
    p.add_argument("--epochs", type=positive, default=2,
                   help="default 2: the first (warm-up) epoch is left out of the means")
    p.add_argument("--launcher", choices=("horovodrun", "mpirun"), default="horovodrun")
    p.add_argument("--hostfile", help="hosts for the launcher (through launch/*.sh); default: this machine")
    p.add_argument("--slurm", action="store_true",
                   help="each configuration a Slurm job of launch/slurm.sbatch (sbatch, then wait), one at a time")
    p.add_argument("--tasks-per-node", type=positive, default=1,
                   help="with --slurm: ranks per node (default 1); the nodes a configuration asks for follow")
    p.add_argument("--sbatch", default="", metavar='"OPTIONS"',
                   help='with --slurm: more sbatch options, e.g. "--partition batch --cpus-per-task 4"')
    p.add_argument("--out", help="output folder (default: logs/bench-YYYYmmdd-HHMMSS)")
    p.add_argument("--extra", default="", help='more trainer flags, e.g. "--lr 0.1 --threads-per-rank 1"')
    p.add_argument("--timeout", type=positive, default=900, help="seconds per configuration (default 900)")
    p.add_argument("--repeats", type=positive, default=3,
                   help="rounds: every configuration once per round, in an order rotated each round (default 3)")
    p.add_argument("--seeds", nargs="+", type=non_negative, default=[],
                   help="one round per seed (--seed to the trainer): accuracy compared paired by seed")
    p.add_argument("--resolve", type=margin, default=0.0, metavar="MARGIN",
                   help="after the rounds, add rounds until every img/s comparison's 95 %% interval lies "
                        "wholly above 1+MARGIN, below 1/(1+MARGIN) or between them (e.g. 0.05), or --budget ends")
    p.add_argument("--budget", type=positive, default=60, metavar="MINUTES",
                   help="with --resolve: no round starts that would end after this many minutes (default 60)")
    p.add_argument("--repeat-disturbed", type=boolean, default=True,
                   help="run a job again at its round's end when the machine was disturbed while it ran (default true)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    args.np = sorted(set(args.np))  # np=1 first, so a group's baseline runs before the others
    try:
        args.also = [also_sweep(sweep_values(args), text) for text in args.also]
    except BenchError as exc:
        p.error(str(exc))
    return args


def extra_flags(extra: str) -> list[str]:
    """--extra as an argument list, checked by the trainer's own flag parser."""
    try:
        flags = shlex.split(extra)
    except ValueError as exc:
        raise BenchError(f"--extra: cannot split {extra!r} ({exc})") from None
    try:
        _, updates = config_mod.parse_flags(flags)
    except ConfigError as exc:
        raise BenchError(f"--extra: {exc}") from None
    owned = [k for k in updates if k in OWNED_KEYS]
    if owned:
        raise BenchError(f"--extra: --{owned[0].replace('_', '-')} is set by the bench itself "
                         f"(use the bench's own option, if it has one)")
    return flags


# ----------------------------------------------------------------------------- the sweep
def configurations(args) -> list[dict]:
    """The main sweep's cartesian product, then each --also sweep's, np varying fastest; a
    configuration asked for twice runs once."""
    configs: list[dict] = []
    for sweep in (sweep_values(args), *args.also):
        for combo in itertools.product(*sweep.values()):
            cfg = dict(zip(sweep, combo), dataset=args.dataset)
            if cfg not in configs:
                configs.append(cfg)
    return configs


def run_name(cfg: dict) -> str:
    return (f"{cfg['model']}-{cfg['dataset']}-{cfg['sync']}-np{cfg['world_size']}-b{cfg['batch_size']}"
            f"-fp16{'on' if cfg['fp16_allreduce'] else 'off'}-acc{cfg['accumulation_steps']}-frz{cfg['freeze']}")


def unique_name(runs_dir: str, name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken or os.path.exists(os.path.join(runs_dir, candidate)):
        n += 1
        candidate = f"{name}-{n}"
    taken.add(candidate)
    return candidate


def train_flags(cfg: dict, args, runs_dir: str, name: str, extra: list[str]) -> list[str]:
    flags = [flag_arg for key, flag in SWEEP if flag
             for flag_arg in (flag, str(cfg[key]).lower() if isinstance(cfg[key], bool) else str(cfg[key]))]
    return [*flags, "--dataset", args.dataset, "--epochs", str(args.epochs),
            "--max-steps-per-epoch", str(args.steps), "--target-acc", str(args.target_acc),
            "--log-dir", runs_dir, "--run-name", name, "--progress", "false", *extra]


def make_runner(args) -> LocalRunner | SlurmRunner:
    """Where the jobs run: here (or the hostfile's hosts) through the launcher, or under Slurm."""
    if not args.slurm:
        if args.tasks_per_node != 1 or args.sbatch:
            raise BenchError(f"--{'sbatch' if args.sbatch else 'tasks-per-node'}: only with --slurm")
        return LocalRunner(args.launcher, args.hostfile)
    if args.hostfile:
        raise BenchError("--hostfile: not with --slurm (Slurm chooses the nodes; --sbatch \"--nodelist ...\" asks)")
    try:
        return SlurmRunner(args.tasks_per_node, shlex.split(args.sbatch))
    except ValueError as exc:
        raise BenchError(f"--sbatch: cannot split {args.sbatch!r} ({exc})") from None


# ----------------------------------------------------------------------------- the rounds
def run_job(cfg: dict, k: int, seed: int | None, args, runner, extra: list[str], dirs: tuple[str, str],
            taken: set[str]) -> dict:
    """One configuration's job of round ``k`` (at ``seed``): launched, waited for, its row, with
    the machine's noise around it (measure.rounds.Disturbance; not sampled under Slurm)."""
    runs_dir, logs_dir = dirs
    name = unique_name(runs_dir, f"{run_name(cfg)}-r{k}", taken)
    flags = train_flags(cfg, args, runs_dir, name, extra) + ([] if seed is None else ["--seed", str(seed)])
    cmd = runner.command(cfg["world_size"], flags)
    stdout_file, stderr_file = (os.path.join(logs_dir, f"{name}.{s}.txt") for s in ("stdout", "stderr"))
    with Disturbance() as noise:
        ended = runner.run(cmd, stdout_file, stderr_file, args.timeout)
    row = collect(cfg, os.path.join(runs_dir, name), ended, args.timeout)
    row.update(round=k, seed=seed, command=shlex.join(cmd), stderr_file=stderr_file, seconds=ended.seconds,
               error=first_error(stderr_file) if row["status"] != "ok" else "")
    if not args.slurm:
        row.update(noise.figures, disturbed=noise.disturbed)
    return row


def run_round(configs: list[dict], k: int, seed: int | None, args, runner, extra, dirs, taken) -> list[dict]:
    """Round ``k``: every configuration once, in the order rotated by k - 1; a disturbed job is
    run again at the round's end (--repeat-disturbed), the repeat counted in its place."""
    rows = []
    for i, cfg in enumerate(rotated(configs, k - 1), 1):
        print(f"[round {k}, {i}/{len(configs)}] {run_name(cfg)} ... ", end="", flush=True)
        row = run_job(cfg, k, seed, args, runner, extra, dirs, taken)
        rows.append(row)
        print(f"{row['status']} ({row['seconds']:.1f} s){' disturbed' if row.get('disturbed') else ''}"
              f"{' ' + row['error'] if row['error'] else ''}{target_note(row)}", flush=True)
    for row in [r for r in rows if r.get("disturbed")] if args.repeat_disturbed else []:
        cfg = {key: row[key] for key in configs[0]}
        print(f"[round {k}, again] {run_name(cfg)} (disturbed) ... ", end="", flush=True)
        again = run_job(cfg, k, seed, args, runner, extra, dirs, taken)
        row["superseded"] = True
        rows.append(again)
        print(f"{again['status']} ({again['seconds']:.1f} s){' disturbed' if again.get('disturbed') else ''}", flush=True)
    add_speedup([r for r in rows if not r.get("superseded")])  # speedups paired within the round
    return rows


def seed_of(args, k: int) -> int | None:
    """Round k's seed: the k-th of --seeds, then one more than the last for each round --resolve adds."""
    if not args.seeds:
        return None
    return args.seeds[k - 1] if k <= len(args.seeds) else args.seeds[-1] + k - len(args.seeds)


def compare_jobs(jobs: list[dict], args) -> list:
    """Every comparison of the sweep (analysis.sweep.comparisons): paired by round, or by seed."""
    test_size = next((j["test_images"] for j in jobs if j.get("test_images")), 0)
    return comparisons(jobs, KEYS, order_of(args), pair_by="seed" if args.seeds else "round",
                       accuracy=bool(args.seeds), test_size=test_size)


def sweep(configs: list[dict], args, runner, extra, dirs) -> tuple[list[dict], bool]:
    """--repeats rounds (or one per seed); with --resolve, more until every throughput comparison
    is resolved or --budget minutes would be passed. Returns (every job's row, interrupted)."""
    jobs: list[dict] = []
    taken: set[str] = set()
    began, k = time.monotonic(), 0
    rounds = len(args.seeds) if args.seeds else args.repeats
    try:
        while True:
            k += 1
            jobs += run_round(configs, k, seed_of(args, k), args, runner, extra, dirs, taken)
            if k < rounds:
                continue
            if not args.resolve or k >= MAX_ROUNDS or not unresolved(compare_jobs(jobs, args), args.resolve):
                break
            spent = time.monotonic() - began
            if spent * (k + 1) / k > args.budget * 60:  # the next round, at the mean round's length, would overrun
                print(f"bench: --budget {args.budget} min ends the rounds after {k}", flush=True)
                break
            print(f"bench: unresolved against ±{args.resolve:.0%} after {k} rounds; one more", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        return jobs, True
    return jobs, False


def order_of(args) -> dict[str, list]:
    """Each swept option's values in the order asked (the first is a comparison's baseline)."""
    order = {key: [] for key in KEYS}
    for sweep_ in (sweep_values(args), *args.also):
        for key, values in sweep_.items():
            order[key] += [v for v in values if v not in order[key]]
    order["world_size"] = sorted(order["world_size"])
    order["dataset"] = [args.dataset]
    return order


def write_results_file(jobs: list[dict], args, out: str, argv: list[str]) -> str:
    """Every job into OUT/bench.json (measure.results: the same schema as the project's benchmarks)."""
    results = Results("bench", argparse.Namespace(**{**vars(args), "results": out, "tag": ""}),
                      {key: Figure(key) for key in FIGURES}, argv=argv)
    for job in jobs:
        label = run_name({key: job[key] for key in KEYS})
        info = {k: job[k] for k in ("seed", "disturbed", "superseded", "steal_share", "foreign_cpus", "run")
                if job.get(k) is not None}
        if job.get("superseded"):  # kept, left out of the summary: its repeat counts
            results.fail(job["round"], label, "disturbed; run again, the repeat counted", **info)
        elif job["status"] == "ok":
            results.add(job["round"], label, {k: job[k] for k in FIGURES if isinstance(job.get(k), (int, float))}, **info)
        else:
            results.fail(job["round"], label, job["status"], **info)
    return results.write()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        extra = extra_flags(args.extra)
        runner = make_runner(args)
        if args.hostfile and not os.path.isfile(args.hostfile):
            raise BenchError(f"--hostfile: {args.hostfile} does not exist")
        if args.hostfile:
            args.hostfile = os.path.abspath(args.hostfile)  # jobs run from the project root
        out = os.path.abspath(args.out or os.path.join("logs", f"bench-{dt.datetime.now():%Y%m%d-%H%M%S}"))
        runs_dir, logs_dir = os.path.join(out, "runs"), os.path.join(out, "logs")
        if not args.dry_run:
            os.makedirs(runs_dir, exist_ok=True)
            os.makedirs(logs_dir, exist_ok=True)
    except BenchError as exc:
        print(f"hvd_cifar: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"hvd_cifar: error: --out: cannot create {exc.filename} ({exc.strerror})", file=sys.stderr)
        return 2

    configs = configurations(args)
    rounds = len(args.seeds) if args.seeds else args.repeats
    print(f"bench: {len(configs)} configuration(s) x {rounds} round(s), output in {out}", flush=True)
    if args.dry_run:  # every round's commands, in their rotated order
        taken: set[str] = set()
        for k in range(1, rounds + 1):
            for cfg in rotated(configs, k - 1):
                seed = seed_of(args, k)
                flags = train_flags(cfg, args, runs_dir, unique_name(runs_dir, f"{run_name(cfg)}-r{k}", taken), extra)
                print(shlex.join(runner.command(cfg["world_size"], flags + ([] if seed is None else ["--seed", str(seed)]))))
        return 0
    jobs, interrupted = sweep(configs, args, runner, extra, (runs_dir, logs_dir))
    found = compare_jobs(jobs, args)
    left = unresolved(found, args.resolve) if args.resolve else []
    table = write_outputs(by_configuration(jobs, KEYS, FIGURES), jobs, found, header(args, runner, argv, jobs), out,
                          args.resolve, left)
    results_file = write_results_file(jobs, args, out, argv)
    print("\n" + table)
    for c in found:
        print(c.sentence)
    print(f"bench: table in {os.path.join(out, 'scaling.md')}, scaling.csv and runs.csv, every round in "
          f"{results_file}{', plot in scaling.png' if any(r['status'] == 'ok' for r in jobs) else ''}")
    if interrupted:
        return 130
    return 0 if all(r["status"] == "ok" or r.get("superseded") for r in jobs) else 1


def header(args, runner, argv: list[str], jobs: list[dict]) -> list[str]:
    rounds = max((j["round"] for j in jobs), default=0)
    return ["# Scaling sweep\n",
            f"`python -m hvd_cifar.bench {shlex.join(argv)}`\n",
            f"{dt.datetime.now().isoformat(timespec='seconds')}; {runner.describe()}; "
            f"{args.epochs} {'whole epoch(s)' if not args.steps else f'epoch(s) of {args.steps} steps per rank'}; "
            f"data set {args.dataset}; {rounds} round(s), each configuration once per round in a rotated order"
            f"{f', round k at seed k of {args.seeds}' if args.seeds else ''}"
            f"{f'; target test accuracy {args.target_acc:.2%}' if args.target_acc else ''}.\n",
            "Each cell: the median over the configuration's rounds and, with two or more, its 95 % interval "
            "(t-interval of the logarithms; scipy.stats). Per job, times, img/s (all ranks) and bytes are means "
            "over the epochs after the first when there are two or more; the median step time is the median of "
            "each epoch's per-step wall times (rank 0). Step and sync times are per training step (sync: mean over "
            "ranks). Bytes: gradient bytes one rank sends per step. Speedup: img/s over img/s of np=1 with the same "
            "other settings in the same round; efficiency: speedup / np.\n"]


if __name__ == "__main__":
    sys.exit(main())
