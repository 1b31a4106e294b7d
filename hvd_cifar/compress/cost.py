"""What each scheme sends, from the parameters' shapes alone (no torch): the counts the schemes
report as their payload (powersgd.py, topk.py, localsgd.py) and the collectives of one update,
which the scaling model times (hvd_cifar.scaling.predict_step)."""
from __future__ import annotations

import math

from hvd_cifar.compress import FP32_BYTES, INDEX_BYTES, allgather_bytes


def matrix_shape(shape: tuple[int, ...], rank: int) -> tuple[int, int] | None:
    """(rows, cols) PowerSGD compresses a gradient of ``shape`` as, or None when it is sent
    whole: a vector, or a matrix whose two factors would be no smaller than itself."""
    if len(shape) < 2:
        return None
    rows, cols = shape[0], math.prod(shape[1:])
    return (rows, cols) if rank * (rows + cols) < rows * cols else None


def powersgd_parts(shapes: list[tuple[int, ...]], rank: int) -> tuple[int, int, int]:
    """Bytes of PowerSGD's three allreduces per update: every P (rows x r), every Q (cols x r)
    and the gradients sent whole, fp32."""
    p = q = whole = 0
    for shape in shapes:
        matrix = matrix_shape(tuple(shape), rank)
        if matrix:
            p, q = p + matrix[0] * rank * FP32_BYTES, q + matrix[1] * rank * FP32_BYTES
        else:
            whole += math.prod(shape) * FP32_BYTES
    return p, q, whole


def powersgd_payload(shapes: list[tuple[int, ...]], rank: int) -> int:
    return sum(powersgd_parts(shapes, rank))


def kept(numel: int, fraction: float) -> int:
    """Entries of a tensor of ``numel`` that one rank sends under top-k."""
    return min(numel, max(1, math.ceil(fraction * numel)))


def topk_payload(numels: list[int], fraction: float) -> int:
    """Bytes one rank contributes per top-k update: fp32 values and int32 indices of its kept entries."""
    return sum(kept(n, fraction) for n in numels) * (FP32_BYTES + INDEX_BYTES)


def localsgd_payload(numel: int, every: int) -> int:
    """The fp32 model averaged once every ``every`` updates: its bytes per update, amortised."""
    return round(numel * FP32_BYTES / every)


def collectives(compression: str, local_sgd_steps: int, shapes: list[tuple[int, ...]],
                powersgd_rank: int = 2, topk_fraction: float = 0.01) -> list[tuple[str, int, float]] | None:
    """One update's collectives under a scheme, as (kind, bytes, share): ``allreduce`` (bytes:
    the buffer) or ``allgather`` (bytes: one rank's part), run in ``share`` of the updates (local
    SGD: 1/H). None without a scheme (the sync method's own allreduce, fp16 or not)."""
    if local_sgd_steps > 1:
        return [("allreduce", sum(math.prod(s) for s in shapes) * FP32_BYTES, 1 / local_sgd_steps)]
    if compression == "powersgd":
        return [("allreduce", part, 1.0) for part in powersgd_parts(shapes, powersgd_rank) if part]
    if compression == "topk":
        entries = sum(kept(math.prod(s), topk_fraction) for s in shapes)
        return [("allgather", entries * FP32_BYTES, 1.0), ("allgather", entries * INDEX_BYTES, 1.0)]
    return None


def allgather_s(n: int, contribution: int, link) -> float:
    """Ring allgather of ``contribution`` bytes from each of ``n`` ranks over ``link`` (a
    hvd_cifar.scaling.Link): N-1 steps, one message each: τ + (N-1)·α + (N-1)·c/β."""
    if n <= 1:
        return 0.0
    return link.per_op_s + (n - 1) * link.alpha_s + allgather_bytes(n, contribution) / link.beta_bytes_per_s


def label(compression: str, local_sgd_steps: int = 1, powersgd_rank: int = 2, topk_fraction: float = 0.01) -> str:
    """A scheme and its setting in a table's cell: none, fp16, powersgd r=2, topk f=0.01, local SGD H=4."""
    if local_sgd_steps > 1:
        return f"local SGD H={local_sgd_steps}"
    return {"powersgd": f"powersgd r={powersgd_rank}", "topk": f"topk f={topk_fraction:g}"}.get(compression, compression)
