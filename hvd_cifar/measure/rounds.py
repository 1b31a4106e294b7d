"""Rounds and the machine's noise around each job.

    for k in range(1, repeats + 1):
        for config in rotated(configs, k - 1):      # no configuration always runs first
            with Disturbance() as noise:            # /proc/stat and the load around the job
                run(config)
            noise.figures   # {"steal_share", "foreign_cpus", "load_average"}; noise.disturbed

    progress = Progress(jobs=30, rounds=5)         # or Progress(rounds=5): the jobs of round 1 counted
    progress.step(round_no=2)   # after a job: "round 2/5, job 7/30, about 6 min left"

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


class Progress:
    """Where a benchmark is and about how long it has left, from its jobs' times so far (the
    mean job so far, times the jobs left). Without ``jobs``, the total is round 1's jobs times
    ``rounds``, known once round 2 starts; a round number lower than the last starts a new pass
    (another set of rounds), counted afresh."""

    def __init__(self, jobs: int = 0, rounds: int = 0, clock=time.perf_counter) -> None:
        self.jobs, self.rounds, self._clock = jobs, rounds, clock
        self._began, self.done, self._first_round, self._last_round = clock(), 0, 0, 0

    def step(self, round_no: int | None = None) -> str:
        """Count one finished job (of round ``round_no``); the line saying where things stand."""
        if round_no is not None and round_no < self._last_round:  # a new pass
            self._began, self.done, self._first_round, self.jobs = self._clock(), 0, 0, 0
        self._last_round = round_no or self._last_round
        self.done += 1
        self._first_round += round_no == 1
        total = self.jobs or (self._first_round * self.rounds if round_no and round_no > 1 else 0)
        where = [f"round {round_no}/{self.rounds}" if round_no and self.rounds else
                 f"round {round_no}" if round_no else "", f"job {self.done}/{total}" if total else f"job {self.done}"]
        if total:
            where.append(left_words((self._clock() - self._began) / self.done * max(0, total - self.done)))
        return ", ".join(w for w in where if w)


def left_words(seconds: float) -> str:
    if seconds <= 0:
        return "nothing left"
    if seconds < 60:
        return "under a minute left"
    minutes = round(seconds / 60)
    return f"about {minutes} min left" if minutes < 90 else f"about {minutes / 60:.1f} h left"
