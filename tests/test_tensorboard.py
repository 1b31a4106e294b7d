"""TensorBoard: rank 0's event files hold every number of metrics.jsonl, read back with
TensorBoard's own reader; the per-rank resource figures and top-5 accuracy of a real 2-rank run."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from conftest import read_metrics, run_train
from hvd_cifar.runfolder import tensorboard

pytestmark = pytest.mark.slow


def board(run: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def expected_scalars(records: list[dict]) -> dict[str, dict[int, float]]:
    """{tag: {epoch: value}} for every number in the metrics lines, worked out here."""
    out: dict[str, dict[int, float]] = {}
    for r in records:
        for key, v in r.items():
            items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else [("", v)]
            for sub, x in items:
                if key != "epoch" and isinstance(x, (int, float)) and not isinstance(x, bool):
                    name = tensorboard.tag(key) + (f"/{sub}" if sub != "" else "")
                    out.setdefault(name, {})[r["epoch"]] = float(x)
    return out


def assert_board_matches_metrics(run: Path) -> None:
    """Every scalar, at every epoch, is the metrics line's number (as float32), and nothing else."""
    acc = board(run)
    events = {name: acc.Scalars(name) for name in acc.Tags()["scalars"]}
    got = {name: {e.step: e.value for e in shown} for name, shown in events.items()}
    want = expected_scalars(read_metrics(run))
    assert set(got) == set(want)
    for name, values in want.items():
        assert [e.step for e in events[name]] == sorted(values), name  # one value per epoch, in order
        for epoch, x in values.items():
            assert got[name][epoch] == pytest.approx(x, rel=1e-6, abs=1e-30), (name, epoch)


def hparams(run: Path) -> tuple[dict, list[str]]:
    """The hparams session's values and the experiment's metric tags."""
    acc = board(run)
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"])
    values = {k: v.string_value or v.number_value or v.bool_value for k, v in start.session_start_info.hparams.items()}
    return values, [m.name.tag for m in experiment.experiment.metric_infos]


def event_files(run: Path) -> list[Path]:
    return sorted(run.rglob("events.out.tfevents.*"))


def test_a_two_rank_run_in_tensorboard(tiny_run):
    run = tiny_run("horovodrun").run  # configs/tiny.yaml: 2 epochs of 6 steps
    assert len(event_files(run)) == 1 and event_files(run)[0].parent == run  # rank 0's alone
    assert_board_matches_metrics(run)
    records = read_metrics(run)
    evaluation = json.loads((run / "eval.json").read_text())
    values, metrics = hparams(run)
    assert values["model"] == "smallcnn" and values["epochs"] == 2 and values["max_steps_per_epoch"] == 6
    assert metrics == ["accuracy/test_acc", "accuracy/test_acc5"]
    assert evaluation["test_acc"] == records[-1]["test_acc"]
    assert evaluation["test_acc5"] == records[-1]["test_acc5"]

    for r in records:  # the figures themselves, per rank and per host
        assert set(r["cpu_percent"]) == set(r["rss_bytes"]) == set(r["rss_peak_bytes"]) == {"0", "1"}
        for rank in ("0", "1"):
            assert 1 < r["cpu_percent"][rank] < 100 * 64
            assert 50e6 < r["rss_bytes"][rank] <= r["rss_peak_bytes"][rank]
        assert list(r["host_cpu_percent"]) == list(r["nic_interface"]) and min(r["host_cpu_percent"].values()) > 1
        assert "gpu_mem_peak_bytes" not in r  # CPU run
        assert r["checkpoint_time_s"] > 0 and r["eval_time_s"] > 0
        assert r["train_acc"] <= r["train_acc5"] <= 1 and r["test_acc"] <= r["test_acc5"] <= 1
        assert r["test_acc5"] > r["test_acc"]  # 10 classes: top-5 catches more than top-1 at this accuracy


def test_a_resumed_run_appends_and_hides_the_epochs_it_reruns(tmp_path, tiny_args):
    """Resumed from an older checkpoint than the last epoch recorded (a job that died between an
    epoch's line and its checkpoint), the run reruns that epoch: TensorBoard shows the rerun."""
    run = tmp_path / "logs" / "run"
    run_train([*tiny_args, "--epochs", "3", "--max-steps-per-epoch", "2", "--stop-after", "1"])
    first = (run / "checkpoint_last.pt").read_bytes()  # covers epoch 0
    run_train(["--resume", str(run), "--stop-after", "2"])
    (run / "checkpoint_last.pt").write_bytes(first)
    before = read_metrics(run)[1]["elapsed_s"]
    run_train(["--resume", str(run), "--stop-after", "0"])
    assert len(event_files(run)) == 3
    assert [r["epoch"] for r in read_metrics(run)] == [0, 1, 2]
    assert read_metrics(run)[1]["elapsed_s"] != before  # epoch 1 was run again
    assert_board_matches_metrics(run)


def test_tensorboard_off_writes_no_event_files(one_epoch_run):
    run = one_epoch_run.run  # one process, 1 epoch, --no-tensorboard (conftest)
    assert (run / "metrics.jsonl").exists() and not event_files(run)


def test_scalars_take_every_number_of_a_record():
    record = {"epoch": 4, "lr": 0.1, "test_acc5": 0.9, "sync": "horovod", "fp16_allreduce": False,
              "cpu_percent": {"0": 150.0, "1": 120.5}, "nic_tx_bytes": {"hostA": 10},
              "block_grad_norm": [1.5, None], "staleness": math.nan, "checkpoint_time_s": 0.2}
    assert tensorboard.scalars(record) == {
        "optimizer/lr": 0.1, "accuracy/test_acc5": 0.9, "resources/cpu_percent/0": 150.0,
        "resources/cpu_percent/1": 120.5, "bytes/nic_tx_bytes/hostA": 10.0, "run/block_grad_norm/0": 1.5,
        "time/checkpoint_time_s": 0.2}


def test_tensorboard_without_its_package_is_one_line(monkeypatch):
    import importlib.util

    from hvd_cifar.core import config
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(config.ConfigError, match=r"^tensorboard: the tensorboard package is not installed"):
        config.from_args([])
    assert config.from_args(["--no-tensorboard"]).tensorboard is False
