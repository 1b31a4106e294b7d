"""What each scheme sends, from the parameters' shapes alone (no torch): the counts the schemes
report as their payload (powersgd.py, topk.py, localsgd.py) and the collectives of one update
(their ``plan`` in registry.py), which the scaling model times
(hvd_cifar.analysis.scaling.predict_step)."""
from __future__ import annotations

import math

from hvd_cifar.core.wire import FP32_BYTES, INDEX_BYTES, allgather_bytes

# The schemes' byte-shaping settings by default (registry.py makes them config keys).
POWERSGD_RANK = 4         # PowerSGD's columns of P and Q (rank 2 lost accuracy at 4 ranks in runs of 66 updates)
TOPK_FRACTION = 0.004     # top-k's share sent after its warm-up (99.6 % sparsity): 50x fewer bytes than a ring
                          # allreduce at 4 ranks, and DGC's 0.001 lagged in runs of a few hundred updates
TOPK_MIN_ENTRIES = 4096   # top-k averages a smaller matrix whole, as it does the vectors (docs/COMM_OPTIONS.md)
WARMUP_START_FRACTION = 0.25  # top-k's share in its sparsity warm-up's first epoch (DGC: 75 % sparsity)
# PowerSGD sends a matrix whole unless r·(rows + cols) times this is below rows·cols (PyTorch's
# PowerSGDState.min_compression_rate, whose default it is).
MIN_COMPRESSION_RATE = 2.0


def matrix_shape(shape: tuple[int, ...], rank: int, min_rate: float = MIN_COMPRESSION_RATE) -> tuple[int, int] | None:
    """(rows, cols) PowerSGD compresses a gradient of ``shape`` as, or None when it is sent
    whole: a vector, or a matrix whose compression rate rows·cols / (r·(rows + cols)) is not
    above ``min_rate`` (PyTorch's PowerSGDState.min_compression_rate, the same test)."""
    if len(shape) < 2:
        return None
    rows, cols = shape[0], math.prod(shape[1:])
    return (rows, cols) if rank * (rows + cols) * min_rate < rows * cols else None


def powersgd_parts(shapes: list[tuple[int, ...]], rank: int,
                   min_rate: float = MIN_COMPRESSION_RATE) -> tuple[int, int, int]:
    """Bytes of PowerSGD's three allreduces per update: every P (rows x r), every Q (cols x r)
    and the gradients sent whole, fp32."""
    p = q = whole = 0
    for shape in shapes:
        matrix = matrix_shape(tuple(shape), rank, min_rate)
        if matrix:
            p, q = p + matrix[0] * rank * FP32_BYTES, q + matrix[1] * rank * FP32_BYTES
        else:
            whole += math.prod(shape) * FP32_BYTES
    return p, q, whole


def powersgd_payload(shapes: list[tuple[int, ...]], rank: int, min_rate: float = MIN_COMPRESSION_RATE) -> int:
    return sum(powersgd_parts(shapes, rank, min_rate))


def kept(numel: int, fraction: float) -> int:
    """Entries of a tensor of ``numel`` that one rank sends under top-k."""
    return min(numel, max(1, math.ceil(fraction * numel)))


def topk_fraction_at(epoch: int, fraction: float, warmup_epochs: float) -> float:
    """The share of each tensor top-k sends in ``epoch`` (0-based): Deep Gradient Compression's
    sparsity warm-up, from WARMUP_START_FRACTION down to ``fraction`` geometrically over
    ``warmup_epochs`` epochs, then ``fraction`` (W = 4, f = 0.001: 0.25, 0.063, 0.016, 0.004, 0.001,
    the paper's 75 %, 93.75 %, 98.4 %, 99.6 % and 99.9 % sparsity)."""
    if epoch >= warmup_epochs or fraction >= WARMUP_START_FRACTION:
        return fraction
    return WARMUP_START_FRACTION * (fraction / WARMUP_START_FRACTION) ** (epoch / warmup_epochs)


def topk_sparse(shape: tuple[int, ...], min_entries: int = TOPK_MIN_ENTRIES) -> bool:
    """Whether top-k sends a gradient of ``shape`` sparse: a matrix of at least ``min_entries``
    entries. Vectors (biases, BatchNorm's) and smaller matrices are averaged whole."""
    return len(shape) > 1 and math.prod(shape) >= min_entries


def topk_parts(shapes: list[tuple[int, ...]], fraction: float,
               min_entries: int = TOPK_MIN_ENTRIES) -> tuple[int, int]:
    """Bytes of one rank's top-k update: (what it contributes to the allgathers, fp32 values and
    int32 indices of the kept entries of every gradient sent sparse; the rest averaged whole in
    fp32)."""
    sparse = [tuple(s) for s in shapes if topk_sparse(tuple(s), min_entries)]
    whole = sum(math.prod(s) for s in shapes if not topk_sparse(tuple(s), min_entries))
    return sum(kept(math.prod(s), fraction) for s in sparse) * (FP32_BYTES + INDEX_BYTES), whole * FP32_BYTES


def localsgd_payload(numel: int, every: int) -> int:
    """The fp32 model averaged once every ``every`` updates: its bytes per update, amortised."""
    return round(numel * FP32_BYTES / every)


def powersgd_plan(shapes: list[tuple[int, ...]], rank: int, min_rate: float) -> list[tuple[str, int, float]]:
    """PowerSGD's update: three allreduces (every P, every Q, the gradients sent whole)."""
    return [("allreduce", part, 1.0) for part in powersgd_parts(shapes, rank, min_rate) if part]


def topk_plan(shapes: list[tuple[int, ...]], fraction: float, min_entries: int) -> list[tuple[str, int, float]]:
    """top-k's update: the kept values and their indices gathered, the rest averaged whole."""
    sparse, whole = topk_parts(shapes, fraction, min_entries)
    entries = sparse // (FP32_BYTES + INDEX_BYTES)
    return [("allgather", entries * FP32_BYTES, 1.0), ("allgather", entries * INDEX_BYTES, 1.0),
            *([("allreduce", whole, 1.0)] if whole else [])]


def localsgd_plan(shapes: list[tuple[int, ...]], every: int) -> list[tuple[str, int, float]]:
    """Local SGD: the fp32 model averaged in one allreduce, once every ``every`` updates."""
    return [("allreduce", sum(math.prod(s) for s in shapes) * FP32_BYTES, 1 / every)]


def allgather_s(n: int, contribution: int, link) -> float:
    """Ring allgather of ``contribution`` bytes from each of ``n`` ranks over ``link`` (a
    hvd_cifar.analysis.scaling.Link): N-1 steps, one message each: τ + (N-1)·α + (N-1)·c/β."""
    if n <= 1:
        return 0.0
    return link.per_op_s + (n - 1) * link.alpha_s + allgather_bytes(n, contribution) / link.beta_bytes_per_s
