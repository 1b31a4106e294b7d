"""What ``hvd_cifar.bench`` leaves in its output folder: scaling.md (the table, each cell the
median over the rounds with its 95 % interval; the comparisons as sentences; unstable
configurations, disturbed and failed jobs), scaling.csv (one row per configuration: medians,
FIGURE_low and FIGURE_high), runs.csv (one row per job, every round) and scaling.png (img/s
and epoch time against np, with the intervals as error bars)."""
from __future__ import annotations

import os
from dataclasses import replace

from hvd_cifar.analysis.plots import plot_scaling
from hvd_cifar.analysis.run_tables import (
    TARGET_CSV_COLUMNS,
    TARGET_NOTE,
    with_target_columns,
)
from hvd_cifar.analysis.summary import MB
from hvd_cifar.analysis.sweep import Comparison
from hvd_cifar.analysis.tabulate import Column, markdown_table, num, write_csv
from hvd_cifar.measure import stats

STDERR_TAIL_LINES = 20
# The time-to-target columns (run_tables.TARGET_COLUMNS) go between these and the status when there
# is a target, beside img/s and its scaling.
SCALING_COLUMNS = [
    Column("np", "world_size"), Column("sync", "sync"), Column("model", "model"), Column("dataset", "dataset"),
    Column("batch/rank", "batch_size"), Column("fp16 allreduce", "fp16_allreduce"),
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
               Column("disturbed", "disturbed"), Column("superseded", "superseded"),
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
    with open(os.path.join(out, "scaling.md"), "w") as f:
        f.write("\n".join(lines))
    return table

