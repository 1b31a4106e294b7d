"""The four sync methods against each other, in real 2-rank jobs under both launchers.

    .venv/bin/python -m pytest -q tests/test_sync_methods.py

Every run trains smallcnn on the digits from the same seed for 2 epochs of 5 steps, with
gradient accumulation in groups of 2 (so each epoch ends on a group of 1) and the first
feature block frozen from epoch 1 on (so every method re-wraps the model mid-run); the fp32
runs under mpirun (test_same_weights_and_losses_under_mpirun) are conftest.sync_run's instead,
which tests/test_autofreeze.py and tests/test_overlap.py read too (one job each instead of
two): the same training for 4 epochs, every feature block frozen by freeze: auto from epoch 2
on (a re-wrap too). In fp32, averaging two ranks' gradients is exact whatever the method
((a+b)/2 = a/2+b/2), so every method must land on the same weights and losses as Horovod
under mpirun, the reference.
With fp16 gradients on the wire the methods round differently: close to the reference, not
equal to it.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import SYNC_FLAGS, read_metrics, run_train
from hvd_cifar.workload.models import build_model, set_frozen_blocks

METHODS = ("horovod", "mpi-allreduce", "mpi-gather-scatter", "ddp")
RANKS = 2
STEPS, GROUP = 5, 2                  # steps per epoch, accumulation steps: syncs of 2, 2, 1
SYNCS_PER_EPOCH = 3
FREEZE = {0: 0, 1: 1}                # epoch -> frozen feature blocks
TRAIN_FLAGS = ["--config", "configs/tiny.yaml", "--model", "smallcnn", "--epochs", "2",
               "--max-steps-per-epoch", str(STEPS), "--accumulation-steps", str(GROUP),
               "--freeze-schedule", "{1: 1}", "--threads-per-rank", "1", "--checkpoint-every", "0"]
# conftest.SYNC_FLAGS (the shared mpirun runs): these steps and groups, 4 epochs, freeze: auto at
# a threshold no change reaches, every block frozen from epoch 2 on. (Not the fp16 runs' flags:
# 2 more unfrozen epochs of fp16 rounding move their losses beyond the 1e-3 they are held to.)
AUTO_FREEZE = {0: 0, 1: 0, 2: 3, 3: 3}
assert SYNC_FLAGS[SYNC_FLAGS.index("--max-steps-per-epoch") + 1] == str(STEPS)
assert SYNC_FLAGS[SYNC_FLAGS.index("--accumulation-steps") + 1] == str(GROUP)

pytestmark = pytest.mark.slow


def train_flags(method: str, log_dir: Path, *flags: str) -> list[str]:
    return [*TRAIN_FLAGS, "--sync", method, "--log-dir", str(log_dir), "--run-name", "run", *flags]


def train(launcher: str, method: str, log_dir: Path, *flags: str) -> Path:
    """One successful 2-rank run; its run folder."""
    run_train(train_flags(method, log_dir, *flags), launcher=launcher, np=RANKS)
    return log_dir / "run"


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoint_last.pt", weights_only=True)["model"]


def initial_weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)  # the config's seed, set by train.py just before it builds the model
    return build_model("smallcnn", 10).state_dict()


def max_weight_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].is_floating_point())


def flat(state: dict) -> torch.Tensor:
    return torch.cat([t.double().flatten() for t in state.values() if t.is_floating_point()])


def trainable_bytes(frozen: int, bytes_per_value: int) -> int:
    model = build_model("smallcnn", 10)
    set_frozen_blocks(model, frozen)
    return sum(p.numel() for p in model.parameters() if p.requires_grad) * bytes_per_value


def analytic_bytes_per_sync(method: str, payload: int, n: int = RANKS) -> int:
    """What one rank sends per synchronisation: a ring allreduce sends 2(N-1)/N of the payload;
    gather-scatter's root sends the mean to the N-1 others."""
    return (n - 1) * payload if method == "mpi-gather-scatter" else round(2 * (n - 1) / n * payload)


def check_accounting(method: str, records: list[dict], fp16: bool, freeze: dict = FREEZE) -> None:
    assert [r["epoch"] for r in records] == list(freeze)
    assert [r["frozen_blocks"] for r in records] == list(freeze.values())
    for r in records:
        payload = trainable_bytes(freeze[r["epoch"]], 2 if fp16 else 4)
        assert r["comm_bytes_per_sync"] == analytic_bytes_per_sync(method, payload), r
        assert r["syncs"] == SYNCS_PER_EPOCH
        assert r["comm_bytes_per_rank"] == r["comm_bytes_per_sync"] * SYNCS_PER_EPOCH
        assert r["sync"] == method and r["world_size"] == RANKS and r["compression"] == ("fp16" if fp16 else "none")
    # freezing blocks must shrink what crosses the wire (at the epoch that froze them)
    first = next(e for e in freeze if freeze[e] > 0)
    assert records[first]["comm_bytes_per_sync"] < records[first - 1]["comm_bytes_per_sync"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """Horovod under mpirun, fp32: what every other run is compared with."""
    return train("mpirun", "horovod", tmp_path_factory.mktemp("reference"))


@pytest.mark.parametrize("method", METHODS)
def test_same_weights_and_losses_under_mpirun(method, sync_run):
    # conftest.sync_run: SYNC_FLAGS by 2 ranks under mpirun, the runs tests/test_autofreeze.py
    # and tests/test_overlap.py read too. Horovod's is the reference here: for it, only the
    # accounting is news.
    reference, run_dir = sync_run("horovod").run, sync_run(method).run
    records, expected = read_metrics(run_dir), read_metrics(reference)
    check_accounting(method, records, fp16=False, freeze=AUTO_FREEZE)
    for got, want in zip(records, expected):
        for key in ("train_loss", "test_loss"):
            assert got[key] == pytest.approx(want[key], rel=1e-5), (key, got["epoch"])
    assert max_weight_difference(weights(run_dir), weights(reference)) <= 1e-5
    # ...and there was something to agree on: training moved the weights
    assert max_weight_difference(weights(run_dir), initial_weights()) > 1e-2


@pytest.mark.parametrize("method", METHODS)
def test_fp16_gradients_under_horovodrun(method, reference, tmp_path):
    """fp16 on the wire: half the bytes, and weights near the fp32 reference but not equal to it
    (equal would mean the gradients never crossed as fp16). Near: the rounding moves the end
    point by a small fraction of the distance training covered (about 0.7% here)."""
    run_dir = train("horovodrun", method, tmp_path, "--compression", "fp16")
    records, expected = read_metrics(run_dir), read_metrics(reference)
    check_accounting(method, records, fp16=True)
    final, fp32, initial = flat(weights(run_dir)), flat(weights(reference)), flat(initial_weights())
    rounding_drift = ((final - fp32).norm() / (fp32 - initial).norm()).item()
    assert 0 < rounding_drift < 0.05, rounding_drift
    for got, want in zip(records, expected):
        for key in ("train_loss", "test_loss"):
            assert got[key] == pytest.approx(want[key], rel=1e-3), (key, got["epoch"])


def test_ddp_under_horovodrun_gloo(reference, tmp_path):
    """No MPI at all: DDP finds its peers through Horovod's Gloo rendezvous."""
    run_dir = train("horovodrun-gloo", "ddp", tmp_path)
    check_accounting("ddp", read_metrics(run_dir), fp16=False)
    assert max_weight_difference(weights(run_dir), weights(reference)) <= 1e-5


def test_mpi_methods_refuse_horovodrun_gloo(tmp_path):
    proc = run_train(train_flags("mpi-gather-scatter", tmp_path), launcher="horovodrun-gloo", np=RANKS,
                     check=False)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "hvd_cifar: error:" in line]
    assert len(errors) == 1 and "sync: 'mpi-gather-scatter' needs an MPI launcher" in errors[0], proc.stderr
    assert not (tmp_path / "run").exists()


def test_gather_scatter_root_traffic_grows_with_ranks():
    """Beyond two ranks the formulas part: the ring stays under 2x the payload per rank while
    gather-scatter's root carries N-1 copies."""
    from hvd_cifar.sync.base import SyncMethod
    from hvd_cifar.sync.mpi import MpiGatherScatterSync

    ring, star = SyncMethod(), object.__new__(MpiGatherScatterSync)  # no MPI needed for arithmetic
    for n, ring_bytes, star_bytes in ((1, 0, 0), (2, 1000, 1000), (4, 1500, 3000), (8, 1750, 7000)):
        ring.size = star.size = n
        assert (ring.wire_bytes_per_sync(1000), star.wire_bytes_per_sync(1000)) == (ring_bytes, star_bytes)


# ----------------------------------------------------------------------------- sync.make
TOY_MODULE = '''
from hvd_cifar.sync.base import SyncMethod


class ToySync(SyncMethod):
    name = "toy"

    def __init__(self, settings):
        self.created_with, self.configured_with = settings, None

    def configure(self, cfg):
        self.configured_with = cfg


def create(name, settings):
    return ToySync(settings)
'''


@pytest.fixture
def toy_method(tmp_path, monkeypatch):
    """A sync method known only by its registry entry: a module of its own (on sys.path, beside
    no other code of hvd_cifar's) and one entry in core.methods.METHODS, with a key of its own."""
    import dataclasses
    from hvd_cifar.core import methods
    from hvd_cifar.core.keys import Setting

    (tmp_path / "toy_sync_for_tests.py").write_text(TOY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = dataclasses.replace(methods.METHODS["mpi-allreduce"], module="toy_sync_for_tests",
                                settings={"toy_hops": Setting(int, 1, "hops per average")})
    monkeypatch.setitem(methods.METHODS, "toy", entry)
    return "toy"


def toy_config(compression: str = "none", **keys):
    """The defaults of every key, as the validated config would hold them, and the toy's own."""
    import dataclasses
    from types import SimpleNamespace
    from hvd_cifar.core.config import Config
    return SimpleNamespace(**{**dataclasses.asdict(Config()), "sync": "toy", "compression": compression,
                              "toy_hops": 3, **keys})


def test_make_finds_a_method_by_its_registry_entrys_module(toy_method):
    """No name of a method in make: the entry's module is imported and its create() called, with
    the common keys and the method's own (red while make chose the module by name: a ValueError
    or another method's module)."""
    from hvd_cifar import sync
    method = sync.make(toy_method, toy_config(comm_timeline=True))
    assert type(method).__name__ == "ToySync" and method.configured_with is method.created_with
    assert dict(method.created_with.own) == {"toy_hops": 3} and method.created_with.comm_timeline
    assert type(sync.make(toy_method)).__name__ == "ToySync"  # the probes' call: no config
    with pytest.raises(ValueError, match="unknown sync method 'nope'"):
        sync.make("nope")


def test_fp16_is_the_methods_own_averaging_and_builds_no_scheme(toy_method, monkeypatch):
    """compression: fp16, which the method does natively, sets its fp16 and builds no Fp16 scheme
    object to throw away (red while make built the scheme first); a scheme that replaces the
    averaging is held beside the method; none leaves the method as it is."""
    from hvd_cifar import compress, sync
    from hvd_cifar.compress.fp16 import Fp16
    from hvd_cifar.compress.localsgd import LocalSGD
    from hvd_cifar.sync.schemes import SchemeSync

    def built(*args, **kwargs):
        raise AssertionError("an Fp16 scheme was built")

    monkeypatch.setattr(Fp16, "__init__", built)
    method = sync.make(toy_method, toy_config("fp16"))
    assert type(method).__name__ == "ToySync" and method.fp16
    assert not sync.make(toy_method, toy_config()).fp16
    held = sync.make(toy_method, toy_config("local-sgd", local_sgd_steps=3, compression_warmup_steps=5))
    assert isinstance(held, SchemeSync) and isinstance(held.scheme, LocalSGD) and not held.method.fp16
    assert (held.scheme.every, held.scheme.warmup_steps) == (3, 5)
    assert compress.make(compress.settings(toy_config("none")), held.collective()) is None
