"""hvd_cifar.report on run folders: folders written by the test (tests/runfolders.py: a one-rank
and a two-rank run of three epochs, runs with a target test accuracy, odd and torn ones), and the
session's real 2-rank horovodrun run of configs/tiny.yaml (conftest's tiny_run) reported through the
command line, where the trainer's own files are the point. The tables are checked against metrics.jsonl / eval.json with
numbers computed here, independently of the report's own code, and every figure must be a
readable, non-blank PNG."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import assert_png, md_table, read_csv, shown
from hvd_cifar import report
from hvd_cifar.analysis import plots
from hvd_cifar.core.names import PHASES
from hvd_cifar.runfolder.reader import load_run
from runfolders import epoch_record, write_run

ROOT = Path(__file__).resolve().parents[1]
RUN_FIGURES = ("acc_train_test.png", "loss.png", "training_time.png", "step_breakdown.png", "comm_bytes.png",
               "resources.png")


# ----------------------------------------------------------------------------- helpers
def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def expected(records: list[dict]) -> dict:
    """What the tables should say, computed from metrics.jsonl: means over epochs after the first."""
    steady = records[1:] if len(records) >= 2 else records
    seconds = sum(r["epoch_time_s"] for r in steady)
    return {
        "mean_epoch_time_s": seconds / len(steady),
        "total_epoch_time_s": sum(r["epoch_time_s"] for r in records),
        "images_per_s": sum(r["images_per_s"] * r["epoch_time_s"] for r in steady) / seconds,
        "bytes_per_epoch_per_rank": sum(r["comm_bytes_per_rank"] for r in steady) / len(steady),
        "final_test_acc": records[-1]["test_acc"],
        "final_train_acc": records[-1]["train_acc"],
    }


def reached(records: list[dict], target: float) -> dict | None:
    """The first epoch record whose test accuracy reached ``target``; None when none did."""
    return next((r for r in records if r["test_acc"] >= target), None)


def run_main(argv: list[str], capsys) -> tuple[int, str]:
    """report.main in this process; returns (exit status, stderr)."""
    try:
        code = report.main(argv)
    except SystemExit as exc:  # argparse's own exits
        code = exc.code
    return code, capsys.readouterr().err


def summary_of(text: str) -> dict[str, str]:
    return {r["item"]: r["value"] for r in md_table(text, "## Summary")}


def check_epoch_table(records: list[dict], text: str) -> None:
    rows = md_table(text, "## Per epoch")
    assert [int(r["epoch"]) for r in rows] == [r["epoch"] for r in records]
    for row, rec in zip(rows, records):
        shown(row["train loss"], rec["train_loss"], 4)
        shown(row["test loss"], rec["test_loss"], 4)
        shown(row["train acc (%)"], rec["train_acc"], 2, 0.01)
        shown(row["test acc (%)"], rec["test_acc"], 2, 0.01)
        assert math.isclose(float(row["lr"]), rec["lr"], rel_tol=1e-3)
        shown(row["epoch time (s)"], rec["epoch_time_s"], 3)
        shown(row["img/s"], rec["images_per_s"], 1)
        for phase in PHASES:
            shown(row[f"{phase} (ms/step)"], rec[f"{phase}_time_s"] / rec["steps"] * 1000, 2)
        shown(row["bytes/rank (MB)"], rec["comm_bytes_per_rank"], 3, 1e6)


def check_summary(records: list[dict], text: str, world_size: int) -> None:
    want = expected(records)
    summary = summary_of(text)
    assert summary["world size (ranks)"] == str(world_size)
    assert summary["model"] == "smallcnn" and summary["dataset"] == "digits"
    assert summary["sync method"] == "horovod" and summary["compression"] == "none"
    assert summary["batch size per rank"] == "32" and summary["accumulation steps"] == "1"
    assert summary["frozen blocks (config)"] == "0"
    shown(summary["mean epoch time (s, first epoch excluded)"], want["mean_epoch_time_s"], 3)
    shown(summary["total training time (s, all epochs)"], want["total_epoch_time_s"], 3)
    shown(summary["throughput (img/s, same epochs)"], want["images_per_s"], 1)
    shown(summary["bytes per epoch per rank (MB, same epochs)"], want["bytes_per_epoch_per_rank"], 3, 1e6)
    shown(summary["final test accuracy (%)"], want["final_test_acc"], 2, 0.01)
    shown(summary["final train accuracy (%)"], want["final_train_acc"], 2, 0.01)
    # One rank sends nothing; two ranks send their gradients every step.
    assert (want["bytes_per_epoch_per_rank"] > 0) == (world_size > 1)


def check_eval_sections(evaluation: dict, text: str) -> None:
    rows = {r["class"]: r for r in md_table(text, "### Classification report")}
    for name, scores in evaluation["classification_report"].items():
        if isinstance(scores, dict):
            for key in ("precision", "recall", "f1-score"):
                shown(rows[name][key], scores[key], 4)
            assert float(rows[name]["support"]) == scores["support"]
    matrix = md_table(text, "### Confusion matrix")
    assert [[int(row[str(j)]) for j in range(len(matrix))] for row in matrix] == evaluation["confusion_matrix"]


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A one-rank and a two-rank run of three epochs, written here."""
    logs = tmp_path_factory.mktemp("report-runs")
    return {"np1": write_run(logs / "np1", world_size=1), "np2": write_run(logs / "np2", world_size=2)}


TARGET = 0.5
TIME_ITEM = "time to target (s, wall time since the run started)"
TARGET_ACCURACIES = {"np1": [0.3, 0.55, 0.7], "np2": [0.3, 0.45, 0.62], "never": [0.4]}  # test acc by epoch


def target_run(folder: Path, world_size: int, accuracies: list[float], target: float) -> Path:
    """A finished run with a target: its eval.json says when it was first reached (as the trainer's)."""
    records = [epoch_record(e, world_size, test_acc=acc) for e, acc in enumerate(accuracies)]
    first = reached(records, target)
    keys = {"target_acc": target, "epochs_to_target": first["epoch"] + 1 if first else None,
            "time_to_target_s": first["elapsed_s"] if first else None}
    return write_run(folder, records, config={"target_acc": target}, target=keys)


@pytest.fixture(scope="module")
def target_runs(tmp_path_factory) -> dict[str, Path]:
    """Whole epochs with a target: np1 and np2 (3 epochs, 50 %; np2 later), never (1 epoch, 99 %)."""
    logs = tmp_path_factory.mktemp("target-runs")
    return {"np1": target_run(logs / "np1", 1, TARGET_ACCURACIES["np1"], TARGET),
            "np2": target_run(logs / "np2", 2, TARGET_ACCURACIES["np2"], TARGET),
            "never": target_run(logs / "never", 1, TARGET_ACCURACIES["never"], 0.99)}


@pytest.fixture(scope="module")
def target_reports(target_runs, tmp_path_factory) -> dict[str, str]:
    """report.md of each target run."""
    texts = {}
    for name, run in target_runs.items():
        out = tmp_path_factory.mktemp(f"{name}-report")
        assert report.main([str(run), "--out", str(out)]) == 0
        texts[name] = (out / "report.md").read_text()
    return texts


@pytest.fixture(scope="module")
def reports(runs, tmp_path_factory) -> dict[str, Path]:
    """report.md + figures: np1 in its default place (RUN/report), np2 in an --out folder."""
    out = tmp_path_factory.mktemp("np2-report")
    assert report.main([str(runs["np1"])]) == 0
    assert report.main([str(runs["np2"]), "--out", str(out)]) == 0
    return {"np1": runs["np1"] / "report", "np2": out}


@pytest.fixture(scope="module")
def comparison(runs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("compare")
    assert report.main([str(runs["np1"]), str(runs["np2"]), "--out", str(out)]) == 0
    return out


# ----------------------------------------------------------------------------- a real run, end to end
@pytest.mark.slow  # the session's 2-rank horovodrun run of tiny.yaml
def test_a_real_runs_report_from_the_command_line(tmp_path, tiny_run):
    """The trainer's own files, through ``python -m hvd_cifar.report RUN``: the default output
    folder, every figure, and the tables matching metrics.jsonl and eval.json."""
    run = tiny_run("horovodrun").copy_to(tmp_path)  # the report goes into RUN/report
    done = subprocess.run([sys.executable, "-m", "hvd_cifar.report", str(run)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"report written to {run / 'report' / 'report.md'}" and not done.stderr
    assert sorted(p.name for p in (run / "report").glob("*.png")) == sorted(RUN_FIGURES)
    for figure in RUN_FIGURES:
        assert_png(run / "report" / figure)
    text = (run / "report" / "report.md").read_text()
    records = metrics(run)
    assert len(records) == 2
    check_epoch_table(records, text)
    check_summary(records, text, 2)
    check_eval_sections(json.loads((run / "eval.json").read_text()), text)


# ----------------------------------------------------------------------------- one run
@pytest.mark.parametrize("name", ["np1", "np2"])
def test_epoch_table_matches_metrics(name, runs, reports):
    check_epoch_table(metrics(runs[name]), (reports[name] / "report.md").read_text())


@pytest.mark.parametrize("name, world_size", [("np1", 1), ("np2", 2)])
def test_summary_matches_metrics_and_config(name, world_size, runs, reports):
    check_summary(metrics(runs[name]), (reports[name] / "report.md").read_text(), world_size)


def test_eval_sections_match_eval_json(runs, reports):
    check_eval_sections(json.loads((runs["np2"] / "eval.json").read_text()), (reports["np2"] / "report.md").read_text())


@pytest.mark.parametrize("name", ["np1", "np2"])
def test_run_figures_are_readable_pngs(name, reports):
    text = (reports[name] / "report.md").read_text()
    for figure in RUN_FIGURES:
        assert_png(reports[name] / figure)
        assert f"]({figure})" in text  # and the report shows it


@pytest.mark.parametrize("run_name", ["20250101-120000-vgg11-cifar10-horovod-np2-fp16-accumulation4-freeze2-sweep",
                                      "ARunNameWithoutHyphensThatIsLongerThanAnyFigureIsWideAndThenSomeMoreToBeSure"])
def test_a_long_run_name_fits_in_every_figure(runs, run_name):
    """matplotlib cuts a title off at the figure's edges: each figure's title, the run's name
    included, lies inside the figure."""
    run = load_run(str(runs["np2"]))
    run.name = run_name
    epochs = [r["epoch"] for r in run.metrics]
    for file_name, plot in plots.RUN_PLOTS:
        fig, _ = plot(run, epochs)
        fig.canvas.draw()
        renderer, box = fig.canvas.get_renderer(), fig.bbox
        titles = [*fig.texts, *(ax.title for ax in fig.axes)]  # fig.texts: suptitle and notes
        texts = [t for t in titles if t.get_visible() and t.get_text().strip()]
        assert any(run_name[:8] in t.get_text() for t in texts), file_name  # the name is shown
        for t in texts:
            extent = t.get_window_extent(renderer)
            assert box.x0 - 1 <= extent.x0 and extent.x1 <= box.x1 + 1, (file_name, t.get_text(), extent, box)
            assert box.y0 - 1 <= extent.y0 and extent.y1 <= box.y1 + 1, (file_name, t.get_text(), extent, box)


def test_missing_and_unknown_keys_are_tolerated(runs, tmp_path, capsys):
    """Older or newer runs: optional keys missing, new keys (NIC counters) present, no eval.json."""
    run = tmp_path / "odd-keys"
    shutil.copytree(runs["np2"], run, ignore=shutil.ignore_patterns("report", "*.pt", "eval.json"))
    records = metrics(run)
    for i, rec in enumerate(records):
        for key in ("eval_time_s", "data_time_s", "comm_bytes_per_rank"):
            rec.pop(key)
        rec.update(nic_rx_bytes={"a": 1_000_000 * (i + 1), "b": 5_000_000 * (i + 1)},
                   nic_tx_bytes={"a": 2_000_000 * (i + 1), "b": 2_000_000 * (i + 1)}, a_future_key="x")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    code, err = run_main([str(run), "--out", str(tmp_path / "out")], capsys)
    assert code == 0, err
    text = (tmp_path / "out" / "report.md").read_text()
    rows = md_table(text, "## Per epoch")
    assert all(r["data (ms/step)"] == "-" and r["bytes/rank (MB)"] == "-" for r in rows)
    shown(rows[0]["forward (ms/step)"], records[0]["forward_time_s"] / records[0]["steps"] * 1000, 2)
    assert "Classification report" not in text
    # Per-host NIC counters: each epoch's mean over the hosts, summed over the run's epochs.
    epochs = sum(range(1, len(records) + 1))
    assert summary_of(text)["NIC bytes over the run per host (MB, tx / rx measured, mean over hosts)"] == \
        f"{2 * epochs:.3f} / {3 * epochs:.3f}"
    for figure in RUN_FIGURES:
        assert_png(tmp_path / "out" / figure)


TORN = '{"epoch": 3, "lr": 0.0125, "train_loss": 0.4, "train_a'  # a write cut short: no newline, not JSON


def test_a_torn_last_line_is_left_out_and_said(runs, tmp_path, capsys):
    """A run killed while writing its last metrics line: the whole epochs are reported, and the
    report and the command both say one line was torn."""
    records = [epoch_record(e, 2) for e in range(3)]
    run = write_run(tmp_path / "killed", records, eval_json=False, metrics_tail=TORN)
    code, err = run_main([str(run), "--out", str(tmp_path / "out")], capsys)
    assert code == 0, err
    note = "metrics.jsonl: its last line is torn (the run was killed while writing it); the 3 whole epochs are reported"
    assert err == f"hvd_cifar: note: {run / note}\n"
    text = (tmp_path / "out" / "report.md").read_text()
    assert f"Note: {note}." in text
    check_epoch_table(records, text)
    code, err = run_main([str(runs["np1"]), str(run), "--out", str(tmp_path / "cmp")], capsys)
    assert code == 0 and err == f"hvd_cifar: note: {run / note}\n"
    assert f"- killed: `{run}` ({note})" in (tmp_path / "cmp" / "compare.md").read_text()
    assert (tmp_path / "cmp" / "compare.md").read_text().count("its last line is torn") == 1  # np1 is whole


# ----------------------------------------------------------------------------- several runs
def test_compare_csv_and_markdown_match_metrics(runs, comparison):
    want = {name: expected(metrics(runs[name])) for name in ("np1", "np2")}
    speedup = want["np2"]["images_per_s"] / want["np1"]["images_per_s"]
    csv_rows = {r["run"]: r for r in read_csv(comparison / "compare.csv")}
    md_rows = {r["run"]: r for r in md_table((comparison / "compare.md").read_text(), "# Run comparison")}
    assert set(csv_rows) == set(md_rows) == {"np1", "np2"}
    for name, world_size in (("np1", 1), ("np2", 2)):
        c, m, w = csv_rows[name], md_rows[name], want[name]
        assert int(c["world_size"]) == world_size and m["np"] == str(world_size)
        assert (c["model"], c["dataset"], c["sync"], c["batch_size"]) == ("smallcnn", "digits", "horovod", "32")
        for key in ("mean_epoch_time_s", "images_per_s", "bytes_per_epoch_per_rank", "final_test_acc"):
            assert math.isclose(float(c[key]), w[key], rel_tol=1e-9, abs_tol=1e-12), key
        shown(m["mean epoch time (s, excl. first epoch)"], w["mean_epoch_time_s"], 3)
        shown(m["img/s (excl. first epoch)"], w["images_per_s"], 1)
        shown(m["bytes/epoch/rank (MB)"], w["bytes_per_epoch_per_rank"], 3, 1e6)
        shown(m["final test acc (%)"], w["final_test_acc"], 2, 0.01)
    assert math.isclose(float(csv_rows["np1"]["speedup"]), 1.0)
    assert math.isclose(float(csv_rows["np2"]["speedup"]), speedup, rel_tol=1e-9)
    assert math.isclose(float(csv_rows["np2"]["efficiency"]), speedup / 2, rel_tol=1e-9)
    shown(md_rows["np2"]["speedup vs np=1"], speedup, 2)
    shown(md_rows["np2"]["scaling efficiency"], speedup / 2, 2)


def test_compare_figures(comparison):
    text = (comparison / "compare.md").read_text()
    for figure in ("compare_test_acc.png", "compare_epoch_time.png", "scaling.png"):
        assert_png(comparison / figure)
        assert f"]({figure})" in text


def test_speedup_only_against_np1_of_the_same_config(runs, tmp_path, capsys):
    """An np=1 run with another batch size is no baseline: no speedup, and no scaling plot."""
    other = tmp_path / "np1-b64"
    shutil.copytree(runs["np1"], other, ignore=shutil.ignore_patterns("report", "*.pt"))
    config = (other / "config.yaml").read_text()
    assert "batch_size: 32\n" in config
    (other / "config.yaml").write_text(config.replace("batch_size: 32\n", "batch_size: 64\n"))
    out = tmp_path / "out"
    code, err = run_main([str(other), str(runs["np2"]), "--out", str(out)], capsys)
    assert code == 0, err
    rows = {r["run"]: r for r in read_csv(out / "compare.csv")}
    assert rows["np1-b64"]["batch_size"] == "64"
    assert float(rows["np1-b64"]["speedup"]) == 1.0
    assert rows["np2"]["speedup"] == "" and rows["np2"]["efficiency"] == ""
    assert not (out / "scaling.png").exists()


# ----------------------------------------------------------------------------- time to target
@pytest.mark.parametrize("name", ["np1", "np2"])
def test_summary_shows_time_to_target(name, target_runs, target_reports):
    records, evaluation = metrics(target_runs[name]), json.loads((target_runs[name] / "eval.json").read_text())
    first = reached(records, TARGET)
    assert evaluation["epochs_to_target"] == first["epoch"] + 1  # the premise: eval.json says when
    summary = summary_of(target_reports[name])
    assert summary["target test accuracy (%)"] == "50.00"
    assert summary["epochs to target"] == str(evaluation["epochs_to_target"])
    shown(summary[TIME_ITEM], evaluation["time_to_target_s"], 3)
    shown(summary["wall time (s, set-up, training and evaluation)"], records[-1]["elapsed_s"], 3)
    rows = md_table(target_reports[name], "## Per epoch")
    assert len(rows) == len(records) == 3
    for row, rec in zip(rows, records):
        shown(row["elapsed (s)"], rec["elapsed_s"], 1)


def test_summary_says_not_reached(target_runs, target_reports):
    evaluation = json.loads((target_runs["never"] / "eval.json").read_text())
    assert evaluation["target_acc"] == 0.99 and all(r["test_acc"] < 0.99 for r in metrics(target_runs["never"]))
    assert evaluation["epochs_to_target"] is None and evaluation["time_to_target_s"] is None
    summary = summary_of(target_reports["never"])
    assert summary["target test accuracy (%)"] == "99.00"
    assert summary["epochs to target"] == summary[TIME_ITEM] == "not reached in 1 epoch"


def test_summary_without_a_target(reports):
    summary = summary_of((reports["np1"] / "report.md").read_text())
    assert summary["target test accuracy (%)"] == "none (target_acc not set)"
    assert summary["epochs to target"] == summary[TIME_ITEM] == "- (no target)"


def test_time_to_target_of_a_run_without_eval_json(target_runs, tmp_path, capsys):
    """An unfinished run (no eval.json yet): found in metrics.jsonl, as the trainer finds it."""
    run = tmp_path / "unfinished"
    shutil.copytree(target_runs["np2"], run, ignore=shutil.ignore_patterns("report", "*.pt", "eval.json"))
    first = reached(metrics(run), TARGET)
    code, err = run_main([str(run), "--out", str(tmp_path / "out")], capsys)
    assert code == 0, err
    summary = summary_of((tmp_path / "out" / "report.md").read_text())
    assert summary["target test accuracy (%)"] == "50.00"
    assert summary["epochs to target"] == str(first["epoch"] + 1)
    shown(summary[TIME_ITEM], first["elapsed_s"], 3)


def test_compare_shows_time_to_target_and_its_speedup(target_runs, tmp_path):
    """'never' (np=1, another target) comes first: np2's baseline must be np1, whose target it shares."""
    out = tmp_path / "compare"
    assert report.main([str(target_runs[n]) for n in ("never", "np1", "np2")] + ["--out", str(out)]) == 0
    evaluation = {n: json.loads((target_runs[n] / "eval.json").read_text()) for n in target_runs}
    csv_rows = {r["run"]: r for r in read_csv(out / "compare.csv")}
    md_rows = {r["run"]: r for r in md_table((out / "compare.md").read_text(), "# Run comparison")}
    for name in ("np1", "np2"):
        c, m, e = csv_rows[name], md_rows[name], evaluation[name]
        assert float(c["target_acc"]) == TARGET and m["target acc (%)"] == "50.00"
        assert int(c["epochs_to_target"]) == e["epochs_to_target"]
        assert m["epochs to target"] == str(e["epochs_to_target"])
        assert float(c["time_to_target_s"]) == e["time_to_target_s"]
        shown(m["time to target (s)"], e["time_to_target_s"], 1)
    speedup = evaluation["np1"]["time_to_target_s"] / evaluation["np2"]["time_to_target_s"]
    assert float(csv_rows["np1"]["target_speedup"]) == 1.0
    assert math.isclose(float(csv_rows["np2"]["target_speedup"]), speedup, rel_tol=1e-12)
    shown(md_rows["np2"]["time-to-target speedup vs np=1"], speedup, 2)
    never_csv, never_md = csv_rows["never"], md_rows["never"]
    assert float(never_csv["target_acc"]) == 0.99 and never_md["target acc (%)"] == "99.00"
    assert never_csv["epochs_to_target"] == never_csv["time_to_target_s"] == never_csv["target_speedup"] == ""
    assert never_csv["target_speedup_note"] == "not reached"
    assert (never_md["epochs to target"], never_md["time to target (s)"],
            never_md["time-to-target speedup vs np=1"]) == ("not reached",) * 3


def test_compare_without_targets_has_no_target_columns(comparison):
    assert "time to target" not in (comparison / "compare.md").read_text()
    assert all(r["target_acc"] == r["time_to_target_s"] == "" and r["target_speedup_note"] == "no target"
               for r in read_csv(comparison / "compare.csv"))


# ----------------------------------------------------------------------------- bad input
def _write(folder: Path, text: str | None) -> Path:
    folder.mkdir()
    if text is not None:
        (folder / "metrics.jsonl").write_text(text)
    return folder


GOOD_LINE = json.dumps({"epoch": 0, "epoch_time_s": 1.0, "steps": 2})


@pytest.mark.parametrize("case, text, message", [
    ("no-metrics", None, "no metrics.jsonl"),
    ("empty", "", "holds no epoch records"),
    ("blank-lines", "\n\n", "holds no epoch records"),
    ("torn-only-line", '{"epoch": 0, "lr"', "holds no epoch records (its only line is torn"),
    ("corrupt-line", GOOD_LINE + "\n" + '{"epoch": 1, "lr": 0.1, trunc' + "\n", "line 2 is not valid JSON"),
    ("not-a-record", GOOD_LINE + "\n[1, 2]\n", "line 2 is not an epoch record"),
])
def test_bad_run_folder_is_one_line_error(case, text, message, tmp_path, capsys):
    folder = _write(tmp_path / case, text)
    code, err = run_main([str(folder)], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("hvd_cifar: error: ") and message in err, err


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
    one, two = _write(tmp_path / "one", GOOD_LINE + "\n"), _write(tmp_path / "two", GOOD_LINE + "\n")
    for argv, message in (([str(tmp_path / "nowhere")], "no such run folder"),
                          ([str(one), str(two)], "--out: needed"),
                          (["--bogus", str(one)], "unrecognized arguments"),
                          ([], "required")):
        code, err = run_main(argv, capsys)
        assert code == 2 and err.count("\n") == 1 and err.startswith("hvd_cifar: error: "), (argv, err)
        assert message in err, (argv, err)


def test_cli_bad_input_has_no_traceback(tmp_path):
    folder = _write(tmp_path / "corrupt", "{not json\n")
    done = subprocess.run([sys.executable, "-m", "hvd_cifar.report", str(folder)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"hvd_cifar: error: {folder}/metrics.jsonl: line 1 is not valid JSON "
                                        f"(Expecting property name enclosed in double quotes)"]


def test_runs_differing_only_in_compression_are_separate_groups_with_their_own_baselines(tmp_path):
    """An uncompressed, a top-k and two local SGD configurations (its period, the scheme's own
    key, at its default and not), each at np 1 and 2 (the top-k run slower): four scaling groups,
    each run's speed-up against its own np 1; runs saved with the older spellings read as the
    one (runfolder.reader): fp16_allreduce: true as compression fp16, local_sgd_steps: 4 as
    compression local-sgd."""
    from runfolders import epoch_record, write_run
    from hvd_cifar.analysis.summary import add_speedup, scaling_groups, summarize
    from hvd_cifar.runfolder.reader import load_run
    speeds = {"none": (1.0, 1.8), "topk": (0.5, 0.95), "local": (1.0, 1.9), "local8": (1.0, 1.95)}
    configs = {"none": {"compression": "none"}, "topk": {"compression": "topk"},
               "local": {"compression": "local-sgd", "local_sgd_steps": 4},
               "local8": {"compression": "local-sgd", "local_sgd_steps": 8}}
    rows = []
    for name, (one, two) in speeds.items():
        for np_, factor in ((1, one), (2, two)):
            records = [epoch_record(e, np_) for e in range(3)]
            for r in records:
                r["images_per_s"] *= factor
            rows.append(summarize(load_run(str(write_run(tmp_path / f"{name}{np_}", records, config=configs[name])))))
    add_speedup(rows)
    groups = scaling_groups(rows)
    assert len(groups) == 4, list(groups)
    by = {r["run"]: r for r in rows}
    for name in speeds:
        assert by[f"{name}1"]["speedup"] == pytest.approx(1.0)
        assert by[f"{name}2"]["speedup"] == pytest.approx(by[f"{name}2"]["images_per_s"] / by[f"{name}1"]["images_per_s"])
    assert by["local81"]["options"] == "local_sgd_steps=8" and by["local1"]["options"] == ""
    old = summarize(load_run(str(write_run(tmp_path / "old", config={"fp16_allreduce": True}))))
    assert old["compression"] == "fp16"
    old_local = summarize(load_run(str(write_run(tmp_path / "old-local", config={"local_sgd_steps": 4}))))
    assert old_local["compression"] == "local-sgd" and old_local["options"] == ""


def test_repeated_runs_are_grouped_with_intervals_and_compared_paired_by_seed(tmp_path):
    """Three seeds of np=1 and np=2 (run folders written here): the comparison groups each
    configuration's runs, gives medians with their intervals, and compares np 2 with np 1 paired
    by seed, as hvd_cifar.measure.stats computes it."""
    from hvd_cifar.measure import stats
    rates, accs = {}, {}
    for seed, (one, two, acc1, acc2) in zip((200, 201, 202), ((100.0, 180.0, 0.60, 0.62), (90.0, 170.0, 0.61, 0.64),
                                                               (110.0, 190.0, 0.63, 0.64))):
        for np_, ips, acc in ((1, one, acc1), (2, two, acc2)):
            records = [epoch_record(e, np_, images_per_s=ips, test_acc=acc) for e in range(2)]
            write_run(tmp_path / f"np{np_}-s{seed}", records, world_size=np_, epochs=2, config={"seed": seed})
            rates.setdefault(np_, []).append(ips)
            accs.setdefault(np_, []).append(acc)
    out = tmp_path / "compare"
    assert report.main([str(p) for p in sorted(tmp_path.glob("np*"))] + ["--out", str(out)]) == 0
    text = (out / "compare.md").read_text()
    section = text.split("## Repeated configurations", 1)[1]
    iv = stats.interval_of(rates[2])
    assert f"| 2 | 3 | 180.0 ({iv.low:.1f}–{iv.high:.1f}) |" in section
    ratio = stats.ratio_interval(rates[2], rates[1])
    assert f"- {stats.ratio_sentence('np 2 vs 1: img/s', ratio, rounds='seeds')}" in section
    diff = stats.difference_interval(accs[2], accs[1], scale=100)
    assert f"({diff.low:+.2f} to {diff.high:+.2f} points, 95 % CI, 3 seeds" in section
    assert "one run's standard error on 400 test images" in section


def _throughput_runs(folder: Path, runs: dict[str, tuple[int, float, dict]]) -> dict[str, Path]:
    """Run folders of three epochs: name -> (world size, img/s factor, config.yaml keys)."""
    paths = {}
    for name, (np_, factor, config) in runs.items():
        records = [epoch_record(e, np_) for e in range(3)]
        for r in records:
            r["images_per_s"] *= factor
        paths[name] = write_run(folder / name, records, config=config)
    return paths


def test_runs_of_the_generated_data_set_at_other_sizes_are_kept_apart(tmp_path):
    """Two shapes runs generated with different shapes_train are two configurations: no speed-up
    between them, a data column that says why; the same shapes_train at np 2 has its speed-up."""
    shapes = {"dataset": "shapes", "shapes_test": 100, "shapes_seed": 0}
    paths = _throughput_runs(tmp_path, {"np1-500": (1, 1.0, {**shapes, "shapes_train": 500}),
                                        "np2-2000": (2, 1.7, {**shapes, "shapes_train": 2000}),
                                        "np2-500": (2, 1.9, {**shapes, "shapes_train": 500})})
    out = tmp_path / "compare"
    assert report.main([str(paths[n]) for n in ("np1-500", "np2-2000")] + ["--out", str(out)]) == 0
    rows = {r["run"]: r for r in read_csv(out / "compare.csv")}
    assert rows["np2-2000"]["speedup"] == "" and rows["np2-2000"]["efficiency"] == ""
    assert rows["np1-500"]["data"] != rows["np2-2000"]["data"]
    assert "2000" in rows["np2-2000"]["data"] and "500" in rows["np1-500"]["data"]
    md = {r["run"]: r for r in md_table((out / "compare.md").read_text(), "# Run comparison")}
    assert md["np2-2000"]["speedup vs np=1"] == "-" and "2000" in md["np2-2000"]["data set keys"]
    assert not (out / "scaling.png").exists()  # no configuration at two world sizes
    same = tmp_path / "same"
    assert report.main([str(paths[n]) for n in ("np1-500", "np2-500")] + ["--out", str(same)]) == 0
    rows = {r["run"]: r for r in read_csv(same / "compare.csv")}
    want = expected(metrics(paths["np2-500"]))["images_per_s"] / expected(metrics(paths["np1-500"]))["images_per_s"]
    assert math.isclose(float(rows["np2-500"]["speedup"]), want, rel_tol=1e-9)


def _auto_chose(run: Path, setting: str, how: str = "auto: fastest of 2 timed on this device") -> None:
    """meta.json and config.yaml as the trainer leaves them after compute: auto chose ``setting``."""
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, "compute_choice": {"setting": setting, "how": how}}))


def test_differing_automatic_compute_choices_are_said_and_the_speedup_shown(tmp_path):
    """compute: auto took fp32 at np 1 and bf16 at np 2: the np 2 run's speed-up is against the np 1
    run all the same, and one line under the table names both runs and their choices. A bf16 run
    whose precision was named (not chosen) has no fp32 baseline."""
    paths = _throughput_runs(tmp_path, {"np1": (1, 1.0, {"compute": "fp32", "amp": "none"}),
                                        "np2": (2, 2.2, {"compute": "bf16", "amp": "bf16"}),
                                        "np2-named": (2, 2.1, {"compute": "bf16", "amp": "bf16"})})
    _auto_chose(paths["np1"], "fp32")
    _auto_chose(paths["np2"], "bf16")
    _auto_chose(paths["np2-named"], "bf16", how="named in the config")
    out = tmp_path / "compare"
    assert report.main([str(p) for p in paths.values()] + ["--out", str(out)]) == 0
    rows = {r["run"]: r for r in read_csv(out / "compare.csv")}
    want = expected(metrics(paths["np2"]))["images_per_s"] / expected(metrics(paths["np1"]))["images_per_s"]
    assert math.isclose(float(rows["np2"]["speedup"]), want, rel_tol=1e-9)
    assert rows["np2-named"]["speedup"] == ""
    text = (out / "compare.md").read_text()
    md = {r["run"]: r for r in md_table(text, "# Run comparison")}
    shown(md["np2"]["speedup vs np=1"], want, 2)
    after = text.split("# Run comparison", 1)[1].split("\n\n|", 1)[1]  # what follows the table
    (line,) = [ln for ln in after.splitlines() if ln.startswith("compute differs between runs compared")]
    assert "np1" in line and "fp32" in line and "np2" in line and "bf16" in line and "np2-named" not in line
