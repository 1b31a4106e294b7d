"""What a sweep (``hvd_cifar.bench``) has finished, kept in OUT/sweep-state.json after every job
(written whole: core.files), so that a sweep stopped by a signal, a closed session or a crash
continues from there (``python -m hvd_cifar.bench --resume OUT``, or the same command into the
same --out): the options it was started with, every finished job's row, the compute setting it
holds across its jobs and the time it ran.

    state = SweepState.begin(out, argv, settings)   # OUT's state when it is this sweep's, else a new one
    progress = Progress(state, keys, same_compute=True, run=lambda cfg, k, seed, held: ...)
    row, earlier = progress.job(cfg, k, seed)       # the job finished before (earlier), or run now
    jobs.append(row); progress.keep(jobs)           # the compute setting to hold, the state saved
    partial_rounds(jobs, configs, keys)             # the rounds a configuration's job is missing from

A job stopped part-way (the signal came while it ran) has no row and runs again. Anything in the
file that is not what this module wrote is a ReportError naming the file.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from hvd_cifar.core.errors import ReportError
from hvd_cifar.core.files import write_json

FILE = "sweep-state.json"
VERSION = 1


def plain(value: Any) -> Any:
    """``value`` as JSON reads it back (tuples as lists), so that settings compare as saved."""
    return json.loads(json.dumps(value))


@dataclass
class SweepState:
    out: str | None                # the sweep's folder; None: kept in memory only
    argv: list[str]                # the options the sweep was started with
    settings: dict                 # the parsed options that make it this sweep (not --out, --resume)
    jobs: list[dict] = field(default_factory=list)  # every finished job's row, in the order run
    compute: str | None = None     # the setting held across the jobs; "": none to hold; None: undecided
    compute_from: str = ""         # the job whose compute: auto chose it
    elapsed_s: float = 0.0         # the sweep's time so far, over every start

    @staticmethod
    def begin(out: str, argv: list[str], settings: dict) -> "SweepState":
        """OUT's state when it holds this sweep (the same settings), a new one when it holds none;
        a ReportError when it holds another sweep's."""
        state = read(out)
        if state is None:
            return SweepState(out, list(argv), plain(settings))
        if state.settings != plain(settings):
            differ = sorted(k for k in {*state.settings, *plain(settings)}
                            if state.settings.get(k) != plain(settings).get(k))
            raise ReportError(f"--out: {out} holds another sweep (started with other {', '.join(differ)}); "
                              f"give another --out, or --resume {out} to continue that one")
        return state

    def save(self, jobs: list[dict], elapsed_s: float) -> None:
        self.jobs, self.elapsed_s = list(jobs), elapsed_s
        if self.out is not None:
            write_json(path(self.out), {"version": VERSION, "argv": self.argv, "settings": self.settings,
                                        "compute": self.compute, "compute_from": self.compute_from,
                                        "elapsed_s": elapsed_s, "jobs": self.jobs})


def path(out: str) -> str:
    return os.path.join(out, FILE)


def read(out: str) -> SweepState | None:
    """OUT's saved state; None when there is none. A file that is not one is a ReportError."""
    file = path(out)
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ReportError(f"{file}: cannot be read ({str(exc).splitlines()[0]})") from None
    if lacks := _lacks(data):
        raise ReportError(f"{file}: not a sweep's state ({lacks})")
    return SweepState(out, data["argv"], data["settings"], data["jobs"], data["compute"], data["compute_from"],
                      float(data["elapsed_s"]))


def _lacks(data: Any) -> str:
    """What ``data`` lacks to be a saved state ('' when it is one)."""
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return f"needs a mapping with version {VERSION}"
    if not isinstance(data.get("argv"), list) or not all(isinstance(a, str) for a in data["argv"]):
        return "argv: needs a list of strings"
    if not isinstance(data.get("settings"), dict):
        return "settings: needs a mapping"
    if not (data.get("compute") is None or isinstance(data["compute"], str)) or not isinstance(
            data.get("compute_from"), str):
        return "compute, compute_from: need a setting's name or null"
    if isinstance(data.get("elapsed_s"), bool) or not isinstance(data.get("elapsed_s"), (int, float)):
        return "elapsed_s: needs a number"
    jobs = data.get("jobs")
    if not isinstance(jobs, list):
        return "jobs: needs a list"
    for i, job in enumerate(jobs, 1):
        if not (isinstance(job, dict) and isinstance(job.get("round"), int) and isinstance(job.get("status"), str)
                and isinstance(job.get("run"), str)):
            return f"job {i}: needs a mapping with an integer round, a status and a run"
    return ""


class Finished:
    """The jobs a sweep finished before, by (round, configuration, whether it was a disturbed
    job's repeat): each taken once, in place of running it again."""

    def __init__(self, jobs: list[dict], keys: tuple):
        self.keys = keys
        self.rows: dict[tuple, list[dict]] = {}
        for job in jobs:
            self.rows.setdefault(self._key(job["round"], job, bool(job.get("again"))), []).append(job)

    def _key(self, k: int, cfg: dict, again: bool) -> tuple:
        return k, json.dumps([cfg.get(key) for key in self.keys]), again

    def take(self, k: int, cfg: dict, again: bool) -> dict | None:
        """Round ``k``'s finished job of ``cfg`` (its repeat, with ``again``), or None."""
        rows = self.rows.get(self._key(k, cfg, again))
        if not rows:
            return None
        row = dict(rows.pop(0))
        row.pop("superseded", None)  # set again when its repeat is taken
        return row


class Progress:
    """A sweep's jobs as its rounds ask for them: the one a resumed sweep finished before, else run
    by ``run(cfg, k, seed, held)`` (``held``: the trainer flags of the compute setting the sweep
    holds); the run names taken; the state kept after every job. ``same_compute``: hold the
    setting compute: auto chose in the first job that finishes (bench's --same-compute)."""

    def __init__(self, state: SweepState, keys: tuple, same_compute: bool,
                 run: Callable[[dict, int, int | None, list[str]], dict]):
        self.state, self.same_compute, self.run = state, same_compute, run
        self.finished = Finished(state.jobs, keys)
        self.taken = {job["run"] for job in state.jobs}
        self.began = time.monotonic() - state.elapsed_s

    def spent(self) -> float:
        """Seconds the sweep has run, over every start."""
        return time.monotonic() - self.began

    def job(self, cfg: dict, k: int, seed: int | None, again: bool = False) -> tuple[dict, bool]:
        """Round ``k``'s job of ``cfg`` (``again``: a disturbed job's repeat) and whether it
        finished before: then its row, else the job run now with the compute setting held."""
        row = self.finished.take(k, cfg, again)
        if row is not None:
            return row, True
        held = ["--compute", self.state.compute] if self.state.compute else []
        row = self.run(cfg, k, seed, held)
        return ({**row, "again": True} if again else row), False

    def keep(self, jobs: list[dict]) -> None:
        """After a job: the compute setting to hold once the first job finished, and the state."""
        row = jobs[-1]
        if self.state.compute is None and self.same_compute and row.get("status") == "ok":
            self.state.compute = row.get("compute", "") if row.get("compute_auto") else ""
            self.state.compute_from = row["run"]
            if self.state.compute:
                print(f"bench: compute: auto chose {self.state.compute} in {row['run']}; the other jobs run with "
                      f"--compute {self.state.compute} (--same-compute false: each decides for itself)", flush=True)
        self.state.save(jobs, self.spent())


def partial_rounds(jobs: list[dict], configs: list[dict], keys: tuple) -> list[int]:
    """The rounds that lack a job of some configuration (the sweep stopped during them)."""
    have: dict[int, set[str]] = {}
    for job in jobs:
        have.setdefault(job["round"], set()).add(json.dumps([job.get(key) for key in keys]))
    every = {json.dumps([cfg.get(key) for key in keys]) for cfg in configs}
    return sorted(k for k, seen in have.items() if every - seen)
