"""benchmarks/crossover_check.py's judgement, on results written here: the measured verdicts per
rate from the paired ratios, the span in which the measured crossover lies, and how far a
predicted crossover may be from it (a span left wide by unresolved rates cannot pass)."""
from __future__ import annotations

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("crossover_check", ROOT / "benchmarks" / "crossover_check.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)
LADDER = ["20mbit", "100mbit", "1gbit"]


def rounds(ratios: dict[str, list[float]]) -> dict:
    return {"rounds": [{"round": k, "config": config, "ok": True, "derived": True, "figures": {"time_of_none": v}}
                       for config, values in ratios.items() for k, v in enumerate(values, 1)]}


def test_verdicts_come_from_the_paired_ratios_interval():
    found = check.measured_verdicts(rounds({"topk / none 20mbit": [0.6, 0.62, 0.65, 0.61, 0.63],
                                            "topk / none 100mbit": [0.9, 1.1, 1.0, 0.95, 1.05],
                                            "topk / none 1gbit": [1.2, 1.25, 1.3, 1.22, 1.27],
                                            "fp16 / none 1gbit": [0.8]}))  # one round: no spread to go by
    assert found == {"topk": {"20mbit": "pays", "100mbit": "unresolved", "1gbit": "does not pay"},
                     "fp16": {"1gbit": "unresolved"}}


@pytest.mark.parametrize("verdicts, span", [
    ({"20mbit": "pays", "100mbit": "does not pay", "1gbit": "does not pay"}, (1, 1)),  # pinned between 20 and 100
    ({"20mbit": "pays", "100mbit": "unresolved", "1gbit": "does not pay"}, (1, 2)),
    ({"20mbit": "pays", "100mbit": "unresolved", "1gbit": "unresolved"}, (1, 3)),
    ({"20mbit": "pays", "100mbit": "pays", "1gbit": "pays"}, (3, 3)),                  # sooner at every rate
    ({"20mbit": "does not pay", "100mbit": "does not pay", "1gbit": "does not pay"}, (0, 0)),
])
def test_the_measured_crossover_lies_in_a_span_of_the_ladder(verdicts, span):
    assert check.measured_span(verdicts, LADDER) == span


def test_a_prediction_counts_the_rates_it_pays_at_and_a_wide_span_cannot_pass():
    assert [check.position(bits, LADDER) for bits in (0.0, 1e7, 5e7, 5e8, 8 * check.HIGHEST)] == [0, 0, 1, 2, 3]
    pinned, wide = (1, 1), (1, 3)
    assert check.rates_off(check.position(5e7, LADDER), pinned) == 0
    assert check.rates_off(check.position(5e8, LADDER), pinned) == 1
    assert check.rates_off(check.position(5e7, LADDER), wide) == 2  # the crossover may be past 1gbit
    assert check.rates_off(check.position(5e8, LADDER), wide) == 1
