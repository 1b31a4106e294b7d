"""Units as people write them on command lines. Link rates in tc's notation ('1gbit',
'100mbit') or as a plain number of bits per second ('1e9', '1000000000', what probe.json and most
tools print); sizes as a plain number of bytes ('4096', '1e6') or with a unit ('4KiB', '25MB').
The predictor's --bandwidth, the probe's --min-bytes/--max-bytes and the namespace cluster's
--rate read them alike."""
from __future__ import annotations

import re

_NUMBER = r"(\d+(?:\.\d*)?(?:e[+-]?\d+)?)"
_RATE = re.compile(rf"^\s*{_NUMBER}\s*(?:([kmg]?)bit)?\s*$", re.IGNORECASE)
_SIZE = re.compile(rf"^\s*{_NUMBER}\s*(?:([kmg]i?)?b)?\s*$", re.IGNORECASE)
_SI = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}
_BINARY = {"ki": 2 ** 10, "mi": 2 ** 20, "gi": 2 ** 30}
RATE_FORMS = "bits per second as a number ('1e9', '1000000000') or tc's notation ('1gbit', '100mbit', '2.5gbit')"
SIZE_FORMS = "bytes as a number ('4096', '1e6') or with a unit ('4KiB', '25MB', '1GiB')"


def parse_rate(rate: str) -> int:
    """A link rate -> bits per second (tc's SI prefixes); a ValueError naming what it cannot
    read and the forms it can."""
    match = _RATE.match(str(rate))
    if not match:
        raise ValueError(f"rate: cannot parse {rate!r} (expected {RATE_FORMS})")
    bits = float(match[1]) * _SI[(match[2] or "").lower()]
    if bits < 1e5:
        raise ValueError(f"rate: {rate!r} is below 100kbit (100000 bits per second)")
    return int(bits)


def parse_size(size: str) -> int:
    """A size -> bytes ('k', 'm', 'g' are powers of 1000, 'Ki', 'Mi', 'Gi' of 1024); a
    ValueError naming what it cannot read and the forms it can."""
    match = _SIZE.match(str(size))
    if not match:
        raise ValueError(f"size: cannot parse {size!r} (expected {SIZE_FORMS})")
    prefix = (match[2] or "").lower()
    count = float(match[1]) * (_BINARY.get(prefix) or _SI[prefix])
    if count != int(count):
        raise ValueError(f"size: {size!r} is not a whole number of bytes")
    return int(count)
