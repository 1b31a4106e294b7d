"""A host that drops off the network mid-epoch: seconds from its link going down to hvd_cifar's
line naming it, to the launcher's end, and to the last process of the job gone from both hosts,
at the default ``liveness_timeout_s`` (30 s), for Horovod under horovodrun (MPI mode) and DDP
under mpirun.

    .venv/bin/python benchmarks/host_loss.py [--rounds 3] [--timeout-s 30] [--out DIR] [--tag TAG]

As root (network namespaces). One testbed.netcluster cluster of 2 hosts, unshaped; each round
runs both methods, in an order that rotates: a 2-rank job of configs/tiny.yaml whose host 1
``ip link set eth0 down`` once its first epoch is written, judged by testbed.host_loss (one line
naming the host and rank, the launcher non-zero, nothing of the job left, a ``host_lost``
event), then, the link back up, ``--resume`` under the same launcher for one more epoch. A job
that does not pass is a failed round of the results file (benchmarks/results/host_loss.json,
``hvd_cifar.measure.results``) with why; OUT/host_loss.json keeps every job's line and output.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from hvd_cifar.analysis.tabulate import Column, markdown_table, num
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options
from testbed import host_loss, jobs
from testbed.netcluster import NetCluster

FIGURES = {"line_s": Figure("link down to the line (s)", ".1f"),
           "exit_s": Figure("to the launcher's end (s)", ".1f"),
           "clear_s": Figure("to the last process gone (s)", ".1f")}
COLUMNS = [Column("round", "round", numeric=True), Column("method", "method"), Column("launcher", "launcher"),
           num("line (s)", "line_s", ".1f"), num("launcher ended (s)", "exit_s", ".1f"),
           num("all gone (s)", "clear_s", ".1f"), Column("exit", "exit", numeric=True, row_fmt=lambda r: str(r["exit"])),
           Column("resumed", "resume_exit", numeric=True, row_fmt=lambda r: str(r.get("resume_exit"))),
           Column("pass", "ok", row_fmt=lambda r: "yes" if r["ok"] else "NO: " + r["why"])]


def config_name(method: str) -> str:
    return f"{method} ({host_loss.LAUNCHER[method]})"


def one_job(cluster: NetCluster, method: str, work: Path, timeout_s: float) -> dict:
    """The drill, then (the link back up) the resume; the row of both, judged."""
    row = host_loss.cut_host(cluster, method, work, timeout_s)
    row.update(host_loss.resume(cluster, method, work) if row["events"] else {"resume_exit": None})
    if row["resume_exit"] != 0:
        row.update(ok=False, why="; ".join(filter(None, [row["why"], f"--resume exited {row['resume_exit']}"])))
    return row


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="jobs per method (default 3)")
    p.add_argument("--timeout-s", type=float, default=30.0, help="liveness_timeout_s of the jobs (default 30, the default)")
    p.add_argument("--out", default=None, help="work folder (default: a new temporary folder)")
    add_results_options(p)
    args = p.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="hvd_cifar-host-loss-"))
    out.mkdir(parents=True, exist_ok=True)
    results = Results("host_loss", args, FIGURES, argv)
    results.sample_noise = False  # its jobs run on the cluster's hosts
    span, rows = jobs.Span(), []
    with NetCluster(n_hosts=2, rate=None) as cluster:
        for k in range(1, args.rounds + 1):
            for method in jobs.rotated(list(host_loss.METHODS), k):
                try:
                    row = one_job(cluster, method, out / f"{method}-r{k}", args.timeout_s)
                except (RuntimeError, OSError, subprocess.SubprocessError) as exc:  # the job never got going
                    row = {"method": method, "launcher": host_loss.LAUNCHER[method], "ok": False,
                           "why": str(exc).splitlines()[0], "line_s": None, "exit_s": None, "clear_s": None,
                           "exit": None}
                rows.append({"round": k, **row})
                print(f"round {k} {method}: line {row['line_s']} s, launcher ended {row['exit_s']} s, all gone "
                      f"{row['clear_s']} s, resumed {row['resume_exit']}{'' if row['ok'] else ': ' + row['why']}",
                      flush=True)
                if row["ok"]:
                    results.add(k, config_name(method), {key: row[key] for key in FIGURES}, line=row["line"])
                else:
                    results.fail(k, config_name(method), row["why"], **{key: row[key] for key in FIGURES})
    results.write()
    jobs.write_results(str(out), "host_loss", {"meta": span.end(args=vars(args)), "rows": rows},
                       markdown_table(COLUMNS, rows))
    print(f"\n{span.line()}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
