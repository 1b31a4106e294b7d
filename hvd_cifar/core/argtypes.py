"""Command-line value types (argparse ``type=``): each parses one word or raises
argparse.ArgumentTypeError with a message naming what was expected."""
from __future__ import annotations

import argparse


def boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def integer(minimum: int):
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {n}")
        return n
    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


positive, non_negative = integer(1), integer(0)


def freeze_value(text: str) -> int | str:
    """A freeze setting: a number of leading frozen blocks, or auto (config's freeze: auto)."""
    if text == "auto":
        return text
    try:
        return non_negative(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a number of blocks (>= 0) or auto, got {text!r}") from None


def margin(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < x < 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1) (a fraction, e.g. 0.05 for 5 %%), got {text}")
    return x


def fraction(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= x <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1] (a fraction, e.g. 0.95), got {text}")
    return x
