"""What ``hvd_cifar.bench`` leaves in its output folder: scaling.md (how the sweep ran, whether it
was interrupted and which rounds it left partial, the compute setting it held; the table, each
cell the median over the rounds with its 95 % interval; the comparisons as sentences; unstable
configurations, disturbed and failed jobs), scaling.csv (one row per configuration: medians,
FIGURE_low and FIGURE_high), runs.csv (one row per job, every round), bench.json (every job as
a round of a results file, hvd_cifar.measure.results) and scaling.png (img/s and epoch time
against np, with the intervals as error bars). Each is written whole or not at all."""
from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
from dataclasses import dataclass, replace
from typing import Callable

from hvd_cifar.analysis.plots import plot_scaling
from hvd_cifar.analysis.run_tables import (
    TARGET_CSV_COLUMNS,
    TARGET_NOTE,
    with_target_columns,
)
from hvd_cifar.analysis.summary import MB
from hvd_cifar.analysis.sweep import Comparison
from hvd_cifar.analysis.tabulate import Column, markdown_table, num, write_csv
from hvd_cifar.core.files import write_text
from hvd_cifar.measure import stats
from hvd_cifar.measure.results import Figure, Results

STDERR_TAIL_LINES = 20
# The time-to-target columns (run_tables.TARGET_COLUMNS) go between these and the status when there
# is a target, beside img/s and its scaling.
SCALING_COLUMNS = [
    Column("np", "world_size"), Column("sync", "sync"), Column("model", "model"), Column("dataset", "dataset"),
    Column("batch/rank", "batch_size"), Column("compression", "compression"),
    Column("accum steps", "accumulation_steps"), Column("freeze", "freeze"),
    num("epoch time (s)", "mean_epoch_time_s", ".3f"),
    num("step time (ms)", "step_time_s", ".2f", 1e-3),
    num("median step time (ms)", "step_time_median_s", ".2f", 1e-3),
    num("sync time (ms/step)", "sync_time_per_step_s", ".2f", 1e-3),
    num("bytes/step/rank (MB)", "bytes_per_step_per_rank", ".4f", MB),
    num("final test acc (%)", "final_test_acc", ".2f", 0.01),
    num("img/s", "images_per_s", ".1f"),
    num("speedup vs np=1", "speedup", ".2f"),
    num("efficiency", "efficiency", ".2f"),
]
FIGURES = tuple(c.key for c in SCALING_COLUMNS[8:]) + ("epochs_to_target", "time_to_target_s", "target_speedup")
STATUS_COLUMN = Column("status", "status")
ROUNDS_COLUMN = Column("rounds", "rounds")
CSV_COLUMNS = SCALING_COLUMNS + TARGET_CSV_COLUMNS + [
    STATUS_COLUMN, ROUNDS_COLUMN, Column("unstable", "unstable"), Column("epochs", "epochs"),
    Column("run_dir", "run_dir"), Column("error", "error"), Column("stderr", "stderr_file"),
    Column("command", "command")]
JOB_COLUMNS = [Column("round", "round"), Column("seed", "seed"), *SCALING_COLUMNS, *TARGET_CSV_COLUMNS, STATUS_COLUMN,
               Column("partial_round", "partial_round"), Column("compute", "compute"),
               Column("compute_auto", "compute_auto"), Column("disturbed", "disturbed"), Column("superseded", "superseded"),
               Column("steal_share", "steal_share"), Column("foreign_cpus", "foreign_cpus"),
               Column("load_average", "load_average"), Column("run", "run"), Column("elapsed_s", "elapsed_s"),
               Column("run_dir", "run_dir"), Column("error", "error"), Column("stderr", "stderr_file"),
               Column("command", "command")]


def with_interval(column: Column) -> Column:
    """A numeric column whose cell is the median and, over two or more rounds, (low–high)."""
    if not column.numeric or column.row_fmt is not None:
        return column

    def cell(row: dict) -> str:
        middle = column.fmt(row[column.key]) if row.get(column.key) is not None else "-"
        low, high = row.get(f"{column.key}_low"), row.get(f"{column.key}_high")
        if low is None or high is None or column.fmt(low) == column.fmt(high):  # one round, or all alike
            return middle
        return f"{middle} ({column.fmt(low)}–{column.fmt(high)})"
    return replace(column, row_fmt=cell)


def csv_columns(rows: list[dict]) -> list[Column]:
    """CSV_COLUMNS, each numeric figure followed by its FIGURE_low and FIGURE_high."""
    columns = []
    for c in CSV_COLUMNS:
        columns.append(c)
        if c.numeric and c.key in FIGURES:
            columns += [Column(f"{c.key}_low", f"{c.key}_low"), Column(f"{c.key}_high", f"{c.key}_high")]
    return columns


def tail(path: str, lines: int = STDERR_TAIL_LINES) -> str:
    try:
        with open(path, errors="replace") as f:
            return "\n".join(f.read().splitlines()[-lines:])
    except OSError:
        return ""


def comparison_lines(found: list[Comparison], margin: float, unresolved_left: list[Comparison]) -> list[str]:
    if not found:
        return []
    lines = ["## Comparisons\n",
             "Each configuration against the one that differs from it in one swept option, set to that "
             "option's first value; img/s as the geometric mean of the ratios paired within each round, "
             "accuracy as the mean difference paired by seed; 95 % t-intervals (scipy.stats).\n",
             *[f"- {c.sentence}" for c in found], ""]
    for c in unresolved_left:
        more = stats.rounds_needed(c.interval, margin)
        lines.append(f"- unresolved against ±{margin:.0%}: {c.label} "
                     f"({f'about {more} rounds in all would resolve it at this spread' if more > 0 else 'one round'})")
    return lines + ([""] if unresolved_left else [])


def compute_lines(jobs: list[dict]) -> list[str]:
    """A line under the table when the jobs computed in different settings (each decided its own
    compute: auto, --same-compute false), naming which ran in which."""
    ran: dict[str, list[str]] = {}
    for job in jobs:
        if job.get("status") == "ok" and not job.get("superseded") and job.get("compute"):
            ran.setdefault(job["compute"], []).append(job["run"])
    if len(ran) < 2:
        return []
    where = "; ".join(f"{setting} in {', '.join(runs)}" for setting, runs in ran.items())
    return [f"compute differs between this sweep's jobs: {where}; the speed-ups and comparisons between them "
            f"include that difference.\n"]


def noise_lines(configs: list[dict], jobs: list[dict]) -> list[str]:
    lines = []
    for row in configs:
        if row.get("unstable"):
            lines.append(f"- unstable: np={row['world_size']} {row['sync']} {row['model']} b{row['batch_size']}: "
                         f"img/s varies by more than {stats.UNSTABLE_CV:.0%} of its mean over its rounds")
    for job in jobs:
        if job.get("disturbed"):
            lines.append(f"- disturbed: {job['run']} (steal {job.get('steal_share', 0):.1%} of the CPUs, other "
                         f"processes {job.get('foreign_cpus', 0):.2f} cores)"
                         f"{'; run again, the repeat counted' if job.get('superseded') else ''}")
    return (["## Noise\n", *lines, ""]) if lines else []


def write_outputs(configs: list[dict], jobs: list[dict], found: list[Comparison], header: list[str], out: str,
                  margin: float = 0.0, unresolved_left: list[Comparison] | None = None) -> str:
    """scaling.md, scaling.csv, runs.csv and scaling.png in ``out``; the table printed."""
    columns = [with_interval(c) for c in with_target_columns(SCALING_COLUMNS, configs)]
    table = markdown_table([*columns, ROUNDS_COLUMN, STATUS_COLUMN], configs)
    write_csv(os.path.join(out, "scaling.csv"), csv_columns(configs), configs)
    write_csv(os.path.join(out, "runs.csv"), JOB_COLUMNS, jobs)
    ok = [r for r in configs if r["status"] == "ok" or r.get("n_rounds")]
    if ok:
        plot_scaling(ok, os.path.join(out, "scaling.png"))
    lines = [*header, *([TARGET_NOTE] if any(r.get("target_acc") for r in configs) else []), table]
    lines += compute_lines(jobs)
    lines += ["![scaling](scaling.png)\n"] if ok else ["No configuration finished; no plot.\n"]
    lines += comparison_lines(found, margin, unresolved_left or []) + noise_lines(configs, jobs)
    failed = [r for r in jobs if r["status"] != "ok"]
    if failed:
        lines.append("## Failed jobs\n")
        for r in failed:
            lines += [f"### {r['run']}: {r['status']}\n", f"`{r['command']}`\n",
                      *([f"Error: {r['error']}\n"] if r.get("error") else []),
                      f"Last lines of stderr (all of it: `{r['stderr_file']}`):\n",
                      "```", tail(r["stderr_file"]) or "(empty)", "```\n"]
    write_text(os.path.join(out, "scaling.md"), "\n".join(lines))
    return table


@dataclass
class SweepFacts:
    """What scaling.md's header and bench.json say of how the sweep ran, beside its jobs."""
    where: str                 # the runner's description
    argv: list[str]            # the options it was started with
    stopped: dict | None       # the signal that interrupted it: signal, exit_status, resume (None: it ended)
    partial: list[int]         # the rounds some configuration's job is missing from
    compute: str | None        # the setting held across the jobs ("" / None: none held)
    compute_from: str          # the job whose compute: auto chose it


def status_lines(facts: SweepFacts, jobs: list[dict]) -> list[str]:
    """scaling.md's lines on an interruption, partial rounds and the compute setting held."""
    lines = []
    if facts.stopped:
        lines.append(f"**Interrupted** by {facts.stopped['signal']}: these tables hold the {len(jobs)} job(s) that "
                     f"finished; `{facts.stopped['resume']}` runs the rest.\n")
    if facts.partial:
        lines.append(f"Partial round(s) {', '.join(map(str, facts.partial))}: some configurations have no job "
                     f"there; comparisons pair only the rounds both sides ran in.\n")
    if facts.compute:
        lines.append(f"compute: auto chose {facts.compute} in {facts.compute_from}; the other jobs run with "
                     f"`--compute {facts.compute}` (`--same-compute false`: each job decides).\n")
    return lines


def header(args, facts: SweepFacts, jobs: list[dict]) -> list[str]:
    rounds = max((j["round"] for j in jobs), default=0)
    return ["# Scaling sweep\n",
            f"`python -m hvd_cifar.bench {shlex.join(facts.argv)}`\n",
            f"{dt.datetime.now().isoformat(timespec='seconds')}; {facts.where}; "
            f"{args.epochs} {'whole epoch(s)' if not args.steps else f'epoch(s) of {args.steps} steps per rank'}; "
            f"data set {args.dataset}; {rounds} round(s), each configuration once per round in a rotated order"
            f"{f', round k at seed k of {args.seeds}' if args.seeds else ''}"
            f"{f'; target test accuracy {args.target_acc:.2%}' if args.target_acc else ''}.\n",
            *status_lines(facts, jobs),
            "Each cell: the median over the configuration's rounds and, with two or more, its 95 % interval "
            "(t-interval of the logarithms; scipy.stats). Per job, times, img/s (all ranks) and bytes are means "
            "over the epochs after the first when there are two or more; the median step time is the median of "
            "each epoch's per-step wall times (rank 0). Step and sync times are per training step (sync: mean over "
            "ranks). Bytes: gradient bytes one rank sends per step. Speedup: img/s over img/s of np=1 with the same "
            "other settings in the same round; efficiency: speedup / np.\n"]


def write_results_file(jobs: list[dict], args, out: str, facts: SweepFacts, label: Callable[[dict], str]) -> str:
    """Every job into OUT/bench.json (measure.results: the same schema as the project's benchmarks),
    ``label``: a job's configuration's name; whether the sweep was interrupted, its partial rounds."""
    results = Results("bench", argparse.Namespace(**{**vars(args), "results": out, "tag": ""}),
                      {key: Figure(key) for key in FIGURES}, argv=facts.argv)
    for job in jobs:
        info = {k: job[k] for k in ("seed", "disturbed", "superseded", "partial_round", "compute", "steal_share",
                                    "foreign_cpus", "run") if job.get(k) is not None}
        if job.get("superseded"):  # kept, left out of the summary: its repeat counts
            results.fail(job["round"], label(job), "disturbed; run again, the repeat counted", **info)
        elif job["status"] == "ok":
            results.add(job["round"], label(job), {k: job[k] for k in FIGURES if isinstance(job.get(k), (int, float))},
                        **info)
        else:
            results.fail(job["round"], label(job), job["status"], **info)
    results.data.update(interrupted=facts.stopped, partial_rounds=facts.partial,
                        compute_held={"setting": facts.compute, "chosen_in": facts.compute_from} if facts.compute
                        else None)
    return results.write()

