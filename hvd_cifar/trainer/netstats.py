"""The network meter: interface byte counters (Linux /proc/net/dev), read by one rank per host
around each epoch's training, beside the resource meter (resources.py); and the check, before
anything starts, that a ``nic`` the config names is one this host has."""
from __future__ import annotations

import socket

from hvd_cifar.core.errors import ConfigError


def read_counters() -> dict[str, tuple[int, int]]:
    """{interface: (rx_bytes, tx_bytes)} for this network namespace."""
    counters = {}
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, _, fields = line.partition(":")
            values = fields.split()
            counters[name.strip()] = (int(values[0]), int(values[8]))
    return counters


def missing_interface(wanted: str, names) -> str:
    """The one line for a ``nic`` that this host does not have, listing those it has."""
    return (f"nic: {wanted!r} is not a network interface of {socket.gethostname()} (it has: "
            f"{', '.join(sorted(names))}); name one of them, or use auto")


def pick_interface(wanted: str) -> str | None:
    """``wanted`` itself, or for "auto" the busiest non-loopback interface so far (the one the
    job's traffic crosses on a cluster node); None when auto finds none. A named interface the
    host lacks is a ConfigError (``check_interface``, which the trainer runs before a run starts;
    this is for callers that did not)."""
    if wanted != "auto":
        check_interface(wanted)
        return wanted
    counters = read_counters()
    candidates = {name: sum(c) for name, c in counters.items() if name != "lo"}
    return max(candidates, key=candidates.get) if candidates else None


class NicMeter:
    """Bytes received and sent on one interface between ``start()`` and ``stop()``."""

    def __init__(self, interface: str | None):
        self.interface = interface
        self._start = (0, 0)

    def _now(self) -> tuple[int, int]:
        return read_counters().get(self.interface, (0, 0)) if self.interface else (0, 0)

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> tuple[int, int]:
        rx, tx = self._now()
        return rx - self._start[0], tx - self._start[1]


def check_interface(nic: str) -> None:
    """``nic`` (the config key) names an interface of this host, or is auto; a ConfigError
    listing the host's interfaces otherwise. Checked on every rank, before anything starts."""
    if nic == "auto":
        return
    try:
        names = read_counters()
    except OSError as exc:
        raise ConfigError(f"nic: cannot list the network interfaces ({exc.strerror}); use auto") from None
    if nic not in names:
        raise ConfigError(missing_interface(nic, names))
