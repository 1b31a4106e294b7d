"""benchmarks/network_validation.py run small for real: probes at np 2 and 3 on a 3-host
namespace cluster at 1 Gbit/s, and each predicted time recomputed here from the np=2 probe's
fit with hvd_cifar.predict's equations, each measured time read from the np=3 probe."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import NEEDS_NETNS, ROOT
from hvd_cifar.analysis import scaling

SCRIPT = ROOT / "benchmarks" / "network_validation.py"


@pytest.mark.timeout(600)
@NEEDS_NETNS[0]
@NEEDS_NETNS[1]
def test_np2_fits_predict_np3_times_by_the_models_equations(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rates", "1gbit", "--nps", "3", "--iters", "2", "--sizes", "3",
                           "--max-bytes", "2000000", "--report-from", "4096", "--out", str(tmp_path),
                           "--results", str(tmp_path / "results")],
                          cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "network_validation.json").read_text())["rows"]
    np2, np3 = (json.loads((tmp_path / f"probe-1gbit-np{n}.json").read_text()) for n in (2, 3))
    assert np2["world_size"] == 2 and np3["world_size"] == 3 and len(np3["hosts"]) == 3
    assert sorted({r["transport"] for r in rows}) == ["horovod-gloo", "mpi-allreduce", "mpi-gather-scatter", "torch-gloo"]
    assert len(rows) == 4 * 3
    for r in rows:
        source = "mpi-p2p" if r["transport"] == "mpi-gather-scatter" else r["transport"]
        fit = np2["transports"][source]
        link = scaling.Link(fit["alpha_s"], fit["beta_bytes_per_s"], np2["reduce_s_per_byte"], per_op_s=fit["per_op_s"])
        equation = scaling.gather_scatter_s if source == "mpi-p2p" else scaling.ring_s
        assert r["predicted_s"] == pytest.approx(equation(3, r["bytes"], link))
        measured = np3["transports"][r["transport"]]
        assert r["measured_s"] == measured["median_s"][measured["sizes_bytes"].index(r["bytes"])]
        assert r["error_pct"] == pytest.approx(100 * (r["predicted_s"] / r["measured_s"] - 1))
    assert "| 1gbit | mpi-gather-scatter | 3 | 2.00 |" in proc.stdout
    results = json.loads((tmp_path / "results" / "network_validation.json").read_text())
    assert len(results["rounds"]) == len(rows) and all(r["ok"] for r in results["rounds"])
    for r, job in zip(rows, results["rounds"]):
        assert job["config"] == f"1gbit {r['transport']} np=3 {r['bytes'] / 1e6:.2f} MB"
        assert job["figures"] == {k: r[k] for k in ("predicted_s", "measured_s", "error_pct")}
