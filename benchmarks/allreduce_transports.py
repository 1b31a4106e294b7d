"""One allreduce, four transports: how fast each sync method's collective moves a gradient-sized
buffer across the namespace cluster, with nothing else running. Separates the transport from
everything a training step adds (backward, overlap, skew between ranks, negotiation).

    .venv/bin/python benchmarks/allreduce_transports.py [--hosts 4] [--rate 1gbit]
        [--elements 9231114] [--iters 8] [--rounds 2] [--out logs/bench-allreduce-YYYYmmdd-HHMMSS]

As root (network namespaces). One ``testbed.netcluster`` cluster of --hosts hosts, links shaped
to --rate both ways, one rank per host, one torch thread per rank. Each transport is one job
whose ranks each allreduce (sum, in place) a float32 tensor of --elements elements --iters
times, a barrier before each, set up by the sync method's own code (``hvd_cifar.sync.make``),
so with the settings training runs use (Open MPI's yield and ring rules, Horovod's 5 ms cycle):

  mpi-allreduce     mpi4py ``Allreduce(IN_PLACE)``: Open MPI's ring over its TCP transport (mpirun)
  horovod           ``hvd.allreduce_`` under mpirun: Horovod's negotiation, then Open MPI's allreduce
  horovod-gloo      ``hvd.allreduce_`` under ``horovodrun --gloo``: Horovod's own Gloo allreduce
  ddp               ``torch.distributed.all_reduce`` over Gloo, DDP's collective (mpirun)

Per transport: the fastest and the median of the timed iterations (the first is warm-up, left
out) over --rounds rounds (rotated order), and the payload rate, 2(N-1)/N x bytes x 8 / time,
which a ring at line rate brings to the link rate. Every job is a round of the results file
benchmarks/results/allreduce_transports.json (``hvd_cifar.measure.results``: --tag, --results); the
table and the samples also go to OUT/allreduce_transports.json and .md, then printed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

from testbed import jobs
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options
from hvd_cifar.analysis.tabulate import Column, markdown_table, num
from hvd_cifar.launch.commands import ROOT

TRANSPORTS = ("mpi-allreduce", "horovod", "horovod-gloo", "ddp")
VGG11_PARAMETERS = 9_231_114  # what one training step allreduces for vgg11 (36.9 MB of fp32)
FIGURES = {"fastest_s": Figure("fastest (s)", ".3f"), "median_s": Figure("median (s)", ".3f"),
           "gbit_s": Figure("payload Gbit/s (fastest)", ".3f")}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=4, help="hosts, one rank each (2..16)")
    p.add_argument("--rate", default="1gbit", help="link rate, tc syntax, both directions")
    p.add_argument("--elements", type=int, default=VGG11_PARAMETERS, help="float32 elements per allreduce")
    p.add_argument("--iters", type=int, default=8, help="allreduces per job; the first is warm-up")
    p.add_argument("--rounds", type=int, default=2, help="jobs per transport; every timed iteration counts")
    p.add_argument("--only", nargs="+", choices=TRANSPORTS, default=list(TRANSPORTS))
    jobs.add_options(p, timeout=300)
    add_results_options(p)
    p.add_argument("--out", default=os.path.join(ROOT, "logs", time.strftime("bench-allreduce-%Y%m%d-%H%M%S")))
    args = p.parse_args(argv)
    if not 2 <= args.hosts <= 16:
        p.error(f"--hosts: {args.hosts} is outside 2..16")
    if args.elements < 1 or args.iters < 2 or args.rounds < 1:
        p.error("--elements must be >= 1, --iters >= 2, --rounds >= 1")
    return args


# --- one rank ---------------------------------------------------------------------------------
def worker(method: str, elements: int, iters: int) -> None:
    """Run on every rank: time ``iters`` allreduces; rank 0 prints one JSON line."""
    import torch

    import hvd_cifar.sync as sync
    from hvd_cifar.core import lifecycle

    torch.set_num_threads(1)
    impl = sync.make("horovod" if method.startswith("horovod") else method)
    tensor = torch.ones(elements)
    if method.startswith("horovod"):
        import horovod.torch as hvd

        def allreduce():
            hvd.allreduce_(tensor, op=hvd.Sum, name="bench.allreduce")
    elif method == "ddp":
        import torch.distributed as dist

        def allreduce():
            dist.all_reduce(tensor)
    else:
        buffer = tensor.numpy()

        def allreduce():
            impl.comm.Allreduce(impl.MPI.IN_PLACE, buffer, op=impl.MPI.SUM)
    seconds = []
    for _ in range(iters):
        impl.allreduce_sum(torch.zeros(1))  # a barrier: every rank starts the allreduce together
        start = time.perf_counter()
        allreduce()
        seconds.append(time.perf_counter() - start)
    # Every element went through `iters` sums of `size` ones each: a check that it really reduced.
    expected = float(impl.size ** iters)
    if not torch.all(tensor == expected):
        raise SystemExit(f"allreduce gave {tensor[0].item()} instead of {expected}")
    if impl.rank == 0:
        print("RESULT " + json.dumps({"method": method, "size": impl.size, "seconds": seconds[1:]}), flush=True)
    impl.close()
    lifecycle.exit_process(0, impl.leaves_threads_running)  # as train.py ends: DDP's Gloo threads outlive its process group


# --- the driver -------------------------------------------------------------------------------
def run_one(cluster, method: str, args) -> dict:
    program = [cluster.python, os.path.abspath(__file__), "_worker", method, str(args.elements), str(args.iters)]
    if method == "horovod-gloo":
        argv = cluster.horovodrun_argv(args.hosts, [], gloo=True, program=program)
    else:
        argv = cluster.mpirun_argv(args.hosts, [], program=program)
    done = jobs.run(method, lambda: cluster.exec(0, argv, timeout=args.timeout))
    lines = [line for line in done.stdout.splitlines() if "RESULT " in line]
    if not lines:
        raise jobs.JobError(method, done.code, None, "no RESULT line in its output:\n" + done.stdout)
    return json.loads(lines[0].split("RESULT ", 1)[1])


def timing(seconds: list[float], payload_bits: float) -> dict:
    """The fastest and median of timed allreduces, and the payload rate of the fastest."""
    return {"fastest_s": min(seconds), "median_s": statistics.median(seconds),
            "gbit_s": payload_bits / min(seconds) / 1e9}


def table(rows: list[dict], args, link_bits: float) -> str:
    mb = args.elements * 4 / 1e6
    ddp = next((r for r in rows if r["method"] == "ddp"), None)
    columns = [Column("transport", "method"), num("fastest (s)", "fastest_s", ".3f"), num("median (s)", "median_s", ".3f"),
               num("payload Gbit/s (fastest)", "gbit_s", ".3f"),
               Column("of link rate", "gbit_s", numeric=True, row_fmt=lambda r: f"{r['gbit_s'] * 1e9 / link_bits:.2f}"),
               Column("median / ddp median", "median_s", numeric=True,
                      row_fmt=lambda r: f"{r['median_s'] / ddp['median_s']:.2f}" if ddp else "-")]
    return (f"allreduce of {args.elements:,} float32 ({mb:.1f} MB), {args.hosts} hosts, one rank each, "
            f"links {args.rate}; payload rate = 2(N-1)/N x bytes x 8 / time\n\n" + markdown_table(columns, rows).rstrip("\n"))


@jobs.one_line_errors("hvd_cifar")
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_worker"]:
        worker(argv[1], int(argv[2]), int(argv[3]))
        return 0
    args = parse_args(argv)
    from testbed.netcluster import NetCluster, parse_rate

    os.makedirs(args.out, exist_ok=True)
    span = jobs.Span()
    results = Results("allreduce_transports", args, FIGURES, argv)
    results.sample_noise = False  # its jobs run on a cluster's hosts, not as this process's children
    payload_bits = 2 * (args.hosts - 1) / args.hosts * args.elements * 4 * 8
    samples: dict[str, list[float]] = {m: [] for m in args.only}
    with NetCluster(args.hosts, rate=args.rate) as cluster:
        for k in range(args.rounds):
            for method in jobs.rotated(args.only, k):
                got = results.attempt(k + 1, method, lambda: run_one(cluster, method, args))
                if got is None:
                    continue
                samples[method] += got["seconds"]
                results.add(k + 1, method, timing(got["seconds"], payload_bits), samples_s=got["seconds"])
    results.write()
    samples = {m: s for m, s in samples.items() if s}
    if not samples:
        raise RuntimeError("every job failed; see the results file's rounds")
    rows = [{"method": m, **timing(s, payload_bits), "samples_s": s} for m, s in samples.items()]
    text = table(rows, args, parse_rate(args.rate))
    meta = span.end(machine=f"{os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}",
                    args=vars(args))
    jobs.write_results(args.out, "allreduce_transports", {"meta": meta, "rows": rows}, text)
    print(f"\n{span.line()}")
    return 0 if all(r["ok"] for r in results.data["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
