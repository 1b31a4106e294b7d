"""benchmarks/allreduce_transports.py, run small for real: a 2-host namespace cluster, every
transport's job launched as the benchmark launches it (mpirun; horovodrun --gloo), each rank
checking that the allreduce really summed, and the table made from what the jobs timed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NEEDS_NETNS, md_table, shown

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "allreduce_transports.py"


@pytest.mark.parametrize("bad, message", [
    (["--hosts", "1"], "--hosts: 1 is outside 2..16"),
    (["--iters", "1"], "--iters >= 2"),
])
def test_bad_options_end_with_one_line(bad, message, tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), *bad, "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr
    assert not list(tmp_path.iterdir())  # nothing measured, nothing written


@pytest.mark.timeout(600)
@NEEDS_NETNS[0]
@NEEDS_NETNS[1]
def test_every_transport_times_a_real_allreduce(tmp_path):
    elements, iters = 200_000, 3
    result = subprocess.run([sys.executable, str(SCRIPT), "--hosts", "2", "--rate", "1gbit",
                             "--elements", str(elements), "--iters", str(iters), "--rounds", "1",
                             "--out", str(tmp_path), "--results", str(tmp_path / "results")],
                            capture_output=True, text=True, timeout=540, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((tmp_path / "allreduce_transports.json").read_text())
    rows = {row["method"]: row for row in data["rows"]}
    assert list(rows) == ["mpi-allreduce", "horovod", "horovod-gloo", "ddp"]
    payload_bits = 2 * (2 - 1) / 2 * elements * 4 * 8
    table = md_table((tmp_path / "allreduce_transports.md").read_text(), "allreduce of 200,000 float32")
    assert [r["transport"] for r in table] == list(rows)
    for cells in table:
        row = rows[cells["transport"]]
        assert len(row["samples_s"]) == iters - 1  # the warm-up iteration is left out
        assert all(0 < s < 30 for s in row["samples_s"])
        assert row["fastest_s"] == min(row["samples_s"])
        assert row["gbit_s"] == pytest.approx(payload_bits / row["fastest_s"] / 1e9)
        shown(cells["fastest (s)"], row["fastest_s"], 3)
        shown(cells["payload Gbit/s (fastest)"], row["gbit_s"], 3)
        shown(cells["median / ddp median"], row["median_s"] / rows["ddp"]["median_s"], 2)
    assert table[-1]["median / ddp median"] == "1.00"
    # The results file: every job a round with its figures, and their spread.
    results = json.loads((tmp_path / "results" / "allreduce_transports.json").read_text())
    assert [(r["round"], r["config"], r["ok"]) for r in results["rounds"]] == [(1, m, True) for m in rows]
    for job in results["rounds"]:
        assert job["samples_s"] == rows[job["config"]]["samples_s"]
        assert job["figures"]["fastest_s"] == rows[job["config"]]["fastest_s"]
        assert results["summary"][job["config"]]["gbit_s"]["n"] == 1
