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

from hvd_cifar.core.intervals import Interval, inside, length, union

# Horovod's top-level activity while a tensor's collective runs (after its negotiation):
# the fusion-buffer copies and the transport's own call are nested inside it.
COLLECTIVES = ("ALLREDUCE",)
# hvd_cifar names its own collectives "hvd_cifar.*" (sync/horovod.py); Horovod's timeline puts the
# operation before the name ("allreduce.hvd_cifar.stop_vote", "allreduce.features.0.weight").
OWN_PREFIX = "hvd_cifar."


def is_own(tensor: str) -> bool:
    """Whether a timeline's tensor is one of hvd_cifar's own collectives, not a gradient."""
    return tensor.partition(".")[2].startswith(OWN_PREFIX)


def hidden_and_exposed(comm: list[Interval], waits: list[Interval]) -> dict:
    """The metrics.jsonl figures from communication intervals and the step's waits."""
    exposed = inside(comm, waits)
    return {"comm_hidden_s": length(comm) - exposed, "comm_exposed_s": exposed}


# ----------------------------------------------------------------------------- Horovod's timeline
def read_events(path: str) -> tuple[float, list[dict]]:
    """The timeline's events and its start (seconds since the Unix epoch). Horovod writes it as
    one JSON array, closed only at shutdown: a file being written is read up to its last whole
    event."""
    with open(path) as f:
        text = f.read()
    events, at, decoder = [], text.find("[") + 1, json.JSONDecoder()
    while at > 0:  # event by event: the last may be cut anywhere, even after a nested object's "}"
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        if at >= len(text) or text[at] == "]":
            break
        try:
            event, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            break
        events.append(event)
    start_us = next((e["args"]["start_time_since_epoch_in_micros"] for e in events
                     if e.get("name") == "process_name" and "start_time_since_epoch_in_micros" in e.get("args", {})), 0)
    return start_us / 1e6, events


def tensor_names(events: list[dict]) -> dict[int, str]:
    """The tensor each ``pid`` of the file stands for (its process_name record)."""
    return {e["pid"]: e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "process_name" and "name" in e.get("args", {})}


def top_level_spans(path: str) -> list[tuple[int, str, float, float]]:
    """Every tensor's top-level activities in the order they ended: (its ``pid`` in the file,
    activity, start, end), seconds since the Unix epoch; what is nested inside one (the fusion
    buffer's copies, the transport's call) is part of it."""
    return _spans(*read_events(path))


def _spans(start: float, events: list[dict]) -> list[tuple[int, str, float, float]]:
    open_spans: dict[int, list[tuple[str, float]]] = {}
    out = []
    for e in events:
        if e.get("ph") == "B":
            open_spans.setdefault(e["pid"], []).append((e.get("name", ""), e["ts"]))
        elif e.get("ph") == "E" and open_spans.get(e["pid"]):
            name, began = open_spans[e["pid"]].pop()
            if not open_spans[e["pid"]]:
                out.append((e["pid"], name, start + began / 1e6, start + e["ts"] / 1e6))
    return out


def collective_intervals(path: str) -> list[Interval]:
    """When each tensor's collective ran (seconds since the Unix epoch): the top-level
    ALLREDUCE spans of every tensor, negotiation left out (that is waiting for the other
    ranks, not moving bytes)."""
    return [(s, e) for _, name, s, e in top_level_spans(path) if name in COLLECTIVES]


def fused_operations(path: str) -> list[tuple[str, float, float]]:
    """Each collective Horovod ran, the tensors fused into it counted once, and before it the
    negotiation of its tensors (from the first rank's request for any of them to the last one
    agreed on): (what, start, end), seconds since the Unix epoch, in the order they began; what is
    "negotiation", "allreduce" (gradients) or "other" (hvd_cifar's own small collectives: the
    stop vote, the epoch's sums). Horovod's background thread runs one collective at a time and
    stamps each tensor of it apart, microseconds from each other: spans that overlap are one."""
    start, events = read_events(path)
    names = tensor_names(events)
    negotiated: dict[int, Interval] = {}   # a tensor's latest negotiation
    tensors = []                           # (its collective's span, its negotiation or None, gradient or not)
    for pid, name, s, e in _spans(start, events):
        if name.startswith("NEGOTIATE_"):
            negotiated[pid] = (s, e)
        elif name in COLLECTIVES:
            # A tensor the response cache already knew is not negotiated: no record of it.
            tensors.append(((s, e), negotiated.pop(pid, None), not is_own(names.get(pid, ""))))
    groups: list[dict] = []
    for (s, e), negotiation, gradient in sorted(tensors, key=lambda t: t[0]):
        if not groups or s >= groups[-1]["end"]:
            groups.append({"start": s, "end": e, "negotiations": [], "gradient": False})
        g = groups[-1]
        g["end"], g["gradient"] = max(g["end"], e), g["gradient"] or gradient
        if negotiation:
            g["negotiations"].append(negotiation)
    out = []
    for g in groups:
        if g["negotiations"]:
            out.append(("negotiation", min(s for s, _ in g["negotiations"]), max(e for _, e in g["negotiations"])))
        out.append(("allreduce" if g["gradient"] else "other", g["start"], g["end"]))
    return sorted(out, key=lambda op: op[1])


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
