"""freeze: auto (hvd_cifar/trainer/freezing.py): the decision rule and its measure on their own, then a
real 2-rank horovodrun run on digits: a freeze event, frozen_blocks growing, fewer gradient bytes
per step after the freeze, and a resume that keeps the decision state."""
from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import AUTO_FREEZE, md_table, read_metrics, run_train
from hvd_cifar import report
from hvd_cifar.core import config
from hvd_cifar.core.config import ConfigError
from hvd_cifar.trainer.freezing import AutoFreeze, decide
from hvd_cifar.workload.models import build_model, set_frozen_blocks


# ----------------------------------------------------------------------------- the decision rule
def test_the_deepest_block_below_the_threshold_freezes_with_every_block_before_it():
    assert decide([0.5, 0.01, 0.3, 0.2], threshold=0.05, current=0) == 2
    assert decide([0.01, 0.5, 0.3, 0.02], threshold=0.05, current=0) == 4


def test_nothing_freezes_without_a_block_below_the_threshold_or_a_history():
    assert decide([0.5, 0.06, 0.3], threshold=0.05, current=0) == 0
    assert decide([None, None, None], threshold=0.05, current=0) == 0
    assert decide([0.05, 0.5], threshold=0.05, current=0) == 0  # strictly below


def test_freezing_only_grows():
    assert decide([None, None, 0.5, 0.5], threshold=0.05, current=2) == 2
    assert decide([None, None, 0.01, 0.5], threshold=0.05, current=2) == 3


def _grads(model, scale: float) -> None:
    """Gradients of ``scale`` times all-ones on every trainable parameter."""
    for p in model.parameters():
        p.grad = torch.full_like(p, scale) if p.requires_grad else None


def test_the_measure_is_the_relative_change_of_each_blocks_mean_gradient_norm():
    torch.manual_seed(0)
    model = build_model("smallcnn", 10)
    policy = AutoFreeze(model.feature_blocks, threshold=0.05)
    sizes = [sum(p.numel() for p in b.parameters()) for b in model.feature_blocks]
    for scale in (1.0, 3.0):  # epoch 0: mean of norms at 1 and 3 = 2 x sqrt(size)
        _grads(model, scale)
        policy.observe(None)
    policy.end_epoch()
    # Norms are float32 sums over the block: agree to 1e-3.
    assert policy.history[0] == pytest.approx([2 * math.sqrt(n) for n in sizes], rel=1e-3)
    assert policy.changes() == [None, None, None]
    _grads(model, 2.1)
    policy.observe(None)
    policy.end_epoch()
    assert policy.changes() == pytest.approx([0.05, 0.05, 0.05], rel=1e-3)
    policy.threshold = 0.049
    assert policy.frozen_blocks(2, 0) == 0
    policy.threshold = 0.051
    assert policy.frozen_blocks(2, 0) == 3


def test_frozen_blocks_and_skipped_updates_are_not_measured():
    torch.manual_seed(0)
    model = build_model("smallcnn", 10)
    policy = AutoFreeze(model.feature_blocks, threshold=0.05)
    set_frozen_blocks(model, 1)
    _grads(model, 1.0)
    policy.observe(None)
    next(model.feature_blocks[2].parameters()).grad[0] = math.inf  # an fp16 overflow: the scaler skips it
    policy.observe(None)
    policy.end_epoch()
    assert policy.history[0][0] is None and policy.history[0][1] > 0


def test_an_fp16_scalers_scale_is_taken_out():
    class Scaler:
        def get_scale(self):
            return 1024.0
    torch.manual_seed(0)
    model = build_model("smallcnn", 10)
    plain, scaled = AutoFreeze(model.feature_blocks, 0.05), AutoFreeze(model.feature_blocks, 0.05)
    _grads(model, 1.0)
    plain.observe(None)
    _grads(model, 1024.0)
    scaled.observe(Scaler())
    plain.end_epoch()
    scaled.end_epoch()
    assert scaled.history[0] == pytest.approx(plain.history[0])


def test_the_state_round_trips_mid_epoch():
    torch.manual_seed(0)
    model = build_model("smallcnn", 10)
    policy = AutoFreeze(model.feature_blocks, 0.05)
    for scale in (1.0, 2.0):
        _grads(model, scale)
        policy.observe(None)
        policy.end_epoch()
    policy.observe(None)  # an open epoch, as a preempted run leaves it
    again = AutoFreeze(model.feature_blocks, 0.05)
    again.load_state_dict(policy.state_dict())
    policy.end_epoch()
    again.end_epoch()
    assert again.history == policy.history and again.changes() == policy.changes()


# ----------------------------------------------------------------------------- the config
@pytest.mark.parametrize("argv, message", [
    (["--freeze", "sometimes"], "freeze: expected a number of leading blocks or auto, got 'sometimes'"),
    (["--freeze", "1.5"], "freeze: expected int or str, got 1.5 (float)"),
    (["--freeze-auto-threshold", "0"], "freeze_auto_threshold: must be > 0"),
    (["--freeze", "auto", "--freeze-schedule", "{2: 1}"], "freeze_schedule: not with freeze: auto"),
    (["--freeze", "auto", "--elastic"], "freeze: auto: not with elastic: true"),
    (["--freeze", "auto", "--sync", "mpi-async-ps"], "freeze: auto needs gradients averaged over the ranks"),
])
def test_auto_is_a_value_of_freeze_and_what_does_not_fit_it_is_one_line(argv, message):
    with pytest.raises(ConfigError) as err:
        config.from_args(argv)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_auto_round_trips_through_config_yaml(tmp_path):
    cfg = config.from_args(["--freeze", "auto", "--freeze-auto-threshold", "0.2"])
    cfg.save(tmp_path / "config.yaml")
    assert config.from_args(["--config", str(tmp_path / "config.yaml")]) == cfg


# ----------------------------------------------------------------------------- real runs
# smallcnn's three blocks with a threshold no relative change reaches: every block freezes at
# the first decision, at the start of epoch 2 (epochs 0 and 1 measured).
AUTO = ["--config", "configs/tiny.yaml", *AUTO_FREEZE, "--epochs", "4"]


def events(run) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def test_auto_freezes_under_horovodrun_and_sends_fewer_bytes(tmp_path):
    run_train([*AUTO, "--log-dir", str(tmp_path), "--run-name", "auto"], launcher="horovodrun", np=2)
    records = read_metrics(tmp_path / "auto")
    assert [r["frozen_blocks"] for r in records] == [0, 0, 3, 3]
    [event] = events(tmp_path / "auto")
    assert (event["event"], event["policy"], event["epoch"], event["frozen_before"], event["frozen_blocks"]) == \
        ("freeze", "auto", 2, 0, 3)
    assert event["block_grad_norm_change"] == records[1]["block_grad_norm_change"]
    assert all(c is not None and c < 100 for c in event["block_grad_norm_change"])
    assert records[0]["block_grad_norm_change"] == [None] * 3 and records[2]["block_grad_norm"] == [None] * 3
    # Only the classifier (128 x 10 + 10) is left to synchronise: 2(N-1)/N = 1 at N = 2.
    assert records[2]["trainable_params"] == event["trainable_params"] == 1290
    assert records[2]["comm_bytes_per_sync"] == 1290 * 4 < records[1]["comm_bytes_per_sync"]
    assert json.loads((tmp_path / "auto" / "eval.json").read_text())["parameters_identical_across_ranks"]
    # The run report shows the saving, against the same 4 x 6 synchronisations of all 94,986 parameters.
    assert report.main([str(tmp_path / "auto"), "--out", str(tmp_path / "report")]) == 0
    summary = {r["item"]: r["value"] for r in md_table((tmp_path / "report" / "report.md").read_text(), "## Summary")}
    unfrozen, sent = 4 * 6 * 94_986 * 4, 2 * 6 * 94_986 * 4 + 2 * 6 * 1290 * 4
    assert summary["frozen blocks per epoch"] == "0 0 3 3"
    assert summary["saved by freezing over the run (MB per rank, analytic, against nothing frozen)"] == \
        f"{(unfrozen - sent) / 1e6:.3f} of {unfrozen / 1e6:.3f} ({100 * (1 - sent / unfrozen):.2f} %)"


def test_resume_keeps_the_measure_history_and_what_is_frozen(tmp_path):
    """Stopped after epoch 1 (history of epochs 0 and 1, nothing frozen yet): the resumed run
    freezes at the start of epoch 2 as the unbroken run does, which it can only do with the
    history restored. Stopped after epoch 2 (all frozen): the resumed epoch 3 starts frozen.
    One process: what is saved and restored is the same at every size (2 ranks under horovodrun:
    the test above). One run stopped at both places (3 starts instead of 4): stopped after
    epoch 1, resumed until it stops after epoch 2, resumed to the end."""
    name = "stops"
    run_train([*AUTO, "--log-dir", str(tmp_path), "--run-name", name, "--stop-after", "2"])
    for stop in (3, 0):
        run_train(["--resume", str(tmp_path / name), "--stop-after", str(stop)])
        records = read_metrics(tmp_path / name)
        assert [r["frozen_blocks"] for r in records] == [0, 0, 3, 3][:stop or 4], (name, stop)
        assert [(e["epoch"], e["frozen_blocks"]) for e in events(tmp_path / name)] == [(2, 3)], (name, stop)


@pytest.mark.parametrize("sync", ["ddp", "mpi-allreduce", "mpi-gather-scatter"])
def test_every_averaging_method_freezes_alike(sync_run, sync):
    """The measure is read from whatever the method leaves in .grad after synchronize."""
    # The 2-rank mpirun run of tests/test_sync_methods.py (conftest.SYNC_FLAGS): freeze: auto at
    # this threshold over 4 epochs, as AUTO, in 5 steps an epoch in updates of 2 micro-batches.
    run = sync_run(sync).run
    records = read_metrics(run)
    assert [r["frozen_blocks"] for r in records] == [0, 0, 3, 3]
    assert records[2]["comm_bytes_per_sync"] < records[1]["comm_bytes_per_sync"]
    assert json.loads((run / "eval.json").read_text())["parameters_identical_across_ranks"]
