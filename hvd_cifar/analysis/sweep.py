"""A sweep's rounds into what a user can trust: per configuration the median of every figure
over its rounds with its 95 % interval, and each comparison as a sentence.

    jobs = [...]                  # one row per job: the configuration's keys, "round", figures, "status"
    configs = by_configuration(jobs, KEYS, FIGURES)  # median, FIGURE_low, FIGURE_high, rounds, unstable
    for c in comparisons(jobs, KEYS, sweep_order):   # paired within a round (or a seed)
        print(c.sentence)

A comparison is one configuration against its baseline, the configuration that differs from it
in one swept option only, set to that option's first value (np: against np=1, which is the
speedup). Throughput is compared by the ratio of img/s paired within each round (the rounds'
neighbours load both alike); with seeds, the final test accuracy by the difference in points
paired by seed. hvd_cifar.measure.stats makes the intervals and the words.
"""
from __future__ import annotations

import math
import os
import re
import statistics
from dataclasses import dataclass

from hvd_cifar.analysis.summary import summarize
from hvd_cifar.core.errors import ReportError
from hvd_cifar.measure import stats
from hvd_cifar.runfolder.reader import load_run

# The trainer's own one-line verdict, without the "[1,0]<stderr>:" tags launchers add around it.
ERROR_LINE = re.compile(r"hvd_cifar: (?:error: |rank \d+ failed).*?(?=\[\d+,\d+\]<std|$)")


@dataclass
class Comparison:
    label: str                 # "compression fp16 vs none (np=2, ...)"
    config: tuple              # the configuration's identity, and its baseline's
    baseline: tuple
    figure: str                # images_per_s (a ratio) or final_test_acc (a difference in points)
    interval: stats.Interval
    sentence: str


def identity(row: dict, keys: tuple) -> tuple:
    return tuple(row.get(k) for k in keys)


def _ok(row: dict) -> bool:
    return row.get("status") == "ok" and not row.get("superseded")


def by_configuration(jobs: list[dict], keys: tuple, figures: tuple) -> list[dict]:
    """One row per configuration (in the order first seen): its keys, per figure the median over
    its good rounds and ``FIGURE_low`` / ``FIGURE_high`` (stats.interval_of; with two or more
    rounds), ``rounds`` (good of all), ``unstable`` (img/s varies by more than 10 %), and
    ``status``: ok, or the first failure with how many rounds failed."""
    groups: dict[tuple, list[dict]] = {}
    for job in jobs:
        if not job.get("superseded"):
            groups.setdefault(identity(job, keys), []).append(job)
    rows = []
    for ident, group in groups.items():
        good = [j for j in group if _ok(j)]
        row = {**dict(zip(keys, ident)), "rounds": f"{len(good)} of {len(group)}", "n_rounds": len(good),
               "run_dir": " ".join(j.get("run_dir", "") for j in group), "unstable": False}
        for key in figures:
            values = [j[key] for j in good if isinstance(j.get(key), (int, float)) and not math.isnan(j[key])]
            if not values:
                continue
            row[key] = statistics.median(values)
            if len(values) > 1:
                iv = stats.interval_of(values)
                row[f"{key}_low"], row[f"{key}_high"] = iv.low, iv.high
        ips = [j["images_per_s"] for j in good if isinstance(j.get("images_per_s"), float)]
        row["unstable"] = stats.unstable(ips)
        failed = [j for j in group if not _ok(j)]
        row["status"] = "ok" if not failed else (
            f"{failed[0]['status']}" if not good else f"{failed[0]['status']} in {len(failed)} of {len(group)} rounds")
        for extra in ("command", "stderr_file", "error", "target_acc", "target_speedup_note"):
            source = next((j for j in group if j.get(extra)), group[0])
            if extra in source:
                row[extra] = source[extra]
        rows.append(row)
    return rows


def _baseline(ident: tuple, keys: tuple, key: str, first) -> tuple | None:
    at = keys.index(key)
    if ident[at] == first:
        return None
    return (*ident[:at], first, *ident[at + 1:])


def _context(ident: tuple, keys: tuple, varying: set[str], skip: str) -> str:
    parts = [f"{k}={v}" for k, v in zip(keys, ident) if k in varying and k != skip]
    return f" ({', '.join(parts)})" if parts else ""


def comparisons(jobs: list[dict], keys: tuple, order: dict[str, list], pair_by: str = "round",
                accuracy: bool = False, test_size: int = 0) -> list[Comparison]:
    """Every configuration against each baseline it has (see the module doc), paired by
    ``pair_by`` (at least two pairs: runs that share one seed are not paired by it); ``order``: each swept option's values as asked (the first is the baseline);
    ``accuracy``: also the final test accuracy's difference (seeds)."""
    values: dict[tuple, dict] = {}
    for job in jobs:
        if _ok(job):
            values.setdefault(identity(job, keys), {})[job[pair_by]] = job
    varying = {k for k, vs in order.items() if len(vs) > 1}
    found = []
    for ident in values:
        for key in (k for k in keys if k in varying):
            base = _baseline(ident, keys, key, order[key][0])
            if base is None or base not in values:
                continue
            shared = sorted(set(values[ident]) & set(values[base]))
            if len(shared) < 2:  # one pair says nothing of its spread
                continue
            mine, theirs = values[ident], values[base]
            name = "np" if key == "world_size" else key
            label = f"{name} {ident[keys.index(key)]} vs {order[key][0]}{_context(ident, keys, varying, key)}"
            rates = [(mine[s].get("images_per_s"), theirs[s].get("images_per_s")) for s in shared]
            rates = [(a, b) for a, b in rates if a and b and not math.isnan(a) and not math.isnan(b)]
            if rates:
                iv = stats.ratio_interval([a for a, _ in rates], [b for _, b in rates])
                found.append(Comparison(f"{label}: img/s", ident, base, "images_per_s", iv,
                                        stats.ratio_sentence(f"{label}: img/s", iv, rounds=f"{pair_by}s")))
            accs = [(mine[s].get("final_test_acc"), theirs[s].get("final_test_acc")) for s in shared]
            accs = [(a, b) for a, b in accs if a is not None and b is not None]
            if accuracy and accs:
                iv = stats.difference_interval([a for a, _ in accs], [b for _, b in accs], scale=100)
                p = statistics.fmean(b for _, b in accs)
                found.append(Comparison(f"{label}: accuracy", ident, base, "final_test_acc", iv,
                                        stats.difference_sentence(f"{label}: final test accuracy", iv, test_size, p)))
    return found


def unresolved(found: list[Comparison], margin: float) -> list[Comparison]:
    """The throughput comparisons whose interval does not yet say which side of 1 ± ``margin``
    they are on (stats.resolved)."""
    return [c for c in found if c.figure == "images_per_s" and not stats.resolved(c.interval, margin)]


# ----------------------------------------------------------------------------- one job
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


def collect(cfg: dict, run_dir: str, ended, timeout: int) -> dict:
    """The table row of one job (``ended``: the runner's launch.runners.Ended): its configuration,
    status and (when it ran) its numbers, and the size of the test set it was judged on."""
    row = dict(cfg, run=os.path.basename(run_dir), run_dir=run_dir)
    if ended.why:
        row["status"] = f"failed ({ended.why})"
    elif ended.code is None:
        row["status"] = f"failed (timeout after {timeout} s)"
    elif ended.code != 0:
        row["status"] = f"failed (exit {ended.code})"
    else:
        try:
            run = load_run(run_dir)
            summary = summarize(run)
        except ReportError as exc:
            row["status"] = f"failed (exit 0 but {exc})"
        else:
            row.update({k: v for k, v in summary.items() if k not in cfg})
            row["test_images"] = test_images(run)
            row["status"] = "ok"
    return row


def test_images(run) -> int:
    """The size of the test set a finished run (runfolder.reader.Run) was judged on; 0 unknown."""
    report = (run.evaluation or {}).get("classification_report", {})
    return int(report.get("macro avg", {}).get("support", 0))


def target_note(row: dict) -> str:
    """The progress line's word on the target: when (and in which epoch) it was reached."""
    if not row.get("target_acc"):
        return ""
    if row.get("time_to_target_s") is None:
        return f"; {row['target_acc']:.2%} not reached"
    return f"; {row['target_acc']:.2%} reached in {row['time_to_target_s']:.1f} s (epoch {row['epochs_to_target']})"


# ----------------------------------------------------------------------------- repeated runs
REPEATED_FIGURES = ("images_per_s", "final_test_acc", "mean_epoch_time_s")


def repeated_section(runs: list, rows: list[dict], keys: tuple) -> list[str]:
    """For a report of several runs (runfolder.reader.Run, and their summary rows): when some runs
    share a configuration (``keys``), each
    configuration's median img/s, final accuracy and epoch time with their 95 % intervals, and
    the comparisons of configurations paired by seed (each run's config); nothing when every
    configuration ran once."""
    jobs = [{**row, "seed": run.config.get("seed"), "status": "ok", "test_images": test_images(run)}
            for run, row in zip(runs, rows)]
    configs = by_configuration(jobs, keys, REPEATED_FIGURES)
    if not any(c["n_rounds"] > 1 for c in configs):
        return []
    order = {k: list(dict.fromkeys(j.get(k) for j in jobs)) for k in keys}  # the first seen is the baseline
    test_size = next((j["test_images"] for j in jobs if j.get("test_images")), 0)
    found = comparisons(jobs, keys, order, pair_by="seed", accuracy=True, test_size=test_size)

    def cell(c: dict, key: str, spec: str, scale: float = 1.0) -> str:
        if key not in c:
            return "-"
        middle = format(c[key] / scale, spec)
        low, high = (format(c[f"{key}_{end}"] / scale, spec) if f"{key}_{end}" in c else None for end in ("low", "high"))
        return middle if low is None or low == high else f"{middle} ({low}–{high})"
    varying = [k for k in keys if len(order[k]) > 1] or ["world_size"]
    lines = ["## Repeated configurations\n",
             "Runs with the same configuration, grouped: each figure's median over them and, with two or more, "
             "its 95 % interval (t-interval of the logarithms, scipy.stats). Comparisons pair runs by seed: img/s by "
             "the geometric mean of the ratios, accuracy by the mean difference in points.\n",
             "| " + " | ".join([*varying, "runs", "img/s", "final test acc (%)", "epoch time (s)"]) + " |",
             "|" + "---|" * len(varying) + "---:|" * 4,
             *["| " + " | ".join([*(str(c[k]) for k in varying), str(c["n_rounds"]), cell(c, "images_per_s", ".1f"),
                                  cell(c, "final_test_acc", ".2f", 0.01), cell(c, "mean_epoch_time_s", ".3f")]) + " |"
               for c in configs], ""]
    return lines + [f"- {c.sentence}" for c in found] + ([""] if found else [])
