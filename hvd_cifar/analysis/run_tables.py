"""The tables of run reports, comparisons and sweeps: their columns (header with units, format)
and the rows they are filled from. No torch, no plotting; the writers are hvd_cifar.analysis.tabulate'."""
from __future__ import annotations

import math
from typing import Callable

from hvd_cifar.analysis.summary import MB, value
from hvd_cifar.analysis.tabulate import Column, fmt_number, markdown_table, num
from hvd_cifar.core.names import PHASES
from hvd_cifar.runfolder.reader import Run


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


# One traced step per rank (hvd_cifar.analysis.steps.rank_row), ms from the rank's start of the step.
STEP_COLUMNS = [
    Column("rank", "rank", numeric=True), num("step (ms)", "step_ms", ".1f"), Column("backward (ms)", "backward_ms"),
    num("sync wait (ms)", "sync_ms", ".1f"), num("allreduces", "allreduces", ".0f"),
    num("first began, after backward began (ms)", "first_after_backward_began_ms", "+.1f"),
    num("last ended, after backward ended (ms)", "last_after_backward_ended_ms", "+.1f"),
    num("allreduce inside backward (ms)", "hidden_ms", ".1f"), num("allreduce after it (ms)", "after_backward_ms", ".1f"),
    num("negotiation (ms)", "negotiation_ms", ".1f"),
]

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
    num("CPU s/image/rank", "cpu_s_per_image", ".4f"),
    num("host CPU (%)", "host_cpu_percent", ".0f"),
    num("RSS/rank (MB)", "rss_bytes", ".0f", MB),
    num("peak RSS/rank (MB)", "rss_peak_bytes", ".0f", MB),
    num("peak GPU mem/rank (MB)", "gpu_mem_peak_bytes", ".0f", MB),
]


def compute_cell(row: dict) -> str:
    """The precision and layout a run computed in, ``(auto)`` when compute: auto chose them."""
    return f"{row.get('compute', '-')}{' (auto)' if row.get('compute_auto') else ''}"


CONFIG_COLUMNS = [
    Column("run", "run"), Column("model", "model"), Column("dataset", "dataset"),
    Column("sync", "sync"), Column("np", "world_size"), Column("batch/rank", "batch_size"),
    Column("compression", "compression"), Column("accum steps", "accumulation_steps"),
    Column("freeze", "freeze"), Column("compute", "compute", row_fmt=compute_cell),
]
# The data set's own keys and the other options that change the work (analysis.summary's
# ``data`` and ``options``): in the Markdown tables when some run has one, in the CSV files always.
WORK_COLUMNS = [Column("data set keys", "data"), Column("other options", "options")]
CONFIG_CSV_COLUMNS = [*WORK_COLUMNS, Column("amp", "amp"), Column("compute_auto", "compute_auto"),
                      Column("speedup_baseline", "speedup_baseline")]


def with_work_columns(columns: list[Column], rows: list[dict]) -> list[Column]:
    """``columns`` (CONFIG_COLUMNS first) with WORK_COLUMNS after them where some row has one."""
    shown = [c for c in WORK_COLUMNS if any(row.get(c.key) for row in rows)]
    return columns[:len(CONFIG_COLUMNS)] + shown + columns[len(CONFIG_COLUMNS):]


COMPARE_COLUMNS = CONFIG_COLUMNS + [
    Column("epochs", "epochs"),
    num("mean epoch time (s, excl. first epoch)", "mean_epoch_time_s", ".3f"),
    num("img/s (excl. first epoch)", "images_per_s", ".1f"),
    num("CPU s/image/rank (excl. first epoch)", "cpu_s_per_image", ".4f"),
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
