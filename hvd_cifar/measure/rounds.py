"""Rounds and the machine's noise around each job.

    for k in range(1, repeats + 1):
        for config in rotated(configs, k - 1):      # no configuration always runs first
            with Disturbance() as noise:            # /proc/stat and the load around the job
                run(config)
            noise.figures   # {"steal_share", "foreign_cpus", "load_average"}; noise.disturbed

A job is *disturbed* when, while it ran, the hypervisor stole more than STEAL_SHARE of the
machine's CPU time, or processes other than the job's own used more than FOREIGN_CPUS cores on
average (this process's children are the job's: their CPU time comes from getrusage once they
are waited for). Linux only; elsewhere nothing is sampled and nothing is disturbed.
"""
from __future__ import annotations

import os
import resource
import time

STEAL_SHARE = 0.05   # of all CPUs' time while the job ran
FOREIGN_CPUS = 0.5   # cores' worth of CPU used by other processes, on average over the job


def rotated(items: list, k: int) -> list:
    """``items`` started at position ``k`` (mod its length): round k+1's order."""
    if not items:
        return []
    k %= len(items)
    return [*items[k:], *items[:k]]


def _proc_stat() -> tuple[float, float] | None:
    """(busy, steal) seconds of all CPUs since boot, or None where /proc/stat is unreadable."""
    try:
        with open("/proc/stat") as f:
            fields = [float(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0.0] * 8)[:8]
    return (user + nice + system + irq + softirq) / hz, steal / hz


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Disturbance:
    """Samples the machine around one job run as a child of this process (``with``)."""

    def __init__(self) -> None:
        self.figures: dict[str, float] = {}  # empty until a job ran inside ``with``, and where nothing was sampled

    def __enter__(self) -> "Disturbance":
        self.figures = {}
        self._stat, self._own, self._began = _proc_stat(), _children_cpu(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        after, elapsed = _proc_stat(), time.perf_counter() - self._began
        if self._stat is None or after is None or elapsed <= 0:
            return
        cpus = os.cpu_count() or 1
        busy, steal = (a - b for a, b in zip(after, self._stat))
        own = _children_cpu() - self._own
        self.figures = {"steal_share": steal / (elapsed * cpus),
                        "foreign_cpus": max(0.0, busy - own) / elapsed,
                        "load_average": os.getloadavg()[0]}

    @property
    def disturbed(self) -> bool:
        return bool(self.figures) and (self.figures["steal_share"] > STEAL_SHARE
                                       or self.figures["foreign_cpus"] > FOREIGN_CPUS)
