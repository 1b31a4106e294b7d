"""A compression scheme is one file plus one entry in hvd_cifar/core/schemes.py: a copy of the
package gets a toy scheme that way (its module, and its entry appended to ``SCHEMES``) and nothing
else is edited; then, run from the copy, the config takes its key with its rule and default, the
trainer's --help lists it, a 2-rank horovodrun job trains with it and counts its bytes as its plan
says, predict prices it on other world sizes, and the report gives its run a group of its own
beside an uncompressed run at the same world size.

Red when any of those reads a list of schemes of its own instead of the registry (e.g. the
config's ``compression`` choices, predict's ``--compression`` choices or its settings flags)."""
from __future__ import annotations

import csv
import json

import pytest

from conftest import ROOT
from hvd_cifar.core.wire import ring_allreduce_bytes
from package_copy import package_copy, registry_seen, run

TOY = '''"""toy: every gradient averaged whole, then rounded to toy_decimals decimals (a test's scheme)."""
import torch

from hvd_cifar.compress.base import Collective, Scheme
from hvd_cifar.compress.flat import average_in_place


class Toy(Scheme):
    name = "toy"

    def __init__(self, collective: Collective, decimals: int, warmup_steps: int):
        super().__init__(collective, warmup_steps)
        self.decimals = decimals

    def synchronize(self) -> None:
        params = self.begin_update()
        if params is None:
            return
        grads = [p.grad for _, p in params]
        average_in_place(self.collective, grads, "toy.grads")
        for g in grads:
            g.copy_(torch.round(g, decimals=self.decimals))

    def payload_bytes(self, named_parameters) -> int:
        return sum(4 * p.numel() for _, p in named_parameters)


def create(settings, collective: Collective) -> Toy:
    return Toy(collective, settings.toy_decimals, settings.compression_warmup_steps)
'''
ENTRY = ('    "toy": Spec("hvd_cifar.compress.toy", "toy", "rounded gradients", settings={"toy_decimals": Setting('
         'int, 3, "decimals each averaged gradient keeps", lambda v: v >= 0, "must be >= 0", bytes=True)}, '
         'reads=("compression_warmup_steps",), plan=lambda shapes, s: cost.localsgd_plan(shapes, 1), '
         'label=lambda s: f"toy d={s[\'toy_decimals\']}"),\n')
TINY = str(ROOT / "configs" / "tiny.yaml")
TINY_PARAMS = 94_986  # the small CNN's parameters (10 classes), every one trainable


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    """The package copied, with the toy scheme's file and its one registry entry added."""
    return package_copy(tmp_path_factory.mktemp("pkg"), "compress/toy.py", TOY, "core/schemes.py",
                        "SCHEMES: dict[str, Spec]", ENTRY)


def test_the_copy_is_what_runs(copy):
    seen = registry_seen(copy, "hvd_cifar.core.schemes", "SCHEMES")
    assert seen.startswith(str(copy)) and "'toy'" in seen, seen


def test_the_config_and_the_help_take_its_key(copy):
    bad = run(copy, ["hvd_cifar.train", "--config", TINY, "--compression", "toy", "--toy-decimals", "-1"])
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == "hvd_cifar: error: toy_decimals: must be >= 0, got -1", bad.stderr
    helped = run(copy, ["hvd_cifar.train", "--help"])
    assert "compression: toy:" in helped.stdout and "  --toy-decimals INT  (default 3)" in helped.stdout
    inert = run(copy, ["hvd_cifar.train", "--config", TINY, "--toy-decimals", "2", "--epochs", "1",
                       "--max-steps-per-epoch", "1", "--log-dir", str(copy / "inert")])
    assert inert.returncode == 0, inert.stderr
    assert "toy_decimals: has no effect here (a toy setting, and compression is none)" in inert.stderr


def test_it_trains_at_two_ranks_counts_its_bytes_and_is_predicted_and_reported(copy):
    logs = copy / "logs"
    for name, flags in (("toy", ["--compression", "toy", "--toy-decimals", "2"]), ("plain", [])):
        done = run(copy, ["hvd_cifar.train", "--config", TINY, "--log-dir", str(logs), "--run-name", name,
                          "--no-tensorboard", *flags], np=2, launcher="horovodrun")
        assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (logs / "toy" / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if "epoch" in r and "test_acc" in r]
    assert len(epochs) == 2 and all(r["compression"] == "toy" for r in epochs)
    # every update (the tiny config's 6 an epoch) one ring allreduce of every fp32 gradient
    assert [r["comm_bytes_per_rank"] for r in epochs] == [6 * ring_allreduce_bytes(2, 4 * TINY_PARAMS)] * 2
    predicted = run(copy, ["hvd_cifar.predict", str(logs / "toy"), "--bandwidth", "1gbit", "--np", "2", "4",
                           "--compression", "toy", "--toy-decimals", "1", "--out", str(copy / "predicted")])
    assert predicted.returncode == 0, predicted.stderr
    with open(copy / "predicted" / "predict.csv") as f:
        rows = list(csv.DictReader(f))
    wire = {(r["compression"], r["np"]): float(r["bytes_per_rank_per_step"]) for r in rows}
    for label in ("toy d=2", "toy d=1"):  # the run's own, and the one asked for: its plan's ring
        assert wire[(label, "4")] == pytest.approx(ring_allreduce_bytes(4, 4 * TINY_PARAMS)), rows
    reported = run(copy, ["hvd_cifar.report", str(logs / "toy"), str(logs / "plain"), "--out", str(copy / "report")])
    assert reported.returncode == 0, reported.stderr
    with open(copy / "report" / "compare.csv") as f:
        compared = {r["run"]: r for r in csv.DictReader(f)}
    assert (compared["toy"]["compression"], compared["plain"]["compression"]) == ("toy", "none"), compared
