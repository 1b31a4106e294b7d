"""A checkpoint is input: one read from disk that is not what this program wrote (not a dict, a
key missing, a value of the wrong type, tensors of another shape, a truncated or garbage file)
ends the resume with one line naming the file and what is wrong, exit 2, before any of it is
used. Each case is a real file made from a real run's checkpoint; the contents are checked in
this process (rank 0's read, checkpoint.load_checkpoint, and every rank's fit to the model,
checkpoint.restore_training), and two cases run as 2-rank mpirun jobs for the one line from one
rank."""
import copy
import os
import subprocess

import pytest
import torch

from conftest import ROOT, launch_argv
from hvd_cifar.core.config import Config
from hvd_cifar.core.files import RunError
from hvd_cifar.runfolder import checkpoint
from hvd_cifar.workload import models, optim


@pytest.fixture
def saved(tmp_path, tiny_run):
    """A copy of a finished one-process run (configs/tiny.yaml) and its checkpoint's contents."""
    run = tiny_run().copy_to(tmp_path)
    return run, torch.load(run / checkpoint.CHECKPOINT, weights_only=True)


def rewrite(run, state) -> str:
    path = run / checkpoint.CHECKPOINT
    torch.save(state, path)
    return str(path)


def changed(state: dict, change) -> dict:
    state = copy.deepcopy(state)
    change(state)
    return state


def _position(state):
    state["position"] = {"step": 3, "position": 96, "totals": [1.0, 2.0, "x"], "elapsed_s": 1.5}


# (what is broken, how, what the line says after "is not a checkpoint this program wrote (")
CONTENTS = [
    ("a list, not a dict", lambda s: [s], "it holds list, not a checkpoint's dict"),
    ("no epoch", lambda s: changed(s, lambda c: c.pop("epoch")), "'epoch' is missing"),
    ("no weights", lambda s: changed(s, lambda c: c.pop("model")), "'model' is missing"),
    ("epoch a string", lambda s: changed(s, lambda c: c.update(epoch="2")), "'epoch' is str '2', not an integer >= 0"),
    ("epoch negative", lambda s: changed(s, lambda c: c.update(epoch=-1)), "'epoch' is int -1, not an integer >= 0"),
    ("identity a list", lambda s: changed(s, lambda c: c.update(identity=[1])), "'identity' is list, not a dict"),
    ("a weight a string", lambda s: changed(s, lambda c: c["model"].update({next(iter(c["model"])): "w"})),
     "'model' holds str at "),
    ("optimizer without its groups", lambda s: changed(s, lambda c: c["optimizer"].pop("param_groups")),
     "'optimizer' is not an optimizer's state"),
    ("frozen blocks a float", lambda s: changed(s, lambda c: c.update(frozen_blocks=1.5)),
     "'frozen_blocks' is float 1.5, not an integer >= 0"),
    ("record without its epoch", lambda s: changed(s, lambda c: c.update(record={"loss": 1.0})),
     "'record': 'epoch' is missing"),
    ("a position's sums not numbers", lambda s: changed(s, _position),
     "'position': 'totals' holds something other than numbers"),
    ("rank states not dicts", lambda s: changed(s, lambda c: c.update(rank_states=[1, 2])),
     "'rank_states' holds something other than dicts"),
]


@pytest.mark.parametrize("what, make, says", CONTENTS, ids=[c[0] for c in CONTENTS])
def test_contents_not_a_checkpoints_are_one_line_naming_the_file(saved, what, make, says):
    run, state = saved
    path = rewrite(run, make(state))
    with pytest.raises(RunError) as raised:
        checkpoint.load_checkpoint(str(run), state["identity"])
    line = str(raised.value)
    assert line.startswith(f"resume: {path} is not a checkpoint this program wrote (") and says in line, line
    assert "\n" not in line


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_truncated_or_garbage_file_is_one_line(saved, damage):
    run, state = saved
    path = run / checkpoint.CHECKPOINT
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "garbage": os.urandom(4096), "empty": b""}[damage])
    with pytest.raises(RunError, match=rf"^resume: {path} is not a readable checkpoint \(\w+\)$"):
        checkpoint.load_checkpoint(str(run), state["identity"])


def model_and_optimizer(state):
    """This run's model and optimizer, as the trainer builds them for the checkpoint's run."""
    cfg = Config(**{k: state["config"][k] for k in ("lr", "momentum", "weight_decay", "nesterov")})
    model = models.build_model(state["identity"]["model"], state["identity"]["num_classes"],
                               state["config"]["batchnorm"])
    return model, optim.sgd(list(model.named_parameters()), optim.OptimSettings.of(cfg))


def _momentum_reshaped(c):
    buffer = c["optimizer"]["state"][0]["momentum_buffer"]
    c["optimizer"]["state"][0]["momentum_buffer"] = torch.zeros(buffer.numel() + 1)


def _weight_reshaped(c):
    name = next(iter(c["model"]))
    c["model"][name] = torch.zeros(3, 3)


def _buffers_reshaped(c):
    buffers = {name: t for name, t in c["model"].items() if "running_mean" in name}
    name = next(iter(buffers))
    c["position"] = {"step": 1, "position": 32, "totals": [0.0], "elapsed_s": 1.0,
                     "rank_buffers": [{**buffers, name: torch.zeros(1)}]}


FITS = [
    ("a weight of another shape", _weight_reshaped, "resume: the checkpoint's weights do not fit this smallcnn ("),
    ("momentum of another shape", _momentum_reshaped,
     "resume: the checkpoint's optimizer state does not fit this smallcnn (momentum_buffer of parameter 0 is"),
    ("a learning rate that is a string", lambda c: c["optimizer"]["param_groups"][0].update(lr="fast"),
     "resume: the checkpoint's optimizer does not fit this run's (group 0's 'lr' is str 'fast', not a number)"),
    ("a saved rank's BatchNorm statistics of another shape", _buffers_reshaped,
     "resume: the checkpoint's weights do not fit this smallcnn (rank 0's BatchNorm statistics: "),
]


@pytest.mark.parametrize("what, change, says", FITS, ids=[c[0] for c in FITS])
def test_tensors_and_settings_that_do_not_fit_the_model_are_one_line(saved, what, change, says):
    """What every rank checks alike against its model and optimizer, each before the first update
    would trip on it."""
    run, state = saved
    rewrite(run, changed(state, change))
    ckpt = checkpoint.load_checkpoint(str(run), state["identity"])  # the contents are a checkpoint's
    model, optimizer = model_and_optimizer(state)
    with pytest.raises(RunError) as raised:
        checkpoint.restore_training(ckpt, model, optimizer, None, state["identity"]["model"])
    assert str(raised.value).startswith(says) and "\n" not in str(raised.value), raised.value


def test_the_real_checkpoint_fits(saved):
    run, state = saved
    model, optimizer = model_and_optimizer(state)
    checkpoint.restore_training(checkpoint.load_checkpoint(str(run), state["identity"]), model, optimizer, None,
                                "smallcnn")
    assert torch.equal(model.state_dict()[next(iter(state["model"]))], next(iter(state["model"].values())))


@pytest.mark.slow
@pytest.mark.parametrize("what, make, says", [
    ("a list, not a dict", lambda s: [s], "is not a checkpoint this program wrote (it holds list"),
    ("momentum of another shape", lambda s: changed(s, _momentum_reshaped),
     "resume: the checkpoint's optimizer state does not fit this smallcnn"),
], ids=["not a dict", "momentum reshaped"])
def test_a_bad_checkpoint_under_mpirun_is_one_line_from_one_rank(saved, what, make, says):
    run, state = saved
    rewrite(run, make(state))
    proc = subprocess.run([*launch_argv("mpirun", 2), "--resume", str(run), "--epochs", "3"], cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if "hvd_cifar" in line or "Traceback" in line]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("hvd_cifar: error: resume: ") and says in lines[0], lines


def test_a_freezing_state_that_does_not_fit_is_one_line(saved):
    """freeze: auto keeps its measure per feature block: a saved one for another number of blocks
    is refused naming the file, where the policy's own load would raise from torch."""
    from hvd_cifar.trainer import freezing, restore
    run, state = saved
    model, _ = model_and_optimizer(state)
    policy = freezing.AutoFreeze(model.feature_blocks, threshold=0.1)
    saved_state = {"history": [], "norm_sums": [0.0] * (len(model.feature_blocks) + 1), "updates": [0.0]}
    with pytest.raises(RunError) as raised:
        restore.loading(str(run), "the freezing policy's", lambda: policy.load_state_dict(saved_state))
    assert str(raised.value).startswith(f"resume: {run / checkpoint.CHECKPOINT}: the freezing policy's state does not "
                                        f"fit this run (RuntimeError: "), raised.value


@pytest.mark.slow
def test_one_ranks_communication_state_that_does_not_fit_stops_both_with_one_line(tmp_path):
    """PowerSGD's error feedback is each rank's own: rank 1's, saved without its residuals, is
    met by rank 1 alone, and still both ranks stop, with rank 0's one line."""
    flags = ["--config", str(ROOT / "configs" / "tiny.yaml"), "--compression", "powersgd", "--epochs", "1",
             "--max-steps-per-epoch", "3", "--threads-per-rank", "1", "--log-dir", str(tmp_path), "--run-name", "run"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    first = subprocess.run([*launch_argv("mpirun", 2), *flags], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    run = tmp_path / "run"
    state = torch.load(run / checkpoint.CHECKPOINT, weights_only=True)
    assert len(state["rank_states"]) == 2 and "errors" in state["rank_states"][1]
    rewrite(run, changed(state, lambda c: c["rank_states"][1].pop("errors")))
    proc = subprocess.run([*launch_argv("mpirun", 2), "--resume", str(run), "--epochs", "2"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if "hvd_cifar" in line or "Traceback" in line]
    assert proc.returncode == 2 and lines == [
        f"hvd_cifar: error: resume: {run / checkpoint.CHECKPOINT}: rank 1's communication state does not fit this run "
        f"(KeyError: 'errors')"], proc.stderr[-3000:]
