"""hvd_cifar.analysis.scaling and hvd_cifar.predict: the model's equations on hand-computed cases, the fits
recovering known α/β, one whole prediction worked by hand, the command on run folders written
here (tests/runfolders.py) and, once, on a real run folder."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from conftest import ROOT, md_table, read_csv
from hvd_cifar import predict
from hvd_cifar.analysis import fits
from hvd_cifar.analysis import scaling as p
from runfolders import epoch_record, write_run

LINK = p.Link(alpha_s=1e-3, beta_bytes_per_s=1000.0, reduce_s_per_byte=1e-6)


def test_ring_is_2_n_minus_1_latencies_plus_2_n_minus_1_over_n_payloads():
    assert p.ring_s(1, 1000, LINK) == 0.0
    assert p.ring_s(2, 1000, LINK) == pytest.approx(2e-3 + 1.0)        # 2 latencies, S/β
    assert p.ring_s(4, 1000, LINK) == pytest.approx(6e-3 + 1.5)        # 6 latencies, 1.5 S/β
    cycle = p.Link(1e-3, 1000.0, per_op_s=5e-3)                         # Horovod: one cycle per collective
    assert p.ring_s(4, 1000, cycle) == pytest.approx(5e-3 + 6e-3 + 1.5)


def test_gather_scatter_moves_n_minus_1_buffers_each_way_through_the_root():
    assert p.gather_scatter_s(1, 1000, LINK) == 0.0
    # 6 messages of 1 ms, 3 buffers in + 3 out of 1 s each, 3 buffers of 1000 bytes summed at 1 µs/byte
    assert p.gather_scatter_s(4, 1000, LINK) == pytest.approx(6e-3 + 6.0 + 3e-3)


def test_hierarchical_is_a_local_ring_plus_a_ring_across_hosts():
    local = p.Link(1e-5, 1e5)
    # 8 ranks, 4 per host: ring of 4 inside (6e-5 + 1500/1e5), ring of 2 hosts across (2e-3 + 1000/1000)
    assert p.hierarchical_s(8, 4, 1000, LINK, local) == pytest.approx(6e-5 + 0.015 + 2e-3 + 1.0)
    assert p.hierarchical_s(8, 1, 1000, LINK, local) == pytest.approx(p.ring_s(8, 1000, LINK))
    assert p.wire_bytes("hierarchical", 8, 1000, 4) == pytest.approx(1000 / 4)  # each rank's slice
    assert p.wire_bytes("star", 8, 1000) == 7000


def test_only_what_backward_can_hide_is_hidden():
    assert p.exposed_s(1.0, 0.5, backward_s=0.3) == pytest.approx(0.7)   # capped by backward
    assert p.exposed_s(1.0, 0.5, backward_s=2.0) == pytest.approx(0.5)   # the measured fraction
    assert p.exposed_s(1.0, 0.0, backward_s=2.0) == pytest.approx(1.0)   # no overlap: all exposed


def test_without_a_measured_fraction_what_hides_follows_the_order_gradients_come_ready():
    # two halves of backward; the first ready holds 90 % of the bytes: its allreduce (0.9 s of a
    # 1 s ring) starts at 0.5 s and ends at 1.4 s, the second's at 1.5 s, 0.5 s after backward
    assert p.overlap_exposed_s([(0.5, 0.9), (0.5, 0.1)], comm=1.0, backward_s=1.0) == pytest.approx(0.5)
    # the same bytes ready in the other order: the large part only starts at 1 s
    assert p.overlap_exposed_s([(0.5, 0.1), (0.5, 0.9)], comm=1.0, backward_s=1.0) == pytest.approx(0.9)
    # a short ring waits only for the last part's share
    assert p.overlap_exposed_s([(0.5, 0.9), (0.5, 0.1)], comm=0.2, backward_s=1.0) == pytest.approx(0.02)
    # backward finishes the head first, then the blocks from the last trainable one down
    prof = p.Profile(block_params=(10, 30), block_macs=(60, 20), head_params=60, head_macs=20)
    assert prof.ready_order(0) == [(0.2, 0.6), (0.2, 0.3), (0.6, 0.1)]
    assert prof.ready_order(1) == [(0.5, 60 / 90), (0.5, 30 / 90)]
    # in a prediction: Horovod with no recorded fraction hides that much; mpi4py's allreduce none
    net = p.Network({"horovod": p.Link(0.0, 4000.0), "mpi-allreduce": p.Link(0.0, 4000.0)}, None)
    c = compute(hidden_fraction=None)
    ring = p.ring_s(2, 4000, net.links["horovod"])  # 1000 params x 4 bytes
    hvd = p.predict_step(c, PROFILE, net, p.Scenario("horovod", "none", 1, 0), 2)
    assert hvd["exposed_s_per_sync"] == pytest.approx(
        p.overlap_exposed_s(PROFILE.ready_order(0), ring, c.backward_s)) and hvd["exposed_s_per_sync"] < ring
    assert p.predict_step(c, PROFILE, net, p.Scenario("mpi-allreduce", "none", 1, 0), 2)["exposed_s_per_sync"] == ring


def test_fits_recover_alpha_and_beta_from_exact_times():
    sizes = [4e3, 64e3, 1e6, 16e6]
    ring = fits.fit_ring(4, sizes, [p.ring_s(4, s, p.Link(2e-4, 1.25e8)) for s in sizes])
    assert (ring.alpha_s, ring.beta_bytes_per_s) == (pytest.approx(2e-4), pytest.approx(1.25e8))
    cycled = p.Link(2e-4, 1.25e8, per_op_s=5e-3)
    ring = fits.fit_ring(4, sizes, [p.ring_s(4, s, cycled) for s in sizes], per_op_s=5e-3)
    assert (ring.alpha_s, ring.beta_bytes_per_s, ring.per_op_s) == (pytest.approx(2e-4), pytest.approx(1.25e8), 5e-3)
    star_link = p.Link(1e-4, 2e8, 1e-10)
    star = fits.fit_gather_scatter(4, sizes, [p.gather_scatter_s(4, s, star_link) for s in sizes], 1e-10)
    assert (star.alpha_s, star.beta_bytes_per_s) == (pytest.approx(1e-4), pytest.approx(2e8))
    p2p = fits.fit_p2p(sizes, [3e-5 + s / 5e8 for s in sizes])
    assert (p2p.alpha_s, p2p.beta_bytes_per_s) == (pytest.approx(3e-5), pytest.approx(5e8))
    # The slope from all sizes, the intercept from the smallest: t = 0, 2, 4 at S = 1, 2, 3 is
    # slope 2 (β 0.5) and intercept 0 - 2·1, which is no latency: 0.
    through_0 = fits.fit_p2p([1.0, 2.0, 3.0], [0.0, 2.0, 4.0])
    assert through_0.alpha_s == 0.0 and through_0.beta_bytes_per_s == pytest.approx(0.5)
    # 10 % noise on the largest message moves β, not the latency the small messages show.
    noisy = fits.fit_p2p(sizes, [3e-5 + s / 5e8 * (1.1 if s == sizes[-1] else 1.0) for s in sizes])
    assert noisy.alpha_s == pytest.approx(3e-5, rel=0.15) and noisy.beta_bytes_per_s == pytest.approx(5e8 / 1.1, rel=0.05)


def compute(**changes) -> p.Compute:
    c = p.Compute(model="x", num_classes=10, sync="horovod", world_size=1, compression="none", accumulation_steps=1,
                  frozen_blocks=0, images_per_step=32, data_s=0.01, forward_s=0.1, backward_s=0.2, other_s=0.0,
                  optimizer_s=0.05, sync_s=0.0, hidden_fraction=0.5, step_s=0.36)
    return p.Compute(**{**c.__dict__, **changes})


PROFILE = p.Profile(block_params=(100, 900), block_macs=(300, 700), head_params=0, head_macs=0)


def test_one_step_worked_by_hand():
    net = p.Network({"horovod": p.Link(0.0, 3600.0), "mpi-gather-scatter": p.Link(0.0, 3600.0)}, None)
    s = p.Scenario("horovod", "none", accumulation_steps=2, freeze=1)
    row = p.predict_step(compute(), PROFILE, net, s, 4)
    # freeze 1: 900 params x 4 bytes; backward 0.2 x 0.7 (block 1 had 30 % of the multiply-adds)
    assert row["payload_bytes"] == 3600
    assert row["comm_s_per_sync"] == pytest.approx(1.5)                 # 2·3/4 · 3600 / 3600
    assert row["exposed_s_per_sync"] == pytest.approx(1.5 - 0.14)       # half would hide; backward is 0.14
    assert row["step_s"] == pytest.approx(0.01 + 0.1 + 0.14 + (0.05 + 1.36) / 2)
    assert row["images_per_s"] == pytest.approx(4 * 32 / row["step_s"])
    assert row["bytes_per_rank_per_step"] == pytest.approx(1.5 * 3600 / 2)
    star = p.predict_step(compute(), PROFILE, net, p.Scenario("mpi-gather-scatter", "fp16", 1, 0), 4)
    assert star["payload_bytes"] == 2000 and star["exposed_s_per_sync"] == pytest.approx(2 * 3 * 2000 / 3600)


def test_backward_slowed_by_the_transfer_it_hides_is_taken_from_the_traced_run():
    """The cores that compute also carry the transfer: the traced run at N hid 0.5 of a 0.4 s
    allreduce and its backward took 0.3 s against the np=1 run's 0.2 — 0.1 s more for 0.2 s
    hidden, 0.5 s per second; a step that hides more pays more, one that hides none nothing."""
    traced = compute(world_size=2, backward_s=0.3, hidden_fraction=0.5, comm_s=0.4)
    c = p.with_overlap(compute(hidden_fraction=None), traced)
    assert c.hidden_fraction == 0.5 and c.contention == pytest.approx(0.5)
    net = p.Network({"horovod": p.Link(0.0, 4000.0)}, None)      # 1000 params x 4 bytes: a 1 s ring at np=2
    row = p.predict_step(c, PROFILE, net, p.Scenario("horovod", "none", 1, 0), 2)
    hidden = min(0.5 * 1.0, 0.2)                                 # at most the backward it hides behind
    assert row["contended_s_per_sync"] == pytest.approx(0.5 * hidden)
    assert row["step_s"] == pytest.approx(0.01 + 0.1 + 0.2 + 0.05 + (1.0 - hidden) + 0.5 * hidden)
    # on the ranks' own cores: N ranks sharing 2 cores are slower by their share first, not by contention
    shared = p.with_overlap(compute(hidden_fraction=None, threads_per_rank=1),
                            compute(world_size=4, backward_s=0.4, hidden_fraction=0.5, comm_s=0.4, threads_per_rank=1), 2)
    assert shared.contention == 0.0
    # no allreduce timed: no contention, the fraction as recorded
    assert p.with_overlap(compute(), compute(hidden_fraction=None)).contention == 0.0


def test_ranks_sharing_one_machines_cores_compute_slower_by_their_share():
    link = p.Link(0.0, 3600.0)
    shared = p.Network({"mpi-allreduce": link}, None, shared_cores=2)
    s = p.Scenario("mpi-allreduce", "none", accumulation_steps=1, freeze=0)
    c = compute(threads_per_rank=1, hidden_fraction=None)
    comm4 = p.ring_s(4, 4000, link)  # 1000 params x 4 bytes
    # 4 ranks of 1 thread on 2 cores: every part of the compute twice as long; the link unchanged
    assert p.predict_step(c, PROFILE, shared, s, 4)["step_s"] == pytest.approx(2 * (0.01 + 0.1 + 0.2 + 0.05) + comm4)
    # up to 2 ranks each has a core: as with cores of its own
    assert p.predict_step(c, PROFILE, shared, s, 2)["step_s"] == pytest.approx(
        p.predict_step(c, PROFILE, p.Network({"mpi-allreduce": link}, None), s, 2)["step_s"])
    # compute measured at np=4 on the 2 cores is taken back to a rank's own core first: at np=3, 1.5/2 of it
    at4 = compute(threads_per_rank=1, hidden_fraction=None, world_size=4)
    comm3 = p.ring_s(3, 4000, link)
    assert p.predict_step(at4, PROFILE, shared, s, 3)["step_s"] == pytest.approx(0.75 * 0.36 + comm3)
    assert p.cpu_share(8, 2, 4) == 4 and p.cpu_share(8, 2, 0) == 1


def test_fp16_pays_below_a_bandwidth_and_gather_scatter_falls_behind_at_a_worker_count():
    net = p.Network({"mpi-allreduce": p.Link(0.0, 1e6)}, None)
    s = p.Scenario("mpi-allreduce", "none", 1, 0)
    beta = p.break_even_bandwidth(compute(), PROFILE, net, s, replace(s, compression="fp16", scheme_s=4e-6), 4)
    # saving 1.5·2000/β equals the casts' 4 µs per update (scaling.time_schemes) at β = 7.5e8 bytes/s
    assert beta == pytest.approx(7.5e8, rel=1e-6)
    n = p.gather_scatter_falls_behind(compute(), PROFILE, net, s)
    ratio = lambda k: (p.predict_step(compute(), PROFILE, p.Network({"mpi-gather-scatter": net.links["mpi-allreduce"]}, None), p.Scenario("mpi-gather-scatter", "none", 1, 0), k)["step_s"]  # noqa: E731
                       / p.predict_step(compute(), PROFILE, net, s, k)["step_s"])
    assert ratio(n) >= 2 > ratio(n - 1)


@pytest.mark.slow  # a real run (shared): the trainer's own metrics.jsonl is the point
def test_predict_on_a_real_run_folder(tmp_path, tiny_run):
    run_dir = tiny_run("single").run  # read only; the outputs go to tmp_path
    out = tmp_path / "pred"
    proc = subprocess.run([sys.executable, "-m", "hvd_cifar.predict", str(run_dir), "--bandwidth", "100mbit",
                           "--np", "1", "2", "8", "--sync", "horovod", "mpi-gather-scatter", "--compression", "fp16",
                           "--measured", str(run_dir), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = read_csv(out / "predict.csv")
    assert len(rows) == 2 * 2 * 3 and (out / "predict.png").stat().st_size > 10_000
    by = {(r["method"], r["compression"], r["np"]): r for r in rows}
    smallcnn_bytes = 94_986 * 4
    assert int(by["horovod", "none", "1"]["payload_bytes"]) == smallcnn_bytes
    assert int(by["horovod", "fp16", "1"]["payload_bytes"]) == smallcnn_bytes // 2  # the fp16 entry's 2 bytes
    # np=1 predicts the run itself back (only its near-zero sync wait is left out)
    assert abs(float(by["horovod", "none", "1"]["error_pct"])) < 5, by["horovod", "none", "1"]
    assert float(by["mpi-gather-scatter", "none", "8"]["comm_s_per_sync"]) == pytest.approx(
        14 * 50e-6 + 2 * 7 * smallcnn_bytes / 12.5e6)
    assert "| mpi-gather-scatter | 8 |" in proc.stdout


def test_no_network_is_one_line_and_status_2(tmp_path):
    run = write_run(tmp_path / "run")
    proc = subprocess.run([sys.executable, "-m", "hvd_cifar.predict", str(run), "--np", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--probe" in proc.stderr


def two_epochs(path, world_size: int, epoch_time_s: float, phases: dict, **extra) -> None:
    """A run folder of two epochs of 10 steps of 32 images per rank, with these phase times."""
    write_run(path, [epoch_record(e, world_size, steps=10, epoch_time_s=epoch_time_s,
                                  images_per_s=world_size * 32 * 10 / epoch_time_s,
                                  **{f"{phase}_time_s": v for phase, v in phases.items()}, **extra) for e in range(2)])


def test_report_says_where_the_time_went(tmp_path):
    # np=1: 100 ms steps (compute 90, data 10); np=2: 150 ms (compute 110, 20 of its 30 ms sync
    # wait moved bytes, data 10, so 10 ms idle). Ideal 640 img/s, measured 426.7: 213.3 lost.
    two_epochs(tmp_path / "np1", 1, 1.0, {"data": 0.1, "forward": 0.2, "backward": 0.5, "sync": 0.0, "optimizer": 0.2})
    two_epochs(tmp_path / "np2", 2, 1.5, {"data": 0.1, "forward": 0.2, "backward": 0.7, "sync": 0.3, "optimizer": 0.2},
               comm_exposed_s=0.2, comm_hidden_s=0.1)
    proc = subprocess.run([sys.executable, "-m", "hvd_cifar.report", str(tmp_path / "np1"), str(tmp_path / "np2"),
                           "--out", str(tmp_path / "cmp")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "cmp" / "compare.md").read_text()
    assert "Ideal 640.0 img/s (np x the np=1 run's), measured 426.7" in text
    parts = {r["part of the step"]: r for r in md_table(text, "Ideal 640.0")}
    assert [parts[k]["difference (ms/step)"] for k in ("compute", "exposed communication", "data", "idle")] == \
        ["+20.00", "+20.00", "+0.00", "+10.00"]
    assert [parts[k]["img/s it cost"] for k in ("compute", "exposed communication", "idle")] == ["+85.3", "+85.3", "+42.7"]
    # the run's own link: 30 ms of allreduce per sync moved smallcnn's 379,944 bytes (ring, np=2)
    assert f"({379_944 / 0.03 * 8 / 1e9:.3g} Gbit/s effective" in text
    assert "gather/scatter's step would take twice ring allreduce's from np=" in text
    # fp16 and each scheme the run's method (horovod) runs: where each would pay, by the model
    from hvd_cifar.core.cost import POWERSGD_RANK, TOPK_FRACTION
    for option in ("fp16 on ", f"powersgd r={POWERSGD_RANK} on ", f"topk f={TOPK_FRACTION:g} on ", "local SGD H=4 on "):
        assert option in text, option


def test_fp16_pays_its_casts_on_a_named_link_and_in_the_reports_break_even(tmp_path):
    """With --bandwidth (no probe), and on the link a run's own communication implies (the
    report's "where the time went"), fp16's casts are timed in this process on the model's
    shapes, as a scheme's compute is (compress/compute.py). Red while they were priced from a
    probe alone: 0 s here, and fp16 paid on every link up to 10 Tbit/s."""
    from hvd_cifar.analysis.explain import explain
    from hvd_cifar.runfolder.reader import load_run
    phases = {"data": 0.0, "forward": 0.1, "backward": 0.2, "sync": 0.0, "optimizer": 0.1}
    two_epochs(tmp_path / "np1", 1, 0.4, phases)
    two_epochs(tmp_path / "np2", 2, 0.6, {**phases, "sync": 0.2})
    rows, _ = predict.run(predict.parse_args([str(tmp_path / "np1"), "--bandwidth", "100mbit", "--np", "1", "2",
                                              "--compression", "fp16", "--out", str(tmp_path / "out")]))
    by = {(r["compression"], r["np"]): r for r in rows}
    assert by["fp16", 1]["scheme_s_per_sync"] == 0 < by["fp16", 2]["scheme_s_per_sync"]  # one rank alone casts nothing
    fp16, plain = by["fp16", 2], by["none", 2]  # the casts and what backward does not hide add up
    assert fp16["step_s"] == pytest.approx(plain["step_s"] - plain["exposed_s_per_sync"]
                                           + fp16["exposed_s_per_sync"] + fp16["scheme_s_per_sync"])
    assert 0 < fp16["exposed_s_per_sync"] < fp16["comm_s_per_sync"]  # part hides (no measured fraction)
    beta = explain(load_run(str(tmp_path / "np2")), load_run(str(tmp_path / "np1")))["break_even_bytes_per_s"]["fp16"]
    assert beta is not None and beta < 1.25e12  # 1.25e12: scaling.break_even_bandwidth's "on every link"


def test_overlap_from_another_run_and_shared_cores_need_the_runs_thread_count(tmp_path):
    phases = {"data": 0.0, "forward": 0.1, "backward": 0.2, "sync": 0.0, "optimizer": 0.1}
    two_epochs(tmp_path / "np1", 1, 0.4, phases)
    two_epochs(tmp_path / "np2", 2, 0.6, {**phases, "sync": 0.2}, comm_exposed_s=0.15, comm_hidden_s=0.05)
    args = predict.parse_args([str(tmp_path / "np1"), "--bandwidth", "1gbit", "--np", "2", "--overlap-from", str(tmp_path / "np2"),
                         "--out", str(tmp_path / "out")])
    _, text = predict.run(args)
    assert "hidden fraction 0.25 (from " in text
    # the run chose its threads from its host's cores: no share can be computed from it
    with pytest.raises(predict.PredictError, match="--shared-cores: .* threads_per_rank set"):
        predict.run(predict.parse_args([str(tmp_path / "np1"), "--bandwidth", "1gbit", "--np", "2", "--shared-cores", "2"]))


def test_the_model_loads_no_plotting_no_report_and_no_torch(tmp_path):
    """Dependencies point one way: the scaling model, the run readers and the tables load neither
    matplotlib nor the report (nor torch, until a byte count or a profile asks for it); the
    probe, an MPI program, loads the model without plotting."""
    check = ("import sys, hvd_cifar.{0}; bad = [m for m in ('torch', 'matplotlib', 'hvd_cifar.report', "
             "'hvd_cifar.predict') if m in sys.modules and m not in {1}]; print(bad)")
    for module, allowed in (("analysis.scaling", ()), ("analysis.summary", ()), ("analysis.run_tables", ()),
                            ("probe", ("torch",))):
        done = subprocess.run([sys.executable, "-c", check.format(module, allowed)], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.strip() == "[]", (module, done.stdout, done.stderr)


def test_a_method_the_model_cannot_price_is_refused_in_one_line(tmp_path):
    """The registry says what the model can price (core.methods.priced): a method whose entry
    names no transport (the parameter server) is refused by predict, asked for or as the run's
    own, and by explain (the report's "where the time went"), never priced as another method."""
    from hvd_cifar.core import methods
    unpriced = next(m for m, spec in methods.METHODS.items() if not spec.transports)
    asked = write_run(tmp_path / "run")
    proc = subprocess.run([sys.executable, "-m", "hvd_cifar.predict", str(asked), "--bandwidth", "1gbit", "--np", "2",
                           "--sync", unpriced], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"sync: {unpriced}: the scaling model cannot price it" in proc.stderr
    phases = {"data": 0.0, "forward": 0.1, "backward": 0.2, "sync": 0.1, "optimizer": 0.1}
    for n in (1, 2):
        two_epochs(tmp_path / f"ps{n}", n, 0.5, phases, sync=unpriced)
        (tmp_path / f"ps{n}" / "config.yaml").write_text(f"model: smallcnn\nsync: {unpriced}\nbatch_size: 32\n")
    own = subprocess.run([sys.executable, "-m", "hvd_cifar.predict", str(tmp_path / "ps1"), "--bandwidth", "1gbit",
                          "--np", "2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert own.returncode == 2 and own.stderr.count("\n") == 1 and "; pick --sync from horovod" in own.stderr, own.stderr
    reported = subprocess.run([sys.executable, "-m", "hvd_cifar.report", str(tmp_path / "ps1"), str(tmp_path / "ps2"),
                               "--out", str(tmp_path / "cmp")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert reported.returncode == 0, reported.stderr
    assert (f"ps2: not explained (sync: {unpriced}: the scaling model cannot price it"
            in (tmp_path / "cmp" / "compare.md").read_text())
    with pytest.raises(predict.PredictError, match="'nope' is not a sync method"):
        methods.priced("nope")


def test_the_hierarchical_allreduce_is_a_scenarios_option_where_the_method_has_one(tmp_path):
    """Hierarchical is no method of its own: a scenario asks for it, and a method whose registry
    entry has a hierarchical_key prices it as a ring inside each host plus one across hosts."""
    local, link = p.Link(0.0, 1e5), p.Link(0.0, 1000.0)
    net = p.Network({"horovod": link, "mpi-allreduce": link}, local, ranks_per_host=4)
    c = compute(hidden_fraction=0.0)
    flat, hier = (p.predict_step(c, PROFILE, net, p.Scenario("horovod", "none", 1, 0, hierarchical=h), 8) for h in (False, True))
    assert flat["comm_s_per_sync"] == pytest.approx(p.ring_s(8, 4000, link))
    assert hier["comm_s_per_sync"] == pytest.approx(p.hierarchical_s(8, 4, 4000, link, local))
    assert hier["comm_s_per_sync"] < flat["comm_s_per_sync"]
    assert hier["bytes_per_rank_per_step"] == pytest.approx(p.wire_bytes("hierarchical", 8, 4000, 4))
    # a method without the key: its own ring, whatever the scenario asks
    ring = p.predict_step(c, PROFILE, net, p.Scenario("mpi-allreduce", "none", 1, 0, hierarchical=True), 8)
    assert ring["comm_s_per_sync"] == pytest.approx(p.ring_s(8, 4000, link))
    run = write_run(tmp_path / "run", config={"horovod_hierarchical": True})
    rows, text = predict.run(predict.parse_args([str(run), "--bandwidth", "1gbit", "--np", "8", "--sync", "horovod",
                                                 "mpi-allreduce", "--hierarchical", "--ranks-per-host", "4",
                                                 "--out", str(tmp_path / "out")]))
    assert sorted((r["method"], r["hierarchical"]) for r in rows) == [("horovod", True), ("mpi-allreduce", False)]
    assert "| hierarchical |" in text  # shown where a row has it
    with pytest.raises(predict.PredictError, match="--hierarchical: no method of --sync has one"):
        predict.run(predict.parse_args([str(run), "--bandwidth", "1gbit", "--np", "8", "--sync", "mpi-allreduce",
                                        "--hierarchical"]))


def test_the_scenario_carries_the_runs_compression_and_local_sgd_is_one(tmp_path):
    """A run's compression (local SGD among them, its period the scheme's own setting) is the
    scenario's; --local-sgd-steps shapes --compression local-sgd's bytes, by the scheme's rule."""
    run = write_run(tmp_path / "run", config={"compression": "local-sgd", "local_sgd_steps": 8})
    rows, _ = predict.run(predict.parse_args([str(run), "--bandwidth", "1gbit", "--np", "2", "--compression", "none",
                                              "local-sgd", "--local-sgd-steps", "2", "--out", str(tmp_path / "out")]))
    wire = {r["compression"]: r["bytes_per_rank_per_step"] for r in rows}
    assert set(wire) == {"local SGD H=8", "none", "local SGD H=2"}  # the run's own, and the two asked for
    assert wire["local SGD H=2"] == pytest.approx(4 * wire["local SGD H=8"])  # models averaged 4x as often
    assert wire["local SGD H=2"] == pytest.approx(p.ring_wire_bytes(2, 4 * 94_986) / 2)
    bad = subprocess.run([sys.executable, "-m", "hvd_cifar.predict", str(run), "--bandwidth", "1gbit", "--np", "2",
                          "--compression", "local-sgd", "--local-sgd-steps", "1"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "--local-sgd-steps: must be >= 2" in bad.stderr
