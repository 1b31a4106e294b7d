"""Fault drill: every bad input and every rank kill that the reliability guarantees cover, run
for real with the shipped launchers and timed.

    .venv/bin/python benchmarks/reliability.py [--only bad-inputs|kills|preemptions] [--match TEXT ...] [--out DIR]
        [--tag TAG] [--results benchmarks/results]

--match runs only the bad inputs whose name holds TEXT (rows keep their numbers in the table).

Bad inputs: each case is one real command (``mpirun -np 2`` of the trainer unless the case is
about another launcher) given one mistake. A case passes when the command exits non-zero
within BAD_INPUT_BOUND_S, stderr holds no Python traceback, and exactly one line comes from
hvd_cifar (``hvd_cifar: error: ...``): one line from one rank. mpirun's own note that a process
exited non-zero is counted apart (``launcher lines``); it is not ours to silence.

Kills: for each launcher and sync method, a 2-rank job on the tiny config is started, and once
its first epoch is written one rank (rank 0, then rank 1 in a second job) gets SIGKILL. A kill
passes when the launcher exits non-zero within KILL_BOUND_S of the signal and, a second later,
no rank of the job is left running.

Preemptions: a 2-rank job on the tiny config gets a stop signal once its first epoch is written,
through the launcher (SIGUSR1, which mpirun passes on) or straight to one or both ranks
(SIGTERM, as a scheduler's preemption). It passes when the job exits 4 within PREEMPT_BOUND_S
with one line from hvd_cifar, one ``preempted`` event and no rank left, and ``--resume`` under
the same launcher finishes the run.

Output: the results file benchmarks/results/reliability.json (hvd_cifar.measure.results: every case a
configuration of one round, its seconds; a case that did not pass is a failed round with why;
per group the cases that passed and the slowest), three Markdown tables (printed, and
OUT/reliability.md) and OUT/reliability.json with every case's exit code, seconds, and stderr. Each case works in its own folder under OUT.
The cases and their pass criteria are testbed.drill's; this script runs them all and writes
the tables. The tests take them from there too: tests/test_bad_inputs.py (the config errors
in-process, the rest launched), tests/test_reliability.py the kills, tests/test_preemption.py the
preemptions under horovodrun.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from testbed import drill
from testbed.drill import BAD_INPUT_BOUND_S, BAD_INPUTS, KILL_BOUND_S, KILL_JOBS, PREEMPT_BOUND_S, PREEMPT_JOBS
from hvd_cifar.analysis.tabulate import Column, markdown_table, num
from hvd_cifar.core.files import write_json, write_text
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options
from hvd_cifar.measure.rounds import Progress

FIGURES = {"seconds": Figure("seconds to exit", ".1f"), "passed": Figure("passed", ".0f"),
           "cases": Figure("cases", ".0f"), "slowest_s": Figure("slowest (s)", ".1f")}
GROUPS = {"bad_inputs": "bad input", "kills": "kill", "preemptions": "preemption"}


def verdict(r: dict) -> str:
    return "yes" if r["ok"] else "NO: " + r["why"]


def seconds_or_dash(r: dict) -> str:
    return "-" if r["seconds"] is None else f"{r['seconds']:.1f}"


def as_is(header: str, key: str) -> Column:
    """A numeric column shown as it is, None too (a job that never exited)."""
    return Column(header, key, numeric=True, row_fmt=lambda r: str(r[key]))


PASS = Column("pass", "ok", row_fmt=verdict)
BAD_INPUT_COLUMNS = [
    as_is("#", "number"), Column("bad input", "case"), as_is("exit", "exit"), num("seconds", "seconds", ".1f"),
    Column("the one line from hvd_cifar", "line", row_fmt=lambda r: f"`{r['line']}`"),
    as_is("launcher lines", "other_lines"), PASS]
KILL_COLUMNS = [
    Column("launcher", "launcher"), Column("sync", "sync"), as_is("rank killed", "victim"), as_is("exit", "exit"),
    Column("seconds to exit", "seconds", numeric=True, row_fmt=seconds_or_dash), as_is("ranks left", "orphans"), PASS]
PREEMPT_COLUMNS = [
    Column("launcher", "launcher"), Column("sync", "sync"), Column("signal to", "target"), Column("signal", "signal"),
    as_is("exit", "exit"), Column("seconds to exit", "seconds", numeric=True, row_fmt=seconds_or_dash),
    Column("stopped after", "stopped"), as_is("resume exit", "resume_exit"), PASS]


def table(columns: list[Column], rows: list[dict]) -> str:
    return markdown_table(columns, rows).rstrip("\n")


def slowest(rows: list[dict]) -> float:
    return max((r["seconds"] for r in rows if r["seconds"] is not None), default=float("nan"))


def chosen_bad_inputs(match: list[str]) -> list[tuple]:
    """(number, case) of the bad inputs whose name holds one of ``match`` (all without)."""
    return [(i, case) for i, case in enumerate(BAD_INPUTS, 1) if not match or any(t in case.name for t in match)]


def planned(args) -> int:
    """The cases this invocation runs (for its progress lines)."""
    return ((len(chosen_bad_inputs(args.match)) if args.only in (None, "bad-inputs") else 0)
            + (2 * len(KILL_JOBS) if args.only in (None, "kills") else 0)
            + (len(PREEMPT_JOBS) if args.only in (None, "preemptions") else 0))


def run_bad_inputs(rows: list[dict], work: Path, match: list[str], progress: Progress) -> list[str]:
    """The bad inputs whose name holds one of ``match`` (all without), appended to ``rows``; the
    table and its summary."""
    cases = chosen_bad_inputs(match)
    for i, case in cases:
        rows.append({"number": i, **drill.run_bad_input(case, work / f"bad-{i:02d}")})
        print(f"bad input {i}/{len(BAD_INPUTS)}: {case.name}: {'ok' if rows[-1]['ok'] else rows[-1]['why']}; "
              f"{progress.step()}", flush=True)
    return [table(BAD_INPUT_COLUMNS, rows), "",
            f"bad inputs: {sum(r['ok'] for r in rows)} of {len(cases)} passed (one line from hvd_cifar, no "
            f"traceback, exit != 0 within {BAD_INPUT_BOUND_S:.0f} s); slowest {slowest(rows):.1f} s", ""]


def run_kills(rows: list[dict], work: Path, progress: Progress) -> list[str]:
    """Rank 0, then rank 1, of every job of KILL_JOBS, appended to ``rows``; the table and its summary."""
    for launcher, sync in KILL_JOBS:
        for victim in (0, 1):
            rows.append(drill.kill_drill(launcher, sync, victim, work))
            r = rows[-1]
            print(f"kill rank {victim} of {launcher} {sync}: exit {r['exit']} after {r['seconds']} s"
                  f"{'' if r['ok'] else ': ' + r['why']}; {progress.step()}", flush=True)
    return [table(KILL_COLUMNS, rows), "",
            f"kills: {sum(r['ok'] for r in rows)} of {len(rows)} ended the job non-zero within {KILL_BOUND_S:.0f} s "
            f"with no rank left running; slowest {slowest(rows):.1f} s", ""]


def run_preemptions(rows: list[dict], work: Path, progress: Progress) -> list[str]:
    """Every job of PREEMPT_JOBS, appended to ``rows``; the table and its summary."""
    for job in PREEMPT_JOBS:
        rows.append(drill.preempt_drill(*job, work))
        r = rows[-1]
        print(f"preempt {' '.join(job)}: exit {r['exit']} after {r['seconds']} s, resumed: {r['resume_exit']}"
              f"{'' if r['ok'] else ': ' + r['why']}; {progress.step()}", flush=True)
    return [table(PREEMPT_COLUMNS, rows), "", f"preemptions: {sum(r['ok'] for r in rows)} of {len(rows)} exited 4 "
            f"within {PREEMPT_BOUND_S:.0f} s with a checkpoint and resumed to the end; slowest {slowest(rows):.1f} s", ""]


def case_name(group: str, r: dict) -> str:
    if group == "bad_inputs":
        return f"bad input {r['number']:02d}: {r['case']}"
    if group == "kills":
        return f"kill rank {r['victim']} of {r['launcher']} {r['sync']}"
    return f"preemption: {r['signal']} to {r['target']} of {r['launcher']} {r['sync']}"


def record(results: Results, report: dict) -> None:
    """Every case as one round of its own configuration (a failed one with why), then per group
    the cases that passed, the cases run and the slowest exit."""
    for group, prefix in GROUPS.items():
        rows = report[group]
        for r in rows:
            name = case_name(group, r)
            if r["ok"]:
                results.add(1, name, {"seconds": r["seconds"]})
            else:
                results.fail(1, name, r["why"] or f"exit {r['exit']}", seconds=r["seconds"])
        if rows:
            results.add(1, f"{prefix}s", {"passed": sum(r["ok"] for r in rows), "cases": len(rows),
                                          "slowest_s": slowest(rows)})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("bad-inputs", "kills", "preemptions"))
    p.add_argument("--match", nargs="+", default=[], metavar="TEXT",
                   help="only the bad inputs whose name holds one of these")
    p.add_argument("--out", default=None, help="work folder (default: a new temporary folder)")
    add_results_options(p)
    args = p.parse_args(argv)
    results = Results("reliability", args, FIGURES, argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="hvd_cifar-reliability-"))
    out.mkdir(parents=True, exist_ok=True)
    report = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": platform.platform(),
              "cpus": os.cpu_count(), "load_start": os.getloadavg()[0], "bad_inputs": [], "kills": [],
              "preemptions": []}
    text, progress = [], Progress(jobs=planned(args))
    if args.only in (None, "bad-inputs"):
        text += run_bad_inputs(report["bad_inputs"], out, args.match, progress)
    if args.only in (None, "kills"):
        text += run_kills(report["kills"], out / "kills", progress)
    if args.only in (None, "preemptions"):
        text += run_preemptions(report["preemptions"], out / "preemptions", progress)
    report["load_end"] = os.getloadavg()[0]
    report["ended"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    write_json(str(out / "reliability.json"), report)
    record(results, report)
    results.write()
    write_text(str(out / "reliability.md"), "\n".join(text))
    print("\n" + "\n".join(text))
    print(f"load average {report['load_start']:.2f} at the start, {report['load_end']:.2f} at the end; "
          f"details in {out}/reliability.json")
    ok = all(r["ok"] for r in report["bad_inputs"] + report["kills"] + report["preemptions"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
