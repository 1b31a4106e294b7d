"""hvd_cifar.bench for real: a 2-configuration horovodrun sweep (np 1 and 2, 3 whole epochs of
configs/tiny.yaml with a 50 % target, which both reach), an mpirun sweep whose first
configuration the trainer rejects and whose second misses its 99 % target, and a job that
outlives its timeout, and sweeps stopped by SIGINT and SIGTERM after their first job, then resumed.
The scaling table is checked against the run folders' metrics.jsonl and eval.json with numbers
computed here; a failure must be a row, not the end of the sweep, and an interruption must keep
what finished."""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import assert_png, md_table, read_csv, read_metrics, shown
from hvd_cifar import bench
from hvd_cifar.analysis import sweep_state
from hvd_cifar.runfolder.reader import read_config

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.5  # configs/tiny.yaml passes it within 3 whole epochs at np=1 and np=2


# ----------------------------------------------------------------------------- helpers
def run_bench(*args: str, timeout: int = 500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hvd_cifar.bench", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def expected(run_dir: Path) -> dict:
    """The table's numbers from metrics.jsonl: sums and means over the epochs after the first."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    steady = records[1:] if len(records) >= 2 else records
    seconds = sum(r["epoch_time_s"] for r in steady)
    steps = sum(r["steps"] for r in steady)
    return {
        "world_size": records[-1]["world_size"],
        "mean_epoch_time_s": seconds / len(steady),
        "images_per_s": sum(r["images_per_s"] * r["epoch_time_s"] for r in steady) / seconds,
        "step_time_s": seconds / steps,
        "sync_time_per_step_s": sum(r["sync_time_s"] for r in steady) / steps,
        "bytes_per_step_per_rank": sum(r["comm_bytes_per_rank"] for r in steady) / steps,
        "final_test_acc": records[-1]["test_acc"],
    }


def reached(run_dir: Path, target: float) -> dict | None:
    """The first epoch record whose test accuracy reached ``target``; None when none did."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return next((r for r in records if r["test_acc"] >= target), None)


def dry_run_names(argv: list[str], capsys) -> list[str]:
    """The run names of the commands a dry run prints, in order."""
    assert bench.main([*argv, "--repeats", "1", "--dry-run"]) == 0
    commands = [shlex.split(ln) for ln in capsys.readouterr().out.splitlines() if not ln.startswith("bench:")]
    return [cmd[cmd.index("--run-name") + 1].removesuffix("-r1") for cmd in commands]


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    done = run_bench("--np", "2", "1", "--steps", "0", "--epochs", "3", "--target-acc", str(TARGET),
                     "--dataset", "digits", "--model", "smallcnn", "--batch-size", "32", "--repeats", "1",
                     "--repeat-disturbed", "false", "--extra", "--config configs/tiny.yaml", "--out", str(out))
    return done, out


@pytest.fixture(scope="module")
def failing_sweep(tmp_path_factory):
    """mpirun; the first configuration asks for more images per step than the data set has."""
    out = tmp_path_factory.mktemp("failing")
    done = run_bench("--np", "1", "--launcher", "mpirun", "--batch-size", "100000", "32", "--steps", "2",
                     "--epochs", "1", "--dataset", "digits", "--target-acc", "0.99", "--repeats", "1",
                     "--repeat-disturbed", "false", "--out", str(out))
    return done, out


# ----------------------------------------------------------------------------- the sweep
@pytest.mark.slow  # real launcher jobs
def test_sweep_runs_every_configuration(sweep):
    done, out = sweep
    assert done.returncode == 0, done.stdout + done.stderr
    names = sorted(p.name for p in (out / "runs").iterdir())
    assert names == ["smallcnn-digits-horovod-np1-b32-none-acc1-frz0-r1",
                     "smallcnn-digits-horovod-np2-b32-none-acc1-frz0-r1"]
    progress = [line for line in done.stdout.splitlines() if line.startswith("[round 1, ")]
    assert len(progress) == 2 and all(" ok (" in line for line in progress), done.stdout
    assert "| np | sync |" in done.stdout  # the table is printed too
    for name in names:
        assert (out / "logs" / f"{name}.stderr.txt").is_file()


@pytest.mark.slow  # real launcher jobs
def test_scaling_csv_matches_metrics(sweep):
    _, out = sweep
    rows = read_csv(out / "scaling.csv")
    assert [int(r["world_size"]) for r in rows] == [1, 2]  # np=1 first, whatever the order asked
    want = [expected(Path(r["run_dir"])) for r in rows]
    for row, w in zip(rows, want):
        assert row["status"] == "ok"
        assert int(row["world_size"]) == w["world_size"]
        assert (row["model"], row["dataset"], row["sync"], row["batch_size"], row["compression"],
                row["accumulation_steps"], row["freeze"]) == ("smallcnn", "digits", "horovod", "32", "none", "1", "0")
        for key in ("mean_epoch_time_s", "images_per_s", "step_time_s", "sync_time_per_step_s",
                    "bytes_per_step_per_rank", "final_test_acc"):
            assert math.isclose(float(row[key]), w[key], rel_tol=1e-9, abs_tol=1e-12), key
    assert float(rows[0]["bytes_per_step_per_rank"]) == 0 < float(rows[1]["bytes_per_step_per_rank"])
    speedup = want[1]["images_per_s"] / want[0]["images_per_s"]
    assert math.isclose(float(rows[0]["speedup"]), 1.0)
    assert math.isclose(float(rows[1]["speedup"]), speedup, rel_tol=1e-9)
    assert math.isclose(float(rows[1]["efficiency"]), speedup / 2, rel_tol=1e-9)


@pytest.mark.slow  # real launcher jobs
def test_scaling_markdown_matches_csv(sweep):
    _, out = sweep
    rows = read_csv(out / "scaling.csv")
    table = md_table((out / "scaling.md").read_text(), "# Scaling sweep")
    assert len(table) == len(rows)
    for md, row in zip(table, rows):
        assert md["np"] == row["world_size"] and md["status"] == row["status"] == "ok"
        shown(md["epoch time (s)"], float(row["mean_epoch_time_s"]), 3)
        shown(md["img/s"], float(row["images_per_s"]), 1)
        shown(md["step time (ms)"], float(row["step_time_s"]), 2, 1e-3)
        shown(md["sync time (ms/step)"], float(row["sync_time_per_step_s"]), 2, 1e-3)
        shown(md["bytes/step/rank (MB)"], float(row["bytes_per_step_per_rank"]), 4, 1e6)
        shown(md["final test acc (%)"], float(row["final_test_acc"]), 2, 0.01)
        shown(md["speedup vs np=1"], float(row["speedup"]), 2)
        shown(md["efficiency"], float(row["efficiency"]), 2)


@pytest.mark.slow  # real launcher jobs
def test_time_to_target_matches_eval_json(sweep):
    done, out = sweep
    rows = read_csv(out / "scaling.csv")
    md = md_table((out / "scaling.md").read_text(), "# Scaling sweep")
    times = []
    for row, cells in zip(rows, md):
        run_dir = Path(row["run_dir"])
        evaluation, first = json.loads((run_dir / "eval.json").read_text()), reached(run_dir, TARGET)
        assert first is not None, [r["test_acc"] for r in read_metrics(run_dir)]  # the premise: both runs reached 50 %
        assert "--max-steps-per-epoch 0 --target-acc 0.5 " in row["command"]  # whole epochs, the target
        assert evaluation["target_acc"] == float(row["target_acc"]) == TARGET and cells["target acc (%)"] == "50.00"
        assert int(row["epochs_to_target"]) == evaluation["epochs_to_target"] == first["epoch"] + 1
        assert cells["epochs to target"] == row["epochs_to_target"]
        assert float(row["time_to_target_s"]) == evaluation["time_to_target_s"] == first["elapsed_s"]
        shown(cells["time to target (s)"], first["elapsed_s"], 1)
        assert f"50.00% reached in {first['elapsed_s']:.1f} s (epoch {first['epoch'] + 1})" in done.stdout
        times.append(first["elapsed_s"])
    assert [int(r["world_size"]) for r in rows] == [1, 2]
    assert float(rows[0]["target_speedup"]) == 1.0
    assert math.isclose(float(rows[1]["target_speedup"]), times[0] / times[1], rel_tol=1e-12)
    shown(md[1]["time-to-target speedup vs np=1"], times[0] / times[1], 2)
    assert "3 whole epoch(s)" in (out / "scaling.md").read_text()


@pytest.mark.slow  # real launcher jobs
def test_scaling_plot(sweep):
    _, out = sweep
    assert_png(out / "scaling.png")
    assert "](scaling.png)" in (out / "scaling.md").read_text()


# ----------------------------------------------------------------------------- failures
@pytest.mark.slow  # real launcher jobs
def test_failed_configuration_is_a_row_and_the_sweep_goes_on(failing_sweep):
    done, out = failing_sweep
    assert done.returncode == 1, done.stdout + done.stderr  # some configuration failed
    rows = read_csv(out / "scaling.csv")
    assert [r["batch_size"] for r in rows] == ["100000", "32"]
    failed, ok = rows
    assert re.fullmatch(r"failed \(exit [1-9][0-9]*\)", failed["status"]), failed["status"]
    assert all(failed[k] == "" for k in ("images_per_s", "mean_epoch_time_s", "final_test_acc", "speedup"))
    assert failed["error"].startswith("hvd_cifar: error: batch_size: 100000")
    assert "batch_size: 100000" in Path(failed["stderr_file"]).read_text()
    assert failed["command"].startswith("mpirun ")
    # The next configuration still ran, with mpirun, and has its numbers.
    assert ok["status"] == "ok" and ok["command"].startswith("mpirun ")
    assert math.isclose(float(ok["images_per_s"]), expected(Path(ok["run_dir"]))["images_per_s"], rel_tol=1e-9)
    text = (out / "scaling.md").read_text()
    md = md_table(text, "# Scaling sweep")
    assert md[0]["status"] == failed["status"] and md[0]["img/s"] == "-" and md[1]["status"] == "ok"
    failures = text.split("## Failed jobs", 1)[1]
    assert "Error: hvd_cifar: error: batch_size: 100000" in failures and "```" in failures
    (failed_job, _) = read_csv(out / "runs.csv")
    assert f"{failed_job['run']}: {failed['status']}" in text  # the failed job's own section
    assert f"{failed_job['run'].removesuffix('-r1')}: {failed['status']}" in done.stdout.replace(" ... ", ": ")
    # The target (99 % after 2 steps) was missed: said so, no speedup; the failed row has no numbers.
    assert json.loads((Path(ok["run_dir"]) / "eval.json").read_text())["time_to_target_s"] is None
    assert ok["time_to_target_s"] == ok["epochs_to_target"] == ok["target_speedup"] == ""
    assert float(ok["target_acc"]) == 0.99 and ok["target_speedup_note"] == "not reached"
    assert (md[1]["epochs to target"], md[1]["time to target (s)"],
            md[1]["time-to-target speedup vs np=1"]) == ("not reached",) * 3
    assert md[0]["time to target (s)"] == md[0]["time-to-target speedup vs np=1"] == "-"
    assert "99.00% not reached" in done.stdout


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


@pytest.mark.slow  # real launcher jobs
def test_timeout_fails_the_configuration_and_ends_its_processes(tmp_path):
    out = tmp_path / "slow"
    done = run_bench("--np", "2", "--timeout", "3", "--steps", "1000", "--dataset", "digits", "--repeats", "1",
                     "--out", str(out))
    assert done.returncode == 1, done.stdout + done.stderr
    (row,) = read_csv(out / "scaling.csv")
    assert row["status"] == "failed (timeout after 3 s)"
    deadline = time.time() + 15
    while _processes_mentioning(str(out)) and time.time() < deadline:
        time.sleep(0.5)
    assert _processes_mentioning(str(out)) == []  # horovodrun, mpirun and both ranks are gone
    assert not (out / "scaling.png").exists()  # nothing finished, nothing to plot


# ----------------------------------------------------------------------------- options
def test_commands_are_argument_lists_for_each_launcher(tmp_path, capsys):
    hostfile = ROOT / "hostfiles" / "localhost"
    cases = [
        ([], [str(Path(sys.executable).parent / "horovodrun"), "-np", "2", "-H", "localhost:2",
              sys.executable, "-m", "hvd_cifar.train"]),
        (["--launcher", "mpirun"], ["mpirun", *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
                                    "--oversubscribe", "-np", "2", "-bind-to", "none", "-map-by", "slot",
                                    sys.executable, "-m", "hvd_cifar.train"]),
        (["--hostfile", str(hostfile)], [str(ROOT / "launch" / "horovodrun.sh"), "-np", "2",
                                         "-hostfile", str(hostfile), "--model"]),
    ]
    for extra_args, prefix in cases:
        assert bench.main(["--np", "2", "--steps", "7", "--out", str(tmp_path), "--dry-run", "--repeats", "1",
                           "--extra", "--lr 0.1 --threads-per-rank 1", *extra_args]) == 0
        (line,) = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("bench:")]
        argv = shlex.split(line)
        assert argv[:len(prefix)] == prefix, argv
        flags = argv[argv.index("--model"):]
        assert flags[flags.index("--max-steps-per-epoch") + 1] == "7"
        assert flags[flags.index("--log-dir") + 1] == str(tmp_path / "runs")
        assert flags[-4:] == ["--lr", "0.1", "--threads-per-rank", "1"]
    assert not (tmp_path / "runs").exists()  # a dry run runs nothing


def test_also_adds_sweeps_with_the_main_options_for_the_rest(capsys):
    """The issue 12 table: three methods at np 1, 2, 4; three options at np=2 only."""
    names = dry_run_names(["--np", "4", "1", "2", "--sync", "horovod", "ddp", "--model", "vgg11",
                           "--also", "--np 2 --sync horovod --compression fp16",
                           "--also", "--np 2 --accumulation-steps 4 --sync horovod",
                           "--also=--np=2 --sync horovod --freeze 2",  # "--also", "--np=2 ..." would be two options
                           "--also", "--np 2 --freeze auto",
                           "--also", "--np 2 1"], capsys)  # only configurations already asked for
    assert names == [f"vgg11-synthetic-{sync}-np{n}-b32-none-acc1-frz0" for sync in ("horovod", "ddp")
                     for n in (1, 2, 4)] + ["vgg11-synthetic-horovod-np2-b32-fp16-acc1-frz0",
                                            "vgg11-synthetic-horovod-np2-b32-none-acc4-frz0",
                                            "vgg11-synthetic-horovod-np2-b32-none-acc1-frz2"] + [
                                            f"vgg11-synthetic-{sync}-np2-b32-none-acc1-frzauto"
                                            for sync in ("horovod", "ddp")]


def test_compression_is_a_sweep_axis_of_the_registrys_names(capsys):
    """--compression takes core/schemes.py's names, several at once, and hands each job its one;
    a scheme's own key goes through --extra, and an older spelling there that would train another
    compression than the table says (core.aliases) is refused."""
    def given(argv: list[str]) -> list[list[str]]:
        assert bench.main(["--np", "2", "--repeats", "1", "--dry-run", *argv]) == 0
        return [shlex.split(ln) for ln in capsys.readouterr().out.splitlines() if not ln.startswith("bench:")]
    jobs = given(["--compression", "none", "fp16", "local-sgd"])
    assert [argv[argv.index("--compression") + 1] for argv in jobs] == ["none", "fp16", "local-sgd"]
    (job,) = given(["--compression", "local-sgd", "--extra", "--local-sgd-steps 2"])
    assert job[-2:] == ["--local-sgd-steps", "2"]


def test_target_and_whole_epochs_reach_the_trainer(capsys):
    cases = ((["--steps", "0", "--target-acc", "0.95"], ["--max-steps-per-epoch", "0", "--target-acc", "0.95"]),
             ([], ["--max-steps-per-epoch", "10", "--target-acc", "0.0"]))  # default: 10 steps, no target
    for argv, flags in cases:
        assert bench.main(["--np", "2", *argv, "--repeats", "1", "--dry-run"]) == 0
        (line,) = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("bench:")]
        assert shlex.join(flags) in line, line


@pytest.mark.parametrize("argv, message", [
    (["--np", "0"], "--np: must be >= 1"),
    (["--steps", "-1"], "--steps: must be >= 0"),
    (["--target-acc", "95"], "--target-acc: must be in [0, 1]"),
    (["--extra", "--target-acc 0.9"], "--extra: --target-acc is set by the bench itself"),
    (["--also", "--np 0"], "--also: argument --np: must be >= 1"),
    (["--also", "--epochs 3"], "--also: unrecognized arguments: --epochs 3"),
    (["--also", "--sync nccl"], "--also: argument --sync: invalid choice: 'nccl'"),
    (["--freeze", "some"], "--freeze: expected a number of blocks (>= 0) or auto, got 'some'"),
    (["--freeze", "-1"], "--freeze: expected a number of blocks (>= 0) or auto, got '-1'"),
    (["--compression", "fp32"], "argument --compression: invalid choice: 'fp32'"),
    (["--extra=--fp16-allreduce"], "--extra: reads as compression: fp16 beside the sweep's --compression none"),
    (["--extra", "--local-sgd-steps 2"], "--extra: reads as compression: local-sgd beside the sweep's --compression none"),
    (["--compression", "topk", "--extra", "--local-sgd-steps 2"], "--extra: local_sgd_steps: averages whole models"),
    (["--extra", "--log-dir /tmp/x"], "--extra: --log-dir is set by the bench itself"),
    (["--extra", "--batch-size 8"], "--extra: --batch-size is set by the bench itself"),
    (["--extra", "--no-such-key 1"], "--extra: no_such_key: unknown config key"),
    (["--hostfile", "/nonexistent/hosts"], "--hostfile: /nonexistent/hosts does not exist"),
    (["--sbatch", "-p batch"], "--sbatch: only with --slurm"),
    (["--tasks-per-node", "2"], "--tasks-per-node: only with --slurm"),
    (["--slurm", "--hostfile", "hostfiles/localhost"], "--hostfile: not with --slurm"),
    (["--slurm", "--sbatch", "-p 'batch"], "--sbatch: cannot split"),
])
def test_bad_options_are_one_line_errors(argv, message, capsys):
    try:
        code = bench.main([*argv, "--dry-run"])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("hvd_cifar: error: ") and message in err, err


# ----------------------------------------------------------------------------- rounds
def test_repeats_run_each_configuration_once_per_round_in_rotated_order(capsys):
    names = []
    assert bench.main(["--np", "1", "2", "4", "--repeats", "3", "--dry-run"]) == 0
    for line in capsys.readouterr().out.splitlines():
        if not line.startswith("bench:"):
            argv = shlex.split(line)
            names.append(argv[argv.index("--run-name") + 1])
    np_of = [int(re.search(r"-np(\d+)-", n)[1]) for n in names]
    assert np_of == [1, 2, 4, 2, 4, 1, 4, 1, 2]  # round k starts k - 1 places further on
    assert [n.rsplit("-r", 1)[1] for n in names] == ["1"] * 3 + ["2"] * 3 + ["3"] * 3


def test_seeds_give_one_round_each_at_that_seed(capsys):
    assert bench.main(["--np", "2", "--seeds", "200", "201", "--dry-run"]) == 0
    lines = [shlex.split(ln) for ln in capsys.readouterr().out.splitlines() if not ln.startswith("bench:")]
    assert [argv[argv.index("--seed") + 1] for argv in lines] == ["200", "201"]


@pytest.fixture(scope="module")
def repeated_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("repeated")
    done = run_bench("--np", "1", "2", "--repeats", "3", "--steps", "3", "--epochs", "2", "--dataset", "digits",
                     "--repeat-disturbed", "false", "--extra", "--config configs/tiny.yaml", "--out", str(out))
    return done, out


@pytest.mark.slow  # real launcher jobs
def test_repeated_sweep_gives_medians_intervals_and_paired_comparisons(repeated_sweep):
    """Three rounds of np 1 and 2: runs.csv holds every job in the order run; scaling.csv each
    configuration's median img/s with the interval of its rounds; the comparison np 2 vs 1 is the
    ratio paired within each round, said in a sentence; bench.json keeps every round."""
    from hvd_cifar.measure import stats
    done, out = repeated_sweep
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = read_csv(out / "runs.csv")
    assert [(j["round"], j["world_size"]) for j in jobs] == [("1", "1"), ("1", "2"), ("2", "2"), ("2", "1"),
                                                              ("3", "1"), ("3", "2")]
    rates = {(j["round"], j["world_size"]): expected(Path(j["run_dir"]))["images_per_s"] for j in jobs}
    configs = read_csv(out / "scaling.csv")
    for row in configs:
        mine = [rates[(k, row["world_size"])] for k in ("1", "2", "3")]
        iv = stats.interval_of(mine)
        assert math.isclose(float(row["images_per_s"]), sorted(mine)[1], rel_tol=1e-9)
        assert math.isclose(float(row["images_per_s_low"]), iv.low, rel_tol=1e-9)
        assert math.isclose(float(row["images_per_s_high"]), iv.high, rel_tol=1e-9)
        assert row["rounds"] == "3 of 3"
    paired = stats.ratio_interval([rates[(k, "2")] for k in "123"], [rates[(k, "1")] for k in "123"])
    sentence = stats.ratio_sentence("np 2 vs 1: img/s", paired)
    assert sentence in done.stdout and f"- {sentence}" in (out / "scaling.md").read_text()
    md = md_table((out / "scaling.md").read_text(), "# Scaling sweep")
    assert re.fullmatch(r"[0-9.]+ \([0-9.]+–[0-9.]+\)", md[0]["img/s"]), md[0]["img/s"]
    saved = json.loads((out / "bench.json").read_text())
    assert len(saved["rounds"]) == 6 and {r["round"] for r in saved["rounds"]} == {1, 2, 3}
    assert saved["summary"]["smallcnn-digits-horovod-np2-b32-none-acc1-frz0"]["images_per_s"]["n"] == 3


def _fake_jobs(monkeypatch, rate_of):
    """bench.run_job replaced by a job that takes no time and has img/s ``rate_of(cfg, k)``."""
    calls = []

    def fake(cfg, k, seed, args, runner, extra, dirs, taken):
        calls.append((cfg["world_size"], k))
        return {**cfg, "round": k, "seed": seed, "status": "ok", "images_per_s": rate_of(cfg, k), "seconds": 0.0,
                "error": "", "run": f"np{cfg['world_size']}-r{k}", "run_dir": "", "world_size": cfg["world_size"]}
    monkeypatch.setattr(bench, "run_job", fake)
    return calls


def _sweep(argv):
    args = bench.parse_args(argv)
    return bench.sweep(bench.configurations(args), args, None, [], ("", ""))


def test_resolve_adds_rounds_until_the_comparison_is_resolved(monkeypatch):
    """np 2 runs 1.3x np 1 give or take 4 % in turn: 3 rounds leave the interval wide, more rounds
    narrow it until it lies wholly above 1.05; then the sweep stops."""
    calls = _fake_jobs(monkeypatch, lambda cfg, k: 100.0 * (1.3 * (1 + 0.04 * (-1) ** k) if cfg["world_size"] == 2 else 1))
    jobs, interrupted = _sweep(["--np", "1", "2", "--repeats", "2", "--resolve", "0.05", "--budget", "5"])
    rounds = max(j["round"] for j in jobs)
    assert not interrupted and rounds > 2 and len(calls) == 2 * rounds
    args = bench.parse_args(["--np", "1", "2"])
    assert not bench.unresolved(bench.compare_jobs(jobs, args), 0.05)
    earlier = [j for j in jobs if j["round"] < rounds]
    assert bench.unresolved(bench.compare_jobs(earlier, args), 0.05)


def test_resolve_stops_at_the_round_limit_when_the_spread_never_allows_it(monkeypatch):
    """np 2 exactly on the margin's edge: never resolved; the sweep ends at MAX_ROUNDS (the budget
    is not reached: the fake jobs take no time), and the comparison is reported unresolved."""
    _fake_jobs(monkeypatch, lambda cfg, k: 100.0 * (1.05 * (1 + 0.02 * (-1) ** k) if cfg["world_size"] == 2 else 1))
    jobs, _ = _sweep(["--np", "1", "2", "--repeats", "2", "--resolve", "0.05"])
    assert max(j["round"] for j in jobs) == bench.MAX_ROUNDS
    args = bench.parse_args(["--np", "1", "2"])
    (left,) = bench.unresolved(bench.compare_jobs(jobs, args), 0.05)
    assert left.label == "np 2 vs 1: img/s"


def test_without_resolve_the_sweep_runs_exactly_its_rounds(monkeypatch):
    calls = _fake_jobs(monkeypatch, lambda cfg, k: 100.0 + k)
    jobs, _ = _sweep(["--np", "1", "2", "--repeats", "3"])
    assert sorted(calls) == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]


def test_budget_ends_the_rounds_before_one_would_overrun_it(monkeypatch, capsys):
    """Jobs that take 20 s each (a fake clock), 2 per round, an unresolvable comparison, a budget
    of 3 minutes: rounds 1-4 end by 160 s; a fifth would end at 200 s, so the sweep stops at 4."""
    now = [0.0]
    monkeypatch.setattr(sweep_state.time, "monotonic", lambda: now[0])  # the sweep's clock

    def rate(cfg, k):
        now[0] += 20  # the job's time
        return 100.0 * (1.05 * (1 + 0.02 * (-1) ** k) if cfg["world_size"] == 2 else 1)
    _fake_jobs(monkeypatch, rate)
    jobs, _ = _sweep(["--np", "1", "2", "--repeats", "2", "--resolve", "0.05", "--budget", "3"])
    assert max(j["round"] for j in jobs) == 4
    assert "--budget 3 min ends the rounds after 4" in capsys.readouterr().out


# ----------------------------------------------------------------------------- interrupted, resumed
def _jobs_until(monkeypatch, stop_at: int | None, rate_of, compute=lambda cfg, k: ("fp32", False)):
    """bench.run_job replaced by a job that takes no time: img/s ``rate_of(cfg, k)``, computing in
    ``compute(cfg, k)`` (setting, whether compute: auto chose it); the ``stop_at``-th call is
    Ctrl-C while it runs. Returns the calls: (world size, round, the extra flags it was given)."""
    calls = []

    def fake(cfg, k, seed, args, runner, extra, dirs, taken):
        calls.append((cfg["world_size"], k, list(extra)))
        if len(calls) == stop_at:
            raise KeyboardInterrupt
        name = f"np{cfg['world_size']}-r{k}"
        taken.add(name)
        setting, auto = compute(cfg, k)
        return {**cfg, "round": k, "seed": seed, "status": "ok", "images_per_s": rate_of(cfg, k),
                "mean_epoch_time_s": 1.0, "seconds": 0.0, "error": "", "run": name, "run_dir": "",
                "command": name, "stderr_file": "", "compute": setting, "compute_auto": auto}
    monkeypatch.setattr(bench, "run_job", fake)
    return calls


def test_an_interrupted_sweep_keeps_its_jobs_marks_the_partial_round_and_continues(monkeypatch, tmp_path, capsys):
    """Ctrl-C during round 3's second job: the outputs hold the five jobs that finished, round 3 is
    partial, the np 2 vs 1 comparison pairs rounds 1 and 2 only; the same command into the same
    folder then runs the one job missing and nothing else."""
    from hvd_cifar.measure import stats
    rate = lambda cfg, k: 100.0 * (1.8 + 0.1 * k if cfg["world_size"] == 2 else 1 + 0.05 * k)
    argv = ["--np", "1", "2", "--repeats", "3", "--repeat-disturbed", "false", "--out", str(tmp_path)]
    calls = _jobs_until(monkeypatch, 6, rate)
    assert bench.main(argv) == 130
    jobs = read_csv(tmp_path / "runs.csv")
    assert [(j["round"], j["world_size"], j["partial_round"]) for j in jobs] == [
        ("1", "1", "false"), ("1", "2", "false"), ("2", "2", "false"), ("2", "1", "false"), ("3", "1", "true")]
    text = (tmp_path / "scaling.md").read_text()
    assert "**Interrupted** by SIGINT" in text and f"--resume {tmp_path}" in text and "Partial round(s) 3" in text
    paired = stats.ratio_interval([rate({"world_size": 2}, k) for k in (1, 2)], [rate({"world_size": 1}, k) for k in (1, 2)])
    assert f"- {stats.ratio_sentence('np 2 vs 1: img/s', paired)}" in text
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["interrupted"]["signal"] == "SIGINT" and saved["interrupted"]["exit_status"] == 130
    assert saved["partial_rounds"] == [3] and len(saved["rounds"]) == 5
    assert [r["world_size"] for r in read_csv(tmp_path / "scaling.csv")] == ["1", "2"]
    assert_png(tmp_path / "scaling.png")
    capsys.readouterr()
    calls.clear()
    assert bench.main(argv) == 0
    assert [(n, k) for n, k, _ in calls] == [(2, 3)]  # only round 3's missing job
    assert "5 job(s) that finished before are kept" in capsys.readouterr().out
    jobs = read_csv(tmp_path / "runs.csv")
    assert len(jobs) == 6 and all(j["partial_round"] == "false" for j in jobs)
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["interrupted"] is None and saved["partial_rounds"] == [] and len(saved["rounds"]) == 6
    assert "Interrupted" not in (tmp_path / "scaling.md").read_text()


def test_another_sweep_into_the_folder_of_an_interrupted_one_is_refused(monkeypatch, tmp_path, capsys):
    _jobs_until(monkeypatch, 2, lambda cfg, k: 100.0)
    assert bench.main(["--np", "1", "2", "--repeats", "1", "--out", str(tmp_path)]) == 130
    capsys.readouterr()
    assert bench.main(["--np", "1", "4", "--repeats", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out: {tmp_path} holds another sweep (started with other np)" in err, err
    (tmp_path / "sweep-state.json").write_text('{"version": 1, "argv": [], "jobs": "no"}')
    assert bench.main(["--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hvd_cifar: error: ") and "not a sweep's state" in err, err
    assert bench.main(["--resume", str(tmp_path), "--np", "2"]) == 2
    assert "--resume: give it alone" in capsys.readouterr().err


@pytest.mark.parametrize("same", [True, False])
def test_the_sweep_holds_the_compute_setting_auto_chose_first(monkeypatch, tmp_path, same, capsys):
    """The first job's compute: auto chose bf16: the later jobs get --compute bf16 (each its own
    choice with --same-compute false, which here differs: said under the table)."""
    calls = _jobs_until(monkeypatch, None, lambda cfg, k: 100.0 * cfg["world_size"] + k,
                        compute=lambda cfg, k: ("bf16" if same or cfg["world_size"] == 1 else "fp32", True))
    assert bench.main(["--np", "1", "2", "--repeats", "2", "--repeat-disturbed", "false", "--same-compute",
                       str(same).lower(), "--out", str(tmp_path)]) == 0
    assert calls[0][2] == []
    assert all(extra == (["--compute", "bf16"] if same else []) for _, _, extra in calls[1:])
    text = (tmp_path / "scaling.md").read_text()
    assert ("compute: auto chose bf16 in np1-r1; the other jobs run with `--compute bf16`" in text) == same
    assert ("compute differs between this sweep's jobs: bf16 in np1-r1, np1-r2; fp32 in np2-r1, np2-r2" in text) != same
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["compute_held"] == ({"setting": "bf16", "chosen_in": "np1-r1"} if same else None)


def _until(condition, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


@pytest.mark.slow  # real launcher jobs
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_after_the_first_job_keeps_it_and_resume_runs_the_rest(signum, tmp_path):
    """A real sweep of np 1 and 2 stopped by SIGINT or SIGTERM while its second job runs: that job
    is stopped, the outputs (the four files and the plot) hold the first, marked interrupted, and
    the exit status is 128 + the signal's. ``--resume`` then runs the np 2 job alone, with the
    compute setting compute: auto chose in the first held (--compute), and leaves the first's
    run folder as it was."""
    out, env = tmp_path / "sweep", dict(os.environ, HVD_CIFAR_CACHE_DIR=str(tmp_path / "cache"))
    argv = ["--np", "1", "2", "--repeats", "1", "--steps", "3", "--epochs", "2", "--dataset", "digits",
            "--repeat-disturbed", "false", "--extra", "--config configs/tiny.yaml --compute auto", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "hvd_cifar.bench", *argv], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a shell starts it
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(iter(lambda: proc.stdout.read(1), "")), daemon=True)
    reader.start()
    try:
        _until(lambda: "[round 1, 2/2]" in "".join(said), 300, "the first job to end")
        _until(lambda: any(out.glob("runs/*np2*/config.yaml")) or proc.poll() is not None, 120, "the second job to start")
        assert proc.poll() is None, "".join(said)
        proc.send_signal(signum)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    text = "".join(said)
    assert code == 128 + signum, text
    (first,) = read_csv(out / "runs.csv")
    assert first["world_size"] == "1" and first["status"] == "ok" and first["partial_round"] == "true"
    assert [r["world_size"] for r in read_csv(out / "scaling.csv")] == ["1"]
    md = (out / "scaling.md").read_text()
    assert [r["np"] for r in md_table(md, "# Scaling sweep")] == ["1"]
    assert f"**Interrupted** by {signal.Signals(signum).name}" in md and "Partial round(s) 1" in md
    saved = json.loads((out / "bench.json").read_text())
    assert saved["interrupted"]["signal"] == signal.Signals(signum).name and len(saved["rounds"]) == 1
    assert_png(out / "scaling.png")
    _until(lambda: not _processes_mentioning(str(out / "runs")), 30, "the stopped job's processes to end")
    np1_dir = Path(first["run_dir"])
    chose = read_config(str(np1_dir))["compute"]  # resolved.yaml's: what compute: auto chose
    assert json.loads((np1_dir / "meta.json").read_text())["compute_choice"]["how"].startswith("auto")
    assert f"compute: auto chose {chose} in {np1_dir.name}" in text
    before = (np1_dir / "metrics.jsonl").read_bytes(), (np1_dir / "metrics.jsonl").stat().st_mtime_ns

    done = subprocess.run([sys.executable, "-m", "hvd_cifar.bench", "--resume", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\[round 1, 1/2\] \S+np1\S+ \.\.\. ok \(earlier, ", done.stdout), done.stdout
    jobs = read_csv(out / "runs.csv")
    assert [(j["world_size"], j["status"], j["partial_round"]) for j in jobs] == [("1", "ok", "false"),
                                                                                  ("2", "ok", "false")]
    assert jobs[0]["run_dir"] == str(np1_dir) and jobs[0]["command"] == first["command"]
    assert ((np1_dir / "metrics.jsonl").read_bytes(), (np1_dir / "metrics.jsonl").stat().st_mtime_ns) == before
    assert len(list(out.glob("runs/*np1*"))) == 1  # the np 1 job ran once
    assert jobs[1]["command"].endswith(f"--compute {chose}")
    assert json.loads((Path(jobs[1]["run_dir"]) / "meta.json").read_text())["compute_choice"]["how"] == "named in the config"
    rates = [expected(Path(j["run_dir"]))["images_per_s"] for j in jobs]
    rows = read_csv(out / "scaling.csv")
    assert math.isclose(float(rows[1]["speedup"]), rates[1] / rates[0], rel_tol=1e-9)
    saved = json.loads((out / "bench.json").read_text())
    assert saved["interrupted"] is None and saved["partial_rounds"] == [] and len(saved["rounds"]) == 2
    assert "Interrupted" not in (out / "scaling.md").read_text()
