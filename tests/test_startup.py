"""What every rank pays before its first step: no module it does not use. A trainer process
imports neither scikit-learn (digits and the classification report are read and computed
without it) nor torch._dynamo (hvd_cifar.workload.optim.SGD steps without torch's compile guards),
about 2.5 s of CPU per rank together, and computes what it computed with them."""
import subprocess
import sys

import torch

from conftest import ROOT
from hvd_cifar.core.config import Config
from hvd_cifar.workload import optim
from hvd_cifar.workload.models import build_model

# A rank's start, in a fresh process: data, model, SGD, updates, checkpoint state, the report.
A_RANKS_START = """
import sys, torch
from hvd_cifar import train
from hvd_cifar.core.config import Config
from hvd_cifar.runfolder import evaluation
from hvd_cifar.workload import data, optim
from hvd_cifar.workload.models import build_model
ds = data.load("digits", "")
model = build_model("smallcnn", 10)
opt = optim.sgd(list(model.named_parameters()), optim.OptimSettings.of(Config(lr=0.05).validate()))
for _ in range(2):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(ds.train_images[:8].float()), ds.train_labels[:8]).backward()
    opt.step()
opt.load_state_dict(opt.state_dict())
evaluation.classification_summary(torch.eye(3))
print(sorted({m.split(".")[0] for m in sys.modules if m.startswith("sklearn")} |
             {m for m in sys.modules if m.startswith("torch._dynamo")}))
"""


def test_a_rank_loads_neither_scikit_learn_nor_torch_dynamo():
    proc = subprocess.run([sys.executable, "-c", A_RANKS_START], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout == "[]\n", proc


def test_sgd_computes_what_torch_sgd_computes():
    """Momentum, Nesterov and weight decay on the weights only (optim.sgd's groups): the same
    parameters and momentum, bit for bit, after updates, a state round trip and more updates."""
    torch.manual_seed(0)
    ours_model, torch_model = build_model("smallcnn", 10), build_model("smallcnn", 10)
    torch_model.load_state_dict(ours_model.state_dict())
    cfg = Config(lr=0.05).validate()
    ours = optim.sgd(list(ours_model.named_parameters()), optim.OptimSettings.of(cfg))
    theirs = torch.optim.SGD([{"params": [p for p in torch_model.parameters() if p.ndim > 1],
                               "weight_decay": cfg.weight_decay},
                              {"params": [p for p in torch_model.parameters() if p.ndim <= 1], "weight_decay": 0.0}],
                             lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
    assert type(ours) is optim.SGD and cfg.nesterov and cfg.momentum > 0
    for step in range(6):
        x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
        for model, opt in ((ours_model, ours), (torch_model, theirs)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        if step == 2:
            ours.load_state_dict(ours.state_dict())
    for (name, a), b in zip(ours_model.named_parameters(), torch_model.parameters()):
        assert torch.equal(a, b), name
        assert torch.equal(ours.state[a]["momentum_buffer"], theirs.state[b]["momentum_buffer"]), name


# A rank whose native code jumps to address 0 (as a segfault inside MPI's start-up did once
# under srun) while the trainer's own function is on the stack.
A_NATIVE_CRASH = """
import ctypes
from hvd_cifar import train

def start_the_backend(argv=None):
    ctypes.CFUNCTYPE(None)(0)()  # a call through a null function pointer

train.main = start_the_backend
train.cli()
"""


def test_a_native_crash_names_the_python_call_it_happened_in():
    done = subprocess.run([sys.executable, "-c", A_NATIVE_CRASH], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == -11, (done.returncode, done.stderr[-2000:])
    assert "Fatal Python error: Segmentation fault" in done.stderr, done.stderr[-2000:]
    assert "in start_the_backend" in done.stderr and "in cli" in done.stderr, done.stderr[-2000:]
