"""benchmarks/sync_methods.py's --resolve on constructed rounds (no training): a ratio whose
interval is off the target after the --repeats rounds stops them; one that holds it adds whole
rounds (every row, rotated) until it is met or not met; the budget (a fake clock) or MAX_ROUNDS
ends them with a sentence naming the rounds the spread suggests, and the results file keeps the
record."""
from __future__ import annotations

import math

import pytest

from hvd_cifar.measure.results import Results
from hvd_cifar.measure.stats import Interval, judge, ratio_interval
from test_measure import load_script

sync_methods = load_script("sync_methods")
ROUND_S = 60.0  # one round of the fake pass
PAIRS = [("horovod np=2", "ddp np=2")]


def parsed(tmp_path, *extra: str):
    return sync_methods.parse_args(["--np", "2", "--methods", "horovod", "ddp", "--out", str(tmp_path / "out"),
                                    "--results", str(tmp_path), *extra])


def run(tmp_path, ratio_of_round, repeats: int = 3, budget: float = 60, target: float = 0.97):
    """``run_rounds`` with round k's Horovod/DDP ratio ``ratio_of_round(k)`` (DDP at 100 img/s
    times the round's load); (the results, the rounds run, the labels each ran in order)."""
    args = parsed(tmp_path, "--resolve", str(target), "--budget", str(budget))
    results = Results("sync_methods", args, sync_methods.FIGURES)
    now, ran = [0.0], []

    def one_round(k: int) -> None:
        load = 1 + 0.3 * (k % 3)  # the round's neighbours slow both alike: the pairing removes it
        order = sync_methods.jobs.rotated(["horovod", "ddp"], k - 1)
        for method in order:
            rate = 100 / load * (ratio_of_round(k) if method == "horovod" else 1)
            results.add(k, f"{method} np=2", {"images_per_s": rate})
        ran.append((k, order))
        now[0] += ROUND_S

    sync_methods.run_rounds(args, results, "local", one_round, repeats, 2, PAIRS, clock=lambda: now[0])
    return results, ran


def test_a_ratio_off_the_target_after_the_repeats_stops_the_rounds(tmp_path):
    results, ran = run(tmp_path, lambda k: 1.20 + 0.01 * (k % 2))
    assert [k for k, _ in ran] == [1, 2, 3]
    record, = results.data["resolve"]
    assert record["stopped"] == "resolved" and record["rounds"] == 3 and record["target"] == 0.97
    assert record["verdicts"] == {"horovod np=2 / ddp np=2": "met"}
    assert record["sentence"] == "every ratio met or not met against 0.97 after 3 rounds"


def test_a_ratio_holding_the_target_adds_whole_rotated_rounds_until_it_is_judged(tmp_path):
    """Rounds 1-3 spread across 0.97; later ones at 1.05: more rounds until the interval clears
    the target, each running both methods in the rotated order."""
    first = {1: 0.85, 2: 1.15, 3: 1.00}
    results, ran = run(tmp_path, lambda k: first.get(k, 1.05 + 0.005 * (k % 2)))
    record, = results.data["resolve"]
    assert record["stopped"] == "resolved" and record["rounds"] > 3
    assert [k for k, _ in ran] == list(range(1, record["rounds"] + 1))
    assert ran[3][1] == sync_methods.jobs.rotated(["horovod", "ddp"], 3)  # round 4 rotated as any other
    iv = sync_methods.paired_ratios(results.data["rounds"], PAIRS)[PAIRS[0]]
    assert iv.n == record["rounds"] and iv.low >= 0.97 and record["verdicts"] == {"horovod np=2 / ddp np=2": "met"}
    # one round fewer and the interval still held the target: it stopped as soon as it could
    fewer = [r for r in results.data["rounds"] if r["round"] < record["rounds"]]
    assert judge(sync_methods.paired_ratios(fewer, PAIRS)[PAIRS[0]], ">=", 0.97) == "unresolved"


def test_the_budget_ends_rounds_that_never_resolve_and_says_how_many_would(tmp_path):
    results, ran = run(tmp_path, lambda k: 0.97 * (1.2 if k % 2 else 1 / 1.2), budget=7)
    record, = results.data["resolve"]
    assert record["stopped"] == "budget" and record["rounds"] == 7 == len(ran)  # round 8 would end at 8 min
    assert record["sentence"].startswith("the budget of 7 min ran out after 7 rounds; horovod np=2 / ddp np=2 (")
    assert "would need" in record["sentence"] and record["verdicts"] == {"horovod np=2 / ddp np=2": "unresolved"}


def test_max_rounds_ends_them_whatever_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(sync_methods, "MAX_ROUNDS", 5)
    results, ran = run(tmp_path, lambda k: 0.97 * (1.2 if k % 2 else 1 / 1.2), budget=600)
    record, = results.data["resolve"]
    assert record["stopped"] == "max rounds" and len(ran) == 5 and record["sentence"].startswith("5 rounds")


def test_without_resolve_only_the_repeats_run_and_nothing_is_recorded(tmp_path):
    args = parsed(tmp_path)
    results = Results("sync_methods", args, sync_methods.FIGURES)
    ran = []
    sync_methods.run_rounds(args, results, "local", ran.append, 2, 2, PAIRS)
    assert ran == [1, 2] and "resolve" not in results.data


@pytest.mark.parametrize("extra, words", [
    (["--resolve", "-1"], "a ratio >= 0"),
    (["--resolve", "0.97", "--budget", "0"], "minutes > 0"),
    (["--resolve", "0.97", "--methods", "horovod"], "needs a method besides horovod"),
])
def test_bad_resolve_options_are_refused(tmp_path, capsys, extra, words):
    with pytest.raises(SystemExit):
        sync_methods.parse_args(["--np", "2", "--out", str(tmp_path), *extra])
    assert words in capsys.readouterr().err


def test_rounds_to_judge_follows_the_spread():
    iv = ratio_interval([1.05, 0.95, 1.10, 1.00], [1.0] * 4)
    assert judge(iv, ">=", 0.97) == "unresolved"
    needed = sync_methods.rounds_to_judge(iv, 0.97)
    # the interval shrinks as 1/sqrt(n): at the rounds it names it no longer reaches the target
    distance, half = math.log(iv.centre / 0.97), iv.half_width
    assert needed > 4 and half * math.sqrt(4 / needed) <= distance < half * math.sqrt(4 / (needed - 1))
    assert sync_methods.rounds_to_judge(ratio_interval([1.2, 1.21], [1.0, 1.0]), 0.97) == 0
    assert sync_methods.rounds_to_judge(Interval(0.97, 0.5, 2.0, 3, log=True), 0.97) == -1
