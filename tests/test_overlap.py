"""Communication hidden behind backward and exposed: the interval arithmetic on hand-computed
cases, a Horovod timeline file read by hand, and real 2-rank runs writing comm_hidden_s /
comm_exposed_s per epoch (Horovod's timeline in the run folder, DDP's timed hook, mpi4py)."""
from __future__ import annotations

import json

import pytest

from conftest import read_metrics, run_train
from hvd_cifar.sync import overlap


def test_time_inside_the_waits_is_exposed_and_the_rest_hidden():
    assert overlap.union([(3, 6), (0, 4), (8, 9), (9, 9)]) == [(0, 6), (8, 9)]   # merged; empty dropped
    assert overlap.inside([(0, 10)], [(2, 3), (5, 7), (9, 12)]) == 4
    assert overlap.hidden_and_exposed([(0, 4), (3, 6)], [(5, 10)]) == {"comm_hidden_s": 5, "comm_exposed_s": 1}
    assert overlap.hidden_and_exposed([(0, 2)], []) == {"comm_hidden_s": 2, "comm_exposed_s": 0}
    assert overlap.clip([(0, 4), (5, 6), (9, 12)], (3, 10)) == [(3, 4), (5, 6), (9, 10)]


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


@pytest.mark.timeout(600)
def test_ddp_times_its_buckets_and_mpi_exposes_everything(tmp_path, tiny_args, tiny_run, sync_run):
    run_train(tiny_args + ["--sync", "ddp", "--comm-timeline", "true", "--compression", "fp16"], launcher="mpirun", np=2)
    check_epochs(tmp_path / "logs" / "run", hidden_possible=True)
    # mpi-gather-scatter under mpirun: tests/test_sync_methods.py's run of it (conftest.sync_run)
    check_epochs(sync_run("mpi-gather-scatter").run, hidden_possible=False)
    off = tiny_run("horovodrun").run  # the same tiny run, --comm-timeline left at its default
    assert "comm_hidden_s" not in read_metrics(off)[0]
    assert not (off / "timeline.json").exists()
