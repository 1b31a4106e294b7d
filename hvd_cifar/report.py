"""Reports, tables and figures made from run folders (metrics.jsonl, config.yaml, eval.json).

One run: a Markdown report and six figures, written to RUN_DIR/report/ unless --out says
otherwise::

    python -m hvd_cifar.report logs/RUN
    python -m hvd_cifar.report logs/RUN --out /tmp/run-report

Several runs: a comparison table (compare.md, compare.csv), overlaid curves and, where the
inputs hold one configuration at several world sizes, a scaling plot. --out is required
here (there is no obvious folder to put a comparison in)::

    python -m hvd_cifar.report logs/np1 logs/np2 logs/np2-fp16 --out logs/compare-np

How every number is made (steady-state epochs, img/s, speedup, bytes, time to target):
``hvd_cifar.analysis.summary``. The figures are drawn by ``hvd_cifar.analysis.plots``, the tables' columns are
``hvd_cifar.analysis.run_tables``', "where the time went" is ``hvd_cifar.analysis.explain``'s, and
"time to the target" (runs of several compressions with one target_acc) ``hvd_cifar.analysis.crossover``'s.

A run killed while writing its last metrics.jsonl line is reported from its whole epochs, with a
note saying one line was torn. Bad input (no metrics.jsonl, an empty or corrupt one), and an
output file that cannot be written (no space left, read-only, permission), end with one line
``hvd_cifar: error: ...`` on stderr and exit status 2. Each output file is written whole or not
at all (temp + rename).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

from hvd_cifar.analysis import crossover
from hvd_cifar.analysis.explain import effective_link, explain
from hvd_cifar.analysis.scaling import Network, as_run, measure, profile
from hvd_cifar.analysis.steps import last_trace, trace_rows
from hvd_cifar.analysis.sweep import repeated_section
from hvd_cifar.analysis.plots import plot_compare, plot_run, plot_scaling
from hvd_cifar.core import methods
from hvd_cifar.core.errors import PredictError, ReportError
from hvd_cifar.core.names import RUN_IDENTITY
from hvd_cifar.core.files import RunError, write_text
from hvd_cifar.analysis.run_tables import (ASYNC_PS_COLUMNS, COMPARE_COLUMNS, CONFIG_CSV_COLUMNS, EPOCH_COLUMNS,
                                           STEP_COLUMNS, TARGET_CSV_COLUMNS, TARGET_NOTE, classification_table, confusion_table,
                                           epoch_rows, with_target_columns, with_work_columns)
from hvd_cifar.runfolder.reader import METRICS, Run, load_run
from hvd_cifar.analysis.summary import (MB, baselines, compare_rows, compute_notes, present_mean, rank_max, run_bytes,
                                        scaling_groups, summarize)
from hvd_cifar.analysis.tabulate import Column, OneLineParser, fmt_number, markdown_table, num, text, write_csv


# ----------------------------------------------------------------------------- one run
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
        ("sync method", s["sync"]), ("compression", s["compression"]),
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
    row = summarize(run)
    summary = summary_items(run, row)
    lines = [f"# Run report: {run.name}\n", f"Run folder: `{run.path}`\n",
             *([f"Note: {METRICS}: {torn_note(run)}.\n"] if run.torn else []), "## Summary\n",
            markdown_table([Column("item", "k"), Column("value", "v")], [{"k": k, "v": text(v)} for k, v in summary]),
            "## Per epoch\n",
            "Epochs are numbered from 0 as in metrics.jsonl. Accuracy and loss on the training set are "
            "running values over the epoch's (augmented) batches. Phase times are per training step "
            "(phase time / steps, mean over ranks); bytes are gradient bytes sent per rank in the epoch; "
            "elapsed: wall time since the run started (set-up, training and evaluation).\n",
            markdown_table(EPOCH_COLUMNS, epoch_rows(run))]
    if any("staleness_mean" in r for r in run.metrics):
        title = methods.METHODS[row["sync"]].title if row["sync"] in methods.METHODS else "parameter server"
        lines += [f"## {title[:1].upper()}{title[1:]} ({row['sync']})\n",
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
    lines += step_section([run])
    lines += ["## Figures\n"] + [f"![{os.path.basename(p)}]({os.path.basename(p)})\n" for p in figures]
    path = os.path.join(out, "report.md")
    write_text(path, "\n".join(lines))
    return path


STEP_NOTE = ("From `comm_timeline: true`: of a few steps in the middle of the epoch, the one whose time on rank 0 "
             "is their median; times from each rank's own start of the step. Horovod's timeline is written by "
             "rank 0 alone, so only rank 0's collectives are shown; DDP times each bucket on every rank, from "
             "its gradients' readiness, and its backward returns only once the last bucket is reduced, so "
             "its wait is inside backward.\n")


def step_section(runs: list[Run]) -> list[str]:
    """"One step, rank by rank" for every run that traced one, each under its own heading."""
    lines = []
    for run in runs:
        if traced := last_trace(run):
            epoch, trace = traced
            lines += [f"### {run.name}: epoch {epoch}, step {trace['step']}\n",
                      markdown_table(STEP_COLUMNS, trace_rows(trace))]
    return ["## One step, rank by rank\n", STEP_NOTE, *lines] if lines else []


def torn_note(run: Run) -> str:
    """What a run whose metrics.jsonl ends in a torn line (hvd_cifar.runfolder.reader) is reported from."""
    n = len(run.metrics)
    return (f"its last line is torn (the run was killed while writing it); "
            f"the {n} whole epoch{'s are' if n != 1 else ' is'} reported")


# ----------------------------------------------------------------------------- several runs
TIME_WENT_COLUMNS = [
    Column("part of the step", "part"), num("np=1 (ms/step)", "np1_ms", ".2f"), num("np=N (ms/step)", "npN_ms", ".2f"),
    num("difference (ms/step)", "delta_ms", "+.2f"), num("img/s it cost", "img_s_lost", "+.1f"),
]


def bandwidth_text(option: str, bytes_per_s: float | None) -> str:
    """Where ``option`` (fp16, a scheme) would shorten the step, from explain's break-even."""
    if bytes_per_s is None:
        return f"{option} on no link (its compute costs more than its fewer bytes save)"
    if bytes_per_s >= 1.25e12:  # the search's upper end: nothing in the model offsets the fewer bytes
        return f"{option} on any link up to 10 Tbit/s (nothing measured offsets its fewer bytes)"
    return f"{option} on links below {bytes_per_s * 8 / 1e9:.3g} Gbit/s"


def time_went_section(runs: list[Run], rows: list[dict]) -> list[str]:
    """"Where the time went" for each multi-rank run with an np=1 run of its configuration among
    ``runs`` (hvd_cifar.analysis.explain: the split, and the model's answers for fp16, the schemes and
    gather/scatter)."""
    run_of = {id(row): run for run, row in zip(runs, rows)}
    lines = []
    for run, row, base in zip(runs, rows, baselines(rows, lambda r: True)):
        single = run_of.get(id(base)) if base else None
        if not single or not isinstance(row.get("world_size"), int) or row["world_size"] < 2:
            continue
        try:
            e = explain(run, single)
        except (PredictError, KeyError, ValueError) as exc:  # e.g. a run older than the phase times
            lines.append(f"{row['run']}: not explained ({str(exc).splitlines()[0]})\n")
            continue
        pays = ("; ".join(bandwidth_text(option, beta) for option, beta in e["break_even_bytes_per_s"].items())
                or "none to compare (its method runs no other compression)")
        star = e["gather_scatter_2x_np"]
        lines += [f"### {row['run']} (np={e['np']}) against {single.name}\n",
                  f"Ideal {e['ideal_images_per_s']:.1f} img/s (np x the np=1 run's), measured "
                  f"{e['measured_images_per_s']:.1f}. Per step on one rank, by part (a negative cost: faster than at np=1):\n",
                  markdown_table(TIME_WENT_COLUMNS, e["parts"]),
                  f"From the model (docs/SCALING.md) on this run's own link ({e['link'].beta_bytes_per_s * 8 / 1e9:.3g} Gbit/s "
                  f"effective, latency taken as 0; `python -m hvd_cifar.predict --probe` for a measured one), each "
                  f"option would shorten this step: {pays}; gather/scatter's step "
                  f"would take twice ring allreduce's from {'- (never up to 2^20)' if star is None else f'np={star}'}.\n"]
    return ["## Where the time went\n", *lines] if lines else []


SOONER_COLUMNS = [Column("compression", "compression"), Column("run", "run"),
                  num("epochs to target", "epochs_to_target", ".0f"),
                  num("time to target (s)", "time_to_target_s@this link", ".1f"),
                  crossover.SOONER]


def sooner_section(runs: list[Run], rows: list[dict]) -> list[str]:
    """"Time to the target": for each set of multi-rank runs of one model, data set, world size,
    sync method and target_acc holding one uncompressed run and others compressed, each run's
    epochs and time to the target and the link rate below which it gets there sooner than the
    uncompressed one (hvd_cifar.analysis.crossover), on the link the uncompressed run's own
    communication implies (explain.effective_link)."""
    groups: dict[tuple, list[Run]] = {}
    for run, row in zip(runs, rows):
        if row.get("target_acc") and isinstance(row.get("world_size"), int) and row["world_size"] >= 2:
            key = (row["model"], row["dataset"], row["world_size"], row["sync"], row["target_acc"])
            groups.setdefault(key, []).append(run)
    lines = []
    for (model, dataset, n, sync, target), group in groups.items():
        plain = [r for r in group if (r.config.get("compression") or "none") == "none"]
        if len(plain) != 1 or len(group) < 2:
            continue
        try:
            c = measure(plain[0])
            prof = profile(c.model, c.num_classes)
            comm = c.comm_s if c.comm_s is not None else c.sync_s
            link = effective_link(c, prof, as_run(c, plain[0].config), n, comm)
            net = Network({c.sync: link}, None)
            found = crossover.crossover_rows(c, prof, net, group, n, {"this link": net})
        except (PredictError, KeyError, ValueError, ZeroDivisionError) as exc:
            lines.append(f"{model} on {dataset}, np={n}: not compared ({str(exc).splitlines()[0]})\n")
            continue
        lines += [f"### {model} on {dataset}, np={n}, {sync}: to test accuracy {target}\n",
                  f"Each run's measured epochs to the target; the link {plain[0].name}'s communication implies "
                  f"({link.beta_bytes_per_s * 8 / 1e6:.3g} Mbit/s effective, latency taken as 0), and the rate below "
                  f"which each compression gets there sooner than {plain[0].name} (docs/SCALING.md, \"Time to "
                  f"accuracy\"; `python -m hvd_cifar.predict --accuracy-from` on a probed network):\n",
                  markdown_table(SOONER_COLUMNS, found)]
    return ["## Time to the target\n", *lines] if lines else []


def compare_report(runs: list[Run], out: str) -> str:
    """compare.md, compare.csv and the overlaid figures in ``out``; returns compare.md's path."""
    os.makedirs(out, exist_ok=True)
    rows = compare_rows(runs)
    figures = plot_compare(runs, rows, out)
    if any(len(g) >= 2 for g in scaling_groups(rows).values()):
        figures.append(plot_scaling(rows, os.path.join(out, "scaling.png")))
    write_csv(os.path.join(out, "compare.csv"),
              COMPARE_COLUMNS + CONFIG_CSV_COLUMNS + TARGET_CSV_COLUMNS + [Column("path", "path")], rows)
    lines = ["# Run comparison\n",
            "Means and img/s are over all epochs but the first (warm-up) when a run has two or more. "
            "Speedup = img/s / img/s of the np=1 run of the same model, data set (and its own keys: sizes, seed), "
            "batch size per rank, sync, compression, accumulation steps, freeze, precision and "
            "other options that change the work among these runs (for a run whose precision compute: auto chose, "
            "failing that, the np=1 run whose precision auto chose too); efficiency = speedup / np; '-' where "
            "there is no such run. Bytes: gradient bytes sent per rank.\n",
            *([TARGET_NOTE] if any(r["target_acc"] for r in rows) else []),
            markdown_table(with_target_columns(with_work_columns(COMPARE_COLUMNS, rows), rows), rows),
            *compute_notes(rows),
            *repeated_section(runs, rows, (*RUN_IDENTITY, "world_size")),
            *time_went_section(runs, rows), *sooner_section(runs, rows), *step_section(runs), "## Figures\n",
            *[f"![{os.path.basename(p)}]({os.path.basename(p)})\n" for p in figures],
            "## Run folders\n", *[f"- {row['run']}: `{row['path']}`" + (f" ({METRICS}: {torn_note(run)})" if run.torn else "")
                                   for run, row in zip(runs, rows)], ""]
    path = os.path.join(out, "compare.md")
    write_text(path, "\n".join(lines))
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
    except (ReportError, RunError) as exc:  # bad input; a file that cannot be written
        print(f"hvd_cifar: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. an --out that cannot be created
        print(f"hvd_cifar: error: {exc.filename or ''}: {exc.strerror}", file=sys.stderr)
        return 2
    for run in runs:
        if run.torn:
            print(f"hvd_cifar: note: {os.path.join(run.path, METRICS)}: {torn_note(run)}", file=sys.stderr)
    print(f"report written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
