"""Link shaping. With a rate set, a ``tbf`` qdisc sits on both ends of each host's link (eth0
egress = what the host sends, the bridge port's egress = what it receives), so each host has a
full-duplex link of that rate, like a 1 GbE NIC on a switch. tbf counts Ethernet frames."""
from __future__ import annotations

from typing import Sequence

from hvd_cifar.core import units
from testbed.netcluster.system import NIC, ClusterError, run

DEFAULT_RATE = "1gbit"            # a 1 GbE NIC on a switch
TBF_LATENCY = "10ms"              # longest a packet may wait in the shaper's queue


def parse_rate(rate: str) -> int:
    """``hvd_cifar.core.units.parse_rate``, its error a ClusterError (one line from the CLI)."""
    try:
        return units.parse_rate(rate)
    except ValueError as exc:
        raise ClusterError(str(exc)) from None


def rate_or_none(rate: str) -> str | None:
    """A rate as the command lines take it: 'none' means unshaped (None)."""
    return None if rate.lower() == "none" else rate


def shape_links(switch_ns: str, namespaces: Sequence[str], mtu: int, bits: int | None) -> None:
    """Every host link (host i's eth0 in ``namespaces[i]``, its port ``pi`` on the switch) at
    ``bits`` per second both ways; None: unshaped, veth speed."""
    # tbf needs a bucket of at least one frame and about a timer tick's worth of bytes.
    burst = max(bits // 8 // 1000, 2 * (mtu + 14)) if bits else 0
    for i, ns in enumerate(namespaces):
        for where, dev in ((ns, NIC), (switch_ns, f"p{i}")):
            if bits:
                run(["tc", "-n", where, "qdisc", "replace", "dev", dev, "root", "tbf",
                     "rate", f"{bits}bit", "burst", str(burst), "latency", TBF_LATENCY])
            else:
                run(["tc", "-n", where, "qdisc", "del", "dev", dev, "root"], check=False)
