"""Top-k as Deep Gradient Compression runs it (hvd_cifar/compress/topk.py): each of its four
techniques on a hand-made example, with ranks simulated in this process, each built so that it
fails without the technique; the optimizer's momentum not applied twice; the state a resumed run
needs; the config's refusals."""
import math

import pytest
import torch

from test_compression import FakeCollective, World, on_ranks, param
from hvd_cifar.core.cost import topk_fraction_at, topk_parts
from hvd_cifar.compress.topk import TopK


def alone():
    return FakeCollective(World(1), 0)


def sgd(params, momentum=0.5, nesterov=False, weight_decay=0.0):
    return torch.optim.SGD(params, lr=1.0, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)


def dgc(collective, fraction=0.25, **techniques):
    on = {"momentum_correction": True, "momentum_masking": True, **techniques}
    return TopK(collective, fraction, **on)


def test_momentum_correction_sends_the_accumulated_velocitys_top_entries():
    """m = 0.5, k = 1 of 4. Update 1: g = [4, 3, 0, 0]: u = g, V = u, send 4 at 0. Update 2:
    g = [0, 0, 2.5, 0]: u = 0.5 [0, 3, 0, 0] (masked) + g = [0, 1.5, 2.5, 0], V = [0, 3, 0, 0] + u =
    [0, 4.5, 2.5, 0]: send 4.5 at 1. Accumulating the raw gradient instead would send 3."""
    name, p = param("w", torch.tensor([[4.0, 3.0, 0.0, 0.0]]))  # one row: a matrix, sent sparse
    scheme, optimizer = dgc(alone()), sgd([p])
    scheme.track([(name, p)], optimizer)
    assert optimizer.param_groups[0]["momentum"] == 0 and scheme.hyper["w"] == (0.5, False, 0.0)
    scheme.synchronize()
    assert torch.equal(p.grad, torch.tensor([[4.0, 0.0, 0.0, 0.0]]))
    p.grad = torch.tensor([[0.0, 0.0, 2.5, 0.0]])
    scheme.synchronize()
    assert torch.equal(p.grad, torch.tensor([[0.0, 4.5, 0.0, 0.0]]))
    assert torch.equal(scheme.errors["w"], torch.tensor([0.0, 0.0, 2.5, 0.0]))


def test_momentum_masking_clears_the_velocity_of_what_was_sent():
    """After the first update of the example above the velocity is [0, 3, 0, 0]: entry 0 was
    sent and its momentum cleared (unmasked: [4, 3, 0, 0]), and at the second, entry 1's."""
    name, p = param("w", torch.tensor([[4.0, 3.0, 0.0, 0.0]]))
    scheme = dgc(alone())
    scheme.track([(name, p)], sgd([p]))
    scheme.synchronize()
    assert torch.equal(scheme.velocities["w"], torch.tensor([0.0, 3.0, 0.0, 0.0]))
    p.grad = torch.tensor([[0.0, 0.0, 2.5, 0.0]])
    scheme.synchronize()
    assert torch.equal(scheme.velocities["w"], torch.tensor([0.0, 0.0, 2.5, 0.0]))


@pytest.mark.parametrize("nesterov", [False, True])
def test_the_optimizers_momentum_is_not_applied_a_second_time(nesterov):
    """Everything sent (fraction 1), no masking, 2 ranks: the ranks' mean velocity step is the
    velocity step of the mean gradient, so the weights must follow torch's SGD with momentum,
    nesterov and weight decay on the averaged gradients (every norm here is below the ranks'
    threshold, 1 x sqrt(2), and the mean's below 1, so that nothing clips). Red with the
    optimizer's momentum or weight decay left in the optimizer's groups (applied twice), and with
    the dense warm-up's two updates not stepping the velocity."""
    gen = torch.Generator().manual_seed(0)
    grads = [[torch.randn(3, 4, generator=gen) * 0.05 for _ in range(6)] for _ in range(2)]
    start = torch.randn(3, 4, generator=gen)

    def work(collective, rank):
        scheme, w = dgc(collective, fraction=1.0, momentum_masking=False, clip=1.0), torch.nn.Parameter(start.clone())
        scheme.warmup_steps = 2
        optimizer = sgd([w], momentum=0.9, nesterov=nesterov, weight_decay=0.01)
        optimizer.param_groups[0]["lr"] = 0.1
        scheme.track([("w", w)], optimizer)
        for g in grads[rank]:
            w.grad = g.clone()
            scheme.synchronize()
            scheme.before_step()
            optimizer.step()
        return w.detach()

    w0, w1 = on_ranks(2, work)
    reference = torch.nn.Parameter(start.clone())
    optimizer = torch.optim.SGD([reference], lr=0.1, momentum=0.9, nesterov=nesterov, weight_decay=0.01)
    for g0, g1 in zip(*grads):
        reference.grad = (g0 + g1) / 2
        optimizer.step()
    assert max(g.norm() for g in grads[0] + grads[1]) < 1 / math.sqrt(2)
    assert torch.equal(w0, w1)
    assert torch.allclose(w0, reference.detach(), atol=1e-6)


def test_local_clipping_scales_each_ranks_gradient_before_accumulating_and_the_update_is_applied_as_sent():
    """Two ranks, grad_clip 1: each clips its own gradient at 1 x sqrt(2) first (the threshold
    that holds the mean of two independent gradients at about 1). Rank 0's [3, 4] (norm 5)
    becomes [0.85, 1.13]; rank 1's [0, 0.1] stays. Everything sent, no momentum: the update is
    their mean. The loop's clip of the averaged update (here a factor 0.1 in its place) is undone
    before the step: DGC clips before aggregation only."""
    grads = [torch.tensor([3.0, 4.0]), torch.tensor([0.0, 0.1])]

    def work(collective, rank):
        scheme = TopK(collective, 1.0, clip=1.0)
        name, p = param("w", grads[rank])
        scheme.track([(name, p)])
        scheme.synchronize()
        sent = p.grad.clone()
        p.grad.mul_(0.1)  # what the loop's guard_gradients may do to it
        scheme.before_step()
        return sent, p.grad

    (sent, restored), _ = on_ranks(2, work)
    clipped = grads[0] * math.sqrt(2) / (5 + 1e-6)  # torch's clip: max_norm / (norm + 1e-6)
    assert torch.allclose(sent, (clipped + grads[1]) / 2, atol=1e-6)
    assert torch.equal(restored, sent)


@pytest.mark.parametrize("epoch, kept", [(0, 250), (1, 63), (2, 16), (3, 4), (4, 1), (7, 1)])
def test_the_sparsity_warm_up_sends_the_papers_shares_epoch_by_epoch(epoch, kept):
    """f = 0.001 over 4 warm-up epochs: 75 %, 93.75 %, 98.4 %, 99.6 %, then 99.9 % sparsity (DGC's
    schedule); of 1,000 entries, 250, 63, 16, 4 and then 1 are sent."""
    assert topk_fraction_at(epoch, 0.001, 4) == pytest.approx([0.25, 0.0629, 0.0158, 0.00398, 0.001, 0.001, 0.001, 0.001][epoch], rel=0.01)
    name, p = param("w", torch.arange(1.0, 1001.0).view(10, 100))
    scheme = TopK(alone(), 0.001, warmup_epochs=4)
    scheme.track([(name, p)])
    scheme.epoch = epoch
    scheme.synchronize()
    assert int((p.grad != 0).sum()) == kept
    assert scheme.payload_bytes([(name, p)]) == 1 * 8  # the steady state: after the warm-up


def test_vectors_are_averaged_whole_with_their_velocity_and_matrices_sent_sparse():
    """A bias (a vector) and a weight: the bias's velocity step averaged whole over two ranks in
    one allreduce, the weight's largest entry gathered; the bias keeps its velocity (no masking:
    nothing of it waits in a residual)."""
    weights = [torch.tensor([[4.0, 0.0], [0.0, 1.0]]), torch.tensor([[0.0, 0.0], [-2.0, 1.0]])]
    biases = [torch.tensor([1.0, 3.0]), torch.tensor([3.0, 1.0])]

    def work(collective, rank):
        scheme, (w, b) = dgc(collective), (param("w", weights[rank]), param("b", biases[rank]))
        scheme.track([w, b], sgd([w[1], b[1]]))
        scheme.synchronize()
        return w[1].grad, b[1].grad, scheme.velocities["b"], collective.names

    (w0, b0, velocity, names), (w1, b1, _, _) = on_ranks(2, work)
    assert torch.equal(w0, w1) and torch.equal(b0, b1)
    assert torch.equal(w0, torch.tensor([[2.0, 0.0], [-1.0, 0.0]])) and torch.equal(b0, torch.tensor([2.0, 2.0]))
    assert torch.equal(velocity, biases[0]) and names == ["topk.whole", "topk.values", "topk.indices"]


def test_matrices_under_min_entries_are_averaged_whole_with_the_vectors():
    """topk_min_entries 5: a 2 x 2 weight (4 entries) goes whole into the allreduce, beside the
    bias, and keeps no residual; a 2 x 3 weight (6 entries) is still sent sparse. The analytic
    bytes count the small matrix as whole fp32 too. Red with the matrices all sent sparse (the
    small weight's mean would be its largest entries only)."""
    small = [torch.tensor([[4.0, 1.0], [2.0, 3.0]]), torch.tensor([[0.0, 2.0], [1.0, 1.0]])]
    large = [torch.tensor([[5.0, 0.0, 0.0], [0.0, 0.0, 1.0]]), torch.tensor([[0.0, 0.0, 0.0], [-3.0, 0.0, 0.0]])]

    def work(collective, rank):
        scheme = TopK(collective, 0.1, min_entries=5)  # k = 1 of 6
        s, l = param("s", small[rank]), param("l", large[rank])
        scheme.track([s, l])
        scheme.synchronize()
        return s[1].grad, l[1].grad, sorted(scheme.errors), collective.names, scheme.payload_bytes([s, l])

    (s0, l0, errors, names, payload), _ = on_ranks(2, work)
    assert torch.equal(s0, (small[0] + small[1]) / 2)
    assert torch.equal(l0, torch.tensor([[2.5, 0.0, 0.0], [-1.5, 0.0, 0.0]]))
    assert errors == ["l"] and names == ["topk.whole", "topk.values", "topk.indices"]
    assert payload == 4 * 4 + 1 * (4 + 4) == sum(topk_parts([(2, 2), (2, 3)], 0.1, 5))


def test_the_epoch_loop_gives_the_scheme_its_epoch():
    scheme = TopK(alone(), 0.001, warmup_epochs=4)
    seen = []
    result = type("Result", (), {"extra": {}})()
    scheme.run_epoch(3, lambda: seen.append(scheme.epoch) or result)
    assert seen == [3] and result.extra["compression"] == "topk"


def test_a_resumed_dgc_goes_on_as_the_unbroken_one(tmp_path):
    """Three updates in epoch 1 of the warm-up, the state through torch.save and
    torch.load(weights_only=True), into a fresh scheme and optimizer: the next updates equal the
    unbroken one's (red without the velocities, the residuals or the epoch in the state)."""
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(4, 10, generator=gen) for _ in range(6)]

    def make(start):
        w = torch.nn.Parameter(start.clone())
        scheme, optimizer = TopK(alone(), 0.05, warmup_epochs=2, momentum_correction=True,
                                 momentum_masking=True, clip=1.0), sgd([w], momentum=0.9, nesterov=True)
        scheme.track([("w", w)], optimizer)
        return scheme, optimizer, w

    def update(scheme, optimizer, w, g):
        w.grad = g.clone()
        scheme.synchronize()
        scheme.before_step()
        optimizer.step()
        return w.detach().clone()

    unbroken = make(torch.zeros(4, 10))
    unbroken[0].epoch = 1
    for g in grads[:3]:
        update(*unbroken, g)
    torch.save({"scheme": unbroken[0].state_dict(), "optimizer": unbroken[1].state_dict()}, tmp_path / "state.pt")
    resumed = make(unbroken[2].detach())
    saved = torch.load(tmp_path / "state.pt", weights_only=True)
    resumed[1].load_state_dict(saved["optimizer"])
    resumed[0].load_state_dict(saved["scheme"])
    assert resumed[0].epoch == 1
    for g in grads[3:]:
        assert torch.equal(update(*unbroken, g), update(*resumed, g))


@pytest.mark.parametrize("flags, key", [  # top-k's and PowerSGD's keys
    (["--compression", "topk", "--topk-momentum-masking", "--no-topk-momentum-correction"], "topk_momentum_masking"),
    (["--compression", "topk", "--grad-clip", "0"], "topk_local_clip"),
    (["--compression", "topk", "--freeze", "auto"], "freeze"),
    (["--compression", "topk", "--topk-warmup-epochs", "-1"], "topk_warmup_epochs"),
    (["--compression", "topk", "--topk-min-entries", "-1"], "topk_min_entries"),
    (["--compression", "powersgd", "--powersgd-min-compression-rate", "0.5"], "powersgd_min_compression_rate"),
    (["--compression", "powersgd", "--powersgd-warm-start", "maybe"], "powersgd_warm_start"),
])
def test_wrong_combinations_are_one_line_naming_the_key(flags, key):
    from hvd_cifar.core.config import ConfigError, from_args
    with pytest.raises(ConfigError) as err:
        from_args(["--no-tensorboard", *flags])
    assert str(err.value).startswith(f"{key}:") and "\n" not in str(err.value)


def test_each_technique_can_be_switched_off():
    """The scheme a run builds from its config (compress.topk.create) has each technique on by
    default and off when its flag says so: what the flags reach, not what they set."""
    import math
    from hvd_cifar.compress.base import Collective
    from hvd_cifar.compress.topk import create
    from hvd_cifar.core.config import from_args
    on = create(from_args(["--compression", "topk", "--no-tensorboard"]), Collective(2))
    assert (on.momentum_correction, on.momentum_masking, on.warmup_epochs) == (True, True, 4.0)
    assert on.clip == pytest.approx(1.0 * math.sqrt(2))  # grad_clip x sqrt(ranks)
    off = create(from_args(["--compression", "topk", "--no-tensorboard", "--no-topk-momentum-correction",
                            "--no-topk-momentum-masking", "--no-topk-local-clip", "--topk-warmup-epochs", "0"]),
                 Collective(2))
    assert (off.momentum_correction, off.momentum_masking, off.clip, off.warmup_epochs) == (False, False, 0.0, 0)
