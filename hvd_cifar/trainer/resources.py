"""What a rank's process, and its host, used during an epoch's training: CPU, memory, GPU memory.

Every rank measures itself (``ResourceMeter``), over the same window as the NIC counters (the
epoch's training pass); one rank per host also measures the host's CPUs. The per-rank figures
reach rank 0 packed into the epoch-end allreduce that already sums the phase times: each rank
fills its own slot of a ``world size x RANK_FIELDS`` vector and leaves the others 0, so the sum
holds every rank's figures and no collective is added. The host's figure travels with the NIC
counters' allgather. CPU percentages count one busy core as 100 (like top): a rank running two
threads flat out shows 200.
"""
from __future__ import annotations

import resource
import sys
import time

import psutil
import torch

from hvd_cifar.core.names import HOST_FIELD, RANK_FIELDS  # the keys this module fills

# ru_maxrss is in KiB on Linux and in bytes on macOS.
MAXRSS_BYTES = 1 if sys.platform == "darwin" else 1024


def host_busy_s() -> float:
    """CPU seconds the host's CPUs were busy since boot, all CPUs together (psutil's rule:
    everything but idle and I/O wait; guest time is already inside user time)."""
    t = psutil.cpu_times()
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    return total - t.idle - getattr(t, "iowait", 0.0)


def process_cpu_s(process: psutil.Process | None = None) -> float:
    """CPU seconds this process used so far, user and system, all threads."""
    t = (process or psutil.Process()).cpu_times()
    return t.user + t.system


def per_image(cpu_s: float, images: float, rank: int, size: int) -> torch.Tensor:
    """This rank's CPU seconds per trained image in its own slot of a zero ``size`` vector, for
    the epoch-end allreduce (like ``pack``)."""
    vector = torch.zeros(size, dtype=torch.float64)
    vector[rank] = cpu_s / images if images else 0.0
    return vector


class ResourceMeter:
    """This process's CPU time, memory and peak GPU memory between ``start()`` and ``stop()``;
    with ``host=True`` (one rank per host) also the host's busy CPU time."""

    def __init__(self, device: torch.device, host: bool):
        self.cuda = device.type == "cuda"
        self.device, self.host = device, host
        self.process = psutil.Process()
        self._start = (0.0, 0.0, 0.0)

    def _cpu_s(self) -> float:
        return process_cpu_s(self.process)

    def start(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self._start = (time.perf_counter(), self._cpu_s(), host_busy_s() if self.host else 0.0)

    def stop(self) -> tuple[list[float], float | None]:
        """(this rank's RANK_FIELDS (the GPU's 0 on CPU), the host's CPU percent or None)."""
        wall = max(time.perf_counter() - self._start[0], 1e-9)
        rss = self.process.memory_info().rss
        # The kernel's high-water mark can lag a fresh rss reading by a page or two.
        peak = max(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * MAXRSS_BYTES)
        figures = [100 * (self._cpu_s() - self._start[1]) / wall, float(rss), float(peak),
                   float(torch.cuda.max_memory_allocated(self.device)) if self.cuda else 0.0]
        host = 100 * (host_busy_s() - self._start[2]) / wall if self.host else None
        return figures, host


def pack(figures: list[float], rank: int, size: int) -> torch.Tensor:
    """This rank's figures in its own slot of a zero ``size x RANK_FIELDS`` vector (float64: bytes
    stay exact up to 2^53), for the epoch-end allreduce to sum into every rank's figures."""
    vector = torch.zeros(size, len(RANK_FIELDS), dtype=torch.float64)
    vector[rank] = torch.tensor(figures, dtype=torch.float64)
    return vector.flatten()


def record(summed: torch.Tensor, size: int, cuda: bool, per_host: dict[str, float]) -> dict:
    """The metrics line's resource figures from the summed vector: ``{field: {rank: value}}``
    (ranks as strings, as JSON keys are), and the host CPU percent per host name."""
    rows = summed.view(size, len(RANK_FIELDS)).tolist()
    fields = RANK_FIELDS if cuda else RANK_FIELDS[:-1]
    whole = lambda field, v: int(v) if field.endswith("_bytes") else v  # noqa: E731 - bytes are counts
    out = {field: {str(rank): whole(field, rows[rank][j]) for rank in range(size)} for j, field in enumerate(fields)}
    out[HOST_FIELD] = per_host
    return out
