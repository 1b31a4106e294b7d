"""Units as people write them on command lines: link rates in tc's notation ('1gbit',
'100mbit'). The predictor's --bandwidth and the namespace cluster's --rate read them alike."""
from __future__ import annotations

import re

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?)bit\s*$", re.IGNORECASE)


def parse_rate(rate: str) -> int:
    """tc-style rate ('1gbit', '100mbit', '2.5gbit') -> bits per second (SI prefixes, as tc);
    a ValueError naming what it cannot read."""
    match = _RATE.match(rate)
    if not match:
        raise ValueError(f"rate: cannot parse {rate!r} (expected e.g. '1gbit', '100mbit')")
    bits = float(match[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match[2].lower()]
    if bits < 1e5:
        raise ValueError(f"rate: {rate!r} is below 100kbit")
    return int(bits)
