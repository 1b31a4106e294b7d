"""Rewrite every results table in README.md and docs/*.md from the committed results files.

    .venv/bin/python -m testbed.render_docs            # rewrite the generated blocks in place
    .venv/bin/python -m testbed.render_docs --check    # exit 1, naming each stale block, change nothing

A generated block sits between two markers; everything between them is the renderer's:

    <!-- results: sync_methods.json figures=images_per_s,cpu_s_per_image match="np=2$" -->
    ...
    <!-- /results -->

The marker names a file in benchmarks/results/ and says what to show (``key=value``, shell
quoting):

  show=table     (default) one row per configuration, one column per figure; each cell the
                 median over the configuration's rounds and, with more than one, its 95 %
                 interval (a t-interval; of the logarithms when every value is positive);
                 then the rounds that failed, with their reasons, and where the numbers came from.
  show=rounds    every round's raw figures, one row per round and configuration.
  show=failed    only the rounds that failed, each with its reason (or a line saying none did).
  show=checks    one row per ``check="CONFIG:FIGURE>=TARGET"`` (or <=), repeatable: the
                 figure's median over its rounds, their 95 % interval (a t-interval; of the
                 logarithms when every value is positive: hvd_cifar.measure.stats), n, and the
                 verdict of hvd_cifar.measure.results.verdict: met (the whole interval on the
                 target's right side), not met (wholly on the wrong side) or unresolved.
                 ``FIGURE.mean`` shows the mean instead of the median.
  show=paired    one row per ``pair="A|B"`` (repeatable): FIGURE of A minus FIGURE of B paired by
                 round (a round is a seed where the benchmark runs one per seed), the mean
                 difference and its 95 % t-interval over the pairs (scipy.stats), n, and in words
                 whether the interval resolves a difference; ``figure=KEY`` (default final_acc),
                 ``test_size=N`` adds one run's binomial standard error on a test set of N images,
                 and the differences of a fraction are shown in points (x 100). ``ratio=true``:
                 A over B instead, the geometric mean of the rounds' ratios with the t-interval
                 of their logarithms (for times and rates). ``target=X`` (a difference in points,
                 or a ratio): the verdict is against X instead of no difference (higher is
                 better; ``better=lower``: lower is): met (the whole interval on the right side
                 of it), not met (wholly on the wrong side), unresolved; ``verdicts=W1,W2``
                 says W1 for met and W2 for not met (``_`` for a space: pays,does_not_pay).
  show=plot      ``figure=KEY`` against the link rate of configurations named ``SERIES RATE``:
                 the image (docs/figures/, drawn when rendering, not with --check) and the
                 table of its medians and intervals (testbed.doc_plots).
  figures=a,b    the figures shown, of those the rows have (default: every declared one they have).
  configs=a,b    the configurations shown, in this order; match=REGEX: those it finds (re.search).

A results file that does not exist renders as a line saying which command writes it, never as
an old number. tests/test_docs_tables.py fails when a block differs from what this makes.

A block is stale when code its figures ran changed since: a results file records the modules
its jobs loaded, each by the hash of its code, the benchmark script's and the Horovod build's
fixes (hvd_cifar.measure.results.code_record), and the block then names the files whose code
differs now (comments, docstrings and layout are not code). A results file without that record,
or with jobs whose code is not known, goes stale by the older rule: any file under
MEASURED_PATHS, or the script, whose code changed after the file's commit. ``--check`` also
prints, for each block measured on code that changed since, which files did.
"""
from __future__ import annotations

import argparse
import functools
import glob
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys

from hvd_cifar.measure.results import INSTALL_SCRIPT, RESULTS_DIR, ROOT, horovod_fixes, verdict
from hvd_cifar.measure.stats import Interval, interval_of, judge, t_interval
from hvd_cifar.runfolder import code
from testbed import doc_plots

# A marker is a line of its own; the text may quote the syntax inline without starting a block.
BLOCK = re.compile(r"(?P<open>^<!-- results: (?P<spec>[^\n]*?) -->\n)(?P<body>.*?)(?P<close>^<!-- /results -->)",
                   re.S | re.M)
CHECK = re.compile(r"^(?P<config>.+):(?P<figure>\w+)(?P<mean>\.mean)?\s*(?P<op>>=|<=)\s*(?P<target>[-+0-9.eE]+)$")
SYMBOL = {">=": "≥", "<=": "≤"}


def doc_files() -> list[str]:
    return [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]


def parse_spec(spec: str) -> tuple[str, dict]:
    """The marker's file name and its options (``check`` a list, the rest strings)."""
    words = shlex.split(spec)
    if not words:
        raise ValueError("results marker names no file")
    options: dict = {"check": []}
    for word in words[1:]:
        key, sep, value = word.partition("=")
        if not sep:
            raise ValueError(f"results marker {spec!r}: {word!r} is not key=value")
        if key in ("check", "pair"):
            options.setdefault(key, []).append(value)
        elif key in ("show", "figures", "configs", "match", "figure", "test_size", "ratio", "target", "better",
                     "verdicts"):
            options[key] = value
        else:
            raise ValueError(f"results marker {spec!r}: unknown option {key!r}")
    return words[0], options


def shown(value: float, figure: dict) -> str:
    return format(value / figure.get("scale", 1.0), figure.get("fmt", ".3g"))


def cell(values: list[float], figure: dict, rounds: int = 0, centre: str = "median") -> str:
    """``centre`` (the median, or the mean) of a figure's rounds, then its 95 % interval
    (``interval_of``) when there is more than one round and the interval shows as more than a
    point; '-' with none; [n of N] when the figure has fewer rounds than its row (``rounds``),
    e.g. a target some rounds never reached."""
    if not values:
        return "-"
    middle = shown(statistics.median(values) if centre == "median" else statistics.fmean(values), figure)
    fewer = f" [{len(values)} of {rounds}]" if len(values) < rounds else ""
    if len(values) == 1:
        return middle + fewer
    iv = interval_of(values)
    low, high = shown(iv.low, figure), shown(iv.high, figure)
    return (middle if low == high else f"{middle} ({low}–{high})") + fewer


def figure_of(data: dict, key: str) -> dict:
    return data["figures"].get(key, {"label": key.replace("_", " ")})


def configs_of(data: dict, options: dict) -> list[str]:
    names = list(data["summary"])
    if "configs" in options:
        wanted = [c.strip() for c in options["configs"].split(",")]
        missing = [c for c in wanted if c not in names]
        if missing:
            raise ValueError(f"{data['benchmark']}: no configuration {', '.join(missing)} in the results file")
        return wanted
    if "match" in options:
        return [c for c in names if re.search(options["match"], c)]
    return names


def figures_of(data: dict, options: dict, configs: list[str]) -> list[str]:
    present = {k for c in configs for k in data["summary"].get(c, {})}
    if "figures" in options:  # in the marker's order, those the rows have
        return [f for f in (f.strip() for f in options["figures"].split(",")) if f in present]
    return [k for k in data["figures"] if k in present]


def table(header: list[str], rows: list[list[str]], numeric_from: int = 1) -> list[str]:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if i < numeric_from else "---:" for i in range(len(header))) + "|"]
    return lines + ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]


def failures(data: dict, configs: list[str], of: str = "medians") -> list[str]:
    """The failed rounds of ``configs``, each with its reason, and the rounds run while the
    machine was disturbed (hvd_cifar.measure.rounds); nothing when there are none."""
    failed = [r for r in data["rounds"] if not r["ok"] and r["config"] in configs]
    disturbed = [r for r in data["rounds"] if r.get("disturbed") and r["config"] in configs]
    lines = ["", f"Failed rounds (left out of the {of}):", "",
             *[f"- {r['config']}, round {r['round']}: {r['reason']}" for r in failed]] if failed else []
    if disturbed:
        lines += ["", f"Rounds run while the machine was disturbed (CPU stolen or used by other processes; "
                      f"kept in the {of}): " + ", ".join(f"{r['config']} round {r['round']}" for r in disturbed) + "."]
    return lines


def summary_table(data: dict, options: dict) -> list[str]:
    configs = configs_of(data, options)
    figures = figures_of(data, options, configs)
    rows = []
    for c in configs:
        values = {k: values_of(data, c, k) for k in figures}
        n = max((len(v) for v in values.values()), default=0)
        rows.append([c, *[cell(values[k], figure_of(data, k), n) for k in figures], str(n)])
    return table(["configuration", *[figure_of(data, k)["label"] for k in figures], "rounds"], rows) + \
        failures(data, configs)


def rounds_table(data: dict, options: dict) -> list[str]:
    configs = configs_of(data, options)
    figures = figures_of(data, options, configs)
    rows = [[str(r["round"]), r["config"],
             *[shown(r["figures"][k], figure_of(data, k)) if k in r["figures"] else "-" for k in figures],
             "" if r["ok"] else r["reason"]] for r in data["rounds"] if r["config"] in configs]
    return table(["round", "configuration", *[figure_of(data, k)["label"] for k in figures], "failed"], rows,
                 numeric_from=2)


def failed_list(data: dict, options: dict) -> list[str]:
    configs = configs_of(data, options)
    ok = sum(1 for r in data["rounds"] if r["config"] in configs and r["ok"])
    return failures(data, configs)[1:] or [f"None of the {ok} rounds failed."]


def values_of(data: dict, config: str, key: str) -> list[float]:
    """``key`` in every round of ``config`` that did not fail and has it."""
    return [r["figures"][key] for r in data["rounds"] if r["config"] == config and r["ok"] and key in r["figures"]]


def checks_table(data: dict, options: dict) -> list[str]:
    rows, checked = [], []
    for check in options["check"]:
        m = CHECK.match(check)
        if not m:
            raise ValueError(f"check {check!r} is not CONFIG:FIGURE>=TARGET, CONFIG:FIGURE.mean>=TARGET or <=TARGET")
        config, key, op, target = m["config"], m["figure"], m["op"], float(m["target"])
        checked.append(config)
        figure, values = figure_of(data, key), values_of(data, config, key)
        label = f"{config}: {figure['label']}" + (", mean of the rounds" if m["mean"] else "")
        rows.append([label, f"{SYMBOL[op]} {target:g}", cell(values, figure, centre="mean" if m["mean"] else "median"),
                     str(len(values)), f"**{verdict(values, op, target)}**"])
    return table(["figure", "target", cells_are(options), "rounds", "verdict"], rows, numeric_from=2) + \
        failures(data, checked, " and ".join(f"{c}s" for c in centres(options)))


def paired_table(data: dict, options: dict) -> list[str]:
    """Each ``pair``'s A against B by round: the mean difference in points (or, ratio=true, the
    geometric mean of A / B), its 95 % t-interval, n, and what it resolves."""
    key = options.get("figure", "final_acc")
    by_round: dict = {}
    for r in data["rounds"]:
        if r["ok"] and key in r["figures"]:
            by_round.setdefault(r["config"], {})[r["round"]] = r["figures"][key]
    ratio = options.get("ratio") == "true"
    rows, halves, configs = [], [], {r["config"] for r in data["rounds"]}
    for pair in options.get("pair", []):
        a, _, b = pair.partition("|")
        shared = sorted(set(by_round.get(a, {})) & set(by_round.get(b, {})))
        absent = [c for c in (a, b) if c not in configs]
        if len(absent) == 1:  # a candidate the processor that made the file did not have (bf16)
            row = [f"{a} / {b}" if ratio else f"{a} − {b}", "-", "-", "0", f"not measured: the file has no `{absent[0]}`"]
            rows.append(row[:4] + ["-"] + row[4:] if "test_size" in options and not ratio else row)
            continue
        if len(shared) < 2:
            raise ValueError(f"pair {pair!r}: fewer than 2 rounds where both have {key}")
        if ratio:  # the t-interval of the log-ratios, shown as ratios
            mean, low, high = t_interval([math.log(by_round[a][k] / by_round[b][k]) for k in shared])
            words = _verdict(low, high, options, math.log, ("A higher", "A lower"))
            row = [f"{a} / {b}", *(f"{math.exp(v):.3f}" for v in (mean, low)), f"{math.exp(high):.3f}"]
            halves.append(100 * (math.exp(high) - math.exp(low)) / 2 / math.exp(mean))
        else:
            mean, low, high = t_interval([100 * (by_round[a][k] - by_round[b][k]) for k in shared])
            words = _verdict(low, high, options, float, ("higher", "lower"))
            if words.startswith("no difference"):  # the smallest difference these rounds could have shown
                words += f" (they resolve about ±{(high - low) / 2:.2f} points)"
            row = [f"{a} − {b}", *(f"{v:+.2f}" for v in (mean, low)), f"{high:+.2f}"]
            halves.append((high - low) / 2)
        row = [row[0], row[1], f"{row[2]} to {row[3]}", str(len(shared)), words]
        if "test_size" in options and not ratio:
            p = statistics.fmean(by_round[b][k] for k in shared)
            row.insert(4, f"{100 * (p * (1 - p) / int(options['test_size'])) ** 0.5:.2f}")
        rows.append(row)
    if "target" in options and rows and all(r[-1].startswith("**unresolved**") for r in rows):
        return [resolves_nothing(rows, halves, ratio)]
    header = ["comparison", "ratio (geometric mean)" if ratio else "mean difference (points)", "95 % interval",
              "pairs", "verdict"]
    if "test_size" in options and not ratio:
        header.insert(4, f"one run's standard error on {options['test_size']} images (points)")
    return table(header, rows)


def resolves_nothing(rows: list[list[str]], halves: list[float], ratio: bool) -> str:
    """One sentence in place of a table whose every verdict is unresolved: which comparisons,
    in how many pairs, and how near the target a difference these rounds could show comes."""
    unit = " %" if ratio else " points"
    span = f"±{min(halves):.1f}{unit}" + (f" to ±{max(halves):.1f}{unit}" if max(halves) - min(halves) >= 0.05 else "")
    pairs = sorted({int(r[3]) for r in rows})
    named = (", ".join(f"{r[0]} ({r[1]}, {r[2]})" for r in rows) if len(rows) <= 3
             else f"each of {len(rows)} comparisons")
    counted = f"{pairs[0]}" if len(pairs) == 1 else f"{pairs[0]}–{pairs[-1]}"
    return (f"{rows[0][-1]} for {named}, in {counted} "
            f"pairs: their intervals span {span} about the {'ratio' if ratio else 'difference'}, so a distance from "
            f"the target under that would not show; more rounds narrow it.")


def _verdict(low: float, high: float, options: dict, scale, words: tuple[str, str]) -> str:
    """Against ``target`` (scaled as the interval is; higher is better, or lower with
    ``better=lower``): met, not met or unresolved (hvd_cifar.measure.stats.judge); without one,
    whether the interval resolves a difference from none."""
    if "target" in options:
        op = "<=" if options.get("better") == "lower" else ">="
        met = judge(Interval(0.0, low, high, 0), op, scale(float(options["target"])))
        if "verdicts" in options:  # the words of met and not met, e.g. pays,does_not_pay
            met = dict(zip(("met", "not met"), options["verdicts"].replace("_", " ").split(","))).get(met, met)
        return f"**{met}** ({SYMBOL[op]} {options['target']})"
    # no difference: 0 points, or a log-ratio of 0
    return "no difference these rounds can resolve" if low <= 0 <= high else words[0] if low > 0 else words[1]


def provenance(data: dict, name: str, options: dict | None = None) -> str:
    m = data["machine"]
    before, after = m["load_average_before"][0], (m["load_average_after"] or [float("nan")])[0]
    changed = data.get("changed") or []
    dirty = (f", with uncommitted changes to {', '.join(f'`{p}`' for p in changed[:3])}"
             f"{f' and {len(changed) - 3} more' if len(changed) > 3 else ''}" if changed
             else ", with uncommitted changes" if data.get("dirty") else "")
    return (f"From `benchmarks/results/{name}`: `{shlex.join(data['command'])}`, commit {data['commit']}{dirty}, "
            f"{data['started_utc']} to {data['finished_utc'][11:]}; {m['cpu_model']}, {m['cores']} cores, "
            f"load average {before:.2f} before and {after:.2f} after. Cells: {cells_are(options or {})} over the rounds.")


def centres(options: dict) -> list[str]:
    """What a block's cells show: the median, the mean (checks on ``FIGURE.mean``), or both."""
    means = [c for c in options.get("check", []) if (m := CHECK.match(c)) and m["mean"]]
    if not means:
        return ["median"]
    return ["mean"] if len(means) == len(options["check"]) else ["median", "mean"]


def cells_are(options: dict) -> str:
    if options.get("show") == "paired" and options.get("ratio") == "true":
        return "the geometric mean of the ratios paired by round, with the t-interval of their logarithms,"
    if options.get("show") == "paired":
        return "the mean of the differences paired by round, with its t-interval,"
    shown_as = centres(options)
    return (f"{shown_as[0]} (95 % interval)" if len(shown_as) == 1
            else "median, or mean where the row says, (95 % interval)")


# What a results file without a record of its code measures: the package, its install, and the
# benchmark script that made it (the file's command); when any of these changed after its
# commit, its tables are stale.
MEASURED_PATHS = ("hvd_cifar", INSTALL_SCRIPT)
STALE = "**Stale:**"


def _git(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)


@functools.lru_cache(maxsize=None)
def changed_since(commit: str, script: str = "") -> tuple[str, ...] | None:
    """The measured paths (MEASURED_PATHS and ``script``) whose code differs between ``commit``
    and the working tree (a change to comments alone is none); None when this clone does not
    hold ``commit`` (a shallow clone, or a commit never pushed)."""
    if not commit or commit == "unknown" or _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        return None
    done = _git("diff", "--name-only", commit, "--", *MEASURED_PATHS, *([script] if script else []))
    if done.returncode != 0:
        return None
    return tuple(sorted(p for p in done.stdout.split() if not _same_code(commit, p)))


def _same_code(commit: str, path: str) -> bool:
    """Whether a Python file differs from ``commit``'s only in its comments, docstrings and
    layout (the same code hash): then the code it runs did not change."""
    if not path.endswith(".py"):
        return False
    old = _git("show", f"{commit}:{path}")
    return old.returncode == 0 and code.code_hash(old.stdout) == code.file_hash(os.path.join(ROOT, path))


def code_changes(data: dict) -> tuple[str, ...] | None:
    """The files whose code changed since a results file's figures ran it: by the file's record
    (``code``) the modules its jobs loaded, the benchmark script and the Horovod build's fixes
    that differ now; without a record, or for jobs it names as not known, the older rule too
    (``changed_since`` its commit). None when that rule is needed and this clone cannot tell."""
    record, script = data.get("code"), data.get("command", [""])[0]
    older: tuple[str, ...] | None = ()
    if record is None or record.get("unrecorded"):
        older = changed_since(data.get("commit", ""), script if script.startswith("benchmarks/") else "")
        if record is None or older is None:
            return older
    found = set(code.changed({**record.get("modules", {}), **record.get("script", {})}, ROOT))
    if record.get("horovod_fixes", "") != horovod_fixes(ROOT):
        found.add(INSTALL_SCRIPT)
    return tuple(sorted(found.union(older)))


def few(paths: tuple[str, ...] | list[str], shown: int = 3) -> str:
    """The first ``shown`` paths, then how many more."""
    more = len(paths) - shown
    return ", ".join(f"`{p}`" for p in paths[:shown]) + (f" and {more} more" if more > 0 else "")


def staleness(data: dict) -> str:
    """A sentence when code a results file's figures ran changed since (``code_changes``): when
    they were measured (their age), what changed, and that the command above renews them."""
    changed = code_changes(data)
    if not changed:
        return ""
    files = f"{len(changed)} file{'s' if len(changed) > 1 else ''}: {few(changed)}"
    when = f"measured {data['finished_utc'][:10]}; " if data.get("finished_utc") else ""
    if data.get("code") is not None and not data["code"].get("unrecorded"):
        return (f"{STALE} {when}code these figures ran changed since ({files}); rerun the command above to measure "
                f"the current code.")
    return (f"{STALE} {when}the code these figures measure changed after commit {data['commit']} ({files}); "
            f"rerun the command above to measure the current code.")


def load(name: str, results_dir: str) -> dict | None:
    """The results file ``name`` in ``results_dir``, or None where there is none."""
    path = os.path.join(results_dir, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def render_block(spec: str, results_dir: str, docs_dir: str | None = None) -> str:
    """One block's text; a ``show=plot`` block's image drawn under ``docs_dir`` when given."""
    name, options = parse_spec(spec)
    data = load(name, results_dir)
    if data is None:
        return (f"_Not measured on the current code yet: `make bench` (or the command above) writes "
                f"`benchmarks/results/{name}`._\n")
    show = options.get("show", "table")
    makers = {"table": summary_table, "rounds": rounds_table, "checks": checks_table, "failed": failed_list,
              "paired": paired_table,
              "plot": lambda d, o: doc_plots.plot_block(d, o, name, cell, figure_of(d, o.get("figure", ""))["label"],
                                                        table)}
    if show not in makers:
        raise ValueError(f"results marker {spec!r}: show={show} (table, rounds, checks, paired, plot or failed)")
    body = makers[show](data, options)
    if show == "plot" and docs_dir:
        doc_plots.draw(data, options, name, figure_of(data, options["figure"])["label"], docs_dir)
    stale = staleness(data)
    return "\n".join([*body, "", provenance(data, name, options), *(["", stale] if stale else [])]) + "\n"


def render(text: str, results_dir: str = RESULTS_DIR, docs_dir: str | None = None) -> str:
    """``text`` with every generated block made again (``show=plot`` images drawn under
    ``docs_dir`` when given)."""
    return BLOCK.sub(lambda m: m["open"] + render_block(m["spec"], results_dir, docs_dir) + m["close"], text)


def stale_blocks(text: str, results_dir: str = RESULTS_DIR) -> list[str]:
    """The markers whose block differs from what ``render`` makes. Where a results file's
    staleness cannot be told (it has no record of its code, and this clone does not hold its
    commit), the block's staleness line is left out of the comparison."""
    def same(spec: str, body: str, made: str) -> bool:
        return body == made or _without_staleness(body) == _without_staleness(made) and not _known(spec, results_dir)
    return [m["spec"] for m in BLOCK.finditer(text) if not same(m["spec"], m["body"], render_block(m["spec"], results_dir))]


def stale_code(text: str, results_dir: str = RESULTS_DIR) -> list[tuple[str, tuple[str, ...]]]:
    """(marker, files) of each block whose figures ran code that changed since (``code_changes``)."""
    found = []
    for m in BLOCK.finditer(text):
        data = load(parse_spec(m["spec"])[0], results_dir)
        changed = code_changes(data) if data is not None else None
        if changed:
            found.append((m["spec"], changed))
    return found


def _without_staleness(body: str) -> str:
    return "\n".join(line for line in body.split("\n") if not line.startswith(STALE)).rstrip("\n")


def _known(spec: str, results_dir: str) -> bool:
    """Whether the staleness of a block's results file can be told here."""
    data = load(parse_spec(spec)[0], results_dir)
    return data is not None and code_changes(data) is not None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", help="Markdown files (default: README.md and docs/*.md)")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 naming each stale block")
    p.add_argument("--results", default=RESULTS_DIR, help="folder of the results files")
    args = p.parse_args(argv)
    stale = []
    for path in args.files or doc_files():
        with open(path) as f:
            text = f.read()
        if args.check:
            doc = os.path.relpath(path, ROOT)
            stale += [f"{doc}: {spec}" for spec in stale_blocks(text, args.results)]
            for spec, changed in stale_code(text, args.results):
                print(f"render_docs: {doc}: {spec}: measured before a change to {few(changed, 5)}", file=sys.stderr)
        else:
            new = render(text, args.results, os.path.join(ROOT, "docs"))
            if new != text:
                with open(path, "w") as f:
                    f.write(new)
                print(f"render_docs: rewrote {os.path.relpath(path, ROOT)}")
    for line in stale:
        print(f"render_docs: stale: {line}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
