"""Time as (start, end) intervals in seconds: the same time covered once, its length, the part
inside other intervals, clipped to a window. How much communication hid behind backward
(sync/overlap.py) and what a traced step spent where (analysis/steps.py) are both this arithmetic."""
from __future__ import annotations

Interval = tuple[float, float]


def union(intervals: list[Interval]) -> list[Interval]:
    """The same time covered once: sorted, overlapping or touching intervals merged."""
    merged: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def length(intervals: list[Interval]) -> float:
    return sum(e - s for s, e in union(intervals))


def inside(intervals: list[Interval], windows: list[Interval]) -> float:
    """Time covered by ``intervals`` that lies within ``windows`` (both merged first)."""
    a, b = union(intervals), union(windows)
    total, j = 0.0, 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            total += min(end, b[k][1]) - max(start, b[k][0])
            k += 1
    return total


def clip(intervals: list[Interval], window: Interval) -> list[Interval]:
    lo, hi = window
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]
