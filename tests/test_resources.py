"""Resource figures (hvd_cifar/trainer/resources.py), top-5 accuracy, the checkpoint's copy of its epoch's
metrics line, and how the run report shows them (also for runs older than these keys)."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch

from conftest import TINY, SharedRun, assert_png, md_table, read_metrics, run_train, shown
from hvd_cifar import report
from hvd_cifar.analysis.summary import per_name
from hvd_cifar.core.names import PHASES
from hvd_cifar.trainer import resources
from hvd_cifar.workload import epoch


def test_each_rank_fills_its_own_slot_and_the_sum_holds_every_rank():
    size = 3
    figures = {rank: [100.0 + rank, 1e9 + rank, 2e9 + rank, 3e9 + rank] for rank in range(size)}
    summed = sum(resources.pack(figures[rank], rank, size) for rank in range(size))  # what allreduce_sum gives
    on_cpu = resources.record(summed, size, cuda=False, per_host={"a": 180.0})
    assert on_cpu == {"cpu_percent": {"0": 100.0, "1": 101.0, "2": 102.0},
                      "rss_bytes": {"0": 1_000_000_000, "1": 1_000_000_001, "2": 1_000_000_002},
                      "rss_peak_bytes": {"0": 2_000_000_000, "1": 2_000_000_001, "2": 2_000_000_002},
                      "host_cpu_percent": {"a": 180.0}}
    assert isinstance(on_cpu["rss_bytes"]["1"], int)
    assert resources.record(summed, size, cuda=True, per_host={})["gpu_mem_peak_bytes"]["2"] == 3_000_000_002


def test_the_meter_reads_this_process_and_its_host():
    meter = resources.ResourceMeter(torch.device("cpu"), host=True)
    meter.start()
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:  # one thread busy: about 100 % of a core (less on a loaded host)
        pass
    (cpu, rss, peak, gpu), host = meter.stop()
    # One busy thread cannot use more than one core (the upper bound is the machine's, not a margin).
    assert 15 < cpu < 110 and gpu == 0.0, f"cpu {cpu} %, gpu {gpu}"
    assert 10e6 < rss <= peak
    assert host >= 0.8 * cpu - 5  # the host's busy time includes this process's
    assert resources.ResourceMeter(torch.device("cpu"), host=False).stop()[1] is None


def test_top5_counts_labels_among_the_five_highest_scores():
    scores = torch.tensor([[6.0, 5, 4, 3, 2, 1, 0]] * 4)  # class 0 first, class 6 last
    labels = torch.tensor([0, 4, 5, 6])                     # top-1; 5th; 6th; 7th
    assert epoch.top_k_correct(scores, labels).item() == 2
    loss = torch.tensor(0.5)
    assert epoch.batch_sums(loss, scores, labels).tolist() == [2.0, 1.0, 4.0, 2.0]  # SUMS' order
    # Fewer classes than five: every label is among the top k = classes.
    assert epoch.top_k_correct(torch.randn(8, 3), torch.randint(0, 3, (8,))).item() == 8


@pytest.fixture(scope="module")
def two_of_three_epochs(tmp_path_factory) -> SharedRun:
    """configs/tiny.yaml at 2 steps an epoch, stopped after the second of 3 epochs: the tests
    copy it, change the copy and resume it."""
    logs = tmp_path_factory.mktemp("two_of_three") / "logs"
    run_train(["--config", TINY, "--log-dir", str(logs), "--run-name", "run", "--max-steps-per-epoch", "2",
               "--epochs", "3", "--stop-after", "2"])
    return SharedRun(None, logs / "run")


def test_a_line_lost_after_its_checkpoint_comes_back_on_resume(tmp_path, two_of_three_epochs):
    """A job killed between an epoch's checkpoint and its metrics line (they are written in that
    order, so the line can hold checkpoint_time_s): the checkpoint carries the line."""
    run = two_of_three_epochs.copy_to(tmp_path)
    first, second = read_metrics(run)
    (run / "metrics.jsonl").write_text(json.dumps(first) + "\n")  # as if killed before line 1
    run_train(["--resume", str(run), "--stop-after", "0"])
    records = read_metrics(run)
    assert [r["epoch"] for r in records] == [0, 1, 2]
    assert records[1] == {k: v for k, v in second.items() if k != "checkpoint_time_s"}
    assert records[2]["checkpoint_time_s"] > 0


# ----------------------------------------------------------------------------- the report
def epoch_record(epoch: int, **extra) -> dict:
    record = {"epoch": epoch, "lr": 0.1, "train_loss": 1.0, "train_acc": 0.5, "test_loss": 1.1, "test_acc": 0.4,
              "epoch_time_s": 2.0, "images_per_s": 100.0, "steps": 4, "step_time_s": 0.5,
              "comm_bytes_per_rank": 0, "world_size": 2, **{f"{p}_time_s": 0.1 for p in PHASES}}
    return {**record, **extra}


def write_run(folder: Path, records: list[dict]) -> Path:
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_the_report_shows_resources_and_top5_and_tolerates_runs_without_them(tmp_path):
    measured = [epoch_record(e, train_acc5=0.8 + e / 100, test_acc5=0.7 + e / 100, eval_time_s=0.25,
                             checkpoint_time_s=0.125 * (e + 1), cpu_percent={"0": 150.0 + e, "1": 170.0},
                             host_cpu_percent={"h": 330.0}, rss_bytes={"0": 400e6, "1": 600e6 + e * 1e6},
                             rss_peak_bytes={"0": 700e6, "1": 900e6 + e * 1e6}) for e in range(3)]
    new = write_run(tmp_path / "new", measured)
    assert report.main([str(new), "--out", str(tmp_path / "new-report")]) == 0
    text = (tmp_path / "new-report" / "report.md").read_text()
    for row, r in zip(md_table(text, "## Per epoch"), measured):
        shown(row["train acc@5 (%)"], r["train_acc5"], 2, 0.01)
        shown(row["test acc@5 (%)"], r["test_acc5"], 2, 0.01)
        shown(row["checkpoint (s)"], r["checkpoint_time_s"], 3)
        shown(row["eval (s)"], r["eval_time_s"], 3)
        shown(row["CPU/rank (%)"], (r["cpu_percent"]["0"] + 170.0) / 2, 0)  # the mean over the ranks
        shown(row["host CPU (%)"], 330.0, 0)
        shown(row["RSS/rank (MB)"], (400e6 + r["rss_bytes"]["1"]) / 2, 0, 1e6)
        shown(row["peak RSS/rank (MB)"], (700e6 + r["rss_peak_bytes"]["1"]) / 2, 0, 1e6)
        assert row["peak GPU mem/rank (MB)"] == "-"
    summary = {r["item"]: r["value"] for r in md_table(text, "## Summary")}
    assert summary["final test top-5 accuracy (%)"] == "72.00" and summary["final train top-5 accuracy (%)"] == "82.00"
    assert summary["mean checkpoint write (s, epochs with one)"] == "0.250"
    assert summary["peak RSS of any rank (MB)"] == "902"
    assert_png(tmp_path / "new-report" / "resources.png")
    assert per_name(measured, "cpu_percent") == {"0": [150.0, 151.0, 152.0], "1": [170.0] * 3}

    old = write_run(tmp_path / "old", [epoch_record(e) for e in range(2)])
    assert report.main([str(old), "--out", str(tmp_path / "old-report")]) == 0
    text = (tmp_path / "old-report" / "report.md").read_text()
    for row in md_table(text, "## Per epoch"):
        assert {row[c] for c in ("test acc@5 (%)", "checkpoint (s)", "CPU/rank (%)", "RSS/rank (MB)")} == {"-"}
    assert {r["item"]: r["value"] for r in md_table(text, "## Summary")}["final test top-5 accuracy (%)"] == "-"
    assert (tmp_path / "old-report" / "resources.png").exists()


def test_a_preempted_checkpoint_from_before_top5_resumes_with_that_epochs_top5_unknown(tmp_path, two_of_three_epochs):
    """Its epoch's running sums lack the top-5 count: the epoch's train_acc5 is NaN, not a guess."""
    run = two_of_three_epochs.copy_to(tmp_path)
    ckpt = torch.load(run / "checkpoint_last.pt", weights_only=True)  # epoch 2 next: as if stopped in it
    assert ckpt["epoch"] == 2
    ckpt["position"] = {"step": 1, "position": 32, "totals": [64.0, 5.0, 32.0], "world_size": 1, "elapsed_s": 1.0}
    torch.save(ckpt, run / "checkpoint_last.pt")
    run_train(["--resume", str(run), "--stop-after", "0"])
    first, _, third = read_metrics(run)
    assert first["train_acc5"] > 0 and math.isnan(third["train_acc5"]) and third["resumed_at_step"] == 1
    assert third["train_acc"] > 0 and third["test_acc5"] > 0
