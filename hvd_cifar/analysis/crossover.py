"""Time to an accuracy target on a link, and the link rate below which a scheme gets there sooner
than uncompressed training: each run's measured epochs to the target (its accuracy curve), and
what the scaling model (hvd_cifar.analysis.scaling.predict_step) says changes with the link.

A run that took E epochs to the target, each of S micro-batch steps, measured its epoch times
w_e, evaluations v_e and the rest of its wall time up to the target (start-up, checkpoints: o) on
the link it ran on (``base``). On a link L it would take

    T(L) = o + sum over e < E of ( w_e + v_e + S x (step_e(L) - step_e(base)) )

where step_e is the model's step in epoch e: a scheme's first ``compression_warmup_steps``
updates average the gradients whole (priced as the uncompressed scenario) and top-k sends epoch
e's share of its sparsity warm-up (core.cost.topk_fraction_at). The measured epochs carry what the
model leaves out (the first epoch's warm-up, the scheme's own overheads); the model carries only
the difference the link makes. T(base) is the run's own time to the target. The scheme reaches the
target sooner at a link where its T is below uncompressed training's; the crossover is the rate
where the two meet (bisection on the model, as scaling.break_even_bandwidth does for one step).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hvd_cifar.analysis.scaling import Compute, Network, Profile, Scenario, as_run, predict_step, time_schemes
from hvd_cifar.analysis.summary import time_to_target as measured_target, value
from hvd_cifar.analysis.tabulate import Column
from hvd_cifar.core import cost, schemes
from hvd_cifar.core.config import Config
from hvd_cifar.core.errors import PredictError
from hvd_cifar.runfolder.reader import Run

LOWEST, HIGHEST = 125.0, 1.25e12  # bytes/s searched: 1 kbit/s to 10 Tbit/s


def rate_words(bits_per_s: float | None) -> str:
    """A crossover as a user reads it: a rate, every rate or none (sooner_below's ends)."""
    if bits_per_s is None:
        return "-"
    if bits_per_s >= 8 * HIGHEST:
        return "every rate"
    if bits_per_s <= 0:
        return "no rate"
    return f"{bits_per_s / 1e6:.3g} Mbit/s"


# The crossover's column, as predict's table and the report's "Time to the target" show it.
SOONER = Column("sooner than uncompressed below", "sooner_below_bits_per_s", rate_words)


@dataclass(frozen=True)
class Curve:
    """What one accuracy run measured: the epochs it took to reach the target (None: it never
    did), its micro-batch steps per epoch, and up to the target each epoch's training seconds and
    evaluation seconds, and the rest of its wall time (start-up, checkpoints)."""
    epochs: int | None
    steps_per_epoch: float
    epoch_s: tuple[float, ...] = ()
    eval_s: tuple[float, ...] = ()
    other_s: float = 0.0


def epoch_scenario(s: Scenario, epoch: int) -> Scenario:
    """``s`` as it sends in ``epoch``: top-k at that epoch's share of its sparsity warm-up."""
    settings = dict(s.settings)
    if s.compression != "topk" or not settings.get("topk_warmup_epochs"):
        return s
    share = cost.topk_fraction_at(epoch, settings["topk_fraction"], settings["topk_warmup_epochs"])
    return replace(s, settings=tuple({**settings, "topk_fraction": share}.items()))


def epoch_scenarios(s: Scenario, epochs: int) -> list[Scenario]:
    """The scenario of each of ``epochs`` epochs (time each with scaling.time_schemes)."""
    return [epoch_scenario(s, e) for e in range(epochs)]


def steps_s(c: Compute, prof: Profile, net: Network, s: Scenario, plain: Scenario, n: int, steps: float,
            warm: float) -> float:
    """The model's seconds for one epoch's ``steps`` micro-batch steps of ``s`` on ``net``, the first
    ``warm`` of them averaged whole (``plain``)."""
    return (warm * predict_step(c, prof, net, plain, n)["step_s"]
            + (steps - warm) * predict_step(c, prof, net, s, n)["step_s"])


def time_to_target(c: Compute, prof: Profile, net: Network, base: Network, per_epoch: list[Scenario],
                   plain: Scenario, n: int, curve: Curve, warmup_steps: int = 0) -> float | None:
    """Seconds to the target at ``n`` ranks on ``net`` of a run that measured ``curve`` on
    ``base`` (the module doc's T(L)): each epoch's scenario in ``per_epoch`` (``plain``'s, the
    method's own averaging of every gradient, in the first ``warmup_steps`` updates); None if
    the run never reached the target."""
    if curve.epochs is None:
        return None
    total, done = curve.other_s, 0.0
    for e, s in enumerate(per_epoch[:curve.epochs]):
        warm = min(curve.steps_per_epoch, max(0.0, warmup_steps * s.accumulation_steps - done))
        change = (steps_s(c, prof, net, s, plain, n, curve.steps_per_epoch, warm)
                  - steps_s(c, prof, base, s, plain, n, curve.steps_per_epoch, warm))
        total += curve.epoch_s[e] + curve.eval_s[e] + change
        done += curve.steps_per_epoch
    return total


def at_bandwidth(net: Network, method: str, beta: float) -> Network:
    """``net`` with ``method``'s cross-host link at ``beta`` bytes/s (its latency kept)."""
    return replace(net, links={**net.links, method: replace(net.links[method], beta_bytes_per_s=beta)})


def sooner_below(c: Compute, prof: Profile, net: Network, plain: Scenario, plain_curve: Curve,
                 per_epoch: list[Scenario], curve: Curve, n: int, warmup_steps: int = 0) -> float | None:
    """The bandwidth (bytes/s) below which the scheme of ``per_epoch`` (time_to_target's) reaches
    the target sooner than ``plain``, both runs measured on ``net``: HIGHEST when it does at every
    rate searched, 0.0 when at none (or it never reaches the target), None when ``plain`` never
    reaches it. Only a rate *below* which it is sooner is searched for: a scheme that pays only on
    fast links (one that sends more bytes than the ring) reads as sooner at no rate."""
    if plain_curve.epochs is None:
        return None
    if curve.epochs is None:
        return 0.0

    def gain(beta: float) -> float:
        slow = at_bandwidth(net, plain.method, beta)
        return (time_to_target(c, prof, slow, net, [plain] * plain_curve.epochs, plain, n, plain_curve)
                - time_to_target(c, prof, slow, net, per_epoch, plain, n, curve, warmup_steps))
    low, high = LOWEST, HIGHEST
    if gain(low) <= 0:
        return 0.0
    if gain(high) > 0:
        return HIGHEST
    for _ in range(100):
        mid = math.sqrt(low * high)
        low, high = (mid, high) if gain(mid) > 0 else (low, mid)
        if high / low < 1.0001:
            break
    return low


def curve_of(run: Run) -> Curve:
    """An accuracy run's epochs to its target, steps per epoch, and up to the target its epochs'
    training and evaluation seconds and the rest of its wall time (from metrics.jsonl)."""
    epochs = measured_target(run)["epochs_to_target"]
    records = sorted((r for r in run.metrics if "steps" in r and "elapsed_s" in r), key=lambda r: r["epoch"])
    upto = records[:int(epochs)] if epochs else records
    if not records or (epochs and len(upto) < int(epochs)):
        raise PredictError(f"{run.path}: reached its target at epoch {epochs} but metrics.jsonl holds "
                           f"{len(records)} whole epoch record(s)")
    epoch_s = tuple(value(r, "epoch_time_s") for r in upto)
    eval_s = tuple(value(r, "eval_time_s") for r in upto)
    other = value(upto[-1], "elapsed_s") - sum(epoch_s) - sum(eval_s)
    return Curve(int(epochs) if epochs else None, sum(value(r, "steps") for r in records) / len(records),
                 epoch_s, eval_s, max(other, 0.0))


def check_alike(c: Compute, runs: list[Run]) -> None:
    """The accuracy runs are priced as ``c``'s run computes: each must train its model with its
    method, accumulation and frozen blocks (else one line naming the first that differs)."""
    want = {"model": c.model, "sync": c.sync, "accumulation_steps": c.accumulation_steps}
    for run in runs:
        for key, value_ in want.items():
            if run.config.get(key, getattr(Config, key)) != value_:
                raise PredictError(f"--accuracy-from: {run.name} has {key} {run.config.get(key)!r}, the compute run "
                                   f"{value_!r}: the time to the target is priced on the compute run's steps")
        if run.config.get("freeze", 0) != 0 or c.frozen_blocks:
            raise PredictError(f"--accuracy-from: {run.name}: runs that freeze blocks are not priced "
                               f"(freeze {run.config.get('freeze', 0)!r}, the compute run {c.frozen_blocks})")


def crossover_rows(c: Compute, prof: Profile, net: Network, runs: list[Run], n: int,
                   rates: dict[str, Network] | None = None) -> list[dict]:
    """Per accuracy run (one of them uncompressed), all measured on ``net``: its compression,
    epochs to the target, its time to it at each of ``rates`` (label -> network; the model's
    T(L)), and the bandwidth below which it gets there sooner than the uncompressed run."""
    targets = {r.config.get("target_acc") or 0.0 for r in runs}
    if len(targets) != 1 or not targets.pop():
        raise PredictError("--accuracy-from: the runs must share one target_acc (> 0): "
                           + ", ".join(f"{r.name} {r.config.get('target_acc')}" for r in runs))
    check_alike(c, runs)
    plain_runs = [r for r in runs if (r.config.get("compression") or "none") == "none"]
    if len(plain_runs) != 1:
        raise PredictError(f"--accuracy-from: needs exactly one run with compression none to compare with "
                           f"(got {len(plain_runs)})")
    plain, plain_curve = as_run(c, {**plain_runs[0].config, "compression": "none"}), curve_of(plain_runs[0])
    rows = []
    for run in runs:
        s, curve = as_run(c, run.config), curve_of(run)
        reads = schemes.SCHEMES[s.compression].reads
        given = run.config.get("compression_warmup_steps")
        warmup = (int(Config.compression_warmup_steps if given is None else given)
                  if "compression_warmup_steps" in reads else 0)
        per_epoch = time_schemes(prof, epoch_scenarios(s, curve.epochs or 0), c.threads_per_rank)
        below = (sooner_below(c, prof, net, plain, plain_curve, per_epoch, curve, n, warmup)
                 if run is not plain_runs[0] else None)
        rows.append({"compression": s.label, "run": run.name, "epochs_to_target": curve.epochs,
                     **{f"time_to_target_s@{label}": time_to_target(c, prof, link, net, per_epoch, plain, n, curve,
                                                                    warmup)
                        for label, link in (rates or {}).items()},
                     "sooner_below_bits_per_s": None if below is None else 8 * below})
    return rows
