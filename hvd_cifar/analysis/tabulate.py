"""Tables for reports, sweeps and benchmarks: columns with units and formats, one Markdown
writer and one CSV writer (raw values at full precision), and the command-line parser whose
usage mistakes are one line. No torch, no plotting."""
from __future__ import annotations

import argparse
import csv
import io
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable

from hvd_cifar.core.files import write_text


def text(v: Any) -> str:
    """A text cell; booleans as the YAML spelling (true/false)."""
    return str(v).lower() if isinstance(v, bool) else str(v)


@dataclass
class Column:
    header: str                          # Markdown header, with units
    key: str                             # key in the row dict; also the CSV header
    fmt: Callable[[Any], str] = text     # Markdown cell; the CSV gets the raw value
    numeric: bool = False                # right-aligned in Markdown
    row_fmt: Callable[[dict], str] | None = None  # Markdown cell made from the whole row, if set


def fmt_number(v: Any, spec: str, scale: float = 1.0) -> str:
    """``v / scale`` formatted with ``spec``; '-' for a missing value (None, NaN, not a number)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        return "-"
    return format(v / scale, spec)


def num(header: str, key: str, spec: str, scale: float = 1.0) -> Column:
    """A numeric column shown as ``value / scale`` with ``spec``."""
    return Column(header, key, lambda v: fmt_number(v, spec, scale), numeric=True)


def markdown_table(columns: list[Column], rows: list[dict]) -> str:
    def cell(c: Column, row: dict) -> str:
        v = row.get(c.key)
        shown = c.row_fmt(row) if c.row_fmt else c.fmt(v) if v is not None else "-"
        return shown.replace("|", "\\|")
    lines = ["| " + " | ".join(c.header for c in columns) + " |",
             "|" + "|".join("---:" if c.numeric else "---" for c in columns) + "|"]
    lines += ["| " + " | ".join(cell(c, row) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_csv(path: str, columns: list[Column], rows: list[dict]) -> None:
    """Raw values at full precision; missing numbers are empty cells."""
    def raw(v: Any) -> Any:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        if isinstance(v, bool):
            return text(v)
        return repr(v) if isinstance(v, float) else v
    text_out = io.StringIO(newline="")
    out = csv.writer(text_out)
    out.writerow([c.key for c in columns])
    out.writerows([[raw(row.get(c.key)) for c in columns] for row in rows])
    write_text(path, text_out.getvalue())


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one ``hvd_cifar: error:`` line and exit status 2."""

    def error(self, message: str):
        print(f"hvd_cifar: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)
