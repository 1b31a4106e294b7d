"""sync: horovod at one rank takes the no-communication path (hvd_cifar.sync.horovod.HorovodAlone)
and computes what Horovod's communicating path computes, bit for bit.

Each run is tests/horovod_alone_driver.py in a subprocess (Horovod and MPI never start in the
pytest process), with Horovod's entry points counted.
"""
from __future__ import annotations

import json
import subprocess

import pytest
import torch

from conftest import PYTHON, ROOT, TINY

VARIANTS = {"plain": [], "accumulated": ["--accumulation-steps", "2"]}


def driven(tmp_path, mode: str, extra: list[str]) -> tuple[dict, dict, list[dict]]:
    """(the driver's counts, the final checkpoint's model, the metrics lines) of one tiny run."""
    logs = tmp_path / mode
    proc = subprocess.run([PYTHON, str(ROOT / "tests" / "horovod_alone_driver.py"), mode, "--config", TINY,
                           "--sync", "horovod", "--log-dir", str(logs), "--run-name", "run", *extra],
                          cwd=ROOT, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    model = torch.load(logs / "run" / "checkpoint_last.pt", weights_only=False)["model"]
    lines = [json.loads(line) for line in (logs / "run" / "metrics.jsonl").read_text().splitlines()]
    return report, model, lines


@pytest.mark.parametrize("variant", VARIANTS)
def test_one_rank_trains_without_communication_and_computes_the_same(tmp_path, variant):
    alone, weights, lines = driven(tmp_path, "local", VARIANTS[variant])
    assert alone["optimizers"] == ["hvd_cifar.workload.optim.SGD"], alone["optimizers"]  # not Horovod's wrapper
    talked = {name: n for name, n in alone["calls"].items() if n and name != "init"}
    assert not talked, f"collectives at one rank: {talked}"

    # The same run on Horovod's communicating path: its wrapper, its collectives; same numbers.
    talking, reference, reference_lines = driven(tmp_path, "communicate", VARIANTS[variant])
    assert talking["optimizers"][0].startswith("horovod."), talking["optimizers"]
    assert talking["calls"]["allreduce"] > 0 and talking["calls"]["allreduce_async"] > 0
    assert list(weights) == list(reference)
    differ = [name for name in weights if not torch.equal(weights[name], reference[name])]
    assert not differ, f"final weights differ from the communicating path's: {differ[:5]}"
    for line, ref in zip(lines, reference_lines, strict=True):
        assert set(line) == set(ref)
        for key in ("train_loss", "train_acc", "test_loss", "test_acc", "lr"):
            assert line[key] == ref[key], key
