"""PowerSGD's state as PyTorch's PowerSGDState has it (hvd_cifar/compress/powersgd.py): the
minimum compression rate, warm start, error feedback on and off and the start iteration, each on
a hand-made example that fails without it (the config's refusals: tests/test_dgc.py)."""
import torch

from test_compression import FakeCollective, World, on_ranks, param
from hvd_cifar.core import cost
from hvd_cifar.compress.powersgd import PowerSGD


def alone():
    return FakeCollective(World(1), 0)


def test_a_matrix_not_above_the_minimum_compression_rate_is_sent_whole_with_the_vectors():
    """(10, 16) at r = 2: rate 160 / (2 x 26) = 3.08. Compressed at a minimum of 2 (P and Q,
    then the bias whole); whole, in the bias's allreduce, at 4 (exactly as sent)."""
    g = torch.randn(10, 16, generator=torch.Generator().manual_seed(0))
    for min_rate, names, sent in ((2.0, ["powersgd.whole", "powersgd.P", "powersgd.Q"], (10 + 16) * 2 + 10),
                                  (4.0, ["powersgd.whole"], 160 + 10)):
        collective = FakeCollective(World(1), 0)
        scheme = PowerSGD(collective, rank=2, min_rate=min_rate)
        weight, bias = param("w", g), param("b", torch.ones(10))
        scheme.track([weight, bias])
        scheme.synchronize()
        assert collective.names == names
        assert scheme.payload_bytes([weight, bias]) == sent * 4 == cost.powersgd_payload([(10, 16), (10,)], 2, min_rate)
        if min_rate == 4.0:
            assert torch.equal(weight[1].grad, g)


def test_warm_start_makes_repeated_steps_converge_to_the_best_rank_r_approximation():
    """The same gradient every update, without error feedback: with Q kept between updates the
    power iteration goes on and P Q^T approaches the best rank-2 approximation (the SVD's); with a
    new random Q every update each approximation is one power step from scratch, and worse."""
    gen = torch.Generator().manual_seed(3)
    g = torch.randn(30, 20, generator=gen)
    u, s, vh = torch.linalg.svd(g)
    best = (g - u[:, :2] @ torch.diag(s[:2]) @ vh[:2]).norm()
    errors = {}
    for warm in (True, False):
        scheme, (name, p) = PowerSGD(alone(), rank=2, error_feedback=False, warm_start=warm), param("w", g)
        scheme.track([(name, p)])
        for _ in range(30):
            p.grad = g.clone()
            scheme.synchronize()
        errors[warm] = (g - p.grad).norm()
        assert (name in scheme.qs) == warm and not scheme.errors
    assert errors[True] < 1.01 * best < 0.95 * errors[False]


def test_without_warm_start_every_rank_draws_the_same_new_q():
    def work(collective, rank):
        scheme, (name, p) = PowerSGD(collective, rank=1, warm_start=False), param("w", torch.ones(4, 5) * (rank + 1))
        scheme.track([(name, p)])
        qs = []
        for _ in range(2):
            qs.append(scheme.q(name, p.grad.reshape(4, -1)))
            scheme.synchronize()
        return qs

    (a1, a2), (b1, b2) = on_ranks(2, work)
    assert torch.equal(a1, b1) and torch.equal(a2, b2) and not torch.equal(a1, a2)


def test_error_feedback_off_keeps_no_error_and_the_applied_sum_drifts():
    """The full-rank gradient of test_compression's error-feedback test, at r = 1, 100 updates:
    with error feedback the sum applied tracks 100 G; without, it misses most of G every time."""
    g = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    drift = {}
    for feedback in (True, False):
        scheme, (name, p) = PowerSGD(alone(), rank=1, error_feedback=feedback), param("w", g)
        scheme.track([(name, p)])
        applied = torch.zeros_like(g)
        for _ in range(100):
            p.grad = g.clone()
            scheme.synchronize()
            applied += p.grad
        drift[feedback] = ((applied - 100 * g).norm() / (100 * g).norm()).item()
        assert bool(scheme.errors) == feedback
    assert drift[True] < 0.05 < 0.3 < drift[False]


def test_before_the_start_iteration_every_gradient_is_allreduced_and_no_error_is_kept():
    """start_powerSGD_iter = 2: updates 1 and 2 are the plain mean on both ranks, with no error
    (error feedback starts at the third), then compressed."""
    grads = [torch.randn(6, 5, generator=torch.Generator().manual_seed(r)) for r in range(2)]

    def work(collective, rank):
        scheme, (name, p) = PowerSGD(collective, rank=1, warmup_steps=2), param("w", grads[rank])
        scheme.track([(name, p)])
        seen = []
        for _ in range(3):
            p.grad = grads[rank].clone()
            scheme.synchronize()
            seen.append((p.grad.clone(), dict(scheme.errors)))
        return seen, collective.names

    (seen, names), _ = on_ranks(2, work)
    mean = (grads[0] + grads[1]) / 2
    for averaged, errors in seen[:2]:
        assert torch.allclose(averaged, mean) and not errors
    assert not torch.allclose(seen[2][0], mean) and "w" in seen[2][1]
    assert names == ["powersgd.warmup", "powersgd.warmup", "powersgd.P", "powersgd.Q"]
