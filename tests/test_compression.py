"""PowerSGD, top-k and local SGD (hvd_cifar/compress/): each scheme on hand-sized tensors with ranks
simulated in this process (threads meeting at each collective), then each scheme in real 2-rank
runs (Horovod and DDP between them), resumed onto the unbroken run's weights."""
import json
import threading

import pytest
import torch
import yaml

from conftest import read_metrics, run_train
from hvd_cifar import compress
from hvd_cifar.core import cost
from hvd_cifar.compress.localsgd import LocalSGD
from hvd_cifar.compress.powersgd import PowerSGD, orthonormalise
from hvd_cifar.compress.topk import TopK
from hvd_cifar.core.cost import POWERSGD_RANK, TOPK_FRACTION, TOPK_MIN_ENTRIES


class World:
    """``size`` simulated ranks: each collective waits until every rank has handed in its part."""

    def __init__(self, size):
        self.size, self.parts = size, [None] * size
        self.barrier = threading.Barrier(size)

    def exchange(self, rank, tensor):
        self.parts[rank] = tensor.detach().clone()
        self.barrier.wait()
        parts = [p.clone() for p in self.parts]
        self.barrier.wait()  # nobody overwrites a part before all have read them
        return parts


class FakeCollective(compress.Collective):
    def __init__(self, world, rank):
        super().__init__(world.size)
        self.world, self.rank, self.names = world, rank, []

    def _allreduce_mean(self, tensor, name):
        self.names.append(name)
        return torch.stack(self.world.exchange(self.rank, tensor)).mean(0)

    def _allgather(self, tensor, name):
        self.names.append(name)
        return torch.cat(self.world.exchange(self.rank, tensor))


def on_ranks(size, work):
    """``work(collective, rank)`` on ``size`` simulated ranks at once; their results in rank order."""
    world, results, errors = World(size), [None] * size, []

    def run(rank):
        try:
            results[rank] = work(FakeCollective(world, rank), rank)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)
            world.barrier.abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def param(name, values):
    p = torch.nn.Parameter(torch.zeros_like(values))
    p.grad = values.clone()
    return name, p


# ----------------------------------------------------------------------------- PowerSGD
def test_orthonormalise_gives_orthonormal_columns():
    p = torch.randn(7, 3, generator=torch.Generator().manual_seed(1))
    orthonormalise(p)
    assert torch.allclose(p.t() @ p, torch.eye(3), atol=1e-5)


def test_powersgd_p_is_orthonormal_inside_a_step(monkeypatch):
    from hvd_cifar.compress import powersgd
    seen = []
    real = powersgd.orthonormalise
    monkeypatch.setattr(powersgd, "orthonormalise", lambda p: seen.append(real(p)) or p)
    scheme = PowerSGD(FakeCollective(World(1), 0), rank=2)
    scheme.track([param("w", torch.randn(12, 10))])  # compression rate 120 / (2 x 22) = 2.7
    scheme.synchronize()
    [p] = seen
    assert p.shape == (12, 2) and torch.allclose(p.t() @ p, torch.eye(2), atol=1e-5)


def test_powersgd_error_feedback_makes_the_sent_sum_track_the_gradients():
    """A full-rank gradient, sent at rank 1 for 100 updates: what was applied in sum differs from
    the gradients' sum by the last error only (a few updates' worth); without error feedback by
    100 times the rank-1 approximation's error (most of the gradient)."""
    g = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    scheme = PowerSGD(FakeCollective(World(1), 0), rank=1)
    name, p = param("w", g)
    scheme.track([(name, p)])
    sent = torch.zeros_like(g)
    for _ in range(100):
        p.grad = g.clone()
        m = g + scheme.errors.get("w", torch.zeros_like(g))
        scheme.synchronize()
        assert torch.allclose(scheme.errors["w"], m - p.grad, atol=1e-6)  # E = M - approx
        sent += p.grad
    assert torch.allclose(sent + scheme.errors["w"], 100 * g, atol=1e-3)
    assert (sent - 100 * g).norm() / (100 * g).norm() < 0.05


def test_powersgd_two_ranks_agree_and_a_low_rank_mean_is_exact():
    """M_r = u v_r^T: the mean is rank 1, so rank-1 PowerSGD returns it exactly, the same on
    both ranks; the bias is averaged whole. Two allreduces of P and Q plus one of the bias."""
    u, v = torch.tensor([1.0, -2.0, 0.5, 3.0]), [torch.tensor([1.0, 0.0, 2.0, 1.0, -1.0]),
                                                  torch.tensor([0.0, 3.0, -1.0, 1.0, 2.0])]
    bias = [torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([3.0, 2.0, 1.0, 0.0])]

    def work(collective, rank):
        scheme = PowerSGD(collective, rank=1)
        weight, b = param("w", torch.outer(u, v[rank])), param("b", bias[rank])
        scheme.track([weight, b])
        scheme.synchronize()
        return weight[1].grad, b[1].grad, collective

    (w0, b0, c0), (w1, b1, c1) = on_ranks(2, work)
    assert torch.equal(w0, w1) and torch.equal(b0, b1)
    assert torch.allclose(w0, torch.outer(u, (v[0] + v[1]) / 2), atol=1e-5)
    assert torch.equal(b0, torch.tensor([2.0, 2.0, 2.0, 2.0]))
    assert sorted(c0.names) == ["powersgd.P", "powersgd.Q", "powersgd.whole"]
    assert c0.sent_bytes == (4 + 5 + 4) * 4  # 2(N-1)/N = 1 at N = 2: P, Q, bias, fp32


def test_powersgd_warm_up_averages_whole_and_keeps_no_error():
    grads = [torch.randn(6, 5, generator=torch.Generator().manual_seed(r)) for r in range(2)]

    def work(collective, rank):
        scheme = PowerSGD(collective, rank=1, warmup_steps=1)
        w = param("w", grads[rank])
        scheme.track([w])
        scheme.synchronize()
        first = w[1].grad.clone()
        scheme.synchronize()
        return first, scheme.errors

    (first, errors), _ = on_ranks(2, work)
    assert torch.allclose(first, (grads[0] + grads[1]) / 2)
    assert "w" in errors  # the second update was compressed


def test_powersgd_payload_counts_p_q_and_whole_vectors():
    shapes = [(16, 3, 3, 3), (16,), (10, 16), (2, 2)]
    # conv: 16 x 27 -> (16 + 27) x 2; bias whole; linear 10 x 16 -> 26 x 2; 2x2 gains nothing: whole
    assert cost.powersgd_payload(shapes, 2) == ((16 + 27) * 2 + 16 + (10 + 16) * 2 + 4) * 4


# ----------------------------------------------------------------------------- top-k
def test_topk_carries_the_residual_to_the_next_update():
    scheme = TopK(FakeCollective(World(1), 0), fraction=0.25)  # k = 1 of 4
    name, p = param("w", torch.tensor([[5.0, -1.0], [0.5, 3.0]]))
    scheme.track([(name, p)])
    scheme.synchronize()
    assert torch.equal(p.grad, torch.tensor([[5.0, 0.0], [0.0, 0.0]]))
    assert torch.equal(scheme.errors["w"], torch.tensor([0.0, -1.0, 0.5, 3.0]))
    p.grad = torch.tensor([[0.0, 0.0], [0.0, 1.0]])
    scheme.synchronize()  # M = [0, -1, .5, 4]: the residual wins
    assert torch.equal(p.grad, torch.tensor([[0.0, 0.0], [0.0, 4.0]]))
    assert torch.equal(scheme.errors["w"], torch.tensor([0.0, -1.0, 0.5, 0.0]))


def test_topk_two_ranks_gather_their_pieces_into_one_mean():
    grads = [torch.tensor([[4.0, 0.0], [0.0, 1.0]]), torch.tensor([[0.0, 0.0], [-2.0, 1.0]])]
    bias = [torch.tensor([0.0, 6.0]), torch.tensor([2.0, 0.0])]

    def work(collective, rank):
        scheme = TopK(collective, fraction=0.25)  # k = 1 of 4; the bias averaged whole
        w, b = param("w", grads[rank]), param("b", bias[rank])
        scheme.track([w, b])
        scheme.synchronize()
        return w[1].grad, b[1].grad, collective.sent_bytes, scheme.payload_bytes([w, b])

    (w0, b0, sent, payload), (w1, b1, _, _) = on_ranks(2, work)
    assert torch.equal(w0, w1) and torch.equal(b0, b1)
    assert torch.equal(w0, torch.tensor([[2.0, 0.0], [-1.0, 0.0]]))
    assert torch.equal(b0, torch.tensor([1.0, 3.0]))
    assert payload == (4 + 4) + 2 * 4 and sent == payload  # (N-1) x contribution + ring of the bias, at N = 2


# ----------------------------------------------------------------------------- local SGD
def test_local_sgd_averages_exactly_every_h_updates_and_at_the_epoch_end():
    h, updates = 3, 7

    def work(collective, rank):
        scheme = LocalSGD(collective, every=h)
        name, p = param("w", torch.zeros(2))
        scheme.track([(name, p)])
        equal_after = []
        for update in range(updates):
            scheme.synchronize()
            with torch.no_grad():
                p += torch.tensor([1.0, -1.0]) * (rank + 1) * (update + 1)  # ranks step apart
            scheme.after_step()
            equal_after.append(bool(collective.allgather(p.detach().clone(), "check").view(2, 2).diff(dim=0).abs().sum() == 0))
        scheme.end_epoch()
        return equal_after, p.detach().clone(), scheme.averages

    (equal0, final0, averages), (_, final1, _) = on_ranks(2, work)
    assert equal0 == [False, False, True, False, False, True, False]
    assert averages == 3 and torch.equal(final0, final1)  # the 7th update: averaged at the epoch's end


def test_local_sgd_averages_the_gradients_through_its_warm_up_then_steps_each_ranks_own():
    """Post-local SGD: for the first warmup_steps updates every rank steps on the ranks' mean
    gradient (the models stay one, with no model average); after them on its own gradient, the
    models averaged every h updates counted from the switch."""
    warmup, h, updates = 2, 2, 6

    def work(collective, rank):
        scheme = LocalSGD(collective, every=h, warmup_steps=warmup)
        name, p = param("w", torch.zeros(2))
        scheme.track([(name, p)])
        stepped, equal_after = [], []
        for update in range(updates):
            p.grad = torch.tensor([1.0, -1.0]) * (rank + 1) * (update + 1)  # each rank's own gradient
            scheme.synchronize()
            stepped.append(p.grad.clone())
            with torch.no_grad():
                p -= p.grad
            scheme.after_step()
            equal_after.append(bool(collective.allgather(p.detach().clone(), "check").view(2, 2).diff(dim=0).abs().sum() == 0))
        return stepped, equal_after, scheme.averages

    (stepped0, equal0, averages), (stepped1, _, _) = on_ranks(2, work)
    for update in range(updates):
        own0, own1 = (torch.tensor([1.0, -1.0]) * (r + 1) * (update + 1) for r in (0, 1))
        expected = ((own0 + own1) / 2, (own0 + own1) / 2) if update < warmup else (own0, own1)
        assert torch.equal(stepped0[update], expected[0]) and torch.equal(stepped1[update], expected[1]), update
    assert equal0 == [True, True, False, True, False, True]
    assert averages == 2  # after updates 4 and 6: the warm-up's two are not counted


def test_local_sgd_payload_is_the_model_amortised():
    scheme = LocalSGD(FakeCollective(World(2), 0), every=4)
    assert scheme.payload_bytes([param("w", torch.zeros(10, 10)), param("b", torch.zeros(10))]) == 110 * 4 / 4


# ----------------------------------------------------------------------------- checkpointed state
SCHEMES = {"powersgd": lambda c: PowerSGD(c, rank=1, warmup_steps=1),
           "topk": lambda c: TopK(c, fraction=0.25, warmup_steps=1),
           "localsgd": lambda c: LocalSGD(c, every=3, warmup_steps=1)}


@pytest.mark.parametrize("name", SCHEMES)
def test_a_scheme_taken_back_from_its_saved_state_goes_on_as_the_unbroken_one(tmp_path, name):
    """Three updates, the state through torch.save and torch.load(weights_only=True) as the
    checkpoint carries it, into a fresh scheme: its next updates equal the unbroken scheme's
    (red without the residuals, PowerSGD's Q, the warm-up's count or local SGD's count)."""
    grads = [torch.randn(6, 5, generator=torch.Generator().manual_seed(i)) for i in range(5)]

    def update(scheme, p, g):
        p.grad = g.clone()
        scheme.synchronize()
        with torch.no_grad():
            p -= 0.1 * p.grad
        scheme.after_step()
        return p.detach().clone()

    unbroken, (_, p) = SCHEMES[name](FakeCollective(World(1), 0)), param("w", torch.zeros(6, 5))
    unbroken.track([("w", p)])
    for g in grads[:3]:
        update(unbroken, p, g)
    torch.save(unbroken.state_dict(), tmp_path / "state.pt")
    resumed, q = SCHEMES[name](FakeCollective(World(1), 0)), torch.nn.Parameter(p.detach().clone())
    resumed.track([("w", q)])
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    for g in grads[3:]:
        assert torch.equal(update(unbroken, p, g), update(resumed, q, g))
    assert resumed.state_dict().keys() == unbroken.state_dict().keys()
    if name == "localsgd":  # one rank: the average changes nothing, so count the averages
        assert (resumed.averages, resumed.since_average) == (unbroken.averages, unbroken.since_average) == (1, 1)


def test_local_sgd_stopped_between_averages_keeps_each_ranks_own_parameters():
    """A preempted epoch stops between two averages, where every rank's model is its own: each
    rank's state carries its parameters, loaded over the checkpoint's (rank 0's); at an average
    the models are one and nothing more is saved."""
    def work(collective, rank):
        scheme, (name, p) = LocalSGD(collective, every=3), param("w", torch.zeros(2))
        scheme.track([(name, p)])
        for _ in range(2):
            scheme.synchronize()
            with torch.no_grad():
                p += rank + 1.0
            scheme.after_step()
        return scheme.state_dict()

    states = on_ranks(2, work)
    fresh, (name, q) = LocalSGD(FakeCollective(World(1), 0), every=3), param("w", torch.full((2,), 9.0))
    fresh.track([(name, q)])
    fresh.load_state_dict(states[1])
    assert torch.equal(q.detach(), torch.full((2,), 4.0)) and fresh.since_average == 2  # rank 1's: 2 x (1 + 1)
    scheme, (name, p) = LocalSGD(FakeCollective(World(1), 0), every=1), param("w", torch.zeros(2))
    scheme.track([(name, p)])
    scheme.synchronize()
    scheme.after_step()
    assert "params" not in scheme.state_dict()  # just averaged: the checkpoint's model is every rank's


# ----------------------------------------------------------------------------- real runs
RUNS = {  # name: (launcher, flags); warm-up 2 of the epoch's 6 updates for PowerSGD; top-k with 2
    # micro-batches per update (3 updates): the scheme reads the gradients backward summed
    "horovod-powersgd": ("horovodrun", ["--sync", "horovod", "--compression", "powersgd",
                                        "--compression-warmup-steps", "2"]),
    "ddp-topk": ("mpirun", ["--sync", "ddp", "--compression", "topk", "--compression-warmup-steps", "0",
                            "--accumulation-steps", "2"]),
    # Deep Gradient Compression's state under Horovod: 2 dense updates, then epoch 1 of a 1-epoch
    # sparsity warm-up (25 %), epoch 2 at topk_fraction; velocities and residuals across the stop
    "horovod-topk": ("horovodrun", ["--sync", "horovod", "--compression", "topk", "--compression-warmup-steps", "2",
                                    "--topk-warmup-epochs", "1"]),
    # local SGD after 2 updates of averaged gradients (post-local SGD's switch-over)
    "ddp-localsgd": ("mpirun", ["--sync", "ddp", "--compression", "local-sgd", "--local-sgd-steps", "4",
                                "--compression-warmup-steps", "2"]),
}


def expected_bytes(name, shapes, syncs):
    """(comm_bytes_per_sync, comm_bytes_per_rank) of a 2-rank first epoch of ``syncs`` updates:
    ring allreduce and allgather both send the payload once at N = 2; top-k sends 25 % of each
    tensor in the sparsity warm-up's first epoch, and TOPK_FRACTION after it."""
    fp32 = sum(torch.Size(s).numel() for s in shapes) * 4
    if name == "horovod-powersgd":
        compressed = cost.powersgd_payload(shapes, POWERSGD_RANK)
        return compressed, 2 * fp32 + (syncs - 2) * compressed
    topk = lambda fraction: sum(cost.topk_parts(shapes, fraction, TOPK_MIN_ENTRIES))  # noqa: E731
    if name == "ddp-topk":
        return topk(TOPK_FRACTION), syncs * topk(0.25)
    if name == "horovod-topk":
        return topk(TOPK_FRACTION), 2 * fp32 + (syncs - 2) * topk(0.25)
    return round(fp32 / 4), 3 * fp32  # gradients averaged in updates 1 and 2, the models after update 6


def weights(run_dir):
    return torch.load(run_dir / "checkpoint_last.pt", weights_only=True)["model"]


@pytest.mark.parametrize("name", RUNS)
def test_two_ranks_agree_record_their_bytes_and_resume_onto_the_unbroken_runs_weights(tmp_path, name):
    """Each scheme at 2 ranks: 2 epochs straight, against 1 epoch, stop, resume for 1. The first
    epoch's line counts the bytes sent; the resumed run must end on the straight run's weights,
    so every rank's own state must come back from the checkpoint: PowerSGD's count (the warm-up
    would run again), residuals and Q, top-k's residuals, local SGD's count and each rank's
    momentum (rank 0's on every rank would end elsewhere)."""
    launcher, flags = RUNS[name]
    for run_name, stop_after in (("straight", "0"), ("halves", "1")):
        run_train(["--config", "configs/tiny.yaml", "--epochs", "2", "--stop-after", stop_after, "--log-dir",
                   str(tmp_path), "--run-name", run_name, *flags], launcher=launcher, np=2)
    halves = tmp_path / "halves"
    [record] = read_metrics(halves)
    from hvd_cifar.workload.models import build_model
    shapes = [tuple(p.shape) for p in build_model("smallcnn", 10).parameters()]
    assert record["syncs"] == (3 if name == "ddp-topk" else 6) and record["compression"] == {"localsgd": "local-sgd"}.get(name.split("-")[1], name.split("-")[1])
    per_sync, per_rank = expected_bytes(name, shapes, record["syncs"])
    assert (record["comm_bytes_per_sync"], record["comm_bytes_per_rank"]) == (per_sync, per_rank)
    assert record["comm_bytes_per_sync"] * 3 < record["trainable_params"] * 4  # fp32 ring at N = 2
    saved = torch.load(halves / "checkpoint_last.pt", weights_only=True)["rank_states"]
    assert [s["updates"] for s in saved] == [record["syncs"]] * 2
    if name == "ddp-localsgd":  # each rank's own momentum, not rank 0's twice
        assert not torch.equal(*(s["optimizer"]["state"][0]["momentum_buffer"] for s in saved))
    if name.endswith("topk"):  # each rank's own velocities (the optimizer's momentum moved into them)
        assert saved[0]["velocities"].keys() == saved[1]["velocities"].keys() != set()
        assert not all(torch.equal(saved[0]["velocities"][k], saved[1]["velocities"][k]) for k in saved[0]["velocities"])
    run_train(["--resume", str(halves), "--stop-after", "0"], launcher=launcher, np=2)
    for run_dir in (tmp_path / "straight", halves):
        assert json.loads((run_dir / "eval.json").read_text())["parameters_identical_across_ranks"]
    straight, resumed = weights(tmp_path / "straight"), weights(halves)
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key


ALIASES = {  # the old spelling, read where the config is loaded, and the one spelling it means
    "fp16": (["--fp16-allreduce"], ["--compression", "fp16"]),
    "local-sgd": (["--local-sgd-steps", "2"], ["--compression", "local-sgd", "--local-sgd-steps", "2"]),
}


def same(a, b) -> bool:
    """Whether two checkpoint parts hold the same values: tensors bit for bit, inside dicts and lists."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("compression", ALIASES)
def test_an_alias_trains_as_its_one_spelling(tmp_path, compression):
    """--fp16-allreduce is compression: fp16 and --local-sgd-steps N alone is compression:
    local-sgd: 2 ranks, 1 epoch each way, the same weights, momentum and scheme state bit for bit,
    and the alias's config.yaml holds the one spelling (red while an alias reached the run as a
    setting of its own: local SGD off, or fp16 not on the wire)."""
    saved = {}
    for run_name, flags in zip(("alias", "one"), ALIASES[compression]):
        run_train(["--config", "configs/tiny.yaml", "--epochs", "1", "--sync", "ddp", "--compression-warmup-steps", "2",
                   "--log-dir", str(tmp_path), "--run-name", run_name, "--no-tensorboard", *flags],
                  launcher="mpirun", np=2)
        saved[run_name] = torch.load(tmp_path / run_name / "checkpoint_last.pt", weights_only=True)
    assert yaml.safe_load((tmp_path / "alias" / "config.yaml").read_text())["compression"] == compression
    alias, one = saved["alias"], saved["one"]
    for part in ("model", "optimizer", "rank_states"):
        assert same(alias.get(part), one.get(part)), part
    [alias_record], [one_record] = read_metrics(tmp_path / "alias"), read_metrics(tmp_path / "one")
    assert alias_record["comm_bytes_per_rank"] == one_record["comm_bytes_per_rank"]


@pytest.mark.parametrize("warmup, lr, what", [("1000", "1e30", "non-finite gradients"), ("0", "1000", "chance level")])
def test_local_sgd_diverging_where_every_rank_sees_it_ends_with_one_line(tmp_path, warmup, lr, what):
    """Where every rank sees the divergence alike, local SGD ends as plain averaging does: one
    line from rank 0 and one event without a rank. In the warm-up the ranks step on the same
    averaged gradients; after it, the epoch's training loss is reduced over the ranks (red while
    local SGD counted every divergence as one rank's own: a line per rank, each naming itself)."""
    proc = run_train(["--config", "configs/tiny.yaml", "--epochs", "2", "--log-dir", str(tmp_path), "--run-name", "run",
                      "--sync", "ddp", "--compression", "local-sgd", "--local-sgd-steps", "4",
                      "--compression-warmup-steps", warmup, "--lr", lr],
                     launcher="mpirun", np=2, check=False)
    assert proc.returncode == 3, proc.stderr[-3000:]
    ours = [line for line in proc.stderr.splitlines() if "hvd_cifar:" in line]
    assert len(ours) == 1 and ours[0].startswith("hvd_cifar: diverged:") and " on rank " not in ours[0], proc.stderr[-3000:]
    assert what in ours[0]
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("diverged") == 1 and events[-1].get("rank") is None


# ----------------------------------------------------------------------------- the scaling model
def scenario(method, k, freeze, compression="none", scheme_s=0.0, **settings):
    """A scaling.Scenario, the scheme's settings given as keywords."""
    from hvd_cifar.analysis import scaling
    return scaling.Scenario(method, compression, k, freeze, tuple(settings.items()), scheme_s=scheme_s)


def scaling_case():
    from hvd_cifar.analysis import scaling
    # block 0: a conv (4, 2, 3, 3) and its bias; the head: a linear (10, 4) and its bias
    prof = scaling.Profile(block_params=(76,), block_macs=(1,), head_params=50, head_macs=1,
                           param_shapes=((0, (4, 2, 3, 3)), (0, (4,)), (1, (10, 4)), (1, (10,))))
    c = scaling.Compute(model="m", num_classes=10, sync="horovod", world_size=1, compression="none",
                        accumulation_steps=1, frozen_blocks=0, images_per_step=32, data_s=0.0,
                        forward_s=0.0, backward_s=10.0, other_s=0.0, optimizer_s=0.0, sync_s=0.0,
                        hidden_fraction=0.5, step_s=10.0)
    net = scaling.Network({"horovod": scaling.Link(0.0, 1000.0)}, None)
    return scaling, prof, c, net


@pytest.mark.parametrize("scheme, freeze, payload, comm_s, wire", [
    # P (4 + 10) x r=1, Q (18 + 4) x 1, biases 4 + 10 whole, fp32; 3 rings of 2(N-1)/N = 1.5 x bytes
    ({"compression": "powersgd", "powersgd_rank": 1}, 0, 200, 1.5 * 200 / 1000, 1.5 * 200),
    ({"compression": "powersgd", "powersgd_rank": 1}, 1, 96, 1.5 * 96 / 1000, 1.5 * 96),  # the head's only
    # top-k f=0.5: 36 + 20 entries of the matrices, values and int32 indices, two allgathers of
    # (N-1) parts; the biases' 14 fp32 whole in a ring
    ({"compression": "topk", "topk_fraction": 0.5, "topk_min_entries": 0}, 0, 504, (3 * 448 + 1.5 * 56) / 1000,
     3 * 448 + 1.5 * 56),
    # ... and with topk_min_entries 50, the 40-entry linear goes whole with the biases: 36 entries
    # gathered, 54 fp32 in the ring
    ({"compression": "topk", "topk_fraction": 0.5, "topk_min_entries": 50}, 0, 504, (3 * 288 + 1.5 * 216) / 1000,
     3 * 288 + 1.5 * 216),
    # local SGD H=4: the 126-parameter model in one ring every 4th update
    ({"compression": "local-sgd", "local_sgd_steps": 4}, 0, 504 / 4, 1.5 * 504 / 1000 / 4, 1.5 * 504 / 4),
])
def test_the_scaling_model_counts_each_schemes_collectives(scheme, freeze, payload, comm_s, wire):
    scaling, prof, c, net = scaling_case()
    row = scaling.predict_step(c, prof, net, scenario("horovod", 1, freeze, **scheme), 4)
    assert row["payload_bytes"] == pytest.approx(payload)
    assert row["comm_s_per_sync"] == pytest.approx(comm_s)
    assert row["exposed_s_per_sync"] == pytest.approx(comm_s)  # after backward: nothing hides
    assert row["bytes_per_rank_per_step"] == pytest.approx(wire)
    plain = scaling.predict_step(c, prof, net, scaling.Scenario("horovod", "none", 1, freeze), 4)
    assert plain["compression"] == "none" and plain["payload_bytes"] == 4 * (126 if freeze == 0 else 50)


@pytest.mark.parametrize("option", [{"compression": "topk", "topk_fraction": 0.5}, {"compression": "fp16"}])
def test_a_schemes_own_compute_is_timed_on_the_models_shapes_and_paid_once_per_update(option):
    """time_schemes times the scheme (fp16: the casts to fp16 and back) on the trainable shapes
    (compress/compute.py); predict_step adds it to the step, per update (divided over k
    micro-batches), and to nothing else; fp16's casts only where there is a wire (np > 1).
    Red for fp16 while its casts were priced from a probe's figure alone (0 without one)."""
    scaling, prof, c, net = scaling_case()
    plain = scaling.Scenario("horovod", "none", 2, 0)
    from dataclasses import replace
    timed_one = scenario("horovod", 2, 0, **option)
    timed, same = scaling.time_schemes(prof, [timed_one, plain], threads=1)
    assert timed.scheme_s > 0 and same == plain
    untimed, row = (scaling.predict_step(c, prof, net, s, 4) for s in (timed_one, timed))
    assert row["scheme_s_per_sync"] == timed.scheme_s
    assert row["step_s"] == pytest.approx(untimed["step_s"] + timed.scheme_s / 2)
    alone = scaling.predict_step(c, prof, net, timed, 1)["scheme_s_per_sync"]
    assert alone == (0.0 if option["compression"] == "fp16" else timed.scheme_s)
    # timed with a core to itself: 4 one-thread ranks on 2 cores take twice as long, even when
    # the run's own compute was measured at 4 ranks already (its share is in it)
    shared, at4 = replace(net, shared_cores=2), replace(c, threads_per_rank=1, world_size=4)
    untimed, row = (scaling.predict_step(at4, prof, shared, s, 4) for s in (timed_one, timed))
    assert row["step_s"] == pytest.approx(untimed["step_s"] + 2 * timed.scheme_s / 2)


def test_a_scheme_pays_below_the_bandwidth_where_its_saved_bytes_outweigh_its_compute():
    """Plain: 504 B in a ring at N = 4 (1.5 x 504 / β, a hidden fraction of 0); PowerSGD r=1:
    200 B (1.5 x 200 / β) plus 0.1 s of its own compute: the two steps are equal at
    β = 1.5 x 304 / 0.1 B/s, and PowerSGD is the shorter below it (red without its compute: it
    would pay on every link)."""
    scaling, prof, c, net = scaling_case()
    from dataclasses import replace
    c = replace(c, hidden_fraction=0.0)
    plain = scaling.Scenario("horovod", "none", 1, 0)
    powersgd = scenario("horovod", 1, 0, compression="powersgd", powersgd_rank=1, scheme_s=0.1)
    beta = scaling.break_even_bandwidth(c, prof, net, plain, powersgd, 4)
    assert beta == pytest.approx(1.5 * 304 / 0.1, rel=1e-6)


def test_the_profile_knows_each_parameters_block():
    from hvd_cifar.analysis import scaling
    prof = scaling.profile("smallcnn", 10)
    assert sum(torch.Size(s).numel() for _, s in prof.param_shapes) == sum(prof.block_params) + prof.head_params
    for block, params in enumerate(prof.block_params):
        assert sum(torch.Size(s).numel() for b, s in prof.param_shapes if b == block) == params


def test_predict_adds_the_compressions_where_the_method_runs_them():
    """Each --compression beside the run's own, under each method that runs it (fp16: every one
    with it in its registry entry's native; the schemes: those that run schemes); a compression
    no method asked for runs is one line."""
    from hvd_cifar import predict
    from hvd_cifar.core.errors import PredictError
    _, _, c, _ = scaling_case()
    args = predict.parse_args(["RUN", "--compression", "fp16", "topk", "local-sgd", "--local-sgd-steps", "4"])
    got = {(s.method, s.compression, dict(s.settings).get("local_sgd_steps"))
           for s in predict.scenarios(c, args, ["horovod", "mpi-allreduce"], 3, {})}
    assert got == {("horovod", "none", None), ("mpi-allreduce", "none", None), ("horovod", "fp16", None),
                   ("mpi-allreduce", "fp16", None), ("horovod", "topk", None), ("horovod", "local-sgd", 4)}
    with pytest.raises(PredictError, match="^--compression topk"):
        predict.scenarios(c, args, ["mpi-allreduce"], 3, {})
