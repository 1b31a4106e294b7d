"""hvd_cifar.probe run for real with 2 ranks and tiny messages: through launch/mpirun.sh --probe
(the MPI transports, torch's Gloo, Horovod over MPI) and horovodrun --gloo (Horovod's Gloo);
probe.json's raw timings and fits (hvd_cifar.analysis.scaling's), and hvd_cifar.predict reading them."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from conftest import BIN, PYTHON, ROOT, read_csv
from hvd_cifar.analysis import fits
from hvd_cifar.launch import commands

SMALL = ["--min-bytes", "4096", "--max-bytes", "200000", "--sizes", "3", "--iters", "2"]


def probe(argv: list[str], out, **env_vars) -> dict:
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", OMP_NUM_THREADS="1", **env_vars)
    proc = subprocess.run([*argv, *SMALL, "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "written to" in proc.stdout
    return json.loads(out.read_text())


def check_transport(t: dict, sizes: list[int], reduce_s_per_byte: float) -> None:
    assert t["sizes_bytes"] == sizes and len(t["seconds"]) == len(sizes)
    assert all(len(s) == 2 and all(0 < x < 10 for x in s) for s in t["seconds"])
    fit = fits.fit_transport(t["kind"], t["ranks"], sizes, t["median_s"], reduce_s_per_byte, t["per_op_s"])
    assert (t["alpha_s"], t["beta_bytes_per_s"]) == (fit.alpha_s, fit.beta_bytes_per_s)
    assert t["alpha_s"] >= 0 and t["beta_bytes_per_s"] > 0


@pytest.mark.timeout(600)
def test_probe_under_mpi_and_under_gloo_times_every_transport_there(tmp_path):
    got = probe([str(ROOT / "launch" / "mpirun.sh"), "-np", "2", "--oversubscribe", "--probe"], tmp_path / "mpi.json")
    sizes = got["sizes_bytes"]
    assert sizes == [4096, 28620, 200000] and got["world_size"] == 2 and got["hosts"] and got["iters"] == 2
    # MPI's own link first, then each method the registry has a probe for, in its order
    assert list(got["transports"]) == ["mpi-p2p", "horovod-mpi", "mpi-allreduce", "mpi-gather-scatter", "torch-gloo"]
    assert got["transports"]["mpi-p2p"]["kind"] == "p2p" and got["transports"]["mpi-allreduce"]["scope"] == "intra-host"
    for t in got["transports"].values():
        check_transport(t, sizes, got["reduce_s_per_byte"])
    assert got["reduce_s_per_byte"] > 0 and got["cast_s_per_byte"] > 0
    # Horovod's negotiation cycle is its own term (5 ms, hvd_cifar.sync.horovod's setting), not latency
    assert got["transports"]["horovod-mpi"]["per_op_s"] == 0.005 and got["transports"]["mpi-allreduce"]["per_op_s"] == 0
    # Under MPI's controller with Gloo's operations (what hvd_cifar picks across hosts), Horovod's
    # timing is Gloo's, labelled so
    ops = probe([str(ROOT / "launch" / "mpirun.sh"), "-np", "2", "--oversubscribe", "--probe"],
                tmp_path / "mpi-gloo-ops.json", HOROVOD_CPU_OPERATIONS="gloo")
    assert "horovod-gloo" in ops["transports"] and "horovod-mpi" not in ops["transports"]
    gloo = probe(commands.argv("horovodrun-gloo", 2, [PYTHON, "-m", "hvd_cifar.probe"]), tmp_path / "gloo.json")
    assert list(gloo["transports"]) == ["horovod-gloo", "torch-gloo"] and gloo["launcher"] == "horovodrun-gloo"
    for t in gloo["transports"].values():
        check_transport(t, sizes, gloo["reduce_s_per_byte"])


def test_predict_takes_each_methods_link_from_the_probe(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    epoch = {"steps": 10, "syncs": 10, "epoch_time_s": 1.0, "images_per_s": 320.0, "world_size": 1,
             "data_time_s": 0.1, "forward_time_s": 0.2, "backward_time_s": 0.4, "sync_time_s": 0.0,
             "optimizer_time_s": 0.1, "frozen_blocks": 0, "model": "smallcnn", "sync": "mpi-allreduce"}
    (run / "metrics.jsonl").write_text("".join(json.dumps({"epoch": e, **epoch}) + "\n" for e in range(2)))
    links = {"mpi-allreduce": (1e-4, 1e8, "allreduce"), "mpi-p2p": (2e-5, 5e8, "p2p")}
    transports = {k: {"alpha_s": a, "beta_bytes_per_s": b, "kind": kind, "scope": "inter-host"} for k, (a, b, kind) in links.items()}
    (tmp_path / "probe.json").write_text(json.dumps({"world_size": 2, "transports": transports,
                                                    "reduce_s_per_byte": 1e-10, "cast_s_per_byte": 0.0}))
    proc = subprocess.run([sys.executable, "-m", "hvd_cifar.predict", str(run), "--probe", str(tmp_path / "probe.json"),
                           "--np", "4", "--sync", "mpi-allreduce", "mpi-gather-scatter", "--out", str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = {r["method"]: r for r in read_csv(tmp_path / "o" / "predict.csv")}
    payload = 94_986 * 4
    assert float(rows["mpi-allreduce"]["comm_s_per_sync"]) == pytest.approx(6e-4 + 1.5 * payload / 1e8)
    assert float(rows["mpi-gather-scatter"]["comm_s_per_sync"]) == pytest.approx(6 * 2e-5 + 6 * payload / 5e8 + 3 * payload * 1e-10)
    missing = subprocess.run([sys.executable, "-m", "hvd_cifar.predict", str(run), "--probe", str(tmp_path / "probe.json"),
                              "--np", "4", "--sync", "ddp"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no torch-gloo timings for --sync ddp" in missing.stderr
    assert not math.isnan(float(rows["mpi-allreduce"]["step_s"]))
