"""How sure a comparison is: 95 % intervals from scipy.stats, three verdicts, and sentences.

    iv = ratio_interval([r1_a, r2_a, r3_a], [r1_b, r2_b, r3_b])  # paired by round: A / B
    iv.centre, iv.low, iv.high, iv.n                              # geometric mean, its t-interval
    judge(iv, ">=", 0.95)                                         # met | not met | unresolved
    ratio_sentence("fp16", iv)       # "fp16: 1.21× faster (1.15–1.27, 95 % CI, 5 rounds)"

A ratio is the geometric mean of the per-round ratios, with the t-interval of their logarithms
(rounds paired: the same round's neighbours load both alike, so the pairing removes what they
share); a difference (accuracy, paired by seed) the mean of the per-pair differences with their
t-interval. One figure's rounds are summarised by their median with the 95 % interval of
``interval_of`` (geometric for positive figures). A spread whose standard deviation is more than UNSTABLE_CV of the mean is "unstable", as
pyperf says of its own.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

CONFIDENCE = 0.95
UNSTABLE_CV = 0.10  # standard deviation / mean above which a configuration's rounds are "unstable"
VERDICTS = ("met", "not met", "unresolved")


@dataclass(frozen=True)
class Interval:
    """A centre and its 95 % interval over ``n`` rounds (or pairs); ``log``: a ratio, whose
    interval was computed on logarithms."""
    centre: float
    low: float
    high: float
    n: int
    log: bool = False

    @property
    def half_width(self) -> float:
        """Half the interval's width, on the scale it was computed on (log for a ratio)."""
        if self.log:
            return (math.log(self.high) - math.log(self.low)) / 2
        return (self.high - self.low) / 2


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """The mean of ``values`` and its 95 % t-interval; all equal: the mean itself; one value:
    an interval as wide as the real line (one round says nothing of its spread)."""
    from scipy import stats as scipy_stats  # imported here: scipy is slow to import

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, -math.inf, math.inf
    if len(set(values)) == 1:
        return mean, mean, mean
    low, high = scipy_stats.t.interval(CONFIDENCE, len(values) - 1, loc=mean, scale=scipy_stats.sem(values))
    return mean, float(low), float(high)


def interval_of(values: list[float]) -> Interval:
    """The 95 % interval of one figure's rounds: for figures that are all positive (rates, times,
    ratios), the geometric mean and the t-interval of the logarithms (their noise multiplies,
    and the interval stays positive); otherwise the mean and its t-interval."""
    if values and all(v > 0 for v in values):
        centre, low, high = t_interval([math.log(v) for v in values])
        return Interval(math.exp(centre), math.exp(low), math.exp(high), len(values), log=True)
    centre, low, high = t_interval(values)
    return Interval(centre, low, high, len(values))


def spread(values: list[float]) -> dict:
    """One figure over its rounds: median, the mean's 95 % interval, min, max, n, and whether
    the rounds are unstable."""
    iv = interval_of(values)
    low, high = (iv.low, iv.high) if len(values) > 1 else (None, None)  # one round: no interval
    return {"median": statistics.median(values), "mean": statistics.fmean(values), "low": low, "high": high,
            "min": min(values), "max": max(values), "n": len(values), "unstable": unstable(values)}


def unstable(values: list[float]) -> bool:
    if len(values) < 2:
        return False
    mean = statistics.fmean(values)
    return mean != 0 and statistics.stdev(values) / abs(mean) > UNSTABLE_CV


def ratio_interval(a: list[float], b: list[float]) -> Interval:
    """A / B paired by position (round or seed): the geometric mean of the ratios and the
    t-interval of their logarithms, turned back into ratios."""
    if len(a) != len(b) or not a:
        raise ValueError(f"ratio_interval: {len(a)} and {len(b)} values; give one pair per round")
    if any(x <= 0 for x in (*a, *b)):
        raise ValueError("ratio_interval: every value must be > 0")
    centre, low, high = t_interval([math.log(x / y) for x, y in zip(a, b)])
    return Interval(math.exp(centre), math.exp(low), math.exp(high), len(a), log=True)


def difference_interval(a: list[float], b: list[float], scale: float = 1.0) -> Interval:
    """A − B paired by position, times ``scale`` (100: fractions shown in points)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"difference_interval: {len(a)} and {len(b)} values; give one pair per round")
    centre, low, high = t_interval([scale * (x - y) for x, y in zip(a, b)])
    return Interval(centre, low, high, len(a))


def per_round_best_ratio(rounds: list[dict[str, float]], mine: str) -> float:
    """The median over rounds of ``mine`` over the best of the others in that round: biased low
    when the others are noisy (the maximum of noisy figures is high). Kept to show the bias;
    ``best_other`` and a paired ratio are the estimator to use."""
    return statistics.median(r[mine] / max(v for k, v in r.items() if k != mine) for r in rounds)


def best_other(rounds: list[dict[str, float]], mine: str) -> str:
    """The other configuration with the highest median over all rounds (higher is better)."""
    others = {k for r in rounds for k in r if k != mine}
    if not others:
        raise ValueError(f"best_other: no configuration besides {mine!r}")
    return max(sorted(others), key=lambda k: statistics.median(r[k] for r in rounds if k in r))


def judge(iv: Interval, op: str, target: float) -> str:
    """``met`` when the whole interval is on the right side of ``target`` (on it counts),
    ``not met`` when it is wholly on the wrong side, ``unresolved`` when it holds the target."""
    if op == ">=":
        return "met" if iv.low >= target else "not met" if iv.high < target else "unresolved"
    if op == "<=":
        return "met" if iv.high <= target else "not met" if iv.low > target else "unresolved"
    raise ValueError(f"judge: unknown comparison {op!r} (>= or <=)")


def resolved(iv: Interval, margin: float) -> bool:
    """Whether a ratio's interval says which side of 1 ± ``margin`` it is on: wholly above
    1 + margin, wholly below 1 / (1 + margin), or wholly between them (no difference that big)."""
    up, down = 1 + margin, 1 / (1 + margin)
    return iv.low >= up or iv.high <= down or (iv.low >= down and iv.high <= up)


def rounds_needed(iv: Interval, margin: float) -> int:
    """How many rounds in all the observed spread suggests would resolve ``iv`` against
    1 ± ``margin`` (the interval narrows as 1/√n); 0 when it is resolved already."""
    if resolved(iv, margin):
        return 0
    centre = math.log(iv.centre)
    edges = (math.log(1 + margin), -math.log(1 + margin))
    distance = min(abs(centre - e) for e in edges)  # the nearest edge the interval must clear
    if distance == 0 or not math.isfinite(iv.half_width):
        return -1  # on an edge, or one round: no number of rounds can be estimated
    return max(iv.n + 1, math.ceil(iv.n * (iv.half_width / distance) ** 2))


def ratio_sentence(label: str, iv: Interval, higher: str = "faster", lower: str = "slower",
                   rounds: str = "rounds") -> str:
    """``label: 1.21× faster (1.15–1.27, 95 % CI, 5 rounds)``, or when the interval holds 1:
    ``label: no difference this sweep can resolve (0.97–1.04, 95 % CI, 3 rounds)``."""
    span = f"{iv.low:.2f}–{iv.high:.2f}, 95 % CI, {iv.n} {rounds}"
    if iv.low <= 1 <= iv.high:
        return f"{label}: no difference this sweep can resolve ({span})"
    if iv.centre > 1:
        return f"{label}: {iv.centre:.2f}× {higher} ({span})"
    return f"{label}: {1 / iv.centre:.2f}× {lower} ({iv.centre:.2f} of it; {span})"


def binomial_se_points(p: float, test_size: int) -> float:
    """One run's standard error of an accuracy ``p`` on ``test_size`` images, in points."""
    return 100 * math.sqrt(max(p * (1 - p), 0.0) / test_size)


def difference_sentence(label: str, iv: Interval, test_size: int = 0, accuracy: float = 0.0) -> str:
    """An accuracy difference in points paired by seed, in words: its interval, and when it
    holds 0, the smallest difference these seeds could have resolved; with ``test_size``, one
    run's binomial standard error on that test set."""
    span = f"{iv.low:+.2f} to {iv.high:+.2f} points, 95 % CI, {iv.n} seeds"
    se = f"; one run's standard error on {test_size} test images: {binomial_se_points(accuracy, test_size):.2f}" \
        if test_size else ""
    if iv.low <= 0 <= iv.high:
        return (f"{label}: no difference these seeds can resolve ({span}; they resolve about "
                f"±{iv.half_width:.2f} points{se})")
    return f"{label}: {iv.centre:+.2f} points ({span}{se})"
