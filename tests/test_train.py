"""The trainer end to end in one process: run folder, metrics, checkpoint, resume, errors."""
import json
import os

import pytest
import torch
import yaml

from conftest import read_metrics, run_train, unmeasured

METRIC_KEYS = {"epoch", "lr", "train_loss", "train_acc", "test_loss", "test_acc", "epoch_time_s",
               "images_per_s", "data_time_s", "forward_time_s", "backward_time_s", "sync_time_s",
               "optimizer_time_s", "world_size", "sync", "comm_bytes_per_rank"}


def test_run_folder_is_complete(tiny_run):
    proc, run = tiny_run().proc, tiny_run().run
    names = {p.name for p in run.iterdir()}
    assert {"config.yaml", "metrics.jsonl", "meta.json", "rank0.log", "checkpoint_last.pt", "eval.json"} <= names
    assert not [n for n in names if n.endswith(".tmp")]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"] == "smallcnn" and saved["run_name"] == "run"
    records = read_metrics(run)
    assert [r["epoch"] for r in records] == [0, 1]
    for r in records:
        assert METRIC_KEYS <= set(r)
        assert r["world_size"] == 1 and r["steps"] == 6
        phases = sum(r[f"{p}_time_s"] for p in ("data", "forward", "backward", "sync", "optimizer"))
        assert 0.5 * r["epoch_time_s"] < phases <= r["epoch_time_s"] * 1.01, (phases, r["epoch_time_s"])
    meta = json.loads((run / "meta.json").read_text())
    assert meta["world_size"] == 1 and meta["versions"]["torch"] and meta["hostnames"]
    evaluation = json.loads((run / "eval.json").read_text())
    assert sum(map(sum, evaluation["confusion_matrix"])) == 360
    assert evaluation["test_acc"] == pytest.approx(records[-1]["test_acc"])
    ckpt = torch.load(run / "checkpoint_last.pt", weights_only=True)
    assert ckpt["epoch"] == 2 and "features.0.0.weight" in ckpt["model"]
    # rank 0 prints the report and confusion matrix after the last epoch
    assert "precision" in proc.stdout and "confusion matrix" in proc.stdout


def test_existing_run_name_is_never_overwritten(tmp_path, tiny_args):
    (tmp_path / "logs" / "run").mkdir(parents=True)
    proc = run_train(tiny_args, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"hvd_cifar: error: run_name: {tmp_path}/logs/run already exists; pick another name or "
        f"resume it with --resume {tmp_path}/logs/run"]


RESUME_COMMON = ["--config", "configs/tiny.yaml", "--max-steps-per-epoch", "3", "--epochs", "4", "--warmup-epochs", "1"]


@pytest.fixture(scope="module")
def straight_and_halves(tmp_path_factory):
    """Two runs of one training in one log folder, neither named (--run-name left out): E
    epochs straight, and E/2 epochs then stopped (the halves, which test_resume_is_exact
    resumes). Their folders: (straight, halves)."""
    logs = tmp_path_factory.mktemp("unnamed")
    run_train([*RESUME_COMMON, "--log-dir", str(logs)])
    [straight] = list(logs.iterdir())
    run_train([*RESUME_COMMON, "--log-dir", str(logs), "--stop-after", "2"])
    [halves] = [p for p in logs.iterdir() if p != straight]
    return logs, straight, halves


def test_default_run_names_are_unique(straight_and_halves):
    # Two runs of one config with no --run-name in one log folder (test_resume_is_exact's
    # straight run and halves, one after the other): two folders, one per run.
    logs, _, _ = straight_and_halves
    assert len([p for p in logs.iterdir() if (p / "metrics.jsonl").exists()]) == 2


def test_resume_is_exact(straight_and_halves):
    """E epochs straight == E/2 epochs, stop, resume for the rest: same weights, same metrics."""
    _, straight, halves = straight_and_halves
    assert [r["epoch"] for r in read_metrics(halves)] == [0, 1]
    assert not (halves / "eval.json").exists()
    proc = run_train(["--resume", str(halves), "--stop-after", "0"])
    assert "resuming after epoch 2 of 4" in proc.stdout

    a = torch.load(straight / "checkpoint_last.pt", weights_only=True)["model"]
    b = torch.load(halves / "checkpoint_last.pt", weights_only=True)["model"]
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert unmeasured(read_metrics(straight)) == unmeasured(read_metrics(halves))


def test_resume_of_a_missing_run_is_one_line(tmp_path):
    proc = run_train(["--resume", str(tmp_path / "nope")], check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"hvd_cifar: error: resume: no run folder at '{tmp_path}/nope' (nor under logs/) with a config.yaml"]


def test_resume_with_another_model_is_refused(tmp_path, tiny_run):
    run = tiny_run().copy_to(tmp_path)  # a smallcnn run of 2 epochs
    proc = run_train(["--resume", str(run), "--model", "vgg11", "--epochs", "3"], check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "resume: checkpoint" in lines[0] and "vgg11" in lines[0]


def test_missing_dataset_is_one_line(tmp_path, tiny_args):
    proc = run_train([*tiny_args, "--dataset", "cifar10", "--data-dir", str(tmp_path / "none")], check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cifar10 not found" in lines[0]


# Loaded into the trainer's process (sitecustomize): forward hooks on every model it builds
# record, per forward pass, the input's dtype and memory format, the dtype and memory format
# of each convolution's output and the dtype of each linear layer's, into $RECORD_FORWARDS.
RECORD_FORWARDS = """
import json, os, torch
from hvd_cifar.workload import models

def described(t):
    return {"dtype": str(t.dtype).replace("torch.", ""), "contiguous": t.is_contiguous(),
            "channels_last": t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)}

def recording(build):
    def build_model(*args, **kwargs):
        model, passes = build(*args, **kwargs), []
        def begin(module, inputs):
            passes.append({"training": module.training, "input": described(inputs[0]), "conv": [], "linear": [],
                           "parameters": sorted({str(p.dtype).replace("torch.", "") for p in module.parameters()}),
                           "parameters_contiguous": all(p.is_contiguous() for p in module.parameters())})
        def end(module, inputs, output):
            with open(os.environ["RECORD_FORWARDS"], "w") as f:
                json.dump(passes, f)
        model.register_forward_pre_hook(begin)
        model.register_forward_hook(end)
        for m in model.modules():
            kind = "conv" if isinstance(m, torch.nn.Conv2d) else "linear" if isinstance(m, torch.nn.Linear) else None
            if kind:
                m.register_forward_hook(lambda m, i, out, kind=kind: passes[-1][kind].append(described(out)))
        return model
    return build_model

models.build_model = recording(models.build_model)
"""


def test_bf16_autocast_and_channels_last_train(tmp_path, tiny_args):
    """--amp bf16 --channels-last: the forward passes (training and evaluation) run their
    convolutions and linear layers in bfloat16 on channels-last (NHWC) batches, while the
    parameters stay float32 and contiguous (what allreduce and broadcast of flat buffers need)."""
    (tmp_path / "sitecustomize.py").write_text(RECORD_FORWARDS)
    record = tmp_path / "forwards.json"
    env = {"PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}", "RECORD_FORWARDS": str(record)}
    run_train([*tiny_args, "--amp", "bf16", "--channels-last", "--epochs", "1"], env=env)
    assert read_metrics(tmp_path / "logs" / "run")[0]["train_loss"] > 0
    passes = json.loads(record.read_text())
    assert [p["training"] for p in passes].count(True) == 6 and not passes[-1]["training"]  # 6 steps, evaluation
    for p in passes:
        assert p["input"] == {"dtype": "float32", "contiguous": False, "channels_last": True}, p
        assert len(p["conv"]) == 3 and len(p["linear"]) == 1, p
        assert all(out == {"dtype": "bfloat16", "contiguous": False, "channels_last": True} for out in p["conv"]), p
        assert p["linear"][0]["dtype"] == "bfloat16", p
        assert p["parameters"] == ["float32"] and p["parameters_contiguous"], p


def test_state_dict_mismatch_names_what_differs():
    from hvd_cifar.runfolder.checkpoint import state_dict_mismatch
    model = {"a": torch.zeros(2), "b": torch.zeros(3)}
    assert state_dict_mismatch(model, {"a": torch.ones(2), "b": torch.ones(3)}) == ""
    assert state_dict_mismatch(model, {"a": torch.ones(2), "c": torch.ones(1), "b": torch.ones(4)}) == (
        "1 tensors this model lacks, e.g. c; 1 tensors of another shape, e.g. b")
    assert state_dict_mismatch(model, {"b": torch.ones(3)}) == "1 tensors missing, e.g. a"


@pytest.mark.parametrize("k", [2, 10])
def test_classification_report_is_scikit_learns(k):
    """eval.json's and the printed classification report, computed from the confusion matrix
    without scikit-learn, equal scikit-learn's (text exactly, figures to rounding), a class that
    is never predicted (precision 0) included."""
    import numpy as np
    from sklearn.metrics import classification_report
    from hvd_cifar.runfolder.evaluation import classification_summary
    rng = np.random.default_rng(k)
    for trial in range(10):
        y = rng.integers(0, k, 300)
        p = np.where(rng.random(300) < 0.6, y, rng.integers(0, k, 300))
        if trial == 0:
            p[p == 1] = 0
        confusion = torch.zeros(k, k, dtype=torch.float64)
        for a, b in zip(y, p):
            confusion[a, b] += 1
        text, report = classification_summary(confusion)
        assert text == classification_report(y, p, labels=list(range(k)), digits=4, zero_division=0)
        expected = classification_report(y, p, labels=list(range(k)), output_dict=True, zero_division=0)
        assert report.keys() == expected.keys()
        for key, value in expected.items():
            assert report[key] == (pytest.approx(value, abs=1e-12) if not isinstance(value, dict)
                                   else {s: pytest.approx(v, abs=1e-12) for s, v in value.items()}), key


def test_what_is_built_once_stays_and_what_changes_is_declared():
    """context.Setup (built once) refuses assignment; context.Training and loop.TrainingState
    take their declared fields only, so a part of the run that writes a name nobody declared
    (``run.cfg = ...`` on the run as it goes) fails at once instead of being read nowhere."""
    import dataclasses
    from hvd_cifar.trainer import context, loop
    setup = context.Setup(**dict.fromkeys((f.name for f in dataclasses.fields(context.Setup))))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setup.cfg = None
    run = context.Training(setup, context.Start(), trainable=None)
    run.run_dir, run.updates_per_epoch = "logs/run", 3  # declared: set at every begin
    with pytest.raises(AttributeError):
        run.cfg = None  # the config is the setup's

    class Plain:
        stops_by_vote = False

    place = dict(run_dir="logs/run", epoch=1, step=2, position=3, totals=[0.0] * 4)
    state = loop.TrainingState(Plain(), None, None, **place)
    assert (state.epoch, state.step, state.position, state.restarts, state.stop_vote) == (1, 2, 3, 0, None)
    with pytest.raises(TypeError):
        loop.TrainingState(Plain(), None, None, commit_every=2, **place)  # elastic's, not a plain run's
    with pytest.raises(AttributeError):
        state.reached = (1, 2)
