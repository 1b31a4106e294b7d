"""Communication hidden behind backward and exposed: the interval arithmetic on hand-computed
cases, a Horovod timeline file read by hand (fused collectives and their negotiation), one traced
step chosen and read into its rows, and real 2-rank runs writing comm_hidden_s / comm_exposed_s
and one traced step per epoch (Horovod's timeline in the run folder, DDP's timed hook, mpi4py),
reported alone and side by side."""
from __future__ import annotations

import json

import pytest

from conftest import read_metrics, run_train
from hvd_cifar import report
from hvd_cifar.analysis import steps
from hvd_cifar.core import intervals
from hvd_cifar.sync import overlap
from hvd_cifar.trainer import steptrace


def test_time_inside_the_waits_is_exposed_and_the_rest_hidden():
    assert overlap.union([(3, 6), (0, 4), (8, 9), (9, 9)]) == [(0, 6), (8, 9)]   # merged; empty dropped
    assert overlap.inside([(0, 10)], [(2, 3), (5, 7), (9, 12)]) == 4
    assert overlap.hidden_and_exposed([(0, 4), (3, 6)], [(5, 10)]) == {"comm_hidden_s": 5, "comm_exposed_s": 1}
    assert overlap.hidden_and_exposed([(0, 2)], []) == {"comm_hidden_s": 2, "comm_exposed_s": 0}
    assert intervals.clip([(0, 4), (5, 6), (9, 12)], (3, 10)) == [(3, 4), (5, 6), (9, 10)]


def test_a_timeline_is_read_up_to_its_last_whole_event(tmp_path):
    # Two tensors; negotiation is waiting, not communication; nested activities count once;
    # the file is still being written (no closing bracket, half an event at the end).
    start_us = 1_000_000_000_000_000
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": start_us}},
              {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 100, "pid": 1}, {"ph": "E", "ts": 400, "pid": 1},
              {"ph": "B", "name": "ALLREDUCE", "ts": 500, "pid": 1},
              {"ph": "B", "name": "MPI_ALLREDUCE", "ts": 510, "pid": 1}, {"ph": "E", "ts": 900, "pid": 1},
              {"ph": "E", "ts": 1000, "pid": 1},
              {"ph": "B", "name": "ALLREDUCE", "ts": 800, "pid": 2}, {"ph": "E", "ts": 1500, "pid": 2},
              {"ph": "i", "name": "CYCLE_START", "ts": 2000, "s": "g"}]
    path = tmp_path / "timeline.json"
    path.write_text("[\n" + ",".join(json.dumps(e) for e in events) + ',{"ph": "B", "na')
    start = start_us / 1e6
    spans = overlap.collective_intervals(str(path))
    assert spans == [pytest.approx((start + 500e-6, start + 1000e-6)), pytest.approx((start + 800e-6, start + 1500e-6))]
    assert overlap.length(spans) == pytest.approx(1000e-6, abs=1e-6)  # seconds since 1970 in a double: sub-µs
    assert overlap.last_event_s(str(path)) == pytest.approx(start + 2000e-6)
    # cut after a nested object's closing brace, the event itself not closed
    path.write_text("[\n" + ",".join(json.dumps(e) for e in events) + ',{"ph": "M", "args": {"name": "x"}, "pid')
    assert overlap.collective_intervals(str(path)) == spans


def test_fused_tensors_are_one_collective_after_their_negotiation(tmp_path):
    # Tensors 1 and 2 fused (stamped 3 µs apart, overlapping), then tensor 3 alone (hvd_cifar's
    # own, not a gradient); the second negotiation of tensor 1 (a later step) belongs to its later
    # collective.
    start_us = 2_000_000_000_000_000
    spans = [(1, "NEGOTIATE_ALLREDUCE", 100, 300), (2, "NEGOTIATE_ALLREDUCE", 150, 400), (1, "ALLREDUCE", 500, 900),
             (2, "ALLREDUCE", 503, 902), (3, "NEGOTIATE_ALLREDUCE", 200, 950), (3, "ALLREDUCE", 960, 1200),
             (1, "NEGOTIATE_ALLREDUCE", 2000, 2100), (1, "ALLREDUCE", 2200, 2300)]
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": start_us}}]
    events += [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}
               for pid, name in ((1, "allreduce.conv1.weight"), (2, "allreduce.conv1.bias"), (3, "allreduce.hvd_cifar.stop_vote"))]
    for pid, name, b, e in spans:
        events += [{"ph": "B", "name": name, "ts": b, "pid": pid}, {"ph": "E", "ts": e, "pid": pid}]
    events.sort(key=lambda e: e.get("ts", -1))
    path = tmp_path / "timeline.json"
    path.write_text("[\n" + ",".join(json.dumps(e) for e in events) + "]")
    t = lambda us: pytest.approx(start_us / 1e6 + us / 1e6, abs=1e-7)
    assert overlap.fused_operations(str(path)) == [  # in the order they began
        ("negotiation", t(100), t(400)), ("negotiation", t(200), t(950)), ("allreduce", t(500), t(902)),
        ("other", t(960), t(1200)), ("negotiation", t(2000), t(2100)), ("allreduce", t(2200), t(2300))]


def test_a_cached_tensor_has_no_negotiation(tmp_path):
    # Horovod's response cache: a tensor it knows is allreduced without a negotiation record;
    # the fused collective shows only the negotiations recorded, and one it lacks none at all.
    start_us = 3_000_000_000_000_000
    spans = [(1, "ALLREDUCE", 500, 900), (2, "NEGOTIATE_ALLREDUCE", 150, 400), (2, "ALLREDUCE", 502, 901),
             (1, "ALLREDUCE", 2200, 2300)]
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": start_us}}]
    for pid, name, b, e in spans:
        events += [{"ph": "B", "name": name, "ts": b, "pid": pid}, {"ph": "E", "ts": e, "pid": pid}]
    events.sort(key=lambda e: e.get("ts", -1))
    path = tmp_path / "timeline.json"
    path.write_text("[\n" + ",".join(json.dumps(e) for e in events) + "]")
    t = lambda us: pytest.approx(start_us / 1e6 + us / 1e6, abs=1e-7)
    ops = overlap.fused_operations(str(path))
    assert ops == [("negotiation", t(150), t(400)), ("allreduce", t(500), t(901)), ("allreduce", t(2200), t(2300))]
    assert all(e > s for _, s, e in ops)


class Gathered:
    """allgather_object over two ranks: this rank's object and rank 1's, given."""

    def __init__(self, other):
        self.other = other

    def allgather_object(self, obj):
        return [obj, self.other]


def test_the_median_step_of_the_window_is_kept_for_every_rank():
    window = steptrace.StepWindow(first=0, steps=40)
    assert (window.lo, window.hi) == (16, 25)
    t, took = 0.0, {16: 0.5, 17: 0.9, 18: 0.6, 19: 0.7, 20: 0.4}  # rank 0's steps: 18 is the median
    for step in range(0, 21):
        d = took.get(step, 1.0)
        window.mark("forward", t, t + 0.1 * d)
        window.mark("backward", t + 0.1 * d, t + 0.6 * d)
        window.mark("sync", t + 0.6 * d, t + d)
        window.end_step()
        t += d
    assert sorted(window.steps) == [16, 17, 18, 19, 20]
    marks = [("forward", 5.0, 5.1), ("backward", 5.1, 5.4), ("sync", 5.4, 5.5)]
    other = ({k: marks for k in range(16, 21)}, [("allreduce", 5.2, 5.45)])
    began18 = sum(took.get(k, 1.0) for k in range(18))
    comm = [("allreduce", began18 + 0.2, began18 + 0.5), ("allreduce", 0.0, 0.1)]  # the second: not near the window
    trace = steptrace.gather(Gathered(other), window, comm)
    assert trace["step"] == 18  # rank 0's median
    # A step some rank did not run whole is never drawn: the median of the others'
    lacking = ({**{k: marks for k in (16, 17, 19, 20)}, 18: []}, [])
    assert steptrace.gather(Gathered(lacking), window, comm)["step"] == 16  # of 0.4, 0.5, 0.7, 0.9: the low median
    r0, r1 = trace["ranks"]
    assert r0["step_s"] == pytest.approx(0.6) and r0["comm"] == [["allreduce", pytest.approx(0.2), pytest.approx(0.5)]]
    assert r1["phases"][1] == ["backward", pytest.approx(0.1), pytest.approx(0.4)]
    row = steps.rank_row(r0)  # backward 60-360 ms, allreduce 200-500: 160 inside, 140 after
    assert row["backward_ms"] == "60-360" and row["allreduces"] == 1
    assert row["hidden_ms"] == pytest.approx(160) and row["after_backward_ms"] == pytest.approx(140)
    assert row["first_after_backward_began_ms"] == pytest.approx(140)
    assert row["last_after_backward_ended_ms"] == pytest.approx(140) and row["sync_ms"] == pytest.approx(240)


def test_under_accumulation_a_step_that_synced_is_traced():
    # Accumulating 4 micro-batches: steps 3, 7, ... sync; the others (shorter) are no update.
    window = steptrace.StepWindow(first=0, steps=24)
    t = 0.0
    for step in range(24):
        window.mark("forward", t, t + 0.1)
        window.mark("backward", t + 0.1, t + 0.3)
        if step % 4 == 3:
            window.mark("sync", t + 0.3, t + 0.5)
            window.mark("optimizer", t + 0.5, t + 0.55)
        window.end_step()
        t += 0.6
    trace = steptrace.gather(Gathered(({k: window.steps[k] for k in window.steps}, [])), window, [])
    assert trace["step"] % 4 == 3 and [p for p, _, _ in trace["ranks"][0]["phases"]][-2:] == ["sync", "optimizer"]


def test_every_bucket_is_counted_when_they_overlap():
    rank = {"rank": 0, "step_s": 0.5, "phases": [["backward", 0.1, 0.4], ["sync", 0.4, 0.45]],
            "comm": [["allreduce", 0.2, 0.35], ["allreduce", 0.3, 0.42], ["negotiation", 0.15, 0.2]]}
    row = steps.rank_row(rank)
    assert row["allreduces"] == 2 and row["hidden_ms"] == pytest.approx(200) and row["after_backward_ms"] == pytest.approx(20)


def check_epochs(run_dir, hidden_possible: bool) -> list[dict]:
    records = read_metrics(run_dir)
    for r in records:
        assert r["comm_hidden_s"] >= 0 and r["comm_exposed_s"] > 0
        assert r["comm_hidden_s"] + r["comm_exposed_s"] < r["epoch_time_s"]
        if not hidden_possible:
            assert r["comm_hidden_s"] == 0
    return records


@pytest.mark.timeout(600)
def test_horovod_records_its_timeline_and_splits_allreduce_time(tmp_path, tiny_args):
    # One epoch, then the run resumed for the second: Horovod would truncate the first timeline,
    # so the resumed process records into a file of its own.
    run_train(tiny_args + ["--comm-timeline", "true", "--stop-after", "1"], launcher="mpirun", np=2)
    run_dir = tmp_path / "logs" / "run"
    run_train(tiny_args + ["--resume", str(run_dir), "--stop-after", "0"], launcher="mpirun", np=2)
    records = check_epochs(run_dir, hidden_possible=True)
    assert [r["epoch"] for r in records] == [0, 1]
    assert json.loads((run_dir / "meta.json").read_text())["comm_settings"]["HOROVOD_TIMELINE"] == "DYNAMIC"
    for record, name in zip(records, ("timeline.json", "timeline-1.json")):
        spans = overlap.collective_intervals(str(run_dir / name))
        assert len(spans) >= 6  # every step's gradients, and the metrics' sums
        # The epoch's figures come from its file: their sum is at most its allreduce time.
        assert record["comm_hidden_s"] + record["comm_exposed_s"] <= overlap.length(spans) + 1e-6
        # One step of each epoch, rank by rank: both ranks' phases, rank 0's collectives (its timeline's)
        r0, r1 = check_trace(record)
        assert {"negotiation", "allreduce"} <= {what for what, *_ in r0["comm"]} and r1["comm"] == []
        assert steps.rank_row(r0)["first_after_backward_began_ms"] >= 0  # no gradient is ready before backward
    assert report.main([str(run_dir)]) == 0
    text = (run_dir / "report" / "report.md").read_text()
    assert "## One step, rank by rank" in text and (run_dir / "report" / "step_trace.png").stat().st_size > 0


def check_trace(record: dict) -> list[dict]:
    """The epoch's traced step: a step of the epoch, every rank's phases in order, its collectives."""
    trace = record["step_trace"]
    assert 0 <= trace["step"] < record["steps"] and [r["rank"] for r in trace["ranks"]] == [0, 1]
    for rank in trace["ranks"]:
        phases = [p for p, *_ in rank["phases"]]
        assert phases[:3] == ["data", "forward", "backward"] and "sync" in phases
        ends = [e for *_, e in rank["phases"]]
        assert ends == sorted(ends) and 0 < rank["step_s"] == ends[-1] < record["epoch_time_s"]
    return trace["ranks"]


@pytest.mark.timeout(600)
def test_ddp_times_its_buckets_and_mpi_exposes_everything(tmp_path, tiny_args, tiny_run, sync_run):
    run_train(tiny_args + ["--sync", "ddp", "--comm-timeline", "true", "--compression", "fp16"], launcher="mpirun", np=2)
    ddp = tmp_path / "logs" / "run"
    for record in check_epochs(ddp, hidden_possible=True):
        for rank in check_trace(record):  # every rank times its own buckets, all inside backward's call
            backward = steps.phase_span(rank, "backward")
            assert rank["comm"] and all(what == "allreduce" and backward[0] <= s <= e <= backward[1] + 1e-3
                                        for what, s, e in rank["comm"])
    # mpi-gather-scatter under mpirun: tests/test_sync_methods.py's run of it (conftest.sync_run)
    check_epochs(sync_run("mpi-gather-scatter").run, hidden_possible=False)
    off = tiny_run("horovodrun").run  # the same tiny run, --comm-timeline left at its default
    assert "comm_hidden_s" not in read_metrics(off)[0] and "step_trace" not in read_metrics(off)[0]
    assert not (off / "timeline.json").exists()
    # Side by side: the traced run's step drawn and tabled, the untraced one left out
    assert report.main([str(ddp), str(off), "--out", str(tmp_path / "compare")]) == 0
    text = (tmp_path / "compare" / "compare.md").read_text()
    section = text[text.index("## One step, rank by rank"):text.index("## Figures")]
    assert section.count("### ") == 1 and "compare_step_trace.png" in text
