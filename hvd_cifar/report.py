"""Reports, tables and figures made from run folders (metrics.jsonl, config.yaml, eval.json).

One run: a Markdown report and six figures, written to RUN_DIR/report/ unless --out says
otherwise::

    python -m hvd_cifar.report logs/RUN
    python -m hvd_cifar.report logs/RUN --out /tmp/run-report

Several runs: a comparison table (compare.md, compare.csv), overlaid curves and, where the
inputs hold one configuration at several world sizes, a scaling plot. --out is required
here (there is no obvious folder to put a comparison in)::

    python -m hvd_cifar.report logs/np1 logs/np2 logs/np2-fp16 --out logs/compare-np

How the numbers are made (the same for every table and for ``hvd_cifar.bench``):
  * "steady-state" epochs are all epochs but the first one recorded, when a run has two or
    more; the first epoch holds the warm-up (allocator, first allreduces, thread pools) and
    is slower. A run with one epoch has only that one. Means over epochs use these epochs.
  * img/s over several epochs is (images) / (seconds), summed over the steady-state epochs,
    counting the images of all ranks.
  * speedup = img/s of a run / img/s of the run with world size 1 of the same configuration
    (model, dataset, batch size per rank, sync, fp16_allreduce, accumulation_steps, freeze)
    among the inputs (the first one given, if several); efficiency = speedup / world size.
    Throughput rather than epoch time, because with --max-steps-per-epoch each rank runs the
    same number of steps whatever the world size, so an epoch holds N times more images.
  * per-rank and per-host figures (``{rank or host: value}`` in metrics.jsonl: CPU, memory, NIC
    counters) read as their mean over the ranks or hosts in the tables; the resources figure
    draws each rank's own line.
  * bytes are the gradient bytes one rank sends (``comm_bytes_per_rank`` in metrics.jsonl,
    counted by the sync method), 1 MB = 10^6 bytes.
  * time to target = ``elapsed_s`` (wall time since the run started: set-up, training and
    evaluation, continued across resumes) of the first epoch whose test accuracy reached the
    run's ``target_acc``, and epochs to target its count (eval.json's ``time_to_target_s`` and
    ``epochs_to_target``; for a run without eval.json, found in metrics.jsonl the same way).
    Time-to-target speedup = np=1's time to target / the run's, against the np=1 run of the
    same configuration and target, and only when both reached the target.

Bad input (no metrics.jsonl, an empty or corrupt one), and an output file that cannot be
written (no space left, read-only, permission), end with one line ``hvd_cifar: error: ...`` on
stderr and exit status 2. Each output file is written whole or not at all (temp + rename).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import textwrap
from typing import Any, Callable, Iterable

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from hvd_cifar import runlog, runs
from hvd_cifar.tables import Column, OneLineParser, fmt_number, markdown_table, num, text, write_csv  # noqa: F401
from hvd_cifar.errors import ReportError
from hvd_cifar.runs import PHASES, TARGET_KEYS, Run, load_run

# What makes two runs "the same configuration" for speedup; world size is what differs.
CONFIG_KEYS = ("model", "dataset", "batch_size", "sync", "fp16_allreduce", "accumulation_steps", "freeze")
MB = 1e6  # bytes
TITLE_ROOM = 0.95  # share of a figure's width that its title may take


# ----------------------------------------------------------------------------- figures of a run
def value(record: dict, key: str) -> float:
    """A numeric metric, or NaN when the record lacks it (older runs, optional keys). A per-host
    figure (``{host: bytes}``, the NIC counters) reads as its mean over the hosts."""
    v = record.get(key)
    if isinstance(v, dict):
        numbers = [value(v, host) for host in v]
        return sum(numbers) / len(numbers) if numbers else math.nan
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def steady_epochs(records: list[dict]) -> list[dict]:
    """All epochs but the first (warm-up), when there are two or more."""
    return records[1:] if len(records) >= 2 else records


def _ratio(num: Iterable[float], den: Iterable[float]) -> float:
    n, d = sum(num), sum(den)
    return n / d if d and not math.isnan(d) else math.nan


def steady_mean(records: list[dict], key: str) -> float:
    """Mean of a metric over the steady-state epochs (per epoch)."""
    steady = steady_epochs(records)
    return sum(value(r, key) for r in steady) / len(steady)


def present_mean(records: list[dict], key: str) -> float:
    """Mean of a metric over the epochs that have it (checkpoint_time_s: those that wrote one);
    NaN when none has."""
    present = [value(r, key) for r in records if not math.isnan(value(r, key))]
    return sum(present) / len(present) if present else math.nan


def rank_max(records: list[dict], key: str) -> float:
    """The largest per-rank figure (``{rank: value}``) of any rank in any epoch; NaN when none."""
    figures = [value(r[key], rank) for r in records if isinstance(r.get(key), dict) for rank in r[key]]
    return max(figures, default=math.nan)


def steady_per_step(records: list[dict], key: str) -> float:
    """A metric summed over the steady-state epochs, per training step of those epochs."""
    steady = steady_epochs(records)
    return _ratio((value(r, key) for r in steady), (value(r, "steps") for r in steady))


def run_bytes(records: list[dict]) -> dict:
    """Gradient bytes per rank over the whole run (every epoch, the first included): ``bytes``
    as the sync method counted them, ``unfrozen_bytes`` what the same synchronisations would
    have sent with nothing frozen, ``saved_fraction`` the share freezing saved (NaN for one
    rank or runs older than ``comm_bytes_per_sync_unfrozen``), and the NIC's measured
    ``nic_tx_bytes`` / ``nic_rx_bytes`` (mean over the hosts; NaN without counters)."""
    sent = sum(value(r, "comm_bytes_per_rank") for r in records)
    unfrozen = sum(value(r, "comm_bytes_per_sync_unfrozen") * value(r, "syncs") for r in records)
    return {"bytes": sent, "unfrozen_bytes": unfrozen,
            "saved_fraction": 1 - sent / unfrozen if unfrozen else math.nan,
            "nic_tx_bytes": sum(value(r, "nic_tx_bytes") for r in records),
            "nic_rx_bytes": sum(value(r, "nic_rx_bytes") for r in records)}


def bytes_items(run: Run) -> list[tuple[str, str]]:
    """The summary's lines on what the whole run sent, and what freezing saved of it."""
    b = run_bytes(run.metrics)
    saved = (f"{fmt_number(b['unfrozen_bytes'] - b['bytes'], '.3f', MB)} of {fmt_number(b['unfrozen_bytes'], '.3f', MB)} "
             f"({fmt_number(b['saved_fraction'], '.2f', 0.01)} %)" if not math.isnan(b["saved_fraction"]) else "-")
    return [("frozen blocks per epoch", " ".join(str(r.get("frozen_blocks", "-")) for r in run.metrics)),
            ("gradient bytes over the run per rank (MB, analytic, all epochs)", fmt_number(b["bytes"], ".3f", MB)),
            ("NIC bytes over the run per host (MB, tx / rx measured, mean over hosts)",
             f"{fmt_number(b['nic_tx_bytes'], '.3f', MB)} / {fmt_number(b['nic_rx_bytes'], '.3f', MB)}"),
            ("saved by freezing over the run (MB per rank, analytic, against nothing frozen)", saved)]


def setting(run: Run, key: str) -> Any:
    """A run's setting: config.yaml first, then what the last epoch record says."""
    last = run.metrics[-1]
    if key == "world_size":
        return last.get("world_size", run.meta.get("world_size"))
    if key == "freeze":
        freeze = run.config.get("freeze", last.get("frozen_blocks"))
        schedule = run.config.get("freeze_schedule") or {}
        return f"{freeze} {json.dumps(schedule, sort_keys=True)}" if schedule else freeze
    return run.config.get(key, last.get(key))


def time_to_target(run: Run) -> dict:
    """The run's target test accuracy and the epochs and wall time it took to reach it (see the
    module doc): eval.json's, as the trainer wrote them at the end; for a run without them
    (unfinished, or older than these keys), found in metrics.jsonl by the trainer's own rule."""
    if run.evaluation and all(k in run.evaluation for k in TARGET_KEYS):
        return {k: run.evaluation[k] for k in TARGET_KEYS}
    target = run.config.get("target_acc") or 0.0
    return runs.time_to_target([r for r in run.metrics if "test_acc" in r], target)


def summarize(run: Run) -> dict:
    """One row of numbers for a run; averages are over steady-state epochs (see module doc)."""
    m = run.metrics
    steady = steady_epochs(m)
    images = [value(r, "images_per_s") * value(r, "epoch_time_s") for r in steady]
    row = {"run": run.name, **{k: setting(run, k) for k in CONFIG_KEYS}}
    row.update({
        "world_size": setting(run, "world_size"),
        "epochs": len(m),
        "mean_epoch_time_s": steady_mean(m, "epoch_time_s"),
        "total_epoch_time_s": sum(value(r, "epoch_time_s") for r in m),
        "images_per_s": _ratio(images, (value(r, "epoch_time_s") for r in steady)),
        "step_time_s": steady_per_step(m, "epoch_time_s"),
        "sync_time_per_step_s": steady_per_step(m, "sync_time_s"),
        "bytes_per_epoch_per_rank": steady_mean(m, "comm_bytes_per_rank"),
        "bytes_per_step_per_rank": steady_per_step(m, "comm_bytes_per_rank"),
        "final_test_acc": value(m[-1], "test_acc"),
        "final_test_acc5": value(m[-1], "test_acc5"),
        "final_train_acc": value(m[-1], "train_acc"),
        "final_train_acc5": value(m[-1], "train_acc5"),
        "elapsed_s": value(m[-1], "elapsed_s"),
        **time_to_target(run),
        "path": run.path,
    })
    return row


def config_key(row: dict) -> tuple:
    return tuple(str(row.get(k)) for k in CONFIG_KEYS)


def add_speedup(rows: list[dict]) -> None:
    """Fill ``speedup`` and ``efficiency`` in place against the first world-size-1 row of the
    same configuration; NaN where there is none (or the row has no throughput)."""
    baselines: dict[tuple, float] = {}
    for row in rows:
        if row.get("world_size") == 1 and not math.isnan(row.get("images_per_s", math.nan)):
            baselines.setdefault(config_key(row), row["images_per_s"])
    for row in rows:
        base = baselines.get(config_key(row))
        ips, n = row.get("images_per_s", math.nan), row.get("world_size")
        if base and isinstance(n, int) and not math.isnan(ips):
            row["speedup"] = ips / base
            row["efficiency"] = row["speedup"] / n
        else:
            row["speedup"] = row["efficiency"] = math.nan
    add_target_speedup(rows)


def add_target_speedup(rows: list[dict]) -> None:
    """Fill ``target_speedup`` in place: time to target of the first world-size-1 row of the same
    configuration and target / the row's; NaN unless both reached the target, with
    ``target_speedup_note`` saying why ('' when there is a number, and for rows without the
    target keys: a failed bench job)."""
    baselines: dict[tuple, dict] = {}
    for row in rows:
        if row.get("world_size") == 1 and row.get("target_acc"):
            baselines.setdefault((config_key(row), row["target_acc"]), row)
    for row in rows:
        base = baselines.get((config_key(row), row.get("target_acc")))
        note = target_speedup_note(row, base) if "target_acc" in row else ""
        reached = "target_acc" in row and not note
        row["target_speedup"] = base["time_to_target_s"] / row["time_to_target_s"] if reached else math.nan
        row["target_speedup_note"] = note


def target_speedup_note(row: dict, base: dict | None) -> str:
    """Why ``row`` has no time-to-target speedup against its np=1 row ``base`` ('' if it has one)."""
    if not row.get("target_acc"):
        return "no target"
    if base is None:
        return "no np=1 result"
    if row.get("time_to_target_s") is None:
        return "not reached"
    if base.get("time_to_target_s") is None:
        return "np=1 did not reach it"
    return ""


# ----------------------------------------------------------------------------- tables
def target_cell(key: str, spec: str) -> Callable[[dict], str]:
    """A time-/epochs-to-target cell: the number; 'not reached' when the run had a target and
    never reached it; '-' when it had no target (or the number was not recorded)."""
    def cell(row: dict) -> str:
        if not row.get("target_acc"):
            return "-"
        if row.get("epochs_to_target") is None:
            return "not reached"
        return fmt_number(row.get(key), spec)
    return cell


def target_speedup_cell(row: dict) -> str:
    v = row.get("target_speedup", math.nan)
    return fmt_number(v, ".2f") if not math.isnan(v) else row.get("target_speedup_note") or "-"


ASYNC_PS_COLUMNS = [
    Column("epoch", "epoch"),
    num("staleness, mean (updates)", "staleness_mean", ".2f"),
    num("staleness, max (updates)", "staleness_max", ".0f"),
    num("server updates/s", "server_updates_per_s", ".1f"),
    num("test acc (%)", "test_acc", ".2f", 0.01),
]

EPOCH_COLUMNS = [
    Column("epoch", "epoch"),
    num("train loss", "train_loss", ".4f"),
    num("train acc (%)", "train_acc", ".2f", 0.01),
    num("test loss", "test_loss", ".4f"),
    num("test acc (%)", "test_acc", ".2f", 0.01),
    num("train acc@5 (%)", "train_acc5", ".2f", 0.01),
    num("test acc@5 (%)", "test_acc5", ".2f", 0.01),
    num("lr", "lr", ".4g"),
    num("epoch time (s)", "epoch_time_s", ".3f"),
    num("eval (s)", "eval_time_s", ".3f"),
    num("checkpoint (s)", "checkpoint_time_s", ".3f"),
    num("elapsed (s)", "elapsed_s", ".1f"),
    num("img/s", "images_per_s", ".1f"),
    *[num(f"{p} (ms/step)", f"{p}_ms_per_step", ".2f") for p in PHASES],
    num("bytes/rank (MB)", "comm_bytes_per_rank", ".3f", MB),
    num("CPU/rank (%)", "cpu_percent", ".0f"),
    num("host CPU (%)", "host_cpu_percent", ".0f"),
    num("RSS/rank (MB)", "rss_bytes", ".0f", MB),
    num("peak RSS/rank (MB)", "rss_peak_bytes", ".0f", MB),
    num("peak GPU mem/rank (MB)", "gpu_mem_peak_bytes", ".0f", MB),
]

CONFIG_COLUMNS = [
    Column("run", "run"), Column("model", "model"), Column("dataset", "dataset"),
    Column("sync", "sync"), Column("np", "world_size"), Column("batch/rank", "batch_size"),
    Column("fp16 allreduce", "fp16_allreduce"), Column("accum steps", "accumulation_steps"),
    Column("freeze", "freeze"),
]

COMPARE_COLUMNS = CONFIG_COLUMNS + [
    Column("epochs", "epochs"),
    num("mean epoch time (s, excl. first epoch)", "mean_epoch_time_s", ".3f"),
    num("img/s (excl. first epoch)", "images_per_s", ".1f"),
    num("speedup vs np=1", "speedup", ".2f"),
    num("scaling efficiency", "efficiency", ".2f"),
    num("bytes/epoch/rank (MB)", "bytes_per_epoch_per_rank", ".3f", MB),
    num("final test acc (%)", "final_test_acc", ".2f", 0.01),
]

# Time to accuracy: in the Markdown tables when some run had a target; in the CSV files always.
TARGET_COLUMNS = [
    num("target acc (%)", "target_acc", ".2f", 0.01),
    Column("epochs to target", "epochs_to_target", numeric=True, row_fmt=target_cell("epochs_to_target", ".0f")),
    Column("time to target (s)", "time_to_target_s", numeric=True, row_fmt=target_cell("time_to_target_s", ".1f")),
    Column("time-to-target speedup vs np=1", "target_speedup", numeric=True, row_fmt=target_speedup_cell),
]
TARGET_CSV_COLUMNS = TARGET_COLUMNS + [Column("target_speedup_note", "target_speedup_note")]


TARGET_NOTE = ("Time to target: wall time from the start of the run (set-up, training and evaluation) "
               "to the end of the evaluation of the first epoch whose test accuracy reached the target; "
               "epochs to target: that epoch's count. Time-to-target speedup: the np=1 run's time to "
               "target / this run's, same configuration and target, only when both reached it.\n")


def with_target_columns(columns: list[Column], rows: list[dict]) -> list[Column]:
    """``columns`` plus the time-to-target columns when some row had a target."""
    return columns + TARGET_COLUMNS if any(r.get("target_acc") for r in rows) else columns


def epoch_rows(run: Run) -> list[dict]:
    rows = []
    for r in run.metrics:
        row = {key: value(r, key) if isinstance(v, dict) else v for key, v in r.items()}  # per rank/host: the mean
        for p in PHASES:
            row[f"{p}_ms_per_step"] = value(r, f"{p}_time_s") / value(r, "steps") * 1000
        rows.append(row)
    return rows


def classification_table(evaluation: dict) -> str:
    report = evaluation.get("classification_report") or {}
    columns = [Column("class", "class"), num("precision", "precision", ".4f"),
               num("recall", "recall", ".4f"), num("f1-score", "f1-score", ".4f"),
               num("support", "support", ".0f")]
    rows = [{"class": name, **scores} for name, scores in report.items() if isinstance(scores, dict)]
    table = markdown_table(columns, rows)
    if isinstance(report.get("accuracy"), (int, float)):
        table += f"\naccuracy: {report['accuracy']:.4f}\n"
    return table


def confusion_table(matrix: list[list[int]]) -> str:
    k = len(matrix)
    columns = [Column("true \\ predicted", "true")] + [Column(str(j), str(j)) for j in range(k)]
    rows = [{"true": str(i), **{str(j): str(v) for j, v in enumerate(row)}} for i, row in enumerate(matrix)]
    return markdown_table(columns, rows)


# ----------------------------------------------------------------------------- figures
def _fit_title(fig, title: str, run_name: str = "") -> None:
    """The figure's title: ``title - run_name`` on one line when it fits in the figure's width,
    else the run name on lines of its own, broken at hyphens (or anywhere) into lines that fit.
    matplotlib does not wrap a title; it cuts one off at the figure's edges."""
    text = fig.suptitle(f"{title} - {run_name}" if run_name else title)
    renderer, room = fig.canvas.get_renderer(), TITLE_ROOM * fig.bbox.width  # pixels
    chars = len(run_name)
    while text.get_window_extent(renderer).width > room and chars > 1:
        text.set_text("\n".join([title, *textwrap.wrap(run_name, chars)]))
        chars -= 1


def _figure(title: str, xlabel: str, ylabel: str, size=(7.0, 4.2), run_name: str = ""):
    fig = Figure(figsize=size, dpi=110, layout="constrained")
    FigureCanvasAgg(fig)  # headless: render with Agg, never touch a display
    ax = fig.add_subplot()
    _fit_title(fig, title, run_name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig, path: str) -> str:
    """The figure as a PNG, written whole or not at all; a failed write is one RunError line."""
    runlog.atomic_write(path, lambda f: fig.savefig(f, format="png"))
    return path


def _epoch_axis(ax) -> None:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole epochs, not 0.5 steps


def _plot_accuracy(run: Run, epochs: list[int]):
    m = run.metrics
    fig, ax = _figure("Accuracy by epoch", "epoch (from 0)", "accuracy (%)", run_name=run.name)
    ax.plot(epochs, [100 * value(r, "train_acc") for r in m], "o-", label="train (running, augmented)")
    ax.plot(epochs, [100 * value(r, "test_acc") for r in m], "s-", label="test (after the epoch)")
    if any("test_acc5" in r for r in m):
        ax.plot(epochs, [100 * value(r, "test_acc5") for r in m], "^--", label="test top-5")
    ax.legend()
    return fig, ax


def _plot_loss(run: Run, epochs: list[int]):
    m = run.metrics
    fig, ax = _figure("Loss by epoch", "epoch (from 0)", "cross-entropy loss", run_name=run.name)
    ax.plot(epochs, [value(r, "train_loss") for r in m], "o-", label="train")
    ax.plot(epochs, [value(r, "test_loss") for r in m], "s-", label="test")
    ax.legend()
    return fig, ax


def _plot_epoch_time(run: Run, epochs: list[int]):
    m = run.metrics
    fig, ax = _figure("Time per epoch", "epoch (from 0)", "time (s)", run_name=run.name)
    train_t = [value(r, "epoch_time_s") for r in m]
    eval_t = [value(r, "eval_time_s") for r in m]
    ax.bar(epochs, train_t, label="training")
    ax.bar(epochs, [0 if math.isnan(e) else e for e in eval_t], bottom=train_t, label="evaluation")
    ax.legend()
    return fig, ax


def _plot_step_breakdown(run: Run, epochs: list[int]):
    m = run.metrics
    fig, ax = _figure("Time per training step by phase", "epoch (from 0)", "time per step (ms)",
                      run_name=run.name)
    bottom = [0.0] * len(m)
    for p in PHASES:
        per_step = [value(r, f"{p}_time_s") / value(r, "steps") * 1000 for r in m]
        per_step = [0.0 if math.isnan(v) else v for v in per_step]
        ax.bar(epochs, per_step, bottom=bottom, label=p)
        bottom = [b + v for b, v in zip(bottom, per_step)]
    ax.plot(epochs, [value(r, "step_time_s") * 1000 for r in m], "kD", label="wall-clock step time")
    # Each phase is the mean over ranks, so the stack adds up to about the wall-clock step time.
    ax.text(0.01, 0.99, "each phase: mean over ranks; sync and optimizer: once per update, spread over its steps",
            transform=ax.transAxes, va="top", fontsize=7, color="0.35")
    heights = [h for h in bottom + [value(r, "step_time_s") * 1000 for r in m] if not math.isnan(h)]
    if heights and max(heights) > 0:  # room above the bars for the note
        ax.set_ylim(0, max(heights) * 1.15)
    handles, labels = ax.get_legend_handles_labels()  # stack order: top phase first
    ax.legend(handles[::-1], labels[::-1], loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    return fig, ax


def _plot_comm_bytes(run: Run, epochs: list[int]):
    m = run.metrics
    fig, ax = _figure("Gradient traffic per epoch, per rank", "epoch (from 0)", "MB (10^6 bytes)",
                      run_name=run.name)
    series = [("sent by the sync method (counted)", "comm_bytes_per_rank")]
    series += [(f"NIC measured ({k})", k) for k in ("nic_tx_bytes", "nic_rx_bytes") if any(k in r for r in m)]
    width = 0.8 / len(series)
    for i, (label, key) in enumerate(series):
        offset = (i - (len(series) - 1) / 2) * width
        ax.bar([e + offset for e in epochs], [value(r, key) / MB for r in m], width, label=label)
    if setting(run, "world_size") == 1:
        ax.text(0.5, 0.5, "one rank: no gradient traffic", transform=ax.transAxes, ha="center")
    top = max((value(r, k) / MB for r in m for _, k in series if not math.isnan(value(r, k))), default=0)
    ax.set_ylim(0, top * 1.25 if top > 0 else 1)  # room for the legend above the bars
    ax.legend(loc="upper left")
    return fig, ax


def per_name(records: list[dict], key: str) -> dict[str, list[float]]:
    """A per-rank or per-host figure as {rank or host: its value per epoch} (NaN in epochs
    without it), ranks in numeric order."""
    names = sorted({n for r in records if isinstance(r.get(key), dict) for n in r[key]}, key=lambda n: (len(n), n))
    return {n: [value(r.get(key) or {}, n) for r in records] for n in names}


def _plot_resources(run: Run, epochs: list[int]):
    """CPU (each rank's process, each host's CPUs) and memory (each rank's RSS, its peak, its
    peak GPU memory) per epoch's training."""
    m = run.metrics
    fig = Figure(figsize=(11.0, 4.4), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax_cpu, ax_mem = fig.subplots(1, 2)
    _fit_title(fig, "Resource use during training", run.name)
    for rank, series in per_name(m, "cpu_percent").items():
        ax_cpu.plot(epochs, series, "o-", label=f"rank {rank}")
    for host, series in per_name(m, "host_cpu_percent").items():
        ax_cpu.plot(epochs, series, "--", label=f"host {host} (all CPUs)")
    peaks, gpu = per_name(m, "rss_peak_bytes"), per_name(m, "gpu_mem_peak_bytes")
    for rank, series in per_name(m, "rss_bytes").items():
        line, = ax_mem.plot(epochs, [v / MB for v in series], "o-", label=f"rank {rank} RSS")
        if rank in peaks:
            ax_mem.plot(epochs, [v / MB for v in peaks[rank]], "--", color=line.get_color(), label=f"rank {rank} peak RSS")
        if rank in gpu:
            ax_mem.plot(epochs, [v / MB for v in gpu[rank]], ":", color=line.get_color(), label=f"rank {rank} peak GPU")
    for ax, ylabel, title in ((ax_cpu, "CPU (%, 100 = one core busy)", "CPU"), (ax_mem, "MB (10^6 bytes)", "Memory")):
        ax.set_xlabel("epoch (from 0)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        _epoch_axis(ax)
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not recorded (a run older than these figures)", transform=ax.transAxes, ha="center")
    return fig, ax_cpu


RUN_PLOTS = (("acc_train_test.png", _plot_accuracy), ("loss.png", _plot_loss),
             ("training_time.png", _plot_epoch_time), ("step_breakdown.png", _plot_step_breakdown),
             ("comm_bytes.png", _plot_comm_bytes), ("resources.png", _plot_resources))


def plot_run(run: Run, out: str) -> list[str]:
    """The figures of one run (RUN_PLOTS); returns their paths."""
    epochs = [r["epoch"] for r in run.metrics]
    paths = []
    for file_name, plot in RUN_PLOTS:
        fig, ax = plot(run, epochs)
        _epoch_axis(ax)
        paths.append(_save(fig, os.path.join(out, file_name)))
    return paths


def _label(row: dict) -> str:
    return str(row["run"])


def _line_style(i: int) -> dict:
    """Different markers, each smaller than the last, so that runs with equal values (say, the
    same accuracy) stay visible on top of each other."""
    return {"marker": "osD^v<>p"[i % 8], "markersize": max(10 - 1.5 * i, 3), "linestyle": "-",
            "alpha": 0.85}


def plot_compare(runs: list[Run], rows: list[dict], out: str) -> list[str]:
    paths = []
    fig, ax = _figure("Test accuracy by epoch", "epoch (from 0)", "test accuracy (%)")
    for i, (run, row) in enumerate(zip(runs, rows)):
        ax.plot([r["epoch"] for r in run.metrics], [100 * value(r, "test_acc") for r in run.metrics],
                label=_label(row), **_line_style(i))
    _epoch_axis(ax)
    ax.legend(fontsize=8)
    paths.append(_save(fig, os.path.join(out, "compare_test_acc.png")))

    fig, ax = _figure("Training time per epoch", "epoch (from 0)", "epoch time (s)")
    for i, (run, row) in enumerate(zip(runs, rows)):
        ax.plot([r["epoch"] for r in run.metrics], [value(r, "epoch_time_s") for r in run.metrics],
                label=_label(row), **_line_style(i))
    ax.set_ylim(bottom=0)
    _epoch_axis(ax)
    ax.legend(fontsize=8)
    paths.append(_save(fig, os.path.join(out, "compare_epoch_time.png")))
    return paths


def scaling_groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Rows with a throughput, by configuration, each group sorted by world size."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if isinstance(row.get("world_size"), int) and not math.isnan(row.get("images_per_s", math.nan)):
            groups.setdefault(config_key(row), []).append(row)
    return {k: sorted(v, key=lambda r: r["world_size"]) for k, v in groups.items()}


def config_label(row: dict) -> str:
    return (f"{row['model']}/{row['dataset']} {row['sync']} b{row['batch_size']}"
            f" fp16={str(row['fp16_allreduce']).lower()} accum={row['accumulation_steps']}"
            f" freeze={row['freeze']}")


def plot_scaling(rows: list[dict], path: str) -> str:
    """Throughput and epoch time against world size, one line per configuration; the dashed
    line is linear scaling from that configuration's world-size-1 run."""
    fig = Figure(figsize=(11.0, 4.4), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax_ips, ax_time = fig.subplots(1, 2)
    for group in scaling_groups(rows).values():
        ranks = [r["world_size"] for r in group]
        line, = ax_ips.plot(ranks, [r["images_per_s"] for r in group], "o-", label=config_label(group[0]))
        if group[0]["world_size"] == 1:
            base = group[0]["images_per_s"]
            ax_ips.plot(ranks, [base * n for n in ranks], "--", color=line.get_color(), alpha=0.5)
        ax_time.plot(ranks, [r["mean_epoch_time_s"] for r in group], "o-", color=line.get_color())
    all_ranks = sorted({r["world_size"] for g in scaling_groups(rows).values() for r in g})
    for ax, ylabel, title in ((ax_ips, "images per second (all ranks)", "Throughput"),
                              (ax_time, "mean epoch time (s)", "Epoch time")):
        ax.set_xlabel("processes (np)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.set_xticks(all_ranks)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    handles, labels = ax_ips.get_legend_handles_labels()
    handles.append(Line2D([], [], linestyle="--", color="0.5"))
    labels.append("linear scaling from np=1")
    ax_ips.legend(handles, labels, fontsize=7, loc="upper left")
    fig.suptitle("Scaling with the number of processes (means over epochs after the first)")
    return _save(fig, path)


# ----------------------------------------------------------------------------- reports
def target_items(s: dict) -> list[tuple[str, str]]:
    """The summary's time-to-accuracy lines from a ``summarize`` row; a target never reached is
    said so, a run without a target says that instead."""
    if not s["target_acc"]:
        target, epochs, seconds = "none (target_acc not set)", "- (no target)", "- (no target)"
    elif s["epochs_to_target"] is None:
        target = fmt_number(s["target_acc"], ".2f", 0.01)
        epochs = seconds = f"not reached in {s['epochs']} epoch{'s' if s['epochs'] != 1 else ''}"
    else:
        target = fmt_number(s["target_acc"], ".2f", 0.01)
        epochs, seconds = str(s["epochs_to_target"]), fmt_number(s["time_to_target_s"], ".3f")
    return [("target test accuracy (%)", target), ("epochs to target", epochs),
            ("time to target (s, wall time since the run started)", seconds)]


def summary_items(run: Run, s: dict) -> list[tuple[str, Any]]:
    """The run report's summary table, (item, value) pairs, from a ``summarize`` row."""
    cfg, last = run.config, run.metrics[-1]
    return [
        ("model", s["model"]), ("dataset", s["dataset"]),
        ("world size (ranks)", s["world_size"]), ("hosts", ", ".join(sorted(set(run.meta.get("hostnames", [])))) or "-"),
        ("launcher", run.meta.get("launcher", "-")), ("device", run.meta.get("device", "-")),
        ("sync method", s["sync"]), ("fp16 allreduce", text(s["fp16_allreduce"])),
        ("accumulation steps", s["accumulation_steps"]), ("frozen blocks (config)", s["freeze"]),
        ("frozen blocks (last epoch)", last.get("frozen_blocks", "-")),
        ("trainable parameters (last epoch)", f"{last['trainable_params']:,}" if "trainable_params" in last else "-"),
        ("batch size per rank", s["batch_size"]),
        ("base lr (per rank)", cfg.get("lr", "-")), ("schedule", cfg.get("schedule", "-")),
        ("max steps per epoch", cfg.get("max_steps_per_epoch", "-")),
        ("epochs recorded", s["epochs"]),
        ("total training time (s, all epochs)", f"{s['total_epoch_time_s']:.3f}"),
        ("mean epoch time (s, first epoch excluded)" if len(run.metrics) >= 2 else "mean epoch time (s, one epoch)",
         f"{s['mean_epoch_time_s']:.3f}"),
        ("throughput (img/s, same epochs)", fmt_number(s["images_per_s"], ".1f")),
        ("bytes per epoch per rank (MB, same epochs)", fmt_number(s["bytes_per_epoch_per_rank"], ".3f", MB)),
        *bytes_items(run),
        ("final train accuracy (%)", fmt_number(s["final_train_acc"], ".2f", 0.01)),
        ("final test accuracy (%)", fmt_number(s["final_test_acc"], ".2f", 0.01)),
        ("final train top-5 accuracy (%)", fmt_number(s["final_train_acc5"], ".2f", 0.01)),
        ("final test top-5 accuracy (%)", fmt_number(s["final_test_acc5"], ".2f", 0.01)),
        ("mean checkpoint write (s, epochs with one)", fmt_number(present_mean(run.metrics, "checkpoint_time_s"), ".3f")),
        ("peak RSS of any rank (MB)", fmt_number(rank_max(run.metrics, "rss_peak_bytes"), ".0f", MB)),
        ("peak GPU memory of any rank (MB)", fmt_number(rank_max(run.metrics, "gpu_mem_peak_bytes"), ".0f", MB)),
        ("wall time (s, set-up, training and evaluation)", fmt_number(s["elapsed_s"], ".3f")),
        *target_items(s),
    ]


def run_report(run: Run, out: str) -> str:
    """report.md and the figures of one run in ``out``; returns the report's path."""
    os.makedirs(out, exist_ok=True)
    figures = plot_run(run, out)
    summary = summary_items(run, summarize(run))
    lines = [f"# Run report: {run.name}\n", f"Run folder: `{run.path}`\n", "## Summary\n",
            markdown_table([Column("item", "k"), Column("value", "v")], [{"k": k, "v": text(v)} for k, v in summary]),
            "## Per epoch\n",
            "Epochs are numbered from 0 as in metrics.jsonl. Accuracy and loss on the training set are "
            "running values over the epoch's (augmented) batches. Phase times are per training step "
            "(phase time / steps, mean over ranks); bytes are gradient bytes sent per rank in the epoch; "
            "elapsed: wall time since the run started (set-up, training and evaluation).\n",
            markdown_table(EPOCH_COLUMNS, epoch_rows(run))]
    if any("staleness_mean" in r for r in run.metrics):
        lines += ["## Asynchronous parameter server (mpi-async-ps)\n",
                  "Staleness: server updates between a worker's pull of the weights and its push of the "
                  "gradient computed on them (0 would be synchronous SGD), over every push of the epoch; "
                  "server updates/s: the servers' mean rate of applied pushes.\n",
                  markdown_table(ASYNC_PS_COLUMNS, run.metrics)]
    if run.evaluation:
        lines += ["## Final evaluation (test set)\n",
                 f"Test accuracy {run.evaluation.get('test_acc', math.nan):.4f} "
                 f"(top-5 {fmt_number(run.evaluation.get('test_acc5'), '.4f')}), "
                 f"test loss {run.evaluation.get('test_loss', math.nan):.4f} (eval.json).\n",
                 "### Classification report\n", classification_table(run.evaluation)]
        if run.evaluation.get("confusion_matrix"):
            lines += ["### Confusion matrix\n", "Rows: true class; columns: predicted class.\n",
                     confusion_table(run.evaluation["confusion_matrix"])]
    lines += ["## Figures\n"] + [f"![{os.path.basename(p)}]({os.path.basename(p)})\n" for p in figures]
    path = os.path.join(out, "report.md")
    runlog.write_text(path, "\n".join(lines))
    return path


def compare_rows(runs: list[Run]) -> list[dict]:
    rows = [summarize(run) for run in runs]
    names = [r["run"] for r in rows]
    for run, row in zip(runs, rows):  # same folder name under different parents: say which
        if names.count(row["run"]) > 1:
            row["run"] = os.path.join(os.path.basename(os.path.dirname(run.path)), row["run"])
    add_speedup(rows)
    return rows


TIME_WENT_COLUMNS = [
    Column("part of the step", "part"), num("np=1 (ms/step)", "np1_ms", ".2f"), num("np=N (ms/step)", "npN_ms", ".2f"),
    num("difference (ms/step)", "delta_ms", "+.2f"), num("img/s it cost", "img_s_lost", "+.1f"),
]


def fp16_bandwidth_text(bytes_per_s: float | None) -> str:
    if bytes_per_s is None:
        return "on no link (the casts cost more than the halved bytes save)"
    if bytes_per_s >= 1.25e12:  # the search's upper end: nothing in the model offsets the halved bytes
        return "on any link up to 10 Tbit/s (nothing measured offsets the halved bytes)"
    return f"on links below {bytes_per_s * 8 / 1e9:.3g} Gbit/s"


def time_went_section(runs: list[Run], rows: list[dict]) -> list[str]:
    """"Where the time went" for each multi-rank run with an np=1 run of its configuration among
    ``runs`` (hvd_cifar.predict.explain: the split, and the model's fp16 and gather/scatter answers)."""
    from hvd_cifar import predict  # predict reads runs through this module
    singles = {config_key(r): run for run, r in zip(runs, rows) if r.get("world_size") == 1}
    lines = []
    for run, row in zip(runs, rows):
        single = singles.get(config_key(row))
        if not single or not isinstance(row.get("world_size"), int) or row["world_size"] < 2:
            continue
        try:
            e = predict.explain(run, single)
        except (predict.PredictError, KeyError, ValueError) as exc:  # e.g. a run older than the phase times
            lines.append(f"{row['run']}: not explained ({str(exc).splitlines()[0]})\n")
            continue
        fp16 = e["fp16_break_even_bytes_per_s"]
        star = e["gather_scatter_2x_np"]
        lines += [f"### {row['run']} (np={e['np']}) against {single.name}\n",
                  f"Ideal {e['ideal_images_per_s']:.1f} img/s (np x the np=1 run's), measured "
                  f"{e['measured_images_per_s']:.1f}. Per step on one rank, by part (a negative cost: faster than at np=1):\n",
                  markdown_table(TIME_WENT_COLUMNS, e["parts"]),
                  f"From the model (docs/SCALING.md) on this run's own link ({e['link'].beta_bytes_per_s * 8 / 1e9:.3g} Gbit/s "
                  f"effective, latency taken as 0; `python -m hvd_cifar.predict --probe` for a measured one): fp16 "
                  f"compression would shorten this step {fp16_bandwidth_text(fp16)}; gather/scatter's step "
                  f"would take twice ring allreduce's from {'- (never up to 2^20)' if star is None else f'np={star}'}.\n"]
    return ["## Where the time went\n", *lines] if lines else []


def compare_report(runs: list[Run], out: str) -> str:
    """compare.md, compare.csv and the overlaid figures in ``out``; returns compare.md's path."""
    os.makedirs(out, exist_ok=True)
    rows = compare_rows(runs)
    figures = plot_compare(runs, rows, out)
    if any(len(g) >= 2 for g in scaling_groups(rows).values()):
        figures.append(plot_scaling(rows, os.path.join(out, "scaling.png")))
    write_csv(os.path.join(out, "compare.csv"), COMPARE_COLUMNS + TARGET_CSV_COLUMNS + [Column("path", "path")], rows)
    lines = ["# Run comparison\n",
            "Means and img/s are over all epochs but the first (warm-up) when a run has two or more. "
            "Speedup = img/s / img/s of the np=1 run of the same model, dataset, batch size per rank, "
            "sync, fp16 allreduce, accumulation steps and freeze among these runs; efficiency = "
            "speedup / np; '-' where there is no such run. Bytes: gradient bytes sent per rank.\n",
            *([TARGET_NOTE] if any(r["target_acc"] for r in rows) else []),
            markdown_table(with_target_columns(COMPARE_COLUMNS, rows), rows), *time_went_section(runs, rows), "## Figures\n",
            *[f"![{os.path.basename(p)}]({os.path.basename(p)})\n" for p in figures],
            "## Run folders\n", *[f"- {row['run']}: `{row['path']}`" for row in rows], ""]
    path = os.path.join(out, "compare.md")
    runlog.write_text(path, "\n".join(lines))
    return path


# ----------------------------------------------------------------------------- command line
def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m hvd_cifar.report", description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folder(s) holding metrics.jsonl")
    parser.add_argument("--out", help="output folder (default for one run: RUN_DIR/report; "
                                      "required for several)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        runs = [load_run(p) for p in args.runs]
        if len(runs) == 1:
            path = run_report(runs[0], args.out or os.path.join(args.runs[0], "report"))
        else:
            if not args.out:
                raise ReportError("--out: needed when comparing several runs")
            path = compare_report(runs, args.out)
    except (ReportError, runlog.RunError) as exc:  # bad input; a file that cannot be written
        print(f"hvd_cifar: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. an --out that cannot be created
        print(f"hvd_cifar: error: {exc.filename or ''}: {exc.strerror}", file=sys.stderr)
        return 2
    print(f"report written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
