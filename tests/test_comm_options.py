"""fp16 compression, gradient accumulation and layer freezing: real runs, checked in weights and bytes."""
import json

import pytest
import torch

from conftest import read_metrics, run_train
from hvd_cifar.workload.models import build_model


def final_weights(run):
    return torch.load(run / "checkpoint_last.pt", weights_only=True)["model"]


def test_accumulated_update_equals_one_big_batch_update(tmp_path):
    """k=4 micro-batches of b images == one batch of 4b images, for a model without BatchNorm."""
    common = ["--config", "configs/tiny.yaml", "--batchnorm", "false", "--augment", "false",
              "--epochs", "1", "--warmup-epochs", "0", "--log-dir", str(tmp_path)]
    # same peak lr: lr x world size x accumulation steps
    run_train([*common, "--run-name", "k4", "--batch-size", "8", "--accumulation-steps", "4",
               "--max-steps-per-epoch", "4", "--lr", "0.0125"])
    run_train([*common, "--run-name", "k1", "--batch-size", "32", "--accumulation-steps", "1",
               "--max-steps-per-epoch", "1", "--lr", "0.05"])
    a, b = final_weights(tmp_path / "k4"), final_weights(tmp_path / "k1")
    for key in a:
        assert torch.allclose(a[key], b[key], atol=1e-5, rtol=0), key
    torch.manual_seed(0)  # the trainer's seed: its initial weights
    init = build_model("smallcnn", 10, batchnorm=False).state_dict()
    assert all(not torch.equal(a[k], init[k]) for k in a if k.endswith("weight"))  # the update happened
    [k4], [k1] = read_metrics(tmp_path / "k4"), read_metrics(tmp_path / "k1")
    assert k4["syncs"] == 1 and k1["syncs"] == 1
    assert k4["train_loss"] == pytest.approx(k1["train_loss"], rel=1e-5)


@pytest.mark.parametrize("launcher", ["horovodrun", "horovodrun-gloo"])
def test_options_under_two_ranks(tmp_path, tiny_run, launcher):
    """fp16 halves the payload; k=4 over 6 steps syncs twice (the tail of 2 still syncs); ranks agree."""
    base = ["--config", "configs/tiny.yaml", "--epochs", "1", "--log-dir", str(tmp_path)]
    run_train([*base, "--run-name", "mixed", "--compression", "fp16", "--accumulation-steps", "4"],
              launcher=launcher, np=2)
    fp32_run = tiny_run(launcher).run  # the tiny config as it is: 2 epochs, fp32, k=1
    (fp32, _), [mixed] = read_metrics(fp32_run), read_metrics(tmp_path / "mixed")
    params = fp32["trainable_params"]
    assert fp32["comm_bytes_per_sync"] == round(2 * (2 - 1) / 2 * params * 4)
    assert mixed["comm_bytes_per_sync"] * 2 == fp32["comm_bytes_per_sync"]
    assert (fp32["steps"], fp32["syncs"]) == (6, 6) and (mixed["steps"], mixed["syncs"]) == (6, 2)
    assert mixed["comm_bytes_per_rank"] == 2 * mixed["comm_bytes_per_sync"]
    for run in (fp32_run, tmp_path / "mixed"):
        assert json.loads((run / "eval.json").read_text())["parameters_identical_across_ranks"]


def test_frozen_blocks_do_not_change(script_run):
    # --freeze 2 --epochs 1 by 2 ranks, started by launch/mpirun.sh (conftest.SCRIPT_JOBS): the
    # job test_launch.py's hostfile test reads too
    run = script_run("launch/mpirun.sh").run
    torch.manual_seed(0)  # the trainer's seed: the same initial weights
    init = build_model("smallcnn", 10).state_dict()
    final = final_weights(run)
    for key in init:
        block = int(key.split(".")[1]) if key.startswith("features.") else None
        if key.endswith("num_batches_tracked"):
            continue
        if block is not None and block < 2:
            assert torch.equal(final[key], init[key]), key           # weights and BN statistics
        elif key.endswith("weight"):
            assert not torch.equal(final[key], init[key]), key
    [record] = read_metrics(run)
    frozen_params = sum(v.numel() for k, v in init.items()
                        if k.startswith(("features.0.", "features.1.")) and "running" not in k
                        and "num_batches" not in k)
    assert record["trainable_params"] == 94_986 - frozen_params
    assert record["comm_bytes_per_sync"] == record["trainable_params"] * 4   # 2(N-1)/N = 1 at N=2


def test_freeze_schedule_rebuilds_and_ranks_stay_in_step(tmp_path):
    run_train(["--config", "configs/tiny.yaml", "--epochs", "3", "--freeze-schedule", "{1: 2, 2: 1}",
               "--log-dir", str(tmp_path), "--run-name", "s"], launcher="mpirun", np=2)
    records = read_metrics(tmp_path / "s")
    assert [r["frozen_blocks"] for r in records] == [0, 2, 1]
    assert records[0]["trainable_params"] > records[2]["trainable_params"] > records[1]["trainable_params"]
    assert json.loads((tmp_path / "s" / "eval.json").read_text())["parameters_identical_across_ranks"]


def test_freezing_more_blocks_than_the_model_has(tmp_path, tiny_args):
    proc = run_train([*tiny_args, "--freeze", "4"], check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["hvd_cifar: error: freeze: 4 blocks asked for but smallcnn has 3"]
