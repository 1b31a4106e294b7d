"""Bytes on the wire, in one place and without torch: what one rank sends per collective. The
sync methods count their traffic with these, the compression schemes theirs, and the scaling
model (hvd_cifar/analysis/scaling.py) times the same bytes."""
from __future__ import annotations

FP32_BYTES = 4
FP16_BYTES = 2
INDEX_BYTES = 4  # top-k's indices cross the wire as int32


def gradient_bytes(numel: int, fp16: bool, element_size: int = FP32_BYTES) -> int:
    """Bytes of a gradient of ``numel`` elements as it crosses the wire: 2 an element with fp16
    compression, else the element's own size."""
    return numel * (FP16_BYTES if fp16 else element_size)


def ring_allreduce_bytes(size: int, payload: int) -> int:
    """Bytes one rank sends in a ring allreduce of ``payload`` bytes over ``size`` ranks:
    reduce-scatter, then allgather, each moving (N-1)/N of the payload."""
    return int(round(2 * (size - 1) / size * payload)) if size > 1 else 0


def allgather_bytes(size: int, contribution: int) -> int:
    """Bytes one rank sends in a ring allgather where each rank contributes ``contribution``
    bytes: it forwards every other rank's part once, and its own."""
    return (size - 1) * contribution


def gather_scatter_root_bytes(size: int, payload: int) -> int:
    """Bytes the root of a gather/scatter average sends: the mean to each of the N-1 others (it
    receives as many buffers in the gather); every other rank sends and receives one buffer."""
    return (size - 1) * payload
