"""The model's network equations checked where they can be here: α and β fitted by the probe at
np=2 on the namespace cluster predict the allreduce and gather/scatter times the probe measures
at np=3 and 4 (one rank per host, links shaped), per transport and message size.

    .venv/bin/python benchmarks/network_validation.py [--rates 1gbit 100mbit none] [--iters 4]
        [--min-bytes 1000000] [--max-bytes 0] [--out logs/bench-netval-YYYYmmdd-HHMMSS]

As root (network namespaces). Per rate: one testbed.netcluster cluster of 4 hosts, and
``python -m hvd_cifar.probe`` under mpirun at np 2, 3 and 4 (mpi-allreduce, mpi-p2p,
mpi-gather-scatter, torch-gloo, horovod-mpi). Predicted: hvd_cifar.analysis.scaling's equation of each
transport with the np=2 probe's fit (gather/scatter: the mpi-p2p link and the root's measured
sum cost, as predict uses them); measured: the np=3/4 probe's median. Only the network: the
training step's compute is not in it (4 ranks on this machine's 2 cores would not have the
compute an np=1 run measured; see docs/SCALING.md). Writes OUT/network_validation.json (every
probe whole) and .md, then prints the table; every row, as a configuration of one round, also
goes to the results file benchmarks/results/network_validation.json (``hvd_cifar.measure.results``: --tag,
--results), a rate whose cluster or probes failed as a failed round with its reason.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from hvd_cifar.analysis import scaling

from testbed import jobs
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options
from hvd_cifar.analysis.tabulate import Column, markdown_table, num
from hvd_cifar.launch.commands import ROOT

# transport whose time is predicted -> (the np=2 transport whose fit predicts it, equation)
# (Horovod's: horovod-gloo across hosts, where hvd_cifar runs Gloo's operations, else horovod-mpi;
# a transport the probes lack is left out)
CHECKS = {"mpi-allreduce": ("mpi-allreduce", "ring"), "horovod-mpi": ("horovod-mpi", "ring"),
          "horovod-gloo": ("horovod-gloo", "ring"),
          "torch-gloo": ("torch-gloo", "ring"), "mpi-gather-scatter": ("mpi-p2p", "gather-scatter")}
# the table: one row per (rate, transport, np, message size)
COLUMNS = [Column("rate", "rate"), Column("transport", "transport"), Column("np", "np", numeric=True),
           num("message (MB)", "bytes", ".2f", 1e6), num("predicted (ms)", "predicted_s", ".1f", 1e-3),
           num("measured (ms, median)", "measured_s", ".1f", 1e-3), num("error (%)", "error_pct", "+.1f")]
FIGURES = {"predicted_s": Figure("predicted (ms)", ".1f", 1e-3), "measured_s": Figure("measured (ms, median)", ".1f", 1e-3),
           "error_pct": Figure("error (%)", "+.1f")}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", nargs="+", default=["1gbit", "100mbit", "none"], help="link rates, tc syntax; none: unshaped")
    p.add_argument("--nps", type=int, nargs="+", default=[3, 4], help="world sizes predicted from np=2")
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--sizes", type=int, default=jobs.PROBE_SIZES)
    p.add_argument("--min-bytes", type=int, default=jobs.PROBE_MIN_BYTES)
    p.add_argument("--max-bytes", type=int, default=0, help="default: vgg11's fp32 gradient")
    p.add_argument("--report-from", type=int, default=1_000_000, help="table rows: sizes from this many bytes")
    jobs.add_options(p, timeout=900)
    add_results_options(p)
    p.add_argument("--out", default=os.path.join(ROOT, "logs", time.strftime("bench-netval-%Y%m%d-%H%M%S")))
    return p.parse_args(argv)


def run_probe(cluster, n: int, args, out: str) -> dict:
    return jobs.probe(cluster, n, out, iters=args.iters, timeout=args.timeout, max_bytes=args.max_bytes,
                      sizes=args.sizes, min_bytes=args.min_bytes)


def config(row: dict) -> str:
    """A row's name in the results file."""
    return f"{row['rate']} {row['transport']} np={row['np']} {row['bytes'] / 1e6:.2f} MB"


def measure(rate: str, args) -> list[dict]:
    """The probes at np 2 and each of --nps on a fresh cluster shaped to ``rate``; the rows."""
    from testbed.netcluster import NetCluster
    with NetCluster(max(args.nps), rate=None if rate == "none" else rate) as cluster:
        probes = {n: run_probe(cluster, n, args, os.path.join(args.out, f"probe-{rate}-np{n}.json"))
                  for n in [2, *args.nps]}
    return compare(rate, probes, args)


def compare(rate: str, probes: dict[int, dict], args) -> list[dict]:
    """One row per (transport, np, size): the np=2 fit's prediction against the measured median."""
    base, rows = probes[2], []
    for name, (source, equation) in CHECKS.items():
        if source not in base["transports"]:
            continue
        fit = base["transports"][source]
        link = scaling.Link(fit["alpha_s"], fit["beta_bytes_per_s"], base["reduce_s_per_byte"], per_op_s=fit["per_op_s"])
        for n in args.nps:
            measured = probes[n]["transports"][name]
            for size, median in zip(measured["sizes_bytes"], measured["median_s"]):
                if size < args.report_from:
                    continue
                model = scaling.ring_s if equation == "ring" else scaling.gather_scatter_s
                predicted = model(n, size, link)
                rows.append({"rate": rate, "transport": name, "np": n, "bytes": size, "predicted_s": predicted,
                             "measured_s": median, "error_pct": 100 * (predicted - median) / median})
    return rows


@jobs.one_line_errors("hvd_cifar")
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    span, rows = jobs.Span(), []
    results = Results("network_validation", args, FIGURES, argv)
    results.sample_noise = False  # its jobs run on a cluster's hosts, not as this process's children
    for rate in args.rates:
        rows += results.measure_rows(1, rate, lambda: measure(rate, args), config)
    results.write()
    meta = span.end(args=vars(args))
    jobs.write_results(args.out, "network_validation", {"meta": meta, "rows": rows}, markdown_table(COLUMNS, rows))
    print(f"\n{span.line()}")
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
