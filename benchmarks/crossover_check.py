"""Does ``hvd-cifar-predict --accuracy-from`` name the link rate where a scheme starts to pay, as
benchmarks/time_to_accuracy.py measured it? Per round of that benchmark, the prediction from the
round's runs at its fastest rate alone, against the verdicts measured at every rate.

    .venv/bin/python benchmarks/crossover_check.py [--runs logs/bench-time_to_accuracy-...]
        [--measured benchmarks/results/time_to_accuracy.json] [--out logs/bench-crossover_check-...]
        [--tag TAG] [--results benchmarks/results]

Per round k: ``python -m hvd_cifar.predict RUNS/TOP/none-rK --bandwidth TOP --np N --at-rates
RATES --accuracy-from RUNS/TOP/SCHEME-rK ...`` with TOP the fastest of the measured rates: the
compute and every scheme's epochs and epoch times come from those runs, what the slower links
change from the model. Per scheme and slower rate its predicted time to the target beside the one
measured (``error_pct``); per scheme its crossover (the rate below which it reaches the target sooner, ``crossover_mbit``: 0 at
no rate, the top of the search at every rate).

The measured side, from all rounds of the results file: per scheme and rate, the time to the
target over none's paired by round (the geometric mean's 95 % t-interval): pays (wholly below 1),
does not pay (wholly above) or unresolved. On the ladder of measured rates, the measured crossover
is where the scheme stops paying: after the fastest rate it pays at, up to the slowest faster rate
it does not pay at (an unresolved rate may be either side). ``rates_off``, per round and scheme:
the most rates of the ladder that can lie between the predicted crossover and the measured one,
wherever in that span it is (0: the span is one point and the prediction on it), so that a span
left wide by unresolved rates cannot pass for agreement; ``span_rates`` the span's width.
docs/COMM_OPTIONS.md checks ``rates_off <= 1`` (within one of the rates).

Written to the results file benchmarks/results/crossover_check.json (every round; the measured
verdicts and spans under ``measured``); predict's outputs in OUT/predict-rK/.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import sys
import time

from hvd_cifar.analysis.crossover import HIGHEST
from hvd_cifar.core import units
from hvd_cifar.launch.commands import ROOT
from hvd_cifar.measure.results import RESULTS_DIR, Figure, Results, add_options as add_results_options
from hvd_cifar.measure.stats import t_interval
from testbed import jobs, render_docs

RATIO = re.compile(r"^(?P<scheme>\S+) / none (?P<rate>\S+)$")
FIGURES = {"crossover_mbit": Figure(f"predicted crossover (Mbit/s; 0: at no rate, {8 * HIGHEST / 1e6:.0e}: at "
                                    "every rate)", ".3g"),
           "rates_off": Figure("rates between predicted and measured crossover, at most", ".0f"),
           "span_rates": Figure("rates the measured crossover spans", ".0f"),
           "predicted_s": Figure("predicted time to target (s)", ".1f"),
           "measured_s": Figure("measured time to target (s)", ".1f"),
           "error_pct": Figure("prediction error (%)", "+.1f")}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default=os.path.join(ROOT, "logs", "bench-tta"),
                   help="the OUT folder of benchmarks/time_to_accuracy.py (its runs/RATE/SCHEME-rK)")
    p.add_argument("--measured", default=os.path.join(RESULTS_DIR, "time_to_accuracy.json"))
    p.add_argument("--out", default=os.path.join(ROOT, "logs", time.strftime("bench-crossover_check-%Y%m%d-%H%M%S")))
    jobs.add_options(p, timeout=600, repeats=1)
    add_results_options(p)
    return p.parse_args(argv)


def measured_verdicts(data: dict) -> dict[str, dict[str, str]]:
    """scheme -> rate -> pays, does not pay or unresolved, from every round's time_of_none."""
    ratios: dict[tuple[str, str], list[float]] = {}
    for r in data["rounds"]:
        m = RATIO.match(r["config"])
        if m and r["ok"] and r["figures"].get("time_of_none", 0) > 0:
            ratios.setdefault((m["scheme"], m["rate"]), []).append(r["figures"]["time_of_none"])
    found: dict[str, dict[str, str]] = {}
    for (scheme, rate), values in ratios.items():
        _, low, high = t_interval([math.log(v) for v in values]) if len(values) > 1 else (0.0, -math.inf, math.inf)
        found.setdefault(scheme, {})[rate] = "pays" if high < 0 else "does not pay" if low > 0 else "unresolved"
    return found


def measured_span(verdicts: dict[str, str], ladder: list[str]) -> tuple[int, int]:
    """Where on ``ladder`` (slowest first) the scheme stops paying, as the range of the number of
    ladder rates it pays at: from after the fastest rate it surely pays at to before the slowest
    faster rate it surely does not pay at (unresolved rates may go either way)."""
    paying = [i for i, rate in enumerate(ladder) if verdicts.get(rate) == "pays"]
    low = paying[-1] + 1 if paying else 0
    beyond = [i for i, rate in enumerate(ladder) if i >= low and verdicts.get(rate) == "does not pay"]
    return low, beyond[0] if beyond else len(ladder)


def position(crossover_bits: float, ladder: list[str]) -> int:
    """How many rates of ``ladder`` lie below a predicted crossover (where the scheme pays)."""
    return sum(1 for rate in ladder if units.parse_rate(rate) < crossover_bits)


def rates_off(predicted_position: int, span: tuple[int, int]) -> int:
    """The most ladder rates between a predicted crossover and the measured one, wherever in
    ``span`` that lies."""
    return max(abs(predicted_position - span[0]), abs(predicted_position - span[1]))


def predicted(runs: str, ladder: list[str], k: int, schemes: list[str], np_: int, out: str,
              timeout: float) -> dict[str, dict]:
    """scheme -> its crossover (bits/s; 0: at no rate) and predicted time to the target at each
    rate of ``ladder``, from round ``k``'s runs at the ladder's fastest rate."""
    folder = os.path.join(runs, "runs", ladder[-1])
    argv = [sys.executable, "-m", "hvd_cifar.predict", os.path.join(folder, f"none-r{k}"), "--bandwidth",
            ladder[-1], "--np", str(np_), "--out", out, "--at-rates", *ladder, "--accuracy-from",
            *[os.path.join(folder, f"{s}-r{k}") for s in ["none", *schemes]]]
    jobs.run(f"predict round {k}", argv, log=os.path.join(out, "predict.log"), timeout=timeout)
    with open(os.path.join(out, "crossover.csv")) as f:
        rows = {r["run"].rsplit("-r", 1)[0]: r for r in csv.DictReader(f)}
    return {s: {"bits": None if row["sooner_below_bits_per_s"] == "" else float(row["sooner_below_bits_per_s"]),
                **{rate: float(row[f"time_to_target_s@{rate}"]) for rate in ladder if row[f"time_to_target_s@{rate}"]}}
            for s, row in rows.items()}


def measured_time(data: dict, k: int, config: str) -> float | None:
    return next((r["figures"].get("time_to_target_s") for r in data["rounds"]
                 if r["round"] == k and r["config"] == config and r["ok"]), None)


def check_round(results: Results, data: dict, args, k: int, ladder: list[str], schemes: list[str],
                spans: dict) -> None:
    """Round ``k``: one prediction from the runs at the fastest rate; per scheme and slower rate
    its time to the target against the measured one, and per scheme its crossover against the
    measured span."""
    out = os.path.join(args.out, f"predict-r{k}")
    os.makedirs(out, exist_ok=True)
    found = results.attempt(k, "predict", lambda: predicted(args.runs, ladder, k, schemes, data["settings"]["np"],
                                                            out, args.timeout)) or {}
    for rate in ladder[:-1]:  # the fastest is the runs' own link: its time is theirs by construction
        for s in ["none", *schemes]:
            guess, real = found.get(s, {}).get(rate), measured_time(data, k, f"{s} {rate}")
            if guess and real:
                results.add(k, f"{s} {rate}", {"predicted_s": guess, "measured_s": real,
                                              "error_pct": 100 * (guess - real) / real})
    for s in schemes:
        bits = found.get(s, {}).get("bits")
        if bits is None:  # none's run of the round never reached the target: no crossover to predict
            continue
        low, high = spans[s]
        off = rates_off(position(bits, ladder), spans[s])
        results.add(k, f"{s} crossover", {"crossover_mbit": min(bits, 8 * HIGHEST) / 1e6, "rates_off": float(off),
                                          "span_rates": float(high - low)})


@jobs.one_line_errors("crossover_check")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    with open(args.measured) as f:
        data = json.load(f)
    settings = data["settings"]
    ladder = sorted(settings["rates"], key=units.parse_rate)
    schemes = [s for s in settings["schemes"] if s != "none"]
    verdicts = measured_verdicts(data)
    spans = {s: measured_span(verdicts.get(s, {}), ladder) for s in schemes}
    results = Results("crossover_check", args, FIGURES, argv)
    results.sample_noise = False
    rounds = sorted({r["round"] for r in data["rounds"] if not r.get("derived")})
    results.plan(jobs=len(rounds), rounds=len(rounds))
    for k in rounds:
        check_round(results, data, args, k, ladder, schemes, spans)
    results.data["measured"] = {"ladder": ladder, "verdicts": verdicts,
                                "spans": {s: list(span) for s, span in spans.items()}}
    path = results.write()
    name, folder = os.path.basename(path), os.path.dirname(path)
    jobs.write_results(args.out, "crossover_check", results.data, render_docs.render_block(name, folder))
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
