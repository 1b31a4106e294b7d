"""``show=plot`` blocks of testbed.render_docs: a figure of a results file against the link rate,
one line per series, drawn to docs/figures/ and shown as the image and the table of what it plots.

A configuration named ``SERIES RATE`` (``powersgd 20mbit``: a series, then a link rate in tc
syntax) is a point: its median over the rounds against the rate, with the 95 % interval as a bar.
The table holds the same cells (render_docs.cell), one row per series, one column per rate, the
slowest rate first. The image is written only when the docs are rendered (render_docs without
--check), so that checking changes no file; the block's text does not depend on the image.
"""
from __future__ import annotations

import os
import re
import statistics

from hvd_cifar.core import units
from hvd_cifar.measure.stats import interval_of

POINT = re.compile(r"^(?P<series>\S+) (?P<rate>[0-9.]+[kmg]?bit)$")
FIGURES_DIR = "figures"  # under docs/: the image's path as a doc in docs/ links it


def points(data: dict, key: str) -> dict[str, dict[str, list[float]]]:
    """series -> rate -> the figure's values over the rounds that did not fail."""
    found: dict[str, dict[str, list[float]]] = {}
    for r in data["rounds"]:
        m = POINT.match(r["config"])
        if m and r["ok"] and key in r["figures"]:
            found.setdefault(m["series"], {}).setdefault(m["rate"], []).append(r["figures"][key])
    return found


def rounds_of(data: dict) -> dict[str, int]:
    """Per configuration, its rounds that did not fail (a cell with fewer says [n of N])."""
    counted: dict[str, int] = {}
    for r in data["rounds"]:
        if r["ok"]:
            counted[r["config"]] = counted.get(r["config"], 0) + 1
    return counted


def image_name(results_name: str, key: str) -> str:
    return f"{os.path.splitext(results_name)[0]}-{key}.png"


def plot_block(data: dict, options: dict, results_name: str, cell, label: str, table) -> list[str]:
    """The image line and the table of a ``show=plot figure=KEY`` block (``cell``, ``table``:
    render_docs' own, so that the cells read as every table's do)."""
    key = options.get("figure", "")
    found = points(data, key)
    if not found:
        raise ValueError(f"show=plot: no configuration 'SERIES RATE' with {key!r} in {results_name}")
    rates = sorted({rate for by_rate in found.values() for rate in by_rate}, key=units.parse_rate)
    ran = rounds_of(data)
    rows = [[series, *[cell(found[series].get(rate, []), data["figures"].get(key, {}), ran.get(f"{series} {rate}", 0))
                       for rate in rates]] for series in found]
    path = f"{FIGURES_DIR}/{image_name(results_name, key)}"
    return [f"![{label} against the link rate, median of the rounds with its 95 % interval]({path})", "",
            *table([f"{label} at", *rates], rows)]


def draw(data: dict, options: dict, results_name: str, label: str, docs_dir: str) -> str:
    """The plot of a ``show=plot`` block as a PNG under ``docs_dir``/figures; its path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    key = options["figure"]
    scale = data["figures"].get(key, {}).get("scale", 1.0)
    fig = Figure(figsize=(6.4, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for series, by_rate in points(data, key).items():
        rates = sorted(by_rate, key=units.parse_rate)
        xs = [units.parse_rate(r) / 1e6 for r in rates]
        mids = [statistics.median(by_rate[r]) / scale for r in rates]
        spans = [interval_of(by_rate[r]) if len(by_rate[r]) > 1 else None for r in rates]
        # the interval is of the geometric mean, the point the median: a bar never reaches past it
        low = [max(0.0, m - (iv.low / scale if iv else m)) for m, iv in zip(mids, spans)]
        high = [max(0.0, (iv.high / scale if iv else m) - m) for m, iv in zip(mids, spans)]
        ax.errorbar(xs, mids, yerr=[low, high], marker="o", capsize=3, label=series)
    ax.set_xscale("log")
    ax.set_xlabel("link rate (Mbit/s)")
    ax.set_ylabel(label)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = os.path.join(docs_dir, FIGURES_DIR, image_name(results_name, key))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    return path
