"""Hostfiles: one host per line, ``HOST slots=N`` (Open MPI style) or ``HOST:N`` (horovodrun
style), ``#`` comments and blank lines allowed; each host listed once. Validated before anything
is launched. These rules live here alone: launch/horovodrun.sh and launch/mpirun.sh check the
file with this module, the Horovod that scripts/install.sh builds reads ``horovodrun -H FILE``
and ``-hostfile FILE`` (so also ``python -m hvd_cifar.launch.horovodrun``) through ``parse``, and
launch/discover-hosts.sh prints an elastic job's hosts with it.

    python -m hvd_cifar.launch.hostfile hostfiles/localhost --np 2 --format horovod   # localhost:2
    python -m hvd_cifar.launch.hostfile hostfiles/localhost --np 2 --format mpi       # a clean copy for mpirun
    python -m hvd_cifar.launch.hostfile hostfiles/localhost --format lines            # HOST:SLOTS a line

Only the standard library: the discovery script runs this every second, without site-packages.
"""
from __future__ import annotations

import argparse
import re
import sys

_HOST = r"[A-Za-z0-9]([A-Za-z0-9.\-]*[A-Za-z0-9])?"
_MPI_LINE = re.compile(rf"^(?P<host>{_HOST})(\s+slots\s*=\s*(?P<slots>\d+))?(\s+max_slots\s*=\s*\d+)?$")
_HVD_LINE = re.compile(rf"^(?P<host>{_HOST}):(?P<slots>\d+)$")


class HostfileError(ValueError):
    """One line naming the file, the line number and what is wrong."""


def parse(path: str) -> list[tuple[str, int]]:
    """[(host, slots)] in file order; a host listed twice is an error."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise HostfileError(f"hostfile {path}: cannot read ({exc.strerror})") from None
    hosts: list[tuple[str, int]] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _MPI_LINE.match(line) or _HVD_LINE.match(line)
        if not match:
            raise HostfileError(f"hostfile {path}:{number}: cannot parse {raw.strip()!r} "
                                f"(expected 'HOST slots=N' or 'HOST:N')")
        host, slots = match["host"], int(match["slots"] or 1)
        if slots < 1:
            raise HostfileError(f"hostfile {path}:{number}: {host} has {slots} slots; need at least 1")
        if host in seen:
            together = dict(hosts)[host] + slots
            raise HostfileError(f"hostfile {path}:{number}: {host} already listed on line {seen[host]} "
                                f"(list each host once, with all its slots: '{host} slots={together}')")
        seen[host] = number
        hosts.append((host, slots))
    if not hosts:
        raise HostfileError(f"hostfile {path}: no hosts listed")
    return hosts


def check_slots(hosts: list[tuple[str, int]], np: int, path: str) -> None:
    total = sum(slots for _, slots in hosts)
    if np > total:
        raise HostfileError(f"hostfile {path}: -np {np} needs {np} slots but the file has {total}")


def horovod_hosts(hosts: list[tuple[str, int]]) -> str:
    return ",".join(f"{host}:{slots}" for host, slots in hosts)


def mpi_hostfile(hosts: list[tuple[str, int]]) -> str:
    return "".join(f"{host} slots={slots}\n" for host, slots in hosts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hostfile")
    parser.add_argument("--np", type=int, default=0, help="processes to be launched (checked against slots)")
    parser.add_argument("--format", choices=("horovod", "mpi", "lines", "check"), default="check")
    args = parser.parse_args(argv)
    try:
        hosts = parse(args.hostfile)
        if args.np:
            check_slots(hosts, args.np, args.hostfile)
    except HostfileError as exc:
        print(f"hvd_cifar: error: {exc}", file=sys.stderr)
        return 2
    if args.format == "horovod":
        print(horovod_hosts(hosts))
    elif args.format == "mpi":
        sys.stdout.write(mpi_hostfile(hosts))
    elif args.format == "lines":  # what a host discovery script prints
        sys.stdout.write("".join(f"{host}:{slots}\n" for host, slots in hosts))
    else:
        print(f"{args.hostfile}: {len(hosts)} host(s), {sum(s for _, s in hosts)} slot(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
