"""Gradient compression side by side on the namespace cluster (or your own hosts): each scheme at
its defaults against uncompressed training, for accuracy and time to 95 % on digits, and for the
gradient bytes each rank sends per update, analytic and on the wire, at two link rates; then
``python -m hvd_cifar.predict --compression ...`` against the measured steps.

    .venv/bin/python benchmarks/compression.py      # as root; about 30 minutes on 2 shared cores
        [--np 4] [--schemes none fp16 powersgd topk localsgd] [--model vgg11]
        [--acc-epochs 6] [--acc-rate 1gbit] [--target-acc 0.95]
        [--rates 1gbit 100mbit] [--bytes-steps 4] [--bytes-epochs 2] [--repeats 1]
        [--resolve MARGIN] [--budget MINUTES]
        [--hostfile FILE] [--extra NAME "FLAGS"] [--out logs/bench-compression-YYYYmmdd-HHMMSS]
        [--tag TAG] [--results benchmarks/results]
    .venv/bin/python benchmarks/compression.py --np 2 --acc-epochs 0 --schemes none powersgd topk \
        --rates 1gbit 100mbit --repeats 5 --resolve 0.05 --budget 25
        # the headline step table: two hosts, one rank (one core) each; as root, at most 25 min
    .venv/bin/python benchmarks/compression.py --hostfile my-hosts --np 4 --acc-epochs 0
        # the bytes and step table for your own hosts and network (launch/horovodrun.sh --gloo)

One cluster of --np hosts (``testbed.netcluster``: one rank per host, links shaped with tc),
every job ``horovodrun --gloo`` on digits, seed 0, every key not named here at its default (batch
32 per rank, the model's lr, onecycle; PowerSGD and top-k at their defaults (docs/CONFIG.md); local
SGD averages every 4 updates, which has no default). Per round (--repeats), the jobs of every
scheme, the schemes in a rotated order (interleaved, so that the machine's load drifts over
every scheme alike; the tables give ratios to ``none``, per round):

  accuracy   --acc-epochs whole epochs at --acc-rate with --target-acc: final test accuracy, the
             epoch and wall time at which it reached the target, bytes over the run (analytic and
             eth0, mean over the hosts).
  bytes      at each of --rates: --bytes-steps steps per epoch for --bytes-epochs epochs, without
             the schemes' warm-ups (compression_warmup_steps 0, topk_warmup_epochs 0): bytes per update and per epoch,
             analytic and on the wire, and the step time, over the epochs after the first.
  predict    per rate, the model (docs/SCALING.md) from the ``none`` bytes run at np, --bandwidth
             the rate, --shared-cores this machine's cores, each scheme asked for, the bytes runs
             as --measured: predicted step against measured, per scheme.

--resolve MARGIN: after the --repeats rounds, while some scheme's step over none's at some rate
(the ratio paired within the round) has a 95 % interval that is not wholly below 1/(1+MARGIN)
(faster), wholly above 1+MARGIN (slower) or wholly between them (no difference that big), one more
round of the bytes pass (every scheme, rotated, at each rate still unresolved, with its
prediction), until every ratio is resolved, MAX_ROUNDS rounds, or the next round (at the mean
length of a rate's bytes pass so far) would end after --budget minutes from the first round's
start. The accuracy pass runs --repeats rounds only. The step-ratio table says per scheme and
rate the median ratio, its interval, the rounds and the verdict (unresolved: with the rounds in
all the spread suggests), and why the rounds stopped.

``--extra NAME "FLAGS"`` adds an accuracy job (e.g. a scheme at a setting that closes a gap).
With --hostfile the jobs run on your hosts (``launch/horovodrun.sh --gloo -hostfile FILE``, run
from the first host, run folders on a shared file system), the bytes pass once at your network's
own rate (its label ``hosts``; --rates and --acc-rate are not applied).

Run folders land in OUT/runs/PASS/NAME-rK, outputs in OUT/logs/, the predictions in
OUT/predict-RATE-rK/. The figures are made from the runs' files alone and written to the results
file benchmarks/results/compression.json (hvd_cifar.measure.results: every round, medians and spreads,
each scheme's step and bytes over none's per round; a failed job is a failed round with its
reason); the tables, rendered from it, are printed and left in OUT/compression.md.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys
import time

from testbed import jobs, render_docs
from testbed.hosts import Hosts
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options
from hvd_cifar.core import schemes
from hvd_cifar.core.argtypes import margin, positive
from hvd_cifar.measure.rounds import left_words
from hvd_cifar.measure.stats import Interval, ratio_interval, resolved, rounds_needed
from hvd_cifar.launch.commands import ROOT
from testbed.netcluster import NetCluster
from hvd_cifar.analysis.summary import run_bytes, steady_mean, steady_nic_mean, time_to_target
from hvd_cifar.runfolder.reader import load_run

MAX_ROUNDS = 50  # --resolve adds rounds up to this many, whatever the budget

SCHEMES = {  # name -> trainer flags: each scheme at its defaults
    "none": [],
    "fp16": ["--compression", "fp16"],
    "powersgd": ["--compression", "powersgd"],
    "topk": ["--compression", "topk"],
    "localsgd": ["--compression", "local-sgd", "--local-sgd-steps", "4"],
}
FIGURES = {
    "test_acc": Figure("final test acc", ".4f"),
    "epochs_to_target": Figure("epochs to target", ".0f"),
    "time_to_target_s": Figure("time to target (s)", ".1f"),
    "nic_tx_bytes": Figure("eth0 tx MB/rank over the run", ".1f", 1e6),
    "training_time_s": Figure("training time (s)", ".1f"),
    "bytes_per_update": Figure("analytic MB/update/rank", ".3f", 1e6),
    "tx_bytes": Figure("eth0 tx MB/epoch (mean of hosts)", ".3f", 1e6),
    "tx_over_analytic": Figure("tx / analytic", ".3f"),
    "step_s": Figure("step (ms)", ".0f", 1e-3),
    "sync_s": Figure("sync (ms/update)", ".0f", 1e-3),
    "predicted_step_s": Figure("predicted step (ms)", ".0f", 1e-3),
    "error_pct": Figure("prediction error (%)", "+.1f"),
    "step_of_none": Figure("step x none's", ".3f"),
    "tx_of_none": Figure("tx bytes x none's", ".3f"),
    "analytic_of_none": Figure("analytic bytes x none's", ".4f"),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=4, help="ranks, one per host")
    p.add_argument("--schemes", nargs="*", default=list(SCHEMES), choices=list(SCHEMES),
                   help="schemes to train (none: only --extra, added to OUT's earlier runs)")
    p.add_argument("--model", default="vgg11")
    p.add_argument("--acc-epochs", type=int, default=6, help="whole epochs; 0 skips the accuracy pass")
    p.add_argument("--acc-rate", default="1gbit", help="link rate of the accuracy pass, tc syntax")
    p.add_argument("--target-acc", type=float, default=0.95)
    p.add_argument("--rates", nargs="*", default=["1gbit", "100mbit"], help="link rates of the bytes pass")
    p.add_argument("--bytes-steps", type=int, default=4, help="steps per epoch (a multiple of local SGD's 4)")
    p.add_argument("--bytes-epochs", type=int, default=2)
    p.add_argument("--extra", nargs=2, action="append", default=[], metavar=("NAME", "FLAGS"),
                   help="another accuracy job: its name and trainer flags in one string")
    p.add_argument("--out", default=os.path.join(ROOT, "logs", time.strftime("bench-compression-%Y%m%d-%H%M%S")))
    p.add_argument("--hostfile", default="", help="run on these hosts (launch/horovodrun.sh) instead of the "
                   "namespace cluster; the bytes pass at their own network's rate")
    p.add_argument("--resolve", type=margin, default=0.0, metavar="MARGIN",
                   help="after the rounds, add bytes rounds until every step ratio to none's has a 95 %% interval "
                        "wholly below 1/(1+MARGIN), above 1+MARGIN or between them (e.g. 0.05), or --budget ends")
    p.add_argument("--budget", type=positive, default=60, metavar="MINUTES",
                   help="with --resolve: no round starts that would end after this many minutes (default 60)")
    jobs.add_options(p, timeout=900, repeats=1)
    add_results_options(p)
    args = p.parse_args(argv)
    if args.hostfile:
        args.rates, args.acc_rate = ["hosts"], "hosts"
    if args.resolve and "none" not in args.schemes:
        p.error("--resolve: needs none among --schemes (the step ratios are to none's)")
    return args


def run_job(cluster: NetCluster, pass_name: str, name: str, flags: list[str], args) -> str:
    """One training job; its run folder."""
    own = list(Hosts.FLAGS) if args.hostfile else []
    return jobs.cluster_training(cluster, args.np, ["--dataset", "digits", "--model", args.model, *own, *flags],
                                 os.path.join(args.out, "runs", pass_name), name, label=f"{pass_name} {name}",
                                 log=os.path.join(args.out, "logs", f"{pass_name}-{name}.log"), timeout=args.timeout)


def scheme_label(config: dict) -> str:
    """A run's compression as predict's compression column names it (schemes.label)."""
    name = config.get("compression", "none")
    return schemes.label(name, schemes.of(name, config))


def accuracy_row(run_dir: str) -> dict:
    run = load_run(run_dir)
    return {"scheme": scheme_label(run.config), **run_bytes(run.metrics), **time_to_target(run),
            "test_acc": run.metrics[-1]["test_acc"], "test_acc_per_epoch": [r["test_acc"] for r in run.metrics],
            "training_time_s": sum(r["epoch_time_s"] for r in run.metrics), "path": run_dir}


def bytes_row(run_dir: str) -> dict:
    """Steady-state means (the epochs after the first) per epoch; NIC bytes mean over the hosts."""
    run = load_run(run_dir)
    return {"scheme": scheme_label(run.config), "bytes_per_update": run.metrics[-1]["comm_bytes_per_sync"],
            "analytic_bytes": steady_mean(run.metrics, "comm_bytes_per_rank"),
            "tx_bytes": steady_nic_mean(run.metrics, "tx"), "rx_bytes": steady_nic_mean(run.metrics, "rx"),
            "syncs": steady_mean(run.metrics, "syncs"),
            "step_s": steady_mean(run.metrics, "epoch_time_s") / steady_mean(run.metrics, "steps"),
            "sync_s": steady_mean(run.metrics, "sync_time_s") / steady_mean(run.metrics, "syncs"), "path": run_dir}


def check_predictions(rows: dict, rate: str, args, k: int) -> dict:
    """predict from round ``k``'s ``none`` run at ``rate`` with every other scheme asked for, the
    round's runs as --measured; scheme label -> (predicted, measured step s, error %)."""
    out = os.path.join(args.out, f"predict-{rate}-r{k}")
    asked = [s for s in ("fp16", "powersgd", "topk") if s in rows] + (["local-sgd"] if "localsgd" in rows else [])
    argv = [sys.executable, "-m", "hvd_cifar.predict", rows["none"]["path"], "--bandwidth", rate,
            *([] if args.hostfile else ["--shared-cores", str(os.cpu_count())]), "--np", str(args.np), "--out", out,
            *(["--compression", *asked] if asked else []),
            *(["--local-sgd-steps", "4"] if "localsgd" in rows else []),
            "--measured", *[row["path"] for row in rows.values()]]
    jobs.run(f"predict at {rate}", argv, log=os.path.join(args.out, "logs", f"predict-{rate}-r{k}.log"), timeout=600)
    with open(os.path.join(out, "predict.csv")) as f:
        predicted = [r for r in csv.DictReader(f) if r["measured_step_s"]]
    return {r["compression"]: {"predicted_step_s": float(r["step_s"]), "measured_step_s": float(r["measured_step_s"]),
                               "error_pct": float(r["error_pct"])} for r in predicted}


def accuracy_figures(run_dir: str) -> dict:
    row = accuracy_row(run_dir)
    return {k: row[k] for k in ("test_acc", "epochs_to_target", "time_to_target_s", "nic_tx_bytes", "training_time_s")
            if isinstance(row.get(k), (int, float)) and row[k] == row[k]}


def bytes_figures(row: dict) -> dict:
    return {"bytes_per_update": row["bytes_per_update"], "tx_bytes": row["tx_bytes"], "step_s": row["step_s"],
            "sync_s": row["sync_s"], "tx_over_analytic": row["tx_bytes"] / row["analytic_bytes"]}


def jobs_per_round(args, rates: list[str], accuracy: bool = True) -> int:
    """The jobs of one round (the progress line's total): training jobs and a prediction per rate."""
    acc = (len(args.schemes) if args.acc_epochs else 0) + len(args.extra) if accuracy else 0
    return acc + len(args.schemes) * len(rates) + (len(rates) if "none" in args.schemes else 0)


def run_round(cluster, results: Results, k: int, args, rates: list[str] | None = None,
              accuracy: bool = True) -> float:
    """Round ``k``: every scheme (rotated) at the accuracy rate (``accuracy``) and at each bytes
    rate (``rates``, default --rates), then the prediction per rate from this round's ``none`` run;
    the seconds its bytes pass took (jobs and predictions)."""
    rates = args.rates if rates is None else rates
    acc_flags = ["--epochs", str(args.acc_epochs), "--target-acc", str(args.target_acc)]
    bytes_flags = ["--epochs", str(args.bytes_epochs), "--max-steps-per-epoch", str(args.bytes_steps),
                   "--compression-warmup-steps", "0", "--topk-warmup-epochs", "0"]
    rows: dict[str, dict] = {rate: {} for rate in rates}
    bytes_s = 0.0
    for name in jobs.rotated(args.schemes, k - 1):
        if accuracy and args.acc_epochs:
            cluster.shape(args.acc_rate)
            results.measure(k, f"{name} accuracy", lambda: accuracy_figures(
                run_job(cluster, "accuracy", f"{name}-r{k}", [*acc_flags, *SCHEMES[name]], args)))
        for rate in rates:
            began = time.perf_counter()
            cluster.shape(rate)
            row = results.attempt(k, f"{name} {rate}", lambda: bytes_row(
                run_job(cluster, f"bytes-{rate}", f"{name}-r{k}", [*bytes_flags, *SCHEMES[name]], args)))
            bytes_s += time.perf_counter() - began
            if row is not None:
                rows[rate][name] = row
    for name, flags in args.extra if accuracy else []:
        cluster.shape(args.acc_rate)
        label = name.replace(" ", "-")
        results.measure(k, f"{label} accuracy", lambda: accuracy_figures(
            run_job(cluster, "accuracy", f"{label}-r{k}", [*acc_flags, *flags.split()], args)))
    began = time.perf_counter()
    for rate, by_scheme in rows.items():  # each scheme's predicted step beside its measured one
        predicted = (results.attempt(k, f"prediction {rate}", lambda: check_predictions(by_scheme, rate, args, k))
                     if "none" in by_scheme else None) or {}
        for name, row in by_scheme.items():
            guess = predicted.get(row["scheme"], {})
            results.add(k, f"{name} {rate}", {**bytes_figures(row), **{key: guess[key] for key in
                                                                        ("predicted_step_s", "error_pct") if key in guess}})
    return bytes_s + time.perf_counter() - began


def rounds_at(rounds: list[dict], rate: str, names: list[str]) -> list[int]:
    """The rounds whose bytes pass ran at ``rate`` (--resolve's rounds run only the unresolved rates)."""
    return sorted({r["round"] for r in rounds if not r.get("derived") and r["config"] in
                   [f"{name} {rate}" for name in names]})


def derive_ratios(results: Results, args) -> None:
    """Per round and rate, each scheme's step, eth0 bytes and analytic bytes over none's (in the
    rounds that ran that rate)."""
    for rate in args.rates:
        ran = rounds_at(results.data["rounds"], rate, args.schemes)
        for name in args.schemes:
            if name != "none":
                for figure, key in (("step_of_none", "step_s"), ("tx_of_none", "tx_bytes"),
                                    ("analytic_of_none", "bytes_per_update")):
                    results.derive(f"{name} / none {rate}", figure, lambda r, n=name, key=key, rate=rate:
                                   r[f"{n} {rate}"][key] / r[f"none {rate}"][key], rounds=ran)


# ----------------------------------------------------------------------------- --resolve
def step_intervals(rounds: list[dict], args) -> dict[tuple[str, str], tuple[Interval, float]]:
    """Per (scheme, rate), the step over none's paired within the round (the rounds where both
    ran): its 95 % interval (stats.ratio_interval) and the median of the per-round ratios; a
    comparison with no paired round is left out."""
    steps: dict[int, dict[str, float]] = {}
    for r in rounds:
        if r["ok"] and not r.get("derived") and r["figures"].get("step_s", 0) > 0:
            steps.setdefault(r["round"], {})[r["config"]] = r["figures"]["step_s"]
    found = {}
    for rate in args.rates:
        for name in args.schemes:
            pairs = [(mine[f"{name} {rate}"], mine[f"none {rate}"]) for _, mine in sorted(steps.items())
                     if f"{name} {rate}" in mine and f"none {rate}" in mine]
            if name != "none" and pairs:
                found[(name, rate)] = (ratio_interval([a for a, _ in pairs], [b for _, b in pairs]),
                                       statistics.median(a / b for a, b in pairs))
    return found


def step_verdict(iv: Interval, margin_: float) -> str:
    """faster (wholly below 1/(1+margin)), slower (wholly above 1+margin), no difference that big
    (wholly between), or unresolved with the rounds in all its spread suggests."""
    up, down = 1 + margin_, 1 / (1 + margin_)
    if iv.high <= down and iv.high < 1:
        return "faster"
    if iv.low >= up and iv.low > 1:
        return "slower"
    if margin_ and iv.low >= down and iv.high <= up:
        return f"no difference that big (±{margin_ * 100:g} %)"
    if not margin_:
        return "no difference these rounds can resolve"
    needed = rounds_needed(iv, margin_)
    return f"unresolved (about {needed} rounds in all at this spread)" if needed > 0 else \
        "unresolved (one round: no spread to go by)"


def label_of(name: str, rate: str) -> str:
    return f"{name} / none {rate}"


def needing(left: dict, margin_: float) -> str:
    """``powersgd / none 1gbit would need about 14 rounds, topk / none 100mbit about 9``."""
    words = []
    for (name, rate), (iv, _) in left.items():
        needed = rounds_needed(iv, margin_)
        about = f"about {needed} rounds in all" if needed > 0 else "more rounds than one round can tell"
        words.append(f"{label_of(name, rate)} {'would need ' if not words else ''}{about}")
    return ", ".join(words)


def decide(found: dict, margin_: float, k: int, elapsed_s: float, per_rate_s: float, budget_min: float) -> dict:
    """After round ``k``: whether to run another bytes round, and at which rates (those with an
    unresolved step ratio), or why the rounds stop (``stopped``: resolved, max rounds, budget,
    with its ``sentence``). ``per_rate_s``: the mean seconds of one rate's bytes pass so far."""
    left = {key: v for key, v in found.items() if not resolved(v[0], margin_)}
    if not left:
        return {"more": False, "stopped": "resolved",
                "sentence": f"every step ratio resolved against ±{margin_ * 100:g} % after {k} rounds"}
    if k >= MAX_ROUNDS:
        return {"more": False, "stopped": "max rounds", "left": left,
                "sentence": f"{MAX_ROUNDS} rounds, the most --resolve runs, ended it; {needing(left, margin_)}"}
    rates = list(dict.fromkeys(rate for _, rate in left))  # --rates' order
    next_s = per_rate_s * len(rates)
    if elapsed_s + next_s > budget_min * 60:  # the next round, at the mean rate's length, would overrun
        return {"more": False, "stopped": "budget", "left": left,
                "sentence": f"the budget of {budget_min:g} min ran out after {k} rounds; {needing(left, margin_)}"}
    needed = [rounds_needed(iv, margin_) for iv, _ in left.values()]
    fit = k + max(1, math.floor((budget_min * 60 - elapsed_s) / next_s)) if next_s > 0 else MAX_ROUNDS
    planned = min(MAX_ROUNDS, fit, max(k + 1, *needed))
    return {"more": True, "rates": rates, "left": left, "next_s": next_s, "planned": planned,
            "sentence": f"{len(left)} of {len(found)} step ratios unresolved against ±{margin_ * 100:g} % after {k} "
                        f"rounds ({needing(left, margin_)}); round {k + 1} at {' '.join(rates)} next, "
                        f"{duration(next_s)} a round: {left_words((planned - k) * next_s)} if it takes the "
                        f"{planned} rounds planned ({duration(budget_min * 60 - elapsed_s)} of the budget left)"}


def duration(seconds: float) -> str:
    return f"about {seconds / 60:.0f} min" if seconds >= 60 else f"about {seconds:.0f} s"


def resolve(results: Results, args, k: int, bytes_round, per_round: list[tuple[float, int]],
            began: float, clock=time.perf_counter) -> dict:
    """--resolve after round ``k``: ``bytes_round(k, rates)`` (one more round of the bytes pass
    at those rates; its seconds) while ``decide`` says so; ``per_round`` (seconds, rates) of each
    bytes pass so far, ``began`` the first round's start on ``clock``. The decision that ended it,
    with the rounds run."""
    while True:
        per_rate_s = sum(s for s, _ in per_round) / max(1, sum(n for _, n in per_round))
        decision = decide(step_intervals(results.data["rounds"], args), args.resolve, k, clock() - began,
                          per_rate_s, args.budget)
        print(f"compression: {decision['sentence']}", file=sys.stderr, flush=True)
        if not decision["more"]:
            return {**decision, "rounds": k}
        k += 1
        results.plan(jobs=(decision["planned"] - k + 1) * jobs_per_round(args, decision["rates"], accuracy=False),
                     rounds=decision["planned"])  # each job's line: the time left if the spread holds
        per_round.append((bytes_round(k, decision["rates"]), len(decision["rates"])))


def verdict_text(results: Results, args, record: dict | None) -> str:
    """The step ratios' table (median, 95 % interval, rounds, verdict) and why the rounds stopped."""
    found = step_intervals(results.data["rounds"], args)
    if not found:
        return ""
    rows = [f"| {label_of(name, rate)} | {median:.3f} | {f'{iv.low:.3f}–{iv.high:.3f}' if iv.n > 1 else '-'} | {iv.n} | "
            f"{step_verdict(iv, args.resolve)} |" for (name, rate), (iv, median) in found.items()]
    against = f"1 ± {args.resolve * 100:g} % (faster: wholly below 1/(1+{args.resolve:g}))" if args.resolve else "1"
    lines = [f"Step over none's, paired within the round (geometric 95 % interval of the per-round ratios), "
             f"against {against}:", "", "| comparison | step x none's (median) | 95 % interval | rounds | verdict |",
             "|---|---:|---:|---:|---|", *rows]
    if record:
        lines += ["", f"Rounds: {record['sentence']}."]
    return "\n".join(lines)


@jobs.one_line_errors("compression")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    results = Results("compression", args, FIGURES, argv)
    results.sample_noise = False  # its jobs run on a cluster's hosts, not as this process's children
    results.plan(jobs=args.repeats * jobs_per_round(args, args.rates), rounds=args.repeats)
    place = Hosts(args.hostfile) if args.hostfile else NetCluster(n_hosts=args.np, rate=args.acc_rate)
    record = None
    with place as cluster:
        began, per_round = time.perf_counter(), []
        for k in range(1, args.repeats + 1):
            per_round.append((run_round(cluster, results, k, args), len(args.rates)))
        if args.resolve and "none" in args.schemes:
            record = resolve(results, args, args.repeats, lambda k, rates: run_round(
                cluster, results, k, args, rates, accuracy=False), per_round, began)
    if "none" in args.schemes:
        derive_ratios(results, args)
    verdicts = verdict_text(results, args, record)
    if record:
        results.data["resolve"] = {"margin": args.resolve, "budget_min": args.budget, "rounds": record["rounds"],
                                   "stopped": record["stopped"], "sentence": record["sentence"],
                                   "verdicts": {label_of(*key): step_verdict(iv, args.resolve) for key, (iv, _)
                                                in step_intervals(results.data["rounds"], args).items()}}
    path = results.write()
    name, folder = os.path.basename(path), os.path.dirname(path)
    specs = ['match=accuracy', *[f'match="^[a-z0-9-]+ {rate}$"' for rate in args.rates], 'match=" / none "']
    jobs.write_results(args.out, "compression", results.data,
                       "\n\n".join([*(render_docs.render_block(f"{name} {spec}", folder) for spec in specs),
                                    *([verdicts] if verdicts else [])]))
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
