"""What every part of the namespace cluster shares: its error, the names it gives things, and
the one way it runs a system command (``ip``, ``tc``, ``ssh-keygen``) and asks about namespaces."""
from __future__ import annotations

import shlex
import subprocess
from typing import Sequence

PREFIX = "hvdc"   # every name a cluster makes starts hvdc-PID-N: namespaces, hostnames, temp dirs
NIC = "eth0"      # each host's one interface


class ClusterError(RuntimeError):
    """Setting up or using the cluster failed; the message says which step and why."""


def run(argv: Sequence[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=timeout)
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise ClusterError(f"`{shlex.join(argv)}` failed ({result.returncode}): "
                           f"{detail[-1] if detail else 'no output'}")
    return result


def list_namespaces() -> list[str]:
    result = run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in result.stdout.splitlines() if line.strip()]


def netns_pids(ns: str) -> list[int]:
    result = run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in result.stdout.split() if p.isdigit()] if result.returncode == 0 else []
