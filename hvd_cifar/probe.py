"""Time allreduce on your hosts over each transport hvd_cifar can use there, fit latency α and
bandwidth β per transport, and write probe.json (raw timings and fits) for hvd_cifar.predict.

Launched like training, on the same hostfile (``--probe``: the launch scripts run this module
instead of the trainer; its flags follow):

    launch/mpirun.sh -np 4 -hostfile hostfiles/example-cluster --probe --out probe.json
    launch/horovodrun.sh -np 4 -hostfile hostfiles/example-cluster --probe --out probe-mpi.json
    launch/horovodrun.sh -np 4 -hostfile hostfiles/example-cluster --gloo --probe --out probe-gloo.json
    horovodrun -np 2 -H localhost:2 .venv/bin/python -m hvd_cifar.probe --max-bytes 1000000 --iters 3

The launcher decides what there is to time. Under MPI (mpirun, horovodrun's default MPI mode):
``mpi-allreduce`` (mpi4py Allreduce), ``mpi-p2p`` (one-way Send/Recv between rank 0 and the last
rank, gather/scatter's messages), ``mpi-intra-host`` (Allreduce among one host's ranks, when
hosts hold several), ``horovod-mpi`` and ``torch-gloo`` (DDP's collective). Under
``horovodrun --gloo``: ``horovod-gloo`` and ``torch-gloo``. To have both Horovod transports, run
the probe once with each launcher and pass either file to predict.

Each message size (geometric, --min-bytes to --max-bytes, default the model's fp32 gradient) is
timed --iters times after one warm-up, each time after a 1-element allreduce that starts the
ranks together; rank 0's times are recorded. The fit is least squares on the medians
(hvd_cifar.analysis.scaling.fit_transport). Also timed on rank 0: summing two buffers
(``reduce_s_per_byte``) and fp32 -> fp16 -> fp32 (``cast_s_per_byte``, printed as this host's
figure: the prediction times fp16's casts in its own process, as a scheme's compute).
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

import torch

from hvd_cifar.analysis import scaling
from hvd_cifar.analysis.tabulate import OneLineParser
from hvd_cifar.core import launcher, lifecycle, units
from hvd_cifar.runfolder import writer


def size(text: str) -> int:
    try:
        return units.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(prog="python -m hvd_cifar.probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="probe.json", help="where rank 0 writes the result")
    p.add_argument("--model", default="vgg11", help="whose fp32 gradient size is the largest message")
    p.add_argument("--min-bytes", type=size, default=4096, help="smallest message (4096, 4KiB, 1e4)")
    p.add_argument("--max-bytes", type=size, default=0, help="largest message (e.g. 25MB); default: the model's gradient bytes")
    p.add_argument("--sizes", type=int, default=8, help="message sizes, geometric from min to max")
    p.add_argument("--iters", type=int, default=5, help="timed repetitions per size (after one warm-up)")
    args = p.parse_args(argv)
    if args.min_bytes < 4 or args.sizes < 2 or args.iters < 1 or (args.max_bytes and args.max_bytes <= args.min_bytes):
        p.error("--min-bytes >= 4, --max-bytes > --min-bytes, --sizes >= 2, --iters >= 1")
    return args


def message_sizes(args: argparse.Namespace) -> list[int]:
    """Geometric from --min-bytes to --max-bytes, whole float32 elements."""
    top = args.max_bytes or scaling.profile(args.model, 10).payload_bytes(0, False)
    ratio = (top / args.min_bytes) ** (1 / (args.sizes - 1))
    return sorted({max(1, round(args.min_bytes * ratio ** i / 4)) * 4 for i in range(args.sizes)})


def time_sizes(operation, barrier, sizes: list[int], iters: int) -> list[list[float]]:
    """Seconds of ``operation(tensor)`` per size, ``iters`` times each after one warm-up."""
    out = []
    for size in sizes:
        tensor = torch.ones(size // 4)
        seconds = []
        for i in range(iters + 1):
            barrier()
            start = time.perf_counter()
            operation(tensor)
            if i:
                seconds.append(time.perf_counter() - start)
        out.append(seconds)
    return out


def result(kind: str, ranks: int, scope: str, sizes: list[int], seconds: list[list[float]],
           reduce_s_per_byte: float = 0.0, per_op_s: float = 0.0) -> dict:
    """One transport's raw timings and its fit (allreduce: the ring equation; p2p: α + S/β;
    gather-scatter: its own equation, the root's sums at ``reduce_s_per_byte``)."""
    medians = [statistics.median(s) for s in seconds]
    link = scaling.fit_transport(kind, ranks, sizes, medians, reduce_s_per_byte, per_op_s)
    return {"kind": kind, "ranks": ranks, "scope": scope, "sizes_bytes": sizes, "seconds": seconds,
            "median_s": medians, "alpha_s": link.alpha_s, "beta_bytes_per_s": link.beta_bytes_per_s,
            "per_op_s": link.per_op_s}


# ----------------------------------------------------------------------------- the transports
def probe_mpi(sizes: list[int], iters: int, reduce_s_per_byte: float):
    """mpi4py's Allreduce over all ranks and inside each host, and point-to-point."""
    from hvd_cifar.sync import make
    mpi = make("mpi-allreduce")
    comm, MPI, hosts = mpi.comm, mpi.MPI, _hosts(mpi)
    out = {"mpi-allreduce": result("allreduce", mpi.size, _scope(hosts), sizes, time_sizes(
        lambda t: comm.Allreduce(MPI.IN_PLACE, t.numpy(), op=MPI.SUM), comm.Barrier, sizes, iters))}
    last = mpi.size - 1

    def ping_pong(t):  # rank 0 and the last rank; a round trip is two one-way messages
        if mpi.rank == 0:
            comm.Send(t.numpy(), dest=last)
            comm.Recv(t.numpy(), source=last)
        elif mpi.rank == last:
            comm.Recv(t.numpy(), source=0)
            comm.Send(t.numpy(), dest=0)
    round_trips = time_sizes(ping_pong, comm.Barrier, sizes, iters)
    out["mpi-p2p"] = result("p2p", 2, _scope(hosts), sizes, [[s / 2 for s in r] for r in round_trips])
    gather_scatter = gather_scatter_op()
    out["mpi-gather-scatter"] = result("gather-scatter", mpi.size, _scope(hosts), sizes,
                                       time_sizes(gather_scatter, comm.Barrier, sizes, iters), reduce_s_per_byte)
    if 1 < mpi.local_size < mpi.size:
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        out["mpi-intra-host"] = result("allreduce", mpi.local_size, "intra-host", sizes, time_sizes(
            lambda t: node.Allreduce(MPI.IN_PLACE, t.numpy(), op=MPI.SUM), comm.Barrier, sizes, iters))
        node.Free()
    return mpi, out


def gather_scatter_op():
    """mpi-gather-scatter's own averaging of a buffer the size of the tensor given (its buffers
    laid out once per size, as wrap() does per trainable set)."""
    from hvd_cifar.sync import make
    gs = make("mpi-gather-scatter")

    def average(t):
        if not gs.params or gs.params[0].numel() != t.numel():
            gs.wrap(None, None, [("probe", torch.nn.Parameter(t))], 1)
        gs.average()
    return average


def probe_torch_gloo(sizes: list[int], iters: int):
    """torch.distributed's Gloo allreduce, DDP's collective, set up as DDP sets it up."""
    import torch.distributed as dist
    from hvd_cifar.sync import make
    ddp = make("ddp")
    hosts = _hosts(ddp)
    barrier = lambda: ddp.allreduce_sum(torch.zeros(1))  # noqa: E731
    return ddp, {"torch-gloo": result("allreduce", ddp.size, _scope(hosts), sizes,
                                      time_sizes(dist.all_reduce, barrier, sizes, iters))}


def probe_horovod(sizes: list[int], iters: int):
    """Horovod's allreduce (its negotiation cycle included), over the controller it was given."""
    import horovod.torch as hvd
    from hvd_cifar.sync import make
    horovod = make("horovod")
    hosts = _hosts(horovod)
    name = "horovod-mpi" if hvd.mpi_enabled() else "horovod-gloo"
    op = lambda t: hvd.allreduce_(t, op=hvd.Sum, name=f"probe.{t.numel()}")  # noqa: E731
    barrier = lambda: horovod.allreduce_sum(torch.zeros(1))  # noqa: E731
    # Every collective waits for a negotiation cycle, however many ranks: a constant of its own,
    # not latency per ring step (fitted as such, it made np=3 twice as slow as measured).
    cycle_s = float(os.environ.get("HOROVOD_CYCLE_TIME", "5")) / 1000
    return horovod, {name: result("allreduce", horovod.size, _scope(hosts), sizes, time_sizes(op, barrier, sizes, iters),
                                  per_op_s=cycle_s)}


def _hosts(sync) -> int:
    return len(set(sync.allgather_object(socket.gethostname())))


def _scope(hosts: int) -> str:
    return "inter-host" if hosts > 1 else "intra-host"


def local_costs(size: int, repeats: int = 5) -> dict:
    """Rank 0's memory-bound work per byte: summing a buffer into another (gather/scatter's root
    does it N-1 times) and casting fp32 -> fp16 -> fp32 (per fp16 byte, both casts)."""
    a, b = torch.ones(size // 4), torch.ones(size // 4)
    add = min(_seconds(lambda: a.add_(b)) for _ in range(repeats))
    cast = min(_seconds(lambda: a.half().float()) for _ in range(repeats))
    return {"reduce_s_per_byte": add / size, "cast_s_per_byte": cast / size}


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ----------------------------------------------------------------------------- the run
def run_probe(args: argparse.Namespace) -> tuple[dict, object]:
    """Every transport this launch offers, one after the other: MPI first (so that mpi4py, not
    Horovod, initialises MPI and Horovod's shutdown leaves it up), then torch's Gloo, then
    Horovod. Returns the results and the last sync method (for the ranks and hosts)."""
    if launcher.launch_size() < 2:
        raise ValueError("probe: needs 2 or more ranks; launch it like training (see python -m hvd_cifar.probe --help)")
    sizes = message_sizes(args)
    costs = local_costs(sizes[-1])  # before any transport's threads compete for the cores
    mpi = lambda sizes, iters: probe_mpi(sizes, iters, costs["reduce_s_per_byte"])  # noqa: E731
    steps = ([mpi] if launcher.launched_by_mpi() else []) + [probe_torch_gloo, probe_horovod]
    transports, started = {}, []
    for step in steps:
        sync, found = step(sizes, args.iters)
        started.append(sync)
        transports.update(found)
    hostnames = started[-1].allgather_object(socket.gethostname())
    probe = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "world_size": started[-1].size,
             "hosts": sorted(set(hostnames)), "ranks_per_host": started[-1].local_size,
             "launcher": launcher.launcher_name(), "comm_settings": writer.comm_settings(),
             "sizes_bytes": sizes, "iters": args.iters, "transports": transports,
             **costs}
    for sync in reversed(started):
        sync.close()
    return probe, started


def summary(probe: dict) -> str:
    """The fits as a table (what probe.json holds, printed)."""
    lines = [f"{probe['world_size']} ranks on {len(probe['hosts'])} host(s) ({probe['launcher']}); "
             f"{len(probe['sizes_bytes'])} sizes {probe['sizes_bytes'][0]:,} to {probe['sizes_bytes'][-1]:,} bytes, "
             f"median of {probe['iters']}", "",
             "| transport | kind | ranks | scope | τ (ms) | α (µs) | β (MB/s) | β (Gbit/s) | largest message (ms, median) |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for name, t in probe["transports"].items():
        lines.append(f"| {name} | {t['kind']} | {t['ranks']} | {t['scope']} | {t['per_op_s'] * 1e3:g} | {t['alpha_s'] * 1e6:.1f} | "
                     f"{t['beta_bytes_per_s'] / 1e6:.1f} | {t['beta_bytes_per_s'] * 8 / 1e9:.3f} | {t['median_s'][-1] * 1e3:.2f} |")
    lines.append(f"\nsum: {probe['reduce_s_per_byte'] * 1e9:.3f} ns/byte; fp32->fp16->fp32: "
                 f"{probe['cast_s_per_byte'] * 1e9:.3f} ns/byte")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    rank = launcher.launch_rank()
    try:
        probe, started = run_probe(args)
    except (ValueError, RuntimeError) as exc:
        if rank == 0:
            print(f"hvd_cifar: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    if rank == 0:
        writer.write_json(args.out, probe)  # data first, print second
        print(summary(probe) + f"\nwritten to {args.out}", flush=True)
    # DDP's Gloo threads outlive its process group: end without the interpreter's shutdown.
    lifecycle.exit_process(0, any(s.leaves_threads_running for s in started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
