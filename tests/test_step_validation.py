"""benchmarks/step_validation.py run small for real: on a 3-host namespace cluster at 1 Gbit/s,
the probe at np=2, training at np=1 (another host training alongside as load) and 2, a
prediction of np=3 for Horovod and gather/scatter, and those two trained. Each predicted step is recomputed here from the run folders and the probe
with hvd_cifar.predict's own pieces (the machine's cores shared by every rank), each measured
step read back from its run folder."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import NEEDS_NETNS, ROOT, read_metrics
from hvd_cifar import predict
from hvd_cifar.analysis import scaling
from hvd_cifar.analysis.summary import summarize
from hvd_cifar.runfolder.reader import load_run

SCRIPT = ROOT / "benchmarks" / "step_validation.py"


@pytest.mark.timeout(900)
@NEEDS_NETNS[0]
@NEEDS_NETNS[1]
def test_np3_steps_predicted_from_np1_and_np2_beside_the_trained_ones(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rates", "1gbit", "--nps", "3", "--options", "plain",
                           "--model", "smallcnn", "--batch-size", "16", "--steps", "4", "--probe-iters", "2",
                           "--probe-max-bytes", "1000000", "--out", str(tmp_path),
                           "--results", str(tmp_path / "results")],
                          cwd=ROOT, capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "step_validation.json").read_text())["rows"]
    assert [(r["method"], r["np"]) for r in rows] == [("horovod", 3), ("mpi-gather-scatter", 3)]
    runs = tmp_path / "1gbit"
    single = scaling.measure(load_run(str(runs / "np1")))
    overlap = scaling.measure(load_run(str(runs / "np2-horovod-timeline")))
    assert single.world_size == 1 and single.threads_per_rank == 1 and overlap.world_size == 2
    # the compute was measured with the machine's other core busy: the same training on host 1
    load = read_metrics(runs / "load" / "np1-load1")
    assert load and load[0]["world_size"] == 1
    assert overlap.hidden_fraction is not None            # the np=2 run recorded its timeline
    probe = predict.read_probe(str(tmp_path / "probe-1gbit-np2.json"))
    assert probe["world_size"] == 2
    prof = scaling.profile("smallcnn", 10)
    for r in rows:
        source = "horovod-gloo" if r["method"] == "horovod" else "mpi-p2p"  # Gloo's operations across hosts
        net = scaling.Network({r["method"]: predict.probe_link(probe, source, "p")}, None, shared_cores=os.cpu_count())
        expected = scaling.predict_step(scaling.with_overlap(single, overlap, os.cpu_count()), prof, net,
                                        scaling.Scenario(r["method"], "none", 1, 0), 3)
        assert r["step_s"] == pytest.approx(expected["step_s"])
        trained = summarize(load_run(str(runs / f"np3-{r['method']}-plain")))
        assert trained["world_size"] == 3
        assert r["measured_step_s"] == pytest.approx(trained["step_time_s"])
        assert r["error_pct"] == pytest.approx(100 * (r["step_s"] / r["measured_step_s"] - 1))
    # 3 ranks of one thread on this machine's cores: compute slower by 3/cores when there are fewer
    share = scaling.cpu_share(3, 1, os.cpu_count())
    assert rows[0]["compute_s"] == pytest.approx(share * (single.data_s + single.forward_s + single.backward_s
                                                          + single.other_s))
    assert "| 1gbit | mpi-gather-scatter | plain | 3 |" in proc.stdout
    results = json.loads((tmp_path / "results" / "step_validation.json").read_text())
    assert [(job["round"], job["config"], job["ok"]) for job in results["rounds"]] == [
        (1, "1gbit horovod np=2 traced", True)] + [(1, f"1gbit {r['method']} plain np=3", True) for r in rows]
    traced, *predicted = results["rounds"]
    for r, job in zip(rows, predicted):
        assert job["figures"] == {**{k: r[k] for k in ("step_s", "measured_step_s", "error_pct")},
                                  "abs_error_pct": abs(r["error_pct"])}
    # The traced run's figures: its metrics' hidden and exposed allreduce per step, its traced step's
    record = [r for r in read_metrics(runs / "np2-horovod-timeline")][1:]
    steps_run = sum(r["steps"] for r in record)
    assert traced["figures"]["hidden_ms"] == pytest.approx(1e3 * sum(r["comm_hidden_s"] for r in record) / steps_run)
    assert traced["figures"]["exposed_ms"] == pytest.approx(1e3 * sum(r["comm_exposed_s"] for r in record) / steps_run)
    assert traced["figures"]["first_after_backward_began_ms"] >= 0  # no gradient is ready before backward
