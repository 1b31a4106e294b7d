"""No hand-typed measured figure in README.md or docs/: a number with a unit (×, %, ms, s, min,
img/s, MB, GB, points) in prose is either inside a generated block (testbed.render_docs, made
from a results file) or a set value written as code (`60 s`, `topk_fraction` `0.004`), which
marks it as a constant, a default or a target rather than a measurement. The allow-list holds
what is neither: the confidence level and image shapes. In a table the unit is often in the
header alone: a bare number under a header that names a unit or a measured quantity (img/s,
(ms), MB, acc, time, ratio, ...) is a figure too."""
from __future__ import annotations

import os
import re

import pytest

from testbed import render_docs

# A figure: a number, then a unit (the space is optional, as in "1.2×" and "95 %").
FIGURE = re.compile(r"(?<![\w.\-/·])[-+−]?\d+(?:[.,]\d+)?\s?(?:×|%|ms\b|s\b|min\b|img/s|MB\b|GB\b|points?\b)")
ALLOWED = (
    re.compile(r"95\s?%"),                   # the confidence level of every interval
    re.compile(r"\d+×$"),                    # an image shape: 3×32×32, 32×32
)
CODE = re.compile(r"```.*?```|`[^`]*`", re.S)


def hand_written(text: str) -> str:
    """``text`` with its generated blocks and its code blanked, each keeping its line breaks, so
    that line numbers stay those of the file (a table's code cell becomes an empty cell)."""
    text = render_docs.BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return CODE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def hand_typed(text: str) -> list[tuple[int, str, str]]:
    """(line, figure, the line) of each figure with a unit outside generated blocks and code."""
    text = hand_written(text)
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in FIGURE.finditer(line):
            figure = m.group(0)
            shape = line[m.end():m.end() + 1] in ("×", "x") or line[m.end() - 1] == "×" and line[m.end():m.end() + 1].isdigit()
            if shape or any(a.fullmatch(figure.strip()) for a in ALLOWED):
                continue
            found.append((n, figure, line.strip()))
    return found


# A table column whose header gives a measured quantity's unit or name: its cells are figures
# even without a unit of their own (| img/s | 303.1 |).
MEASURED_COLUMN = re.compile(r"\((?:ms|s|min|%|MB|GB|img/s|points?|×)[^)]*\)|img/s|\bMB\b|\bGB\b|×|"
                             r"\b(?:acc|accuracy|speed-?up|ratio|seconds|time|throughput)\b", re.I)
BARE_NUMBER = re.compile(r"[-+−]?\d+(?:[.,]\d+)?(?:\s?\(.*\))?")


def cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def hand_typed_in_tables(text: str) -> list[tuple[int, str, str]]:
    """(line, cell, the row) of each bare number under a measured column's header, in tables
    outside generated blocks (code spans count as set values, as in prose)."""
    text = hand_written(text)
    lines, found, n = text.splitlines(), [], 0
    while n < len(lines):
        if not (lines[n].lstrip().startswith("|") and n + 1 < len(lines) and set(lines[n + 1].strip()) <= set("|-: ")
                and "-" in lines[n + 1]):
            n += 1
            continue
        measured = [i for i, head in enumerate(cells(lines[n])) if MEASURED_COLUMN.search(head)]
        n += 2
        while n < len(lines) and lines[n].lstrip().startswith("|"):
            row = cells(lines[n])
            found += [(n + 1, row[i], lines[n].strip()) for i in measured
                      if i < len(row) and BARE_NUMBER.fullmatch(row[i])]
            n += 1
    return found


@pytest.mark.parametrize("path", render_docs.doc_files(), ids=os.path.basename)
def test_no_hand_typed_measured_figure(path):
    with open(path) as f:
        text = f.read()
    found = hand_typed(text) + hand_typed_in_tables(text)
    assert not found, (f"{os.path.basename(path)}: figures with units outside generated blocks (measure them "
                       f"into a results file and render them, remove them, or write a set value as `code`):\n"
                       + "\n".join(f"  line {n}: {fig!r} in: {line[:140]}" for n, fig, line in found))


def test_the_rule_finds_a_hand_typed_figure_and_passes_generated_and_set_values():
    doc = ("Horovod was 1.21× faster and took 52 s.\n"
           "<!-- results: x.json -->\n| a | 1.21× |\n<!-- /results -->\n"
           "A rank killed ends the job within `60 s`; images are 3×32×32; a 95 % interval.\n"
           "```\n$ run  # 12.5 img/s\n```\n")
    assert [(n, f) for n, f, _ in hand_typed(doc)] == [(1, "1.21×"), (1, "52 s")]


def test_the_rule_finds_a_hand_typed_table_whose_unit_is_in_its_header():
    doc = ("| setting | img/s | blocks frozen | final test acc |\n|---|---:|---:|---:|\n| fp16 | 303.1 | 2 | 0.99 |\n"
           "| none | `300` | 0 | `0.98` |\n"
           "<!-- results: x.json -->\n| setting | img/s |\n|---|---:|\n| fp16 | 303.1 |\n<!-- /results -->\n"
           "| key | default |\n|---|---|\n| lr | 0.1 |\n")
    assert [(n, cell) for n, cell, _ in hand_typed_in_tables(doc)] == [(3, "303.1"), (3, "0.99")]
