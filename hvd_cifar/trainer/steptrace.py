"""One representative step of an epoch, rank by rank (``comm_timeline: true``): when each phase
(data, forward, backward, sync, optimizer) and each collective ran, so that a report can draw
where the step waited, not only the phase totals.

Every rank records the phases of a few steps in the middle of its pass (``StepWindow``, fed by
the loop's PhaseTimer) and its sync method's collectives over the epoch
(``SyncMethod.comm_spans``); ``gather`` brings them together with one allgather at the epoch's
end and keeps the step whose time on rank 0 is the median of the window. The metrics.jsonl line
holds it as ``step_trace``::

    {"step": 12, "ranks": [{"rank": 0, "step_s": 0.61,
                            "phases": [["data", 0.0, 0.001], ["forward", 0.001, 0.09], ...],
                            "comm": [["negotiation", 0.12, 0.15], ["allreduce", 0.15, 0.31], ...]},
                           ...]}

Times are seconds from that rank's own start of the step (each rank's clock), rounded to 10 µs.
A collective that began before the step (a negotiation under way) starts below 0.
"""
from __future__ import annotations

import statistics

WINDOW = 9   # steps recorded per pass, around its middle
DIGITS = 5   # seconds rounded to 10 µs


class StepWindow:
    """The phases of the steps [lo, hi) of a pass (perf_counter seconds), ``first`` the pass's first step."""

    def __init__(self, first: int, steps: int):
        middle = first + (steps - first) // 2
        self.lo = max(first, middle - WINDOW // 2)
        self.hi = min(steps, self.lo + WINDOW)
        self.step = first
        self.steps: dict[int, list[tuple[str, float, float]]] = {}

    def mark(self, phase: str, start: float, end: float) -> None:
        if self.lo <= self.step < self.hi:
            self.steps.setdefault(self.step, []).append((phase, start, end))

    def end_step(self) -> None:
        self.step += 1


def _rank_step(rank: int, marks: list, comm: list) -> dict:
    """One rank's record of one step: its phases and the collectives that overlap it, from its start."""
    t0, t1 = marks[0][1], marks[-1][2]
    rel = lambda t: round(t - t0, DIGITS)
    return {"rank": rank, "step_s": rel(t1),
            "phases": [[phase, rel(s), rel(e)] for phase, s, e in marks],
            "comm": [[label, rel(s), rel(e)] for label, s, e in comm if e > t0 and s < t1]}


def gather(sync, window: StepWindow, comm: list[tuple[str, float, float]]) -> dict | None:
    """The epoch's ``step_trace`` (every rank gets the same): one allgather of every rank's window
    and collectives; of the window's steps that every rank ran (those that synced, if any did),
    the one whose time on rank 0 is the median. None when no step of the window ran on every rank."""
    lo, hi = window.lo, window.hi
    span = [(s, e) for marks in window.steps.values() for _, s, e in marks]
    near = [c for c in comm if span and c[2] > min(s for s, _ in span) and c[1] < max(e for _, e in span)]
    every = sync.allgather_object((window.steps, near))
    common = [k for k in range(lo, hi) if all(steps.get(k) for steps, _ in every)]
    # Under gradient accumulation most steps are micro-batches with no sync: trace an update's.
    common = [k for k in common if any(p == "sync" for p, _, _ in every[0][0][k])] or common
    if not common:
        return None
    took = {k: every[0][0][k][-1][2] - every[0][0][k][0][1] for k in common}
    middle = statistics.median_low(sorted(took.values()))
    step = next(k for k in common if took[k] == middle)
    return {"step": step, "ranks": [_rank_step(r, steps[step], spans) for r, (steps, spans) in enumerate(every)]}
