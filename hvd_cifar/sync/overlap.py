"""How much of a step's communication hid behind backward and how much the step waited for:
interval arithmetic over (start, end) seconds, and Horovod's timeline file read into intervals.

The sync methods record when their collectives ran (Horovod: its timeline, ``comm_timeline: true``;
DDP: a communication hook; the mpi4py methods need nothing, all of theirs is exposed) and when
the step was waiting, and report per epoch, in metrics.jsonl:

    comm_exposed_s   communication time inside the waits (the step could not go on)
    comm_hidden_s    communication time outside them (overlapped with backward)

Reading a timeline by hand (rank 0 writes it, into the run folder)::

    python -m hvd_cifar.sync.overlap logs/RUN/timeline.json
"""
from __future__ import annotations

import argparse
import json
import sys

Interval = tuple[float, float]

# Horovod's top-level activity while a tensor's collective runs (after its negotiation):
# the fusion-buffer copies and the transport's own call are nested inside it.
COLLECTIVES = ("ALLREDUCE",)


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


def hidden_and_exposed(comm: list[Interval], waits: list[Interval]) -> dict:
    """The metrics.jsonl figures from communication intervals and the step's waits."""
    exposed = inside(comm, waits)
    return {"comm_hidden_s": length(comm) - exposed, "comm_exposed_s": exposed}


def clip(intervals: list[Interval], window: Interval) -> list[Interval]:
    lo, hi = window
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


# ----------------------------------------------------------------------------- Horovod's timeline
def read_events(path: str) -> tuple[float, list[dict]]:
    """The timeline's events and its start (seconds since the Unix epoch). Horovod writes it as
    one JSON array, closed only at shutdown: a file being written is read up to its last whole
    event."""
    with open(path) as f:
        text = f.read()
    body = text[text.find("[") + 1:text.rfind("}") + 1]
    events = json.loads(f"[{body}]") if body.strip() else []
    start_us = next((e["args"]["start_time_since_epoch_in_micros"] for e in events
                     if e.get("name") == "process_name" and "start_time_since_epoch_in_micros" in e.get("args", {})), 0)
    return start_us / 1e6, events


def collective_intervals(path: str) -> list[Interval]:
    """When each tensor's collective ran (seconds since the Unix epoch): the top-level
    ALLREDUCE spans of every tensor (a ``pid`` in the file), negotiation left out (that is
    waiting for the other ranks, not moving bytes)."""
    start, events = read_events(path)
    open_spans: dict[int, list[tuple[str, float]]] = {}
    out = []
    for e in events:
        if e.get("ph") == "B":
            open_spans.setdefault(e["pid"], []).append((e.get("name", ""), e["ts"]))
        elif e.get("ph") == "E" and open_spans.get(e["pid"]):
            name, began = open_spans[e["pid"]].pop()
            if not open_spans[e["pid"]] and name in COLLECTIVES:
                out.append((start + began / 1e6, start + e["ts"] / 1e6))
    return out


def last_event_s(path: str) -> float:
    """Time of the latest event written so far (seconds since the Unix epoch)."""
    start, events = read_events(path)
    return start + max((e["ts"] for e in events if "ts" in e), default=0) / 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hvd_cifar.sync.overlap",
                                     description="Horovod's timeline (comm_timeline: true) read into allreduce spans.")
    parser.add_argument("timeline", metavar="TIMELINE_JSON", help="a run's timeline.json (RUN/timeline.json)")
    path = parser.parse_args(sys.argv[1:] if argv is None else argv).timeline
    spans = collective_intervals(path)
    print(f"{len(spans)} allreduce spans, {length(spans):.3f} s of allreduce time "
          f"({len(union(spans))} separate stretches)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
