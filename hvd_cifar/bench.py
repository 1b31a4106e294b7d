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

Everything goes under --out (default logs/bench-YYYYmmdd-HHMMSS):
  runs/NAME/          the run folders (metrics.jsonl, ...)
  logs/NAME.stdout.txt, logs/NAME.stderr.txt   each job's output
  scaling.md, scaling.csv, scaling.png          the table and the plot
Numbers are made by ``hvd_cifar.report`` (means over epochs after the first when there are two
or more; speedup from img/s against np=1 of the same configuration; time to --target-acc from
each run's eval.json, and its speedup against np=1 when both reached it). A configuration that
fails (non-zero exit, a Slurm job that ends otherwise or that sbatch refuses, or no end
within --timeout seconds: then the job is stopped or cancelled) is a row with status
``failed (...)`` and its stderr tail in scaling.md; the sweep goes on. Exit status: 0 when
every configuration ran, 1 when some failed, 2 for bad options.
"""
from __future__ import annotations

import argparse
import datetime as dt
import itertools
import os
import re
import shlex
import sys

from hvd_cifar.analysis.plots import plot_scaling
from hvd_cifar.analysis.run_tables import TARGET_CSV_COLUMNS, TARGET_NOTE, with_target_columns
from hvd_cifar.analysis.summary import MB, add_speedup, summarize
from hvd_cifar.analysis.tabulate import Column, OneLineParser, markdown_table, num, write_csv
from hvd_cifar.core import config as config_mod
from hvd_cifar.core.errors import ConfigError
from hvd_cifar.core.errors import ReportError
from hvd_cifar.launch.runners import Ended, LocalRunner, SlurmRunner
from hvd_cifar.runfolder.reader import load_run

# Swept options: (bench flag / row key, trainer flag)
SWEEP = (("model", "--model"), ("sync", "--sync"), ("batch_size", "--batch-size"),
         ("fp16_allreduce", "--fp16-allreduce"), ("accumulation_steps", "--accumulation-steps"),
         ("freeze", "--freeze"), ("world_size", None))
# Trainer keys the bench sets itself; --extra may not override them or the table would lie.
OWNED_KEYS = ("model", "sync", "batch_size", "fp16_allreduce", "accumulation_steps", "freeze",
              "dataset", "epochs", "max_steps_per_epoch", "target_acc", "log_dir", "run_name", "resume",
              "progress")
STDERR_TAIL_LINES = 20
# The trainer's own one-line verdict, without the "[1,0]<stderr>:" tags launchers add around it.
ERROR_LINE = re.compile(r"hvd_cifar: (?:error: |rank \d+ failed).*?(?=\[\d+,\d+\]<std|$)")


class BenchError(RuntimeError):
    """A bad option; the message is one line naming it."""


# ----------------------------------------------------------------------------- options
def boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def integer(minimum: int):
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {n}")
        return n
    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


positive, non_negative = integer(1), integer(0)


def freeze_value(text: str) -> int | str:
    """A freeze setting: a number of leading frozen blocks, or auto (config's freeze: auto)."""
    if text == "auto":
        return text
    try:
        return non_negative(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a number of blocks (>= 0) or auto, got {text!r}") from None


def fraction(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= x <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1] (a fraction, e.g. 0.95), got {text}")
    return x


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


def tail(path: str, lines: int = STDERR_TAIL_LINES) -> str:
    try:
        with open(path, errors="replace") as f:
            return "\n".join(f.read().splitlines()[-lines:])
    except OSError:
        return ""


def first_error(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            for line in f:
                found = ERROR_LINE.search(line.rstrip("\n"))
                if found:
                    return found.group(0).strip()
    except OSError:
        pass
    return ""


def collect(cfg: dict, run_dir: str, ended: Ended, timeout: int) -> dict:
    """The table row of one job: its configuration, status and (when it ran) its numbers."""
    row = dict(cfg, run=os.path.basename(run_dir), run_dir=run_dir)
    if ended.why:
        row["status"] = f"failed ({ended.why})"
    elif ended.code is None:
        row["status"] = f"failed (timeout after {timeout} s)"
    elif ended.code != 0:
        row["status"] = f"failed (exit {ended.code})"
    else:
        try:
            summary = summarize(load_run(run_dir))
        except ReportError as exc:
            row["status"] = f"failed (exit 0 but {exc})"
        else:
            row.update({k: v for k, v in summary.items() if k not in cfg})
            row["status"] = "ok"
    return row


def target_note(row: dict) -> str:
    """The progress line's word on the target: when (and in which epoch) it was reached."""
    if not row.get("target_acc"):
        return ""
    if row.get("time_to_target_s") is None:
        return f"; {row['target_acc']:.2%} not reached"
    return f"; {row['target_acc']:.2%} reached in {row['time_to_target_s']:.1f} s (epoch {row['epochs_to_target']})"


# ----------------------------------------------------------------------------- the table
# The time-to-target columns (run_tables.TARGET_COLUMNS) go between these and the status when there
# is a target, beside img/s and its scaling.
SCALING_COLUMNS = [
    Column("np", "world_size"), Column("sync", "sync"), Column("model", "model"), Column("dataset", "dataset"),
    Column("batch/rank", "batch_size"), Column("fp16 allreduce", "fp16_allreduce"),
    Column("accum steps", "accumulation_steps"), Column("freeze", "freeze"),
    num("epoch time (s)", "mean_epoch_time_s", ".3f"),
    num("step time (ms)", "step_time_s", ".2f", 1e-3),
    num("sync time (ms/step)", "sync_time_per_step_s", ".2f", 1e-3),
    num("bytes/step/rank (MB)", "bytes_per_step_per_rank", ".4f", MB),
    num("final test acc (%)", "final_test_acc", ".2f", 0.01),
    num("img/s", "images_per_s", ".1f"),
    num("speedup vs np=1", "speedup", ".2f"),
    num("efficiency", "efficiency", ".2f"),
]
STATUS_COLUMN = Column("status", "status")
CSV_COLUMNS = SCALING_COLUMNS + TARGET_CSV_COLUMNS + [
    STATUS_COLUMN, Column("run", "run"), Column("epochs", "epochs"), Column("elapsed_s", "elapsed_s"),
    Column("run_dir", "run_dir"), Column("error", "error"), Column("stderr", "stderr_file"),
    Column("command", "command")]


def write_outputs(rows: list[dict], args, runner, out: str, argv: list[str]) -> str:
    add_speedup(rows)
    table = markdown_table([*with_target_columns(SCALING_COLUMNS, rows), STATUS_COLUMN], rows)
    write_csv(os.path.join(out, "scaling.csv"), CSV_COLUMNS, rows)
    ok = [r for r in rows if r["status"] == "ok"]
    if ok:
        plot_scaling(ok, os.path.join(out, "scaling.png"))
    lines = ["# Scaling sweep\n",
             f"`python -m hvd_cifar.bench {shlex.join(argv)}`\n",
             f"{dt.datetime.now().isoformat(timespec='seconds')}; {runner.describe()}; "
             f"{args.epochs} {'whole epoch(s)' if not args.steps else f'epoch(s) of {args.steps} steps per rank'}; "
             f"data set {args.dataset}"
             f"{f'; target test accuracy {args.target_acc:.2%}' if args.target_acc else ''}.\n",
             "Times, img/s (all ranks) and bytes are means over the epochs after the first when there are "
             "two or more. Step and sync times are per training step (sync: mean over ranks). Bytes: gradient "
             "bytes one rank sends per step. Speedup: img/s over img/s of np=1 with the same other "
             "settings; efficiency: speedup / np.\n",
             *([TARGET_NOTE] if args.target_acc else []),
             table]
    lines += ["![scaling](scaling.png)\n"] if ok else ["No configuration finished; no plot.\n"]
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        lines.append("## Failed configurations\n")
        for r in failed:
            lines += [f"### {r['run']}: {r['status']}\n", f"`{r['command']}`\n",
                      *([f"Error: {r['error']}\n"] if r.get("error") else []),
                      f"Last lines of stderr (all of it: `{r['stderr_file']}`):\n",
                      "```", tail(r["stderr_file"]) or "(empty)", "```\n"]
    path = os.path.join(out, "scaling.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return table


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
    taken: set[str] = set()
    rows, interrupted = [], False
    print(f"bench: {len(configs)} configuration(s), output in {out}", flush=True)
    for i, cfg in enumerate(configs, 1):
        name = unique_name(runs_dir, run_name(cfg), taken)
        cmd = runner.command(cfg["world_size"], train_flags(cfg, args, runs_dir, name, extra))
        if args.dry_run:
            print(shlex.join(cmd))
            continue
        stdout_file = os.path.join(logs_dir, f"{name}.stdout.txt")
        stderr_file = os.path.join(logs_dir, f"{name}.stderr.txt")
        print(f"[{i}/{len(configs)}] {name} ... ", end="", flush=True)
        try:
            ended = runner.run(cmd, stdout_file, stderr_file, args.timeout)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            interrupted = True
            break
        row = collect(cfg, os.path.join(runs_dir, name), ended, args.timeout)
        row.update(command=shlex.join(cmd), stderr_file=stderr_file,
                   error=first_error(stderr_file) if row["status"] != "ok" else "")
        rows.append(row)
        print(f"{row['status']} ({ended.seconds:.1f} s){' ' + row['error'] if row['error'] else ''}"
              f"{target_note(row)}", flush=True)
    if args.dry_run:
        return 0

    table = write_outputs(rows, args, runner, out, argv)
    print("\n" + table)
    print(f"bench: table in {os.path.join(out, 'scaling.md')} and scaling.csv"
          f"{', plot in scaling.png' if any(r['status'] == 'ok' for r in rows) else ''}")
    if interrupted:
        return 130
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
