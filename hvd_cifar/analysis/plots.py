"""Every figure hvd_cifar draws, as PNG files written whole (temp + rename): the six of one run,
the overlaid curves and the scaling plot of a comparison, and a prediction's img/s and
efficiency. Headless: matplotlib's Agg canvas, never a display. The numbers come from
hvd_cifar.analysis.summary; nothing here computes one of its own."""
from __future__ import annotations

import math
import os
import textwrap

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from hvd_cifar.analysis.scaling import SCENARIO_KEYS
from hvd_cifar.analysis.steps import last_trace
from hvd_cifar.analysis.summary import MB, per_name, scaling_groups, setting, value
from hvd_cifar.core.files import atomic_write
from hvd_cifar.core.names import PHASES
from hvd_cifar.runfolder.reader import Run

TITLE_ROOM = 0.95  # share of a figure's width that its title may take


# ----------------------------------------------------------------------------- drawing
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


def _two_panels():
    """A wide figure of two plots side by side, headless like _figure's."""
    fig = Figure(figsize=(11.0, 4.4), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, 2)


def _save(fig, path: str) -> str:
    """The figure as a PNG, written whole or not at all; a failed write is one RunError line."""
    atomic_write(path, lambda f: fig.savefig(f, format="png"))
    return path


def _epoch_axis(ax) -> None:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole epochs, not 0.5 steps


# ----------------------------------------------------------------------------- one run
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


def _plot_resources(run: Run, epochs: list[int]):
    """CPU (each rank's process, each host's CPUs) and memory (each rank's RSS, its peak, its
    peak GPU memory) per epoch's training."""
    m = run.metrics
    fig, (ax_cpu, ax_mem) = _two_panels()
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
    """The figures of one run (RUN_PLOTS, and one traced step when the run has one); returns their paths."""
    epochs = [r["epoch"] for r in run.metrics]
    paths = []
    for file_name, plot in RUN_PLOTS:
        fig, ax = plot(run, epochs)
        _epoch_axis(ax)
        paths.append(_save(fig, os.path.join(out, file_name)))
    if last_trace(run):
        paths.append(plot_steps([run], os.path.join(out, "step_trace.png")))
    return paths


# ----------------------------------------------------------------------------- a traced step
STEP_COLOURS = {"data": "#bbbbbb", "forward": "#4c72b0", "backward": "#55a868", "sync": "#c44e52",
                "optimizer": "#8172b2", "negotiation": "#f2c57c", "allreduce": "#dd8452", "other": "#937860"}


def _draw_step(ax, run: Run) -> None:
    """One traced step of ``run``, a lane per rank for its phases and one under it for its
    collectives, milliseconds from the rank's start of the step."""
    epoch, trace = last_trace(run)
    lanes = []
    for rank in trace["ranks"]:
        y = -float(len(lanes))  # two lanes a rank, top down
        for phase, s, e in rank["phases"]:
            ax.barh(y, 1e3 * (e - s), left=1e3 * s, height=0.8, color=STEP_COLOURS.get(phase, "k"))
        for what, s, e in rank["comm"]:
            ax.barh(y - 1, 1e3 * (e - s), left=1e3 * s, height=0.5 if what == "negotiation" else 0.8,
                    color=STEP_COLOURS.get(what, "k"))
        if not rank["comm"]:
            ax.text(0, y - 1, " not recorded on this rank", va="center", fontsize=7, color="0.35")
        lanes += [(y, f"rank {rank['rank']}"), (y - 1, "collectives")]
    ax.set_yticks([y for y, _ in lanes], [label for _, label in lanes], fontsize=8)
    ax.set_title(f"{run.name}: epoch {epoch}, step {trace['step']}", fontsize=9)
    ax.grid(alpha=0.3, axis="x")


def plot_steps(runs: list[Run], path: str) -> str:
    """One traced step per run (``comm_timeline: true``), the runs one above the other on one
    time axis: where each rank computed, communicated and waited."""
    traced = [run for run in runs if last_trace(run)]
    fig = Figure(figsize=(9.0, 1.2 + 1.0 * sum(len(last_trace(r)[1]["ranks"]) for r in traced)), dpi=110,
                 layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(traced), 1, sharex=True, squeeze=False)[:, 0]
    for ax, run in zip(axes, traced):
        _draw_step(ax, run)
    axes[-1].set_xlabel("ms from the rank's start of the step (its own clock)")
    fig.legend(handles=[Patch(color=c, label=k) for k, c in STEP_COLOURS.items()], loc="outside lower center",
               ncol=len(STEP_COLOURS), fontsize=7)
    fig.suptitle("One step, rank by rank (the median of a few in the epoch's middle)", fontsize=10)
    return _save(fig, path)


# ----------------------------------------------------------------------------- several runs
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
                label=str(row["run"]), **_line_style(i))
    _epoch_axis(ax)
    ax.legend(fontsize=8)
    paths.append(_save(fig, os.path.join(out, "compare_test_acc.png")))

    fig, ax = _figure("Training time per epoch", "epoch (from 0)", "epoch time (s)")
    for i, (run, row) in enumerate(zip(runs, rows)):
        ax.plot([r["epoch"] for r in run.metrics], [value(r, "epoch_time_s") for r in run.metrics],
                label=str(row["run"]), **_line_style(i))
    ax.set_ylim(bottom=0)
    _epoch_axis(ax)
    ax.legend(fontsize=8)
    paths.append(_save(fig, os.path.join(out, "compare_epoch_time.png")))
    if any(last_trace(run) for run in runs):  # e.g. Horovod's step above DDP's
        paths.append(plot_steps(runs, os.path.join(out, "compare_step_trace.png")))
    return paths


def config_label(row: dict) -> str:
    return (f"{row['model']}/{row['dataset']} {row['sync']} b{row['batch_size']}"
            f" {row.get('compression') or 'none'} accum={row['accumulation_steps']}"
            f" freeze={row['freeze']}")


def _error_bars(group: list[dict], key: str) -> list[list[float]] | None:
    """Distances from each point down to ``KEY_low`` and up to ``KEY_high`` (a sweep's 95 %
    intervals over its rounds); None when no row has them. The point is a median and the interval
    is about the mean, so an interval can miss the point by a hair (rounds all alike): that side's
    bar is then 0, never negative (which matplotlib refuses)."""
    if not any(f"{key}_low" in r for r in group):
        return None
    return [[max(0.0, r[key] - r.get(f"{key}_low", r[key])) for r in group],
            [max(0.0, r.get(f"{key}_high", r[key]) - r[key]) for r in group]]


def plot_scaling(rows: list[dict], path: str) -> str:
    """Throughput and epoch time against world size, one line per configuration; the dashed
    line is linear scaling from that configuration's world-size-1 run; error bars, where the
    rows have them, are the 95 % intervals over a sweep's rounds."""
    fig, (ax_ips, ax_time) = _two_panels()
    for group in scaling_groups(rows).values():
        ranks = [r["world_size"] for r in group]
        ips = [r["images_per_s"] for r in group]
        line = ax_ips.errorbar(ranks, ips, yerr=_error_bars(group, "images_per_s"), fmt="o-", capsize=3,
                               label=config_label(group[0])).lines[0]
        if group[0]["world_size"] == 1:
            base = group[0]["images_per_s"]
            ax_ips.plot(ranks, [base * n for n in ranks], "--", color=line.get_color(), alpha=0.5)
        ax_time.errorbar(ranks, [r["mean_epoch_time_s"] for r in group], yerr=_error_bars(group, "mean_epoch_time_s"),
                         fmt="o-", capsize=3, color=line.get_color())
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


# ----------------------------------------------------------------------------- a prediction
def _series(row: dict) -> tuple:
    return tuple(row[k] for k in SCENARIO_KEYS if k != "np")


def _scenario_label(key: tuple) -> str:
    method, hierarchical, compression, k, freeze = key  # compression: hvd_cifar.core.schemes.label's
    return (f"{method}{' hierarchical' if hierarchical else ''}{f' {compression}' if compression != 'none' else ''}"
            f"{f' accum {k}' if k > 1 else ''}{f' freeze {freeze}' if freeze else ''}")


def plot_prediction(rows: list[dict], measured: list[dict], path: str, title: str) -> str:
    """img/s and efficiency against np, log axes; measured runs as points in their series' colour."""
    fig, (ax_ips, ax_eff) = _two_panels()
    colours = {}
    for key in dict.fromkeys(_series(r) for r in rows):
        series = [r for r in rows if _series(r) == key]
        line, = ax_ips.plot([r["np"] for r in series], [r["images_per_s"] for r in series], "-", label=f"{_scenario_label(key)} (predicted)")
        ax_eff.plot([r["np"] for r in series], [r["efficiency"] for r in series], "-", color=line.get_color())
        colours[key] = line.get_color()
    for m in measured:
        key = _series(m)
        ax_ips.plot([m["np"]], [m["images_per_s"]], "o", color=colours.get(key, "k"), markersize=7,
                    label=f"{m['run']} (measured)")
    for ax, ylabel in ((ax_ips, "images per second (all ranks)"), (ax_eff, "scaling efficiency (step at np=1 / step)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks (np)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
    ax_ips.set_yscale("log")
    ax_eff.set_ylim(0, 1.05)
    ax_ips.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    return _save(fig, path)

