"""Time allreduce on your hosts over each transport hvd_cifar can use there, fit latency α and
bandwidth β per transport, and write probe.json (raw timings and fits) for hvd_cifar.predict.

Launched like training, on the same hostfile (``--probe``: the launch scripts run this module
instead of the trainer; its flags follow):

    launch/mpirun.sh -np 4 -hostfile hostfiles/example-cluster --probe --out probe.json
    launch/horovodrun.sh -np 4 -hostfile hostfiles/example-cluster --probe --out probe-mpi.json
    launch/horovodrun.sh -np 4 -hostfile hostfiles/example-cluster --gloo --probe --out probe-gloo.json
    horovodrun -np 2 -H localhost:2 .venv/bin/python -m hvd_cifar.probe --max-bytes 1000000 --iters 3

What is timed is the sync methods' registry's (hvd_cifar/core/methods.py): each method whose
entry has a ``probe``, started as training starts it, under the transport name its entry gives
("allreduce": its allreduce of a buffer; "gather-scatter": its own averaging, under its name),
and, under an MPI launcher, MPI's own links: ``mpi-p2p`` (one-way Send/Recv between rank 0 and
the last rank, gather/scatter's messages) and ``mpi-intra-host`` (Allreduce among one host's
ranks, when hosts hold several). The launcher decides what can start: under MPI (mpirun,
horovodrun's default MPI mode) Horovod, ``mpi-allreduce``, ``mpi-gather-scatter`` and
``torch-gloo`` (DDP's collective); under ``horovodrun --gloo`` Horovod and ``torch-gloo``.
Horovod's is ``horovod-gloo`` where its operations are Gloo's (its Gloo controller, or across
hosts under MPI's, sync/horovod.py), else ``horovod-mpi``.

Each message size (geometric, --min-bytes to --max-bytes, default the model's fp32 gradient) is
timed --iters times after one warm-up, each time after a 1-element allreduce that starts the
ranks together; rank 0's times are recorded. The fit is least squares on the medians
(hvd_cifar.analysis.fits.fit_transport). Also timed on rank 0: summing two buffers
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

from hvd_cifar.analysis import fits, scaling
from hvd_cifar.analysis.tabulate import OneLineParser
from hvd_cifar.core import launcher, lifecycle, methods, units
from hvd_cifar.core.errors import ConfigError
from hvd_cifar.runfolder import writer
from hvd_cifar.sync import make, openmpi


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
    top = args.max_bytes or scaling.profile(args.model, 10).payload_bytes(0)
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
    link = fits.fit_transport(kind, ranks, sizes, medians, reduce_s_per_byte, per_op_s)
    return {"kind": kind, "ranks": ranks, "scope": scope, "sizes_bytes": sizes, "seconds": seconds,
            "median_s": medians, "alpha_s": link.alpha_s, "beta_bytes_per_s": link.beta_bytes_per_s,
            "per_op_s": link.per_op_s}


# ----------------------------------------------------------------------------- the transports
def mpi_links(sizes: list[int], iters: int) -> dict:
    """MPI's own links, timed with mpi4py before any method starts (so that mpi4py, not a
    method's library, initialises MPI, and that method's shutdown leaves it up): one-way
    point-to-point between rank 0 and the last rank (``mpi-p2p``, what a gather/scatter root's
    messages are priced by) and, when hosts hold several ranks, Allreduce among one host's ranks
    (``mpi-intra-host``, the hierarchical allreduce's local ring)."""
    openmpi.apply_defaults()
    from mpi4py import MPI  # importing initialises MPI
    comm = MPI.COMM_WORLD
    rank, size, last = comm.Get_rank(), comm.Get_size(), comm.Get_size() - 1
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    scope = _scope(len(set(comm.allgather(socket.gethostname()))))

    def ping_pong(t):  # rank 0 and the last rank; a round trip is two one-way messages
        if rank == 0:
            comm.Send(t.numpy(), dest=last)
            comm.Recv(t.numpy(), source=last)
        elif rank == last:
            comm.Recv(t.numpy(), source=0)
            comm.Send(t.numpy(), dest=0)
    round_trips = time_sizes(ping_pong, comm.Barrier, sizes, iters)
    out = {"mpi-p2p": result("p2p", 2, scope, sizes, [[s / 2 for s in r] for r in round_trips])}
    if 1 < node.Get_size() < size:
        out["mpi-intra-host"] = result("allreduce", node.Get_size(), "intra-host", sizes, time_sizes(
            lambda t: node.Allreduce(MPI.IN_PLACE, t.numpy(), op=MPI.SUM), comm.Barrier, sizes, iters))
    node.Free()
    return out


def probe_method(name: str, sync, sizes: list[int], iters: int, reduce_s_per_byte: float) -> dict:
    """Method ``name`` (started: ``sync``) timed as its registry entry's ``probe`` says:
    "allreduce", its allreduce_sum of a buffer, recorded under the one of its entry's transports
    this job runs over (``sync.transport_index``), its per-collective wait apart; "gather-scatter",
    its own averaging of a buffer, the root's sums at ``reduce_s_per_byte``, under its name."""
    spec = methods.METHODS[name]
    scope = _scope(_hosts(sync))
    barrier = lambda: sync.allreduce_sum(torch.zeros(1))  # noqa: E731
    if spec.probe == "gather-scatter":
        return {name: result("gather-scatter", sync.size, scope, sizes,
                             time_sizes(averaging(sync), barrier, sizes, iters), reduce_s_per_byte)}
    return {spec.transports[sync.transport_index]: result(
        "allreduce", sync.size, scope, sizes, time_sizes(sync.allreduce_sum, barrier, sizes, iters),
        per_op_s=sync.collective_wait_s)}


def averaging(sync):
    """The method's own averaging of a buffer the size of the tensor given: the tensor as the
    gradient of the one trainable parameter (laid out once per size, as wrap() does per trainable
    set), then synchronize()."""
    param = torch.nn.Parameter(torch.zeros(0))

    def average(t):
        nonlocal param
        if param.numel() != t.numel():
            param = torch.nn.Parameter(torch.zeros_like(t))
            sync.wrap(None, None, [("probe", param)], 1)
        param.grad = t
        sync.synchronize(None)
    return average


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
def run_probe(args: argparse.Namespace) -> tuple[dict, list]:
    """MPI's own links first (under an MPI launcher), then every method whose registry entry has a
    ``probe`` and that this launch can start (an MPI method refuses one without MPI), one at a
    time in the registry's order, each closed before the next starts (so that no method's
    threads run beside another's timings). Returns the results and the methods started."""
    if launcher.launch_size() < 2:
        raise ValueError("probe: needs 2 or more ranks; launch it like training (see python -m hvd_cifar.probe --help)")
    sizes = message_sizes(args)
    costs = local_costs(sizes[-1])  # before any transport's threads compete for the cores
    transports = mpi_links(sizes, args.iters) if launcher.launched_by_mpi() else {}
    started, job = [], {}
    for name in (m for m, spec in methods.METHODS.items() if spec.probe):
        try:
            sync = make(name)
        except ConfigError:  # this launcher cannot start it
            continue
        started.append(sync)
        transports.update(probe_method(name, sync, sizes, args.iters, costs["reduce_s_per_byte"]))
        job = job or {"world_size": sync.size, "hosts": sorted(set(sync.allgather_object(socket.gethostname()))),
                      "ranks_per_host": sync.local_size}
        sync.close()
    if not started:
        raise ValueError("probe: no sync method could start under this launcher")
    probe = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **job, "launcher": launcher.launcher_name(),
             "comm_settings": writer.comm_settings(), "sizes_bytes": sizes, "iters": args.iters,
             "transports": transports, **costs}
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
