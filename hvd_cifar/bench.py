"""A scaling sweep in one command: train every combination of the options given, each as its
own launched job, and tabulate and plot how throughput scales with the number of processes.

    python -m hvd_cifar.bench --np 1 2 --compression none fp16 --accumulation-steps 1 4 \\
        --batch-size 32 --model smallcnn --steps 10
    python -m hvd_cifar.bench --np 1 2 4 --launcher mpirun --hostfile hostfiles/example-cluster \\
        --model vgg11 --dataset cifar10 --steps 50 --extra "--data-dir /shared/data"
    python -m hvd_cifar.bench --np 1 2 4 --slurm --sbatch "--cpus-per-task 4" --model vgg11 --steps 50
    python -m hvd_cifar.bench --np 1 2 --dry-run          # print the commands, run nothing

Time to accuracy (whole epochs, --steps 0), with options tried at one world size only (--also):

    python -m hvd_cifar.bench --model vgg11 --dataset digits --batch-size 32 --epochs 6 --steps 0 \
        --target-acc 0.95 --np 1 2 4 --sync horovod ddp mpi-gather-scatter \
        --also "--np 2 --sync horovod --compression fp16" --also "--np 2 --sync horovod --accumulation-steps 4"

Options taking several values (--np, --sync, --model, --batch-size, --compression,
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
  sweep-state.json    the options and every finished job, after each job (what --resume reads)
Numbers are made by ``hvd_cifar.report`` (means over epochs after the first when there are two
or more; speedup from img/s against np=1 of the same configuration in the same round; time to
--target-acc from each run's eval.json, and its speedup against np=1 when both reached it). A
job that fails (non-zero exit, a Slurm job that ends otherwise or that sbatch refuses, or no end
within --timeout seconds: then the job is stopped or cancelled) is a failed round with its
stderr tail in scaling.md; the sweep goes on.

compute: auto is decided once, on the first job that finishes, and that setting is passed to the
others (--compute SETTING), so that the sweep compares like with like (--same-compute false: each
job decides for itself). SIGINT, SIGTERM or SIGHUP stops the running job and writes the outputs
from every job that finished, marked interrupted; OUT/sweep-state.json keeps them, and

    python -m hvd_cifar.bench --resume OUT        # or the same command with --out OUT

runs the rest (the stopped job again from its start). Exit status: 0 when every job ran, 1 when
some failed, 2 for bad options, 128 + the signal's number when interrupted (130: SIGINT).
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import signal
import sys
import threading

from hvd_cifar.analysis.summary import add_speedup
from hvd_cifar.analysis.sweep import by_configuration, collect, comparisons, first_error, target_note, unresolved
from hvd_cifar.analysis.sweep_outputs import FIGURES, SweepFacts, header, write_outputs, write_results_file
from hvd_cifar.analysis.sweep_state import FILE as STATE_FILE
from hvd_cifar.analysis.sweep_state import Progress, SweepState, partial_rounds, read
from hvd_cifar.analysis.tabulate import OneLineParser
from hvd_cifar.core import config as config_mod
from hvd_cifar.core.argtypes import boolean, fraction, margin, non_negative, positive
from hvd_cifar.core.errors import ReportError
from hvd_cifar.core.files import RunError
from hvd_cifar.launch.commands import Terminated
from hvd_cifar.launch.runners import LocalRunner, SlurmRunner
from hvd_cifar.launch.sweep_jobs import (BenchError, add_sweep_options, also_sweep, check_compressions, configurations,
                                         extra_flags, run_name, sweep_values, train_flags, unique_name)
from hvd_cifar.measure.rounds import Disturbance, rotated

# A configuration's identity (a job's row keys); comparisons pair jobs of the same identity.
KEYS = ("model", "sync", "batch_size", "compression", "accumulation_steps", "freeze", "world_size", "dataset")
MAX_ROUNDS = 50  # --resolve adds rounds up to this many, whatever the budget


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(prog="python -m hvd_cifar.bench", description=__doc__.split("\n\n")[0],
                      epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sweep_options(p, defaults=True)
    p.add_argument("--also", action="append", default=[], metavar='"OPTIONS"',
                   help='one more sweep, e.g. "--np 2 --compression fp16": the sweep options given '
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
    p.add_argument("--same-compute", type=boolean, default=True,
                   help="compute: auto decided on the first job that finishes, its setting passed to the others "
                        "as --compute (default true; false: each job decides for itself)")
    p.add_argument("--resume", metavar="OUT",
                   help="continue the sweep in OUT with its own options: the jobs it finished are kept, the rest "
                        "run (give it alone)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    args.np = sorted(set(args.np))  # np=1 first, so a group's baseline runs before the others
    try:
        args.also = [also_sweep(sweep_values(args), text) for text in args.also]
    except BenchError as exc:
        p.error(str(exc))
    return args


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


def job_line(row: dict, earlier: bool) -> str:
    """The progress line's end: how the job ended (and that it ended before this start)."""
    return (f"{row['status']} ({'earlier, ' if earlier else ''}{row['seconds']:.1f} s)"
            f"{' disturbed' if row.get('disturbed') else ''}{' ' + row['error'] if row['error'] else ''}"
            f"{target_note(row)}")


def run_round(configs: list[dict], k: int, seed: int | None, args, jobs: list[dict], progress: Progress) -> None:
    """Round ``k``: every configuration once, in the order rotated by k - 1, each job's row added
    to ``jobs`` as it ends; a disturbed job is run again at the round's end (--repeat-disturbed),
    the repeat counted in its place."""
    first = len(jobs)
    for i, cfg in enumerate(rotated(configs, k - 1), 1):
        print(f"[round {k}, {i}/{len(configs)}] {run_name(cfg)} ... ", end="", flush=True)
        row, earlier = progress.job(cfg, k, seed)
        jobs.append(row)
        print(job_line(row, earlier), flush=True)
        progress.keep(jobs)
    for row in [r for r in jobs[first:] if r.get("disturbed")] if args.repeat_disturbed else []:
        cfg = {key: row[key] for key in configs[0]}
        print(f"[round {k}, again] {run_name(cfg)} (disturbed) ... ", end="", flush=True)
        again, earlier = progress.job(cfg, k, seed, again=True)
        row["superseded"] = True
        jobs.append(again)
        print(job_line(again, earlier), flush=True)
        progress.keep(jobs)


def add_round_speedups(jobs: list[dict]) -> None:
    """Each job's speedup against np=1 of its round (paired within the round)."""
    for k in sorted({j["round"] for j in jobs}):
        add_speedup([j for j in jobs if j["round"] == k and not j.get("superseded")])


def seed_of(args, k: int) -> int | None:
    """Round k's seed: the k-th of --seeds, then one more than the last for each round --resolve adds."""
    if not args.seeds:
        return None
    return args.seeds[k - 1] if k <= len(args.seeds) else args.seeds[-1] + k - len(args.seeds)


def compare_jobs(jobs: list[dict], args) -> list:
    """Every comparison of the sweep (analysis.sweep.comparisons): paired by round, or by seed
    (only the rounds or seeds both configurations have a good job in)."""
    test_size = next((j["test_images"] for j in jobs if j.get("test_images")), 0)
    return comparisons(jobs, KEYS, order_of(args), pair_by="seed" if args.seeds else "round",
                       accuracy=bool(args.seeds), test_size=test_size)


def sweep(configs: list[dict], args, runner, extra, dirs, state: SweepState | None = None,
          signals: StopSignals | None = None) -> tuple[list[dict], int]:
    """--repeats rounds (or one per seed); with --resolve, more until every throughput comparison
    is resolved or --budget minutes would be passed; the jobs ``state`` holds are taken, not run
    again; ``signals`` held once they end. Returns (every job's row, the signal that stopped the
    sweep, which stops the job it was running: 0 when none did)."""
    progress = Progress(state or SweepState(None, [], {}), KEYS, args.same_compute,
                        lambda cfg, k, seed, held: run_job(cfg, k, seed, args, runner, extra + held, dirs, progress.taken))
    jobs: list[dict] = []
    k = 0
    rounds = len(args.seeds) if args.seeds else args.repeats
    try:
        while True:
            k += 1
            run_round(configs, k, seed_of(args, k), args, jobs, progress)
            if k < rounds:
                continue
            if not args.resolve or k >= MAX_ROUNDS or not unresolved(compare_jobs(jobs, args), args.resolve):
                break
            if progress.spent() * (k + 1) / k > args.budget * 60:  # the next round, at the mean round's length, would overrun
                print(f"bench: --budget {args.budget} min ends the rounds after {k}", flush=True)
                break
            print(f"bench: unresolved against ±{args.resolve:.0%} after {k} rounds; one more", flush=True)
        if signals:
            signals.hold()
    except (KeyboardInterrupt, Terminated) as exc:
        if signals:
            signals.hold()
        signum = signal.SIGINT if isinstance(exc, KeyboardInterrupt) else signal.Signals(exc.code - 128)
        print(f"interrupted ({signum.name}); the job that was running is stopped", flush=True)
        return jobs, int(signum)
    return jobs, 0


def order_of(args) -> dict[str, list]:
    """Each swept option's values in the order asked (the first is a comparison's baseline)."""
    order = {key: [] for key in KEYS}
    for sweep_ in (sweep_values(args), *args.also):
        for key, values in sweep_.items():
            order[key] += [v for v in values if v not in order[key]]
    order["world_size"] = sorted(order["world_size"])
    order["dataset"] = [args.dataset]
    return order


# ----------------------------------------------------------------------------- the command
def resumed(args, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """With --resume OUT: the options OUT's sweep was started with, its output in OUT; else as given."""
    if not args.resume:
        return args, argv
    others = [a for a in argv if a not in ("--resume", args.resume) and not a.startswith("--resume=")]
    if others:
        raise BenchError(f"--resume: give it alone (the sweep goes on with its own options), not with {others[0]}")
    state = read(args.resume)
    if state is None:
        raise BenchError(f"--resume: {args.resume} holds no sweep to continue (no {STATE_FILE})")
    saved = parse_args(state.argv)
    saved.out = args.resume
    return saved, state.argv


def sweep_settings(args) -> dict:
    """The options that make a sweep this one: all but where it goes and how it was started."""
    return {k: v for k, v in vars(args).items() if k not in ("out", "resume", "dry_run")}


def prepare(args, argv: list[str]):
    """The checked options: (args, argv, the trainer flags of --extra, the runner, the output
    folder, the sweep's state: OUT's when it holds this sweep; None for a dry run)."""
    args, argv = resumed(args, argv)
    extra = extra_flags(args.extra)
    check_compressions(configurations(args), extra)
    runner = make_runner(args)
    if args.hostfile and not os.path.isfile(args.hostfile):
        raise BenchError(f"--hostfile: {args.hostfile} does not exist")
    if args.hostfile:
        args.hostfile = os.path.abspath(args.hostfile)  # jobs run from the project root
    out = os.path.abspath(args.out or os.path.join("logs", f"bench-{dt.datetime.now():%Y%m%d-%H%M%S}"))
    if args.dry_run:
        return args, argv, extra, runner, out, None
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    return args, argv, extra, runner, out, SweepState.begin(out, argv, sweep_settings(args))


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP over a sweep (each one this process does not ignore): while the
    jobs run, raised where the process is (KeyboardInterrupt, launch.commands.Terminated), so that
    the running job is stopped on the way out; after the first, or once ``hold()`` is called, kept
    in ``came`` while the outputs are written whole, the process exiting by the first after."""

    def __init__(self):
        self.raising, self.came, self.previous = True, [], {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(signum) is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
                    self.previous[signum] = signal.signal(signum, self._came)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _came(self, signum: int, frame) -> None:
        if not self.raising:
            self.came.append(signum)
            return
        self.raising = False
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(128 + signum)

    def hold(self) -> None:
        self.raising = False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        args, argv, extra, runner, out, state = prepare(args, argv)
    except (BenchError, ReportError) as exc:
        print(f"hvd_cifar: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"hvd_cifar: error: --out: cannot create {exc.filename} ({exc.strerror})", file=sys.stderr)
        return 2
    runs_dir, logs_dir = os.path.join(out, "runs"), os.path.join(out, "logs")
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
    if state.jobs:
        print(f"bench: continuing the sweep in {out}: {len(state.jobs)} job(s) that finished before are kept", flush=True)
    with StopSignals() as signals:
        try:
            jobs, signum = sweep(configs, args, runner, extra, (runs_dir, logs_dir), state, signals)
            code = finish(jobs, signum, configs, args, (runner, argv, out, state))
        except RunError as exc:  # the state or an output that cannot be written
            print(f"hvd_cifar: error: {exc}", file=sys.stderr)
            return 2
    if signals.came and not signum:
        print(f"bench: {signal.Signals(signals.came[0]).name} came while the outputs were written; they are whole",
              flush=True)
        return 128 + signals.came[0]
    return code


def finish(jobs: list[dict], signum: int, configs: list[dict], args, where: tuple) -> int:
    """Every output from the jobs that finished (marked interrupted when ``signum`` stopped the
    sweep, its partial rounds said); the exit status."""
    runner, argv, out, state = where
    add_round_speedups(jobs)
    partial = partial_rounds(jobs, configs, KEYS)
    for job in jobs:
        job["partial_round"] = job["round"] in partial
    state.save(jobs, state.elapsed_s)
    found = compare_jobs(jobs, args)
    left = unresolved(found, args.resolve) if args.resolve else []
    stopped = {"signal": signal.Signals(signum).name, "exit_status": 128 + signum,
               "resume": f"python -m hvd_cifar.bench --resume {out}"} if signum else None
    facts = SweepFacts(runner.describe(), argv, stopped, partial, state.compute, state.compute_from)
    table = write_outputs(by_configuration(jobs, KEYS, FIGURES), jobs, found, header(args, facts, jobs), out,
                          args.resolve, left)
    results_file = write_results_file(jobs, args, out, facts, lambda job: run_name({key: job[key] for key in KEYS}))
    print("\n" + table)
    for c in found:
        print(c.sentence)
    print(f"bench: table in {os.path.join(out, 'scaling.md')}, scaling.csv and runs.csv, every round in "
          f"{results_file}{', plot in scaling.png' if any(r['status'] == 'ok' for r in jobs) else ''}")
    if signum:
        print(f"bench: interrupted by {stopped['signal']} after {len(jobs)} job(s); "
              f"`{stopped['resume']}` runs the rest", flush=True)
        return 128 + signum
    return 0 if all(r["status"] == "ok" or r.get("superseded") for r in jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
