"""One results file per benchmark invocation: benchmarks/results/NAME.json (NAME-TAG.json with
--tag), the data every table in docs/ is rendered from (``python -m testbed.render_docs``).

    results = Results("sync_methods", args, FIGURES)        # command line, commit, date, machine, load
    results.plan(jobs=30, rounds=5)                         # each job's line: "round 2/5, job 7/30, about 6 min left"
    results.add(1, "horovod np=2", {"images_per_s": 155.0, "cpu_s_per_image": 0.0128})
    results.fail(2, "horovod np=2", "exit status 1; see OUT/horovod-np2-r2.log")
    results.derive("horovod / best other np=2", "ratio", lambda r: r["horovod np=2"]["images_per_s"] / ...)
    path = results.write()                                  # load after, summary, the file

A file holds: ``benchmark``, ``tag``, ``command`` (the argv that made it), ``commit`` (and
``dirty``: tracked files other than results files and docs differed from it, ``changed``: which), ``started_utc`` / ``finished_utc``, ``machine``
(host, CPU model, cores, Python, platform, load average before and after), ``settings`` (the
parsed options), ``figures`` (each figure's label, format, unit scale), ``rounds`` (every job:
round number, configuration, its raw figures, and for a job run through ``measure`` the machine's
noise around it: ``steal_share``, ``foreign_cpus``, ``disturbed``; a failed one with ``ok: false``
and its reason),
``summary``: per configuration and figure the median, the 95 % interval of the mean (low,
high), min, max, n and ``unstable`` over its rounds that did not fail (``stats.spread``), and
``code``, what the figures ran (``code_record``; only where the jobs ran through testbed.jobs,
which notes each): the modules of the package the jobs loaded, with the benchmark's own, each by
the hash of its code (hvd_cifar.runfolder.code), the benchmark script's hash, the Horovod build's
set of fixes, and the jobs whose code is not known (a training job that left no RUN/code.json,
a job run elsewhere that named no run folder). A
derived figure (a ratio of two configurations' figures) is computed per round, so it too has a
spread. Each job's line on stderr says where the benchmark is and about how long it has left
(``rounds.Progress``). No torch here.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from hvd_cifar.core.files import write_json
from hvd_cifar.measure.rounds import Disturbance, Progress
from hvd_cifar.runfolder import code
from hvd_cifar.measure.stats import interval_of, judge, spread

# The project checkout this package runs from (an editable install): where benchmarks/results is.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS_DIR = os.path.join(ROOT, "benchmarks", "results")
INSTALL_SCRIPT = "scripts/install.sh"  # builds Horovod with the set of fixes it names (HOROVOD_FIXES)


@dataclass
class Figure:
    """How a figure is shown: its header (with units), format spec and the unit it is divided by."""
    label: str
    fmt: str = ".3g"
    scale: float = 1.0


def add_options(p: argparse.ArgumentParser) -> None:
    """--tag and --results, which every benchmark that writes a results file takes."""
    p.add_argument("--tag", default="", help="results file NAME-TAG.json instead of NAME.json")
    p.add_argument("--results", default=RESULTS_DIR, help=f"folder of the results file (default {RESULTS_DIR})")


def file_name(benchmark: str, tag: str = "") -> str:
    return f"{benchmark}-{tag}.json" if tag else f"{benchmark}.json"


def stats(values: list[float]) -> dict:
    """A figure over its rounds (``stats.spread``): median, the mean's 95 % interval (low, high),
    min, max, n, and whether the rounds are unstable."""
    return spread(values)


def verdict(values: list[float], op: str, target: float) -> str:
    """A target against a figure's rounds, by their 95 % interval (``stats.interval_of``): ``met`` when the
    whole interval is on the right side, ``not met`` when it is wholly on the wrong side,
    ``unresolved`` when it holds the target (one round always: it has no spread). ``op``: ">="
    (higher is better) or "<="."""
    if not values:
        return "no rounds"
    return judge(interval_of(values), op, target)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def commit() -> tuple[str, list[str]]:
    """HEAD's short hash, and the tracked files that differ from it (uncommitted changes), the
    results files and docs left out: they are what a benchmark writes, not what it measures."""
    def git(*argv):
        return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout
    try:
        changed = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()]
        return git("rev-parse", "--short", "HEAD").strip() or "unknown", sorted(
            p for p in changed if not p.startswith(("benchmarks/results/", "docs/", "README.md")))
    except (OSError, subprocess.SubprocessError):
        return "unknown", []


def utc_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def plain(value: Any) -> Any:
    """A JSON-able copy of an option's value."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return str(value)


def horovod_fixes(root: str = ROOT) -> str:
    """The set of fixes scripts/install.sh builds Horovod with (its HOROVOD_FIXES); '' when it names none."""
    try:
        with open(os.path.join(root, INSTALL_SCRIPT)) as f:
            found = re.search(r"^HOROVOD_FIXES=(\S+)", f.read(), re.M)
    except OSError:
        return ""
    return found[1] if found else ""


# The jobs this process ran, as testbed.jobs notes them (``note_job``); a results file records
# the code of those that ran after it was made. None until ``track_jobs``: a process whose jobs
# run some other way (a sweep's) cannot tell what they ran, and its results files record none.
_jobs: list[dict] | None = None


def track_jobs() -> None:
    """Every job of this process will be noted (testbed.jobs, through which benchmarks run theirs)."""
    global _jobs
    if _jobs is None:
        _jobs = []


def note_job(label: str, run_dir: str | None = None, entry: str | None = None) -> None:
    """A job that ran: a training run (``run_dir``, its folder: its code.json), a program that
    records nothing itself (``entry``, its file: the modules it may import), or, with neither, a
    job whose code is not known."""
    track_jobs()
    _jobs.append({"label": label, "run_dir": run_dir,
                  "modules": code.imports_of(entry) if entry else code.read(run_dir) if run_dir else None})


def code_record(script: str, jobs: list[dict]) -> dict:
    """What a results file's figures ran: the union of the modules its ``jobs`` loaded (each
    training run's code.json, read again where it was not there when the job ended: a run
    resumed later) and this process's own, the code hash of the benchmark ``script`` (its path
    relative to the checkout), the Horovod build's fixes, and the jobs whose code is not known."""
    for job in jobs:
        if job["modules"] is None and job["run_dir"]:
            job["modules"] = code.read(job["run_dir"])
    path = os.path.join(ROOT, script)
    return {"modules": code.union([code.loaded(), *(j["modules"] for j in jobs if j["modules"] is not None)]),
            "script": {script: code.file_hash(path)} if script.endswith(".py") and os.path.isfile(path) else {},
            "horovod_fixes": horovod_fixes(), "jobs": len(jobs),
            "unrecorded": [j["label"] for j in jobs if j["modules"] is None]}


# Seeds by role, kept apart: defaults are chosen on tuning seeds and judged on evaluation seeds
# only. A results file of runs by seed names the role of its seeds (Results.seeds).
SEED_ROLES = {"tuning": range(100, 200), "evaluation": range(200, 300)}


def seed_role(seeds: list[int]) -> str:
    """The role of ``seeds``: all tuning or all evaluation; a mix, or a seed outside both, is an
    error (a judgement on the seeds something was tuned on judges nothing)."""
    roles = {role for seed in seeds for role, span in SEED_ROLES.items() if seed in span}
    if len(roles) != 1 or any(not any(s in span for span in SEED_ROLES.values()) for s in seeds):
        raise ValueError(f"seeds {seeds}: give tuning seeds ({SEED_ROLES['tuning'].start}-"
                         f"{SEED_ROLES['tuning'].stop - 1}) or evaluation seeds ({SEED_ROLES['evaluation'].start}-"
                         f"{SEED_ROLES['evaluation'].stop - 1}), not a mix")
    return roles.pop()


class Results:
    """The results file of one benchmark invocation, filled round by round."""

    def __init__(self, benchmark: str, args: argparse.Namespace, figures: dict[str, Figure],
                 argv: list[str] | None = None):
        sha, dirty = commit()
        skip = {"tag", "results"}
        self.path = os.path.join(getattr(args, "results", RESULTS_DIR), file_name(benchmark, getattr(args, "tag", "")))
        self.data = {
            "benchmark": benchmark, "tag": getattr(args, "tag", ""),
            "command": [os.path.relpath(sys.argv[0], ROOT) if sys.argv[0] else benchmark,
                        *(sys.argv[1:] if argv is None else argv)],
            "commit": sha, "dirty": bool(dirty), "changed": dirty, "started_utc": utc_now(), "finished_utc": "",
            "machine": {"host": platform.node(), "cpu_model": cpu_model(), "cores": os.cpu_count(),
                        "python": platform.python_version(), "platform": platform.platform(),
                        "load_average_before": list(os.getloadavg()), "load_average_after": None},
            "settings": {k: plain(v) for k, v in vars(args).items() if k not in skip},
            "figures": {key: asdict(f) for key, f in figures.items()},
            "rounds": [], "summary": {}}
        self.noise: dict = {}  # the last attempted job's (measure.rounds.Disturbance)
        self._jobs_from = len(_jobs or [])  # the jobs noted from here on are this file's
        self.progress = Progress(rounds=int(getattr(args, "repeats", 0) or 0))
        # False while the jobs run where this process cannot see them as its children (a namespace
        # cluster's hosts, Slurm): the sampler would count their CPU as other processes'.
        self.sample_noise = True

    def plan(self, jobs: int = 0, rounds: int = 0) -> None:
        """Say how many jobs (and rounds) follow, for the progress and time-left on each job's line
        (``self.progress.step``; ``attempt`` calls it)."""
        self.progress = Progress(jobs, rounds)

    def seeds(self, seeds: list[int]) -> None:
        """Name the seeds the rounds ran at, and their role (tuning or evaluation)."""
        self.data["seeds"] = {"role": seed_role(seeds), "seeds": list(seeds)}

    def add(self, round_no: int, config: str, figures: dict[str, float], **info: Any) -> None:
        """One job's raw figures (``info``: anything else worth keeping, not summarised); a figure
        that is None or NaN was not measured and is left out."""
        unknown = set(figures) - set(self.data["figures"])
        if unknown:
            raise ValueError(f"results: figures {sorted(unknown)} are not declared")
        self.data["rounds"].append({"round": round_no, "config": config, "ok": True,
                                    "figures": {k: float(v) for k, v in figures.items()
                                                if v is not None and v == v}, **info})  # None, NaN: not measured

    def fail(self, round_no: int, config: str, reason: str, **info: Any) -> None:
        """A job that failed: kept, with why, and left out of the summary."""
        self.data["rounds"].append({"round": round_no, "config": config, "ok": False, "reason": reason,
                                    "figures": {}, **info})

    def attempt(self, round_no: int, config: str, job: Callable[[], Any]) -> Any:
        """``job()`` (one job of round ``round_no``), or, when it raises what a failed job raises,
        None and a failed round of ``config`` with the error's first line."""
        start = time.perf_counter()
        noise = Disturbance()
        try:
            if self.sample_noise:
                with noise:
                    done = job()
            else:
                done = job()
        except (RuntimeError, OSError, KeyError, ValueError, ZeroDivisionError, StopIteration,
                subprocess.SubprocessError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            print(f"{config} round {round_no}: failed: {reason} ({self.progress.step(round_no)})",
                  file=sys.stderr, flush=True)
            self.fail(round_no, config, reason)
            return None
        self.noise = {**noise.figures, "disturbed": noise.disturbed} if noise.figures else {}
        print(f"{config} round {round_no}: done in {time.perf_counter() - start:.0f} s"
              f"{' (disturbed)' if self.noise.get('disturbed') else ''}; {self.progress.step(round_no)}",
              file=sys.stderr, flush=True)
        return done

    def measure(self, round_no: int, config: str, job: Callable[[], dict]) -> dict | None:
        """``attempt`` a job that returns its figures, and keep them; the figures or None."""
        figures = self.attempt(round_no, config, job)
        if figures is not None:
            self.add(round_no, config, figures, **self.noise)
        return figures

    def measure_rows(self, round_no: int, label: str, job: Callable[[], list[dict]],
                     config_of: Callable[[dict], str]) -> list[dict]:
        """``attempt`` a job that returns rows (``label`` names it if it fails): each row becomes
        configuration ``config_of(row)`` of the round, with the declared figures it holds; the
        rows, or [] when the job failed."""
        rows = self.attempt(round_no, label, job) or []
        for row in rows:
            self.add(round_no, config_of(row), {k: row[k] for k in self.data["figures"] if k in row}, **self.noise)
        return rows

    def derive(self, config: str, figure: str, compute: Callable[[dict[str, dict]], float],
               rounds: list[int] | None = None) -> None:
        """A figure computed in every round (or in ``rounds``) from that round's figures
        (``compute`` gets config -> figures of the round's jobs that did not fail); a round where it
        cannot be computed (a job it needs failed) is a failed round of ``config``."""
        if figure not in self.data["figures"]:
            raise ValueError(f"results: figure {figure!r} is not declared")
        every = sorted({r["round"] for r in self.data["rounds"] if not r.get("derived")})
        for k in every if rounds is None else rounds:
            mine = [r for r in self.data["rounds"] if r["round"] == k and not r.get("derived")]
            ok = {r["config"]: r["figures"] for r in mine if r["ok"]}
            try:
                value = compute(ok)
            except (KeyError, ValueError, ZeroDivisionError) as exc:
                failed = ", ".join(r["config"] for r in mine if not r["ok"]) or "none"
                self.fail(k, config, f"cannot be computed ({type(exc).__name__}: {exc}); failed jobs: {failed}",
                          derived=True)
                continue
            self.data["rounds"].append({"round": k, "config": config, "ok": True, "derived": True,
                                        "figures": {figure: float(value)}})

    def summarize(self) -> dict:
        summary: dict[str, dict] = {}
        for r in self.data["rounds"]:
            summary.setdefault(r["config"], {})
        for config, figures in summary.items():
            good = [r["figures"] for r in self.data["rounds"] if r["config"] == config and r["ok"]]
            for key in dict.fromkeys(k for f in good for k in f):
                figures[key] = stats([f[key] for f in good if key in f])
        return summary

    def write(self) -> str:
        """Finish (load average after, end date, summary) and write the file; its path."""
        self.data["finished_utc"] = utc_now()
        self.data["machine"]["load_average_after"] = list(os.getloadavg())
        self.data["summary"] = self.summarize()
        if _jobs is not None:
            self.data["code"] = code_record(self.data["command"][0], _jobs[self._jobs_from:])
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        write_json(self.path, self.data)
        print(f"results: {self.path}", file=sys.stderr, flush=True)
        return self.path

