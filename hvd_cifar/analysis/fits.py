"""The fits: latency α and bandwidth β of a link (scaling.Link) from timed messages, by the
equation of each transport's collective (docs/SCALING.md, "The network, measured"). Imported by the probe
(an MPI program); numpy only, no torch, no plotting."""
from __future__ import annotations

import math

import numpy as np

from hvd_cifar.analysis.scaling import Link


def fit_line(sizes: list[float], seconds: list[float]) -> tuple[float, float]:
    """t = a + b·S: the slope by least squares over all sizes (the large messages, which
    gradients are, weigh most), the intercept from the smallest message, t_0 - b·S_0, at least 0.
    One least-squares line fits neither end: over sizes spanning orders of magnitude the large
    messages' noise sets its intercept (a 1.5 ms latency for a 21 µs link), and weighted by 1/t
    the small messages set its slope, which shaped links let pass in a burst (a 100 Mbit/s
    link fitted at 110 MB/s)."""
    x, y = np.asarray(sizes, float), np.asarray(seconds, float)
    b = float(np.polyfit(x, y, 1)[0]) if len(set(sizes)) > 1 else float(y.mean() / x.mean())
    smallest = int(np.argmin(x))
    return max(float(y[smallest] - b * x[smallest]), 0.0), b


def fit_ring(n: int, sizes: list[float], seconds: list[float], per_op_s: float = 0.0) -> Link:
    """α and β from allreduce times over ``n`` ranks: the ring equation is a line in S,
    intercept τ + 2(N-1)·α (τ = ``per_op_s``, known) and slope 2(N-1)/(N·β)."""
    a, b = fit_line(sizes, seconds)
    return Link(max(a - per_op_s, 0.0) / (2 * (n - 1)), 2 * (n - 1) / (n * b) if b > 0 else math.inf,
                per_op_s=per_op_s)


def fit_gather_scatter(n: int, sizes: list[float], seconds: list[float], reduce_s_per_byte: float) -> Link:
    """α and β from gather/scatter times over ``n`` ranks, the root's sums taken out: intercept
    2(N-1)·α, slope (N-1)·(2/β + γ)."""
    a, b = fit_line(sizes, seconds)
    per_byte = b / (n - 1) - reduce_s_per_byte
    return Link(a / (2 * (n - 1)), 2 / per_byte if per_byte > 0 else math.inf, reduce_s_per_byte)


def fit_transport(kind: str, ranks: int, sizes: list[float], seconds: list[float],
                  reduce_s_per_byte: float = 0.0, per_op_s: float = 0.0) -> Link:
    """A probe transport's link from its timings, by the equation of its ``kind``."""
    if kind == "allreduce":
        return fit_ring(ranks, sizes, seconds, per_op_s)
    if kind == "gather-scatter":
        return fit_gather_scatter(ranks, sizes, seconds, reduce_s_per_byte)
    return fit_p2p(sizes, seconds)


def fit_p2p(sizes: list[float], seconds: list[float]) -> Link:
    """α and β from one-way point-to-point times: t = α + S/β."""
    a, b = fit_line(sizes, seconds)
    return Link(a, 1 / b if b > 0 else math.inf)
