"""One traced step (``comm_timeline: true``; the metrics line's ``step_trace``, written by
hvd_cifar/trainer/steptrace.py) read into what a user asks of it: when backward ran, when each
allreduce started and ended against it, how much of the allreduce hid behind backward, how long
the step waited for the rest.
"""
from __future__ import annotations

from hvd_cifar.core.intervals import inside, length
from hvd_cifar.runfolder.reader import Run


def last_trace(run: Run) -> tuple[int, dict] | None:
    """(epoch, step_trace) of the run's last epoch that has one, else None."""
    traced = [(r["epoch"], r["step_trace"]) for r in run.metrics if isinstance(r.get("step_trace"), dict)]
    return traced[-1] if traced else None


def phase_span(rank: dict, phase: str) -> tuple[float, float] | None:
    """Where ``phase`` ran in the rank's step (first start, last end), None if it did not."""
    spans = [(s, e) for p, s, e in rank["phases"] if p == phase]
    return (min(s for s, _ in spans), max(e for _, e in spans)) if spans else None


def rank_row(rank: dict) -> dict:
    """The step on one rank, in milliseconds from its start: backward's span, the sync wait,
    the allreduces (how many, the first's start after backward began, the last's end after
    backward ended), and the allreduce time inside backward (hidden) and outside it."""
    backward = phase_span(rank, "backward")
    allreduce = [(s, e) for what, s, e in rank["comm"] if what == "allreduce"]
    negotiation = [(s, e) for what, s, e in rank["comm"] if what == "negotiation"]
    row = {"rank": rank["rank"], "step_ms": 1e3 * rank["step_s"],
           "sync_ms": 1e3 * sum(e - s for p, s, e in rank["phases"] if p == "sync"),
           "allreduces": len(allreduce) if allreduce else None}
    if backward:
        row["backward_ms"] = f"{1e3 * backward[0]:.0f}-{1e3 * backward[1]:.0f}"
    if backward and allreduce:
        hidden = inside(allreduce, [backward])
        row.update(first_after_backward_began_ms=1e3 * (min(s for s, _ in allreduce) - backward[0]),
                   last_after_backward_ended_ms=1e3 * (max(e for _, e in allreduce) - backward[1]),
                   hidden_ms=1e3 * hidden, after_backward_ms=1e3 * (length(allreduce) - hidden),
                   negotiation_ms=1e3 * length(negotiation) if negotiation else None)
    return row


def trace_rows(trace: dict) -> list[dict]:
    return [rank_row(rank) for rank in trace["ranks"]]
