"""benchmarks/compression.py's --resolve on constructed rounds (no cluster, no training): a step
ratio resolved after the --repeats rounds stops them; an unresolved one adds bytes rounds at its
rate only, every scheme there, until it resolves; the budget (a fake clock) or MAX_ROUNDS ends
them with a sentence naming the rounds the spread suggests."""
from __future__ import annotations

import re

import pytest

from hvd_cifar.measure.results import Results
from test_measure import load_script

compression = load_script("compression")
SECONDS_PER_RATE = 60.0  # one rate's bytes pass: every scheme's job and the prediction


def parsed(tmp_path, budget: int = 60):
    return compression.parse_args(["--np", "2", "--acc-epochs", "0", "--schemes", "none", "topk",
                                   "--rates", "1gbit", "100mbit", "--repeats", "2", "--resolve", "0.05",
                                   "--budget", str(budget), "--out", str(tmp_path / "out"),
                                   "--results", str(tmp_path)])


def add_round(results: Results, k: int, topk_of_none: dict[str, float], rates: list[str]) -> None:
    """Round k's bytes jobs at ``rates``: none's step 1 s times the round's load, top-k's its
    ratio (per rate) times that."""
    load = 1 + 0.2 * (k % 3)  # a round's neighbours slow both alike: the pairing removes it
    for rate in rates:
        results.add(k, f"none {rate}", {"step_s": load})
        results.add(k, f"topk {rate}", {"step_s": load * topk_of_none[rate]})


def run_resolve(tmp_path, first: list[dict], later, budget: int = 60):
    """The two --repeats rounds ``first`` (rate -> top-k over none), then ``resolve`` with
    ``later(k)`` as round k's ratios; (its record, the (round, rates) it ran, the results)."""
    args = parsed(tmp_path, budget)
    results = Results("compression", args, compression.FIGURES)
    for k, ratios in enumerate(first, 1):
        add_round(results, k, ratios, args.rates)
    now = [SECONDS_PER_RATE * len(args.rates) * len(first)]
    ran = []

    def bytes_round(k: int, rates: list[str]) -> float:
        ran.append((k, rates))
        add_round(results, k, later(k), rates)
        now[0] += SECONDS_PER_RATE * len(rates)
        return SECONDS_PER_RATE * len(rates)

    per_round = [(SECONDS_PER_RATE * len(args.rates), len(args.rates))] * len(first)
    record = compression.resolve(results, args, len(first), bytes_round, per_round, 0.0, clock=lambda: now[0])
    return record, ran, results


def test_ratios_resolved_after_the_repeats_stop_the_rounds(tmp_path):
    record, ran, results = run_resolve(tmp_path, [{"1gbit": 0.50, "100mbit": 2.0},
                                                  {"1gbit": 0.51, "100mbit": 2.02}], lambda k: pytest.fail("ran"))
    assert ran == [] and record["stopped"] == "resolved" and record["rounds"] == 2
    assert record["sentence"] == "every step ratio resolved against ±5 % after 2 rounds"
    text = compression.verdict_text(results, parsed(tmp_path), record)
    assert re.search(r"\| topk / none 1gbit \| 0\.505 \| [0-9.]+–[0-9.]+ \| 2 \| faster \|", text), text
    assert "| topk / none 100mbit | 2.010 |" in text and "| 2 | slower |" in text


def test_an_unresolved_ratio_adds_rounds_at_its_rate_until_it_resolves(tmp_path):
    """top-k at 100mbit: 1.0 then 1.2 (unresolved), then 1.2 a round: resolved slower after 6."""
    record, ran, results = run_resolve(tmp_path, [{"1gbit": 0.50, "100mbit": 1.0},
                                                  {"1gbit": 0.51, "100mbit": 1.2}], lambda k: {"100mbit": 1.2})
    assert ran == [(k, ["100mbit"]) for k in (3, 4, 5, 6)]
    assert record["stopped"] == "resolved" and record["rounds"] == 6
    later = {r["config"] for r in results.data["rounds"] if r["round"] > 2}
    assert later == {"none 100mbit", "topk 100mbit"}  # every scheme at the unresolved rate, none at 1gbit
    found = compression.step_intervals(results.data["rounds"], parsed(tmp_path))
    assert found[("topk", "100mbit")][0].n == 6 and found[("topk", "1gbit")][0].n == 2
    assert compression.step_verdict(found[("topk", "100mbit")][0], 0.05) == "slower"


def test_the_budget_ends_the_rounds_with_the_sentence(tmp_path, capsys):
    """A ratio that wavers 0.9/1.1 never resolves against ±5 % in a few rounds; with 60 s a rate
    and 5 min, rounds 1-2 (4 min) and 3 (at 100mbit, 1 min) fit, round 4 would not."""
    record, ran, results = run_resolve(tmp_path, [{"1gbit": 0.50, "100mbit": 0.9}, {"1gbit": 0.51, "100mbit": 1.1}],
                                       lambda k: {"100mbit": 0.9 if k % 2 else 1.1}, budget=5)
    assert ran == [(3, ["100mbit"])] and record["stopped"] == "budget" and record["rounds"] == 3
    assert re.fullmatch(r"the budget of 5 min ran out after 3 rounds; topk / none 100mbit would need about "
                        r"\d+ rounds in all", record["sentence"]), record["sentence"]
    err = capsys.readouterr().err
    assert "1 of 2 step ratios unresolved against ±5 % after 2 rounds" in err and "round 3 at 100mbit next" in err
    text = compression.verdict_text(results, parsed(tmp_path), record)
    assert re.search(r"topk / none 100mbit \| [0-9.]+ \| [0-9.]+–[0-9.]+ \| 3 \| unresolved \(about \d+ rounds", text)
    assert f"Rounds: {record['sentence']}." in text


def test_max_rounds_ends_the_rounds_whatever_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(compression, "MAX_ROUNDS", 4)
    record, ran, _ = run_resolve(tmp_path, [{"1gbit": 0.50, "100mbit": 0.9}, {"1gbit": 0.51, "100mbit": 1.1}],
                                 lambda k: {"100mbit": 0.9 if k % 2 else 1.1}, budget=600)
    assert [k for k, _ in ran] == [3, 4] and record["stopped"] == "max rounds"
    assert record["sentence"].startswith("4 rounds, the most --resolve runs, ended it; topk / none 100mbit")
