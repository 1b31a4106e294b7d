"""The tables in README.md and docs/ are what testbed.render_docs makes from the committed
results files (benchmarks/results/*.json): a hand edit or a table left stale after a new results
file fails here. Also the results file's summary and the verdict rule, on constructed results.
All in-process, no training."""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
import statistics

import pytest

from testbed import render_docs
from hvd_cifar.measure import results
from hvd_cifar.measure.results import Figure, Results, verdict
from hvd_cifar.measure.stats import t_interval

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("path", render_docs.doc_files(), ids=os.path.basename)
def test_generated_tables_match_the_results_files(path):
    with open(path) as f:
        text = f.read()
    stale = render_docs.stale_blocks(text)
    assert not stale, (f"{path}: generated blocks differ from the results files (a hand edit, or not "
                       f"rendered since the results changed): {stale}; run .venv/bin/python -m testbed.render_docs")


def test_every_marker_names_a_results_file_that_exists_and_parses():
    """A doc naming a results file that is not committed would render as "not measured" and
    pass the test above: here it fails, as does a file that is not a results file."""
    for path in render_docs.doc_files():
        with open(path) as f:
            for m in render_docs.BLOCK.finditer(f.read()):
                name, _ = render_docs.parse_spec(m["spec"])
                assert name.endswith(".json") and "/" not in name, f"{path}: {m['spec']}"
                file = os.path.join(results.RESULTS_DIR, name)
                assert os.path.isfile(file), f"{path}: {m['spec']}: benchmarks/results/{name} does not exist"
                with open(file) as g:
                    data = json.load(g)
                assert data["rounds"] and data["summary"] and data["benchmark"], f"{path}: {name} holds no rounds"


@pytest.mark.parametrize("values, op, target, expected", [
    ([0.99, 1.00, 1.01], ">=", 0.97, "met"),          # the whole interval above the target
    ([0.90, 0.91, 0.92], ">=", 0.97, "not met"),      # wholly below
    ([0.95, 0.99, 0.97], ">=", 0.97, "unresolved"),   # the interval holds the target
    ([0.98, 0.98, 0.98], ">=", 0.98, "met"),          # on the target counts as meeting it
    ([1.03, 1.04, 1.05], "<=", 1.10, "met"),
    ([1.20, 1.21, 1.22], "<=", 1.10, "not met"),
    ([1.05, 1.12, 1.15], "<=", 1.10, "unresolved"),
    # every round meets the target, but two rounds this far apart do not resolve it: the old
    # min-max rule said "met"
    ([0.98, 1.30], ">=", 0.97, "unresolved"),
    ([-1.1, -1.0, -0.9], ">=", -3.0, "met"),           # a figure that is not positive: a plain t-interval
    ([1.5], ">=", 1.0, "unresolved"),                 # one round has no spread: never resolved
])
def test_verdict_judges_the_interval_of_the_rounds(values, op, target, expected):
    assert verdict(values, op, target) == expected


def test_verdict_interval_is_scipys_t_interval_of_the_logarithms():
    """The interval the verdict uses, checked against scipy.stats directly."""
    import math

    from scipy import stats as scipy_stats

    from hvd_cifar.measure.stats import interval_of
    values = [0.95, 1.01, 0.99, 1.03]
    logs = [math.log(v) for v in values]
    low, high = scipy_stats.t.interval(0.95, 3, loc=sum(logs) / 4, scale=scipy_stats.sem(logs))
    iv = interval_of(values)
    assert iv.low == pytest.approx(math.exp(low)) and iv.high == pytest.approx(math.exp(high))
    assert verdict(values, ">=", math.exp(low) - 1e-9) == "met" and verdict(values, ">=", math.exp(high) + 1e-9) == "not met"


def test_verdict_of_no_rounds_and_of_a_bad_comparison():
    assert verdict([], ">=", 1.0) == "no rounds"
    with pytest.raises(ValueError):
        verdict([1.0, 1.1], ">", 1.0)


def made(tmp_path, rounds: list[tuple]) -> dict:
    """A results file written by Results from (round, config, img/s or a failure reason) tuples,
    with the ratio of a to b derived per round; read back."""
    args = argparse.Namespace(tag="t", results=str(tmp_path), np=[2])
    r = Results("demo", args, {"images_per_s": Figure("img/s", ".1f"), "ratio": Figure("a / b", ".3f")}, argv=["--np", "2"])
    for k, config, value in rounds:
        if isinstance(value, str):
            r.fail(k, config, value)
        else:
            r.add(k, config, {"images_per_s": value})
    r.derive("a / b", "ratio", lambda by: by["a"]["images_per_s"] / by["b"]["images_per_s"])
    path = r.write()
    assert os.path.basename(path) == "demo-t.json"
    with open(path) as f:
        return json.load(f)


def test_summary_is_median_min_max_n_of_the_rounds_that_did_not_fail(tmp_path):
    data = made(tmp_path, [(1, "a", 100.0), (1, "b", 50.0), (2, "a", 90.0), (2, "b", "exit status 1"),
                           (3, "a", 120.0), (3, "b", 60.0)])
    summary = data["summary"]["a"]["images_per_s"]
    assert {k: summary[k] for k in ("median", "min", "max", "n")} == {"median": 100.0, "min": 90.0, "max": 120.0, "n": 3}
    assert summary["low"] < summary["mean"] < summary["high"] and summary["unstable"]  # sd 15.3 of 103.3: > 10 %
    b = data["summary"]["b"]["images_per_s"]
    assert {k: b[k] for k in ("median", "min", "max", "n")} == {"median": 55.0, "min": 50.0, "max": 60.0, "n": 2}
    assert data["summary"]["a / b"]["ratio"] == {"median": 2.0, "mean": 2.0, "low": 2.0, "high": 2.0, "min": 2.0,
                                               "max": 2.0, "n": 2, "unstable": False}
    failed = [r for r in data["rounds"] if not r["ok"]]
    assert [(r["config"], r["round"]) for r in failed] == [("b", 2), ("a / b", 2)]
    assert "exit status 1" == failed[0]["reason"] and "failed jobs: b" in failed[1]["reason"]
    assert data["command"][1:] == ["--np", "2"] and data["machine"]["cores"] == os.cpu_count()
    assert len(data["machine"]["load_average_before"]) == 3 and data["machine"]["load_average_after"]


def test_a_figure_derived_in_named_rounds_only(tmp_path):
    """A pass run once (round 1) beside rounds of others: its derived figure in round 1 alone,
    not a failed round in each round it was not run in."""
    r = Results("demo", argparse.Namespace(results=str(tmp_path)), {"x": Figure("x"), "ratio": Figure("r")})
    for k in (1, 2, 3):
        r.add(k, "a", {"x": float(k)})
    r.add(1, "b", {"x": 4.0})
    r.derive("b / a", "ratio", lambda by: by["b"]["x"] / by["a"]["x"], rounds=[1])
    assert [(x["round"], x["config"], x["ok"]) for x in r.data["rounds"] if x.get("derived")] == [(1, "b / a", True)]
    assert r.summarize()["b / a"]["ratio"] == {"median": 4.0, "mean": 4.0, "low": None, "high": None, "min": 4.0,
                                               "max": 4.0, "n": 1, "unstable": False}


def test_a_job_of_rows_makes_a_configuration_of_each_row_and_fails_as_one_round(tmp_path):
    r = Results("demo", argparse.Namespace(results=str(tmp_path)), {"x": Figure("x"), "y": Figure("y")})
    rows = [{"name": "a", "x": 1.0, "y": 2.0, "other": "kept out"}, {"name": "b", "x": 3.0}]
    assert r.measure_rows(1, "1gbit", lambda: rows, lambda row: f"1gbit {row['name']}") == rows

    def broken():
        raise RuntimeError("1gbit: the cluster did not start")
    assert r.measure_rows(2, "1gbit", broken, lambda row: row["name"]) == []
    assert [(x["round"], x["config"], x["ok"], x["figures"]) for x in r.data["rounds"]] == [
        (1, "1gbit a", True, {"x": 1.0, "y": 2.0}), (1, "1gbit b", True, {"x": 3.0}), (2, "1gbit", False, {})]


def test_a_job_that_fails_is_a_failed_round_with_its_first_line(tmp_path):
    r = Results("demo", argparse.Namespace(results=str(tmp_path)), {"x": Figure("x")})

    def broken():
        raise RuntimeError("np2 horovod: exit status 1; see OUT/np2.log\nlast lines")
    assert r.measure(1, "a", lambda: {"x": 2.0}) == {"x": 2.0} and r.measure(2, "a", broken) is None
    assert r.attempt(3, "a", lambda: {}["missing"]) is None
    assert [(x["round"], x["ok"], x.get("reason")) for x in r.data["rounds"]] == [
        (1, True, None), (2, False, "np2 horovod: exit status 1; see OUT/np2.log"), (3, False, "'missing'")]
    with pytest.raises(TypeError):  # a bug in the benchmark is not a failed round
        r.attempt(4, "a", lambda: None + 1)


def test_undeclared_figure_is_an_error(tmp_path):
    r = Results("demo", argparse.Namespace(results=str(tmp_path)), {"x": Figure("x")})
    with pytest.raises(ValueError, match="not declared"):
        r.add(1, "a", {"y": 1.0})


def test_a_block_renders_medians_spreads_failures_and_verdicts(tmp_path):
    made(tmp_path, [(1, "a", 100.0), (1, "b", 50.0), (2, "a", 90.0), (2, "b", 100.0)])
    doc = ("Text.\n<!-- results: demo-t.json figures=images_per_s configs=a,b -->\nold\n<!-- /results -->\n"
           "<!-- results: demo-t.json show=checks check=\"a / b:ratio>=0.95\" check=\"a / b:ratio<=300\" -->\n"
           "<!-- /results -->\n")
    new = render_docs.render(doc, str(tmp_path))
    assert "| a | 95.0 (48.6–185.3) | 2 |" in new and "| b | 75.0 (0.9–5780.4) | 2 |" in new  # median, 95 % interval
    # ratios 2.0 and 0.9: two rounds this far apart resolve nothing near 1, only a bound far off
    assert "| a / b: a / b | ≥ 0.95 | 1.450 (0.008–214.197) | 2 | **unresolved** |" in new
    assert "| a / b: a / b | ≤ 300 | 1.450 (0.008–214.197) | 2 | **met** |" in new
    assert " --np 2`, commit " in new and "Failed rounds" not in new
    assert render_docs.stale_blocks(doc, str(tmp_path)) and not render_docs.stale_blocks(new, str(tmp_path))
    edited = new.replace("95.0 (48.6–185.3)", "99.0 (48.6–185.3)")  # a hand edit goes red
    assert render_docs.stale_blocks(edited, str(tmp_path)) == [m["spec"] for m in render_docs.BLOCK.finditer(doc)][:1]


def test_failed_rounds_are_listed_with_their_reason_under_tables_and_verdicts(tmp_path):
    made(tmp_path, [(1, "a", 100.0), (1, "b", 50.0), (2, "a", 90.0), (2, "b", "exit status 1; see b-r2.log")])
    doc = ("<!-- results: demo-t.json configs=b -->\n<!-- /results -->\n"
           "<!-- results: demo-t.json show=checks check=\"a / b:ratio>=1.5\" -->\n<!-- /results -->\n")
    new = render_docs.render(doc, str(tmp_path))
    assert "- b, round 2: exit status 1; see b-r2.log" in new
    assert "| a / b: a / b | ≥ 1.5 | 2.000 | 1 | **unresolved** |" in new  # one round: no interval
    assert "- a / b, round 2: cannot be computed (KeyError: 'b'); failed jobs: b" in new
    listed = render_docs.render("<!-- results: demo-t.json show=failed match=^[ab]$ -->\n<!-- /results -->", str(tmp_path))
    assert "- b, round 2: exit status 1; see b-r2.log" in listed and "- a," not in listed
    none = render_docs.render("<!-- results: demo-t.json show=failed configs=a -->\n<!-- /results -->", str(tmp_path))
    assert "None of the 2 rounds failed." in none


def test_a_check_on_the_mean_shows_the_mean_and_judges_the_interval(tmp_path):
    """A target set on a mean shows the mean of the rounds that did not fail; every check is
    judged by the rounds' interval: met, not met, or unresolved."""
    made(tmp_path, [(1, "a", 110.0), (1, "b", 100.0), (2, "a", 112.0), (2, "b", 100.0), (3, "a", 114.0),
                    (3, "b", 100.0)])
    doc = ("<!-- results: demo-t.json show=checks check=\"a / b:ratio.mean>=1\" check=\"a / b:ratio.mean<=1\" "
           "check=\"a / b:ratio>=1.12\" -->\n<!-- /results -->\n")
    new = render_docs.render(doc, str(tmp_path))
    assert "| figure | target | median, or mean where the row says, (95 % interval) | rounds | verdict |" in new
    # ratios 1.10, 1.12, 1.14: their interval lies above 1 and holds 1.12
    assert "| a / b: a / b, mean of the rounds | ≥ 1 | 1.120 (1.071–1.171) | 3 | **met** |" in new
    assert "| a / b: a / b, mean of the rounds | ≤ 1 | 1.120 (1.071–1.171) | 3 | **not met** |" in new
    assert "| a / b: a / b | ≥ 1.12 | 1.120 (1.071–1.171) | 3 | **unresolved** |" in new
    assert "Cells: median, or mean where the row says, (95 % interval) over the rounds." in new
    only_means = render_docs.render(doc.replace(' check="a / b:ratio>=1.12"', ""), str(tmp_path))
    assert "Cells: mean (95 % interval) over the rounds." in only_means and "| mean (95 % interval) |" in only_means
    made(tmp_path, [(1, "a", 100.0), (1, "b", 50.0), (2, "a", 90.0), (2, "b", "exit status 1")])
    failed = render_docs.render(doc, str(tmp_path))
    assert "| a / b: a / b, mean of the rounds | ≥ 1 | 2.000 | 1 | **unresolved** |" in failed
    assert "Failed rounds (left out of the medians and means):" in failed


def test_a_missing_results_file_renders_as_a_command_not_a_number(tmp_path):
    new = render_docs.render("<!-- results: nothing.json -->\n<!-- /results -->", str(tmp_path))
    assert "Not measured on the current code yet: `make bench`" in new and "benchmarks/results/nothing.json" in new


def test_a_bad_marker_is_an_error_naming_it():
    with pytest.raises(ValueError, match="unknown option 'colour'"):
        render_docs.parse_spec("x.json colour=red")
    assert results.file_name("sync_methods") == "sync_methods.json"


def test_paired_comparisons_give_the_interval_and_say_when_it_cannot_resolve(tmp_path):
    """show=paired on a constructed file: a difference that every round shows is resolved, one
    whose rounds disagree in sign is "no difference these rounds can resolve"; ratio=true gives
    the geometric mean of the rounds' ratios with its interval (scipy's t on the logarithms)."""
    args = argparse.Namespace(tag="p", results=str(tmp_path))
    r = Results("demo", args, {"final_acc": Figure("acc", ".3f"), "images_per_s": Figure("img/s", ".1f")}, argv=[])
    for k, (a, b, c, fast, slow) in enumerate([(0.90, 0.88, 0.91, 200.0, 100.0), (0.91, 0.89, 0.89, 210.0, 100.0),
                                               (0.92, 0.90, 0.93, 190.0, 100.0)], 1):
        r.add(k, "a", {"final_acc": a, "images_per_s": fast})
        r.add(k, "b", {"final_acc": b, "images_per_s": slow})
        r.add(k, "c", {"final_acc": c})
    r.write()
    # what the tracked tree held that differed from the commit, results files and docs left out
    assert r.data["dirty"] == bool(r.data["changed"]) and not any(
        p.startswith(("benchmarks/results/", "docs/")) for p in r.data["changed"])
    doc = ('<!-- results: demo-p.json show=paired test_size=360 pair="a|b" pair="c|a" -->\n<!-- /results -->\n'
           '<!-- results: demo-p.json show=paired figure=images_per_s ratio=true pair="a|b" -->\n<!-- /results -->\n')
    text = render_docs.render(doc, str(tmp_path))
    assert "| a − b | +2.00 | +2.00 to +2.00 | 3 |" in text and "| higher |" in text
    assert "| c − a | +0.00 |" in text and "no difference these rounds can resolve" in text
    # ... and says the smallest difference they could have shown: the interval's half-width
    from scipy import stats as st
    diffs = [1.0, -2.0, 1.0]
    half = st.t.ppf(0.975, 2) * st.sem(diffs)
    assert f"no difference these rounds can resolve (they resolve about ±{half:.2f} points)" in text, text
    import math
    from scipy import stats
    logs = [math.log(2.0), math.log(2.1), math.log(1.9)]
    low, high = stats.t.interval(0.95, 2, loc=sum(logs) / 3, scale=stats.sem(logs))
    assert f"| a / b | {(2.0 * 2.1 * 1.9) ** (1 / 3):.3f} | {math.exp(low):.3f} to {math.exp(high):.3f} | 3 | A higher |" \
        in text, text


def test_a_table_whose_code_changed_after_its_results_commit_says_it_is_stale(tmp_path, monkeypatch):
    """The older rule, for a results file without a record of its code: one made at the project's
    first commit: hvd_cifar/ changed since, so its table says so, naming the files; one made at
    HEAD names only what differs from HEAD (none in a clean clone); a commit this clone does not
    hold says nothing, and --check then tolerates a staleness line it cannot judge."""
    import subprocess
    first = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], cwd=results.ROOT, capture_output=True,
                           text=True).stdout.split()
    if not first:
        pytest.skip("no git history in this clone")
    monkeypatch.setattr(results, "_jobs", [])  # the file records its code, as a benchmark's does
    made(tmp_path, [(1, "a", 100.0), (1, "b", 50.0), (2, "a", 90.0), (2, "b", 100.0)])
    path = tmp_path / "demo-t.json"
    data = json.loads(path.read_text())
    data.pop("code", None)  # as a results file written before results files recorded it
    doc = "<!-- results: demo-t.json configs=a -->\n<!-- /results -->\n"
    for commit, stale in ((first[0][:7], True), ("0" * 7, False)):
        path.write_text(json.dumps({**data, "commit": commit}))
        new = render_docs.render(doc, str(tmp_path))
        assert ("the code these figures measure changed after commit " in new) == stale, new
        if stale:
            assert re.search(r"\(\d+ files: `(benchmarks|hvd_cifar)/", new), new
    path.write_text(json.dumps({**data, "commit": first[0][:7]}))
    stale_doc = render_docs.render(doc, str(tmp_path))
    path.write_text(json.dumps({**data, "commit": "0" * 7}))
    assert render_docs.stale_blocks(stale_doc.replace(first[0][:7], "0" * 7), str(tmp_path)) == []
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=results.ROOT, capture_output=True,
                          text=True).stdout.strip()
    differs = [p for p in subprocess.run(["git", "diff", "--name-only", head, "--", *render_docs.MEASURED_PATHS],
                                         cwd=results.ROOT, capture_output=True, text=True).stdout.split()
               if not render_docs._same_code(head, p)]  # a change to comments alone is none
    path.write_text(json.dumps({**data, "commit": head}))
    render_docs.changed_since.cache_clear()
    assert ("**Stale:**" in render_docs.render(doc, str(tmp_path))) == bool(differs)


def test_a_paired_ratio_against_a_target_where_lower_is_better(tmp_path):
    """CPU per image against DDP's at most 1.10: better=lower judges the interval's upper end."""
    args = argparse.Namespace(tag="lower", results=str(tmp_path))
    r = Results("demo", args, {"cpu": Figure("cpu", ".3f")})
    for k, (a, b) in enumerate(((1.00, 1.00), (1.02, 1.00), (0.99, 1.00), (1.01, 1.00)), 1):
        r.add(k, "horovod", {"cpu": a})
        r.add(k, "ddp", {"cpu": b})
    r.write()
    doc = '<!-- results: demo-lower.json show=paired ratio=true figure=cpu target={t} better=lower pair="horovod|ddp" -->\n<!-- /results -->\n'
    assert "**met** (≤ 1.10)" in render_docs.render(doc.format(t="1.10"), str(tmp_path))
    assert "**not met** (≤ 0.90)" in render_docs.render(doc.format(t="0.90"), str(tmp_path))
    assert "**unresolved** (≤ 1.01)" in render_docs.render(doc.format(t="1.01"), str(tmp_path))
    worded = doc.replace("better=lower", "better=lower verdicts=pays,does_not_pay")  # a time to accuracy's words
    assert "**pays** (≤ 1.10)" in render_docs.render(worded.format(t="1.10"), str(tmp_path))
    assert "**does not pay** (≤ 0.90)" in render_docs.render(worded.format(t="0.90"), str(tmp_path))
    assert "**unresolved** (≤ 1.01)" in render_docs.render(worded.format(t="1.01"), str(tmp_path))


def test_a_change_to_comments_alone_leaves_a_table_current(tmp_path, monkeypatch):
    """In a repository of its own: a measured file whose comments changed after the results
    commit is not a code change; one whose code changed is, and is named."""
    import subprocess

    def git(*argv):
        return subprocess.run(["git", *argv], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    (tmp_path / "hvd_cifar").mkdir()
    (tmp_path / "hvd_cifar" / "a.py").write_text("X = 1  # one\n")
    (tmp_path / "hvd_cifar" / "b.py").write_text("Y = 2\n")
    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    commit = git("rev-parse", "--short", "HEAD").strip()
    (tmp_path / "hvd_cifar" / "a.py").write_text("# a comment of its own\nX = 1  # the one\n")
    (tmp_path / "hvd_cifar" / "b.py").write_text("Y = 3\n")
    monkeypatch.setattr(render_docs, "ROOT", str(tmp_path))
    render_docs.changed_since.cache_clear()
    try:
        assert render_docs.changed_since(commit) == ("hvd_cifar/b.py",)
    finally:
        render_docs.changed_since.cache_clear()


def test_make_bench_quick_measures_every_results_file_the_readme_shows():
    """Each command of ``make bench-quick`` writes benchmarks/results/NAME[-TAG].json; together
    they are the files README.md's blocks render, and the docs are rendered after them."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nbench-quick:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    written = set()
    for line in recipe:
        found = re.search(r"benchmarks/(\w+)\.py(.*)", line)
        if found:
            tag = re.search(r"--tag (\S+)", found[2])
            written.add(results.file_name(found[1], tag[1] if tag else ""))
    shown = {render_docs.parse_spec(m["spec"])[0] for m in render_docs.BLOCK.finditer((ROOT / "README.md").read_text())}
    assert shown and written == shown, (sorted(written), sorted(shown))
    assert recipe[-1].strip() == "$(PY) -m testbed.render_docs"


def test_a_paired_table_that_resolves_nothing_is_one_sentence_saying_what_it_could(tmp_path):
    """Every verdict unresolved: no table, one line naming the comparisons, the pairs and the
    half-width of their intervals (what these rounds could have shown); one verdict resolved:
    the table, every row."""
    args = argparse.Namespace(tag="none", results=str(tmp_path))
    r = Results("demo", args, {"ips": Figure("img/s", ".1f")})
    for k, (a, b, c) in enumerate(((100, 100, 50), (110, 100, 52), (95, 100, 49)), 1):
        r.add(k, "a", {"ips": a})
        r.add(k, "b", {"ips": b})
        r.add(k, "c", {"ips": c})
    r.write()
    doc = ('<!-- results: demo-none.json show=paired ratio=true figure=ips target=1.0 pair="a|b"{more} -->\n'
           '<!-- /results -->\n')
    alone = render_docs.render(doc.format(more=""), str(tmp_path))
    ratios = [1.0, 1.1, 0.95]
    _, low, high = t_interval([math.log(x) for x in ratios])
    half = 100 * (math.exp(high) - math.exp(low)) / 2 / math.exp(statistics.fmean(map(math.log, ratios)))
    assert "| comparison |" not in alone
    assert f"**unresolved** (≥ 1.0) for a / b (" in alone and f"in 3 pairs: their intervals span ±{half:.1f} %" in alone
    both = render_docs.render(doc.format(more=' pair="a|c"'), str(tmp_path))  # a is twice c: met
    assert "| comparison |" in both and "| a / b |" in both and "**met** (≥ 1.0)" in both


def test_a_pair_whose_one_side_the_file_lacks_is_a_row_saying_so_and_a_typo_in_both_still_fails(tmp_path):
    """A candidate the processor that made a results file did not have (bf16 on a CPU without it)
    leaves its pair unmeasured, said in its row; a pair naming nothing the file has is an error."""
    args = argparse.Namespace(tag="absent", results=str(tmp_path))
    r = Results("demo", args, {"ips": Figure("img/s", ".1f")})
    for k, (a, b) in enumerate(((100, 90), (110, 100), (95, 90)), 1):
        r.add(k, "a", {"ips": a})
        r.add(k, "b", {"ips": b})
    r.write()
    doc = '<!-- results: demo-absent.json show=paired ratio=true figure=ips pair="a|b" pair="a|{other}" -->\n<!-- /results -->\n'
    made = render_docs.render(doc.format(other="bf16"), str(tmp_path))
    assert "| a / bf16 | - | - | 0 | not measured: the file has no `bf16` |" in made and "| a / b |" in made
    with pytest.raises(ValueError, match="fewer than 2 rounds"):
        render_docs.render('<!-- results: demo-absent.json show=paired pair="x|y" -->\n<!-- /results -->\n', str(tmp_path))


def test_a_plot_block_shows_a_figure_against_the_link_rate_and_draws_it_only_when_rendering(tmp_path):
    """show=plot: configurations "SERIES RATE" as points, the slowest rate first; the table holds
    the medians with their intervals; the image is written under docs/figures when rendering,
    never with --check's comparison."""
    args = argparse.Namespace(tag="plot", results=str(tmp_path))
    r = Results("demo", args, {"t": Figure("time (s)", ".1f")})
    for k in (1, 2, 3):
        for series, rate, t in (("none", "1gbit", 10.0), ("none", "20mbit", 30.0), ("psgd", "20mbit", 12.0),
                                ("psgd", "1gbit", 11.0), ("none", "100mbit", 14.0)):
            r.add(k, f"{series} {rate}", {"t": t + k})
    r.add(1, "none / psgd 20mbit", {"t": 1.0})  # not a point: left out
    for k in (1, 2, 3):  # the same in every round (an interval of a point), and a round that has no figure
        r.add(k, "flat 1gbit", {"t": 5.0})
        r.add(k, "flat 20mbit", {"t": 9.0} if k < 3 else {})
    r.write()
    doc = '<!-- results: demo-plot.json show=plot figure=t -->\n<!-- /results -->\n'
    made = render_docs.render(doc, str(tmp_path))
    assert "![time (s) against the link rate, median of the rounds with its 95 % interval](figures/demo-plot-t.png)" in made
    lines = [line for line in made.splitlines() if line.startswith("|")]
    assert lines[0] == "| time (s) at | 20mbit | 100mbit | 1gbit |"
    none, psgd = ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:4])
    assert [c.split(" ")[0] for c in none] == ["none", "32.0", "16.0", "12.0"]
    assert [c.split(" ")[0] for c in psgd] == ["psgd", "14.0", "-", "13.0"]  # not run at 100mbit
    assert none[1].startswith("32.0 (") and none[1].endswith(")")  # the interval of its 3 rounds
    flat = [c.strip() for c in lines[4].strip("|").split("|")]
    assert flat == ["flat", "9.0 [2 of 3]", "-", "5.0"]
    assert not (tmp_path / "docs").exists()
    docs = tmp_path / "docs"
    assert render_docs.render(doc, str(tmp_path), str(docs)) == made
    assert (docs / "figures" / "demo-plot-t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no configuration 'SERIES RATE'"):
        render_docs.render(doc.replace("figure=t", "figure=nothing"), str(tmp_path))
