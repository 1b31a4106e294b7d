"""Reading run folders: metrics.jsonl, config.yaml and resolved.yaml, meta.json and eval.json, as
written by ``hvd_cifar.train``. A run's config, as every reader sees it, is config.yaml (the
keys as given) with its older spellings read as their one (core.aliases: a folder saved before
has fp16_allreduce and local_sgd_steps as switches), then resolved.yaml's values (what the run
settled at run time: the model's lr for lr 0, compute: auto's choice, the run folder's name);
a folder saved before resolved.yaml existed holds those values in config.yaml itself. No torch
and no trainer here, so that reports, predictions and sweeps read runs without loading either.

The one rule for metrics.jsonl: every record is one line written whole (``writer.append_metrics``:
one write, then fsync). A job killed during that write can leave a last line without its newline
that is not valid JSON: that line is *torn*. It is left out and said so (``Metrics.torn``): its
epoch did not finish being recorded and reruns on resume. Any other line that is not an epoch
record is an error naming the line.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

from hvd_cifar.core import aliases
from hvd_cifar.core.errors import ConfigError, ReportError

METRICS = "metrics.jsonl"
CONFIG = "config.yaml"
RESOLVED = "resolved.yaml"  # {values: {key: the value the run used}, how: {key: why it was settled}}
EVENTS = "events.jsonl"  # one line per thing that happened to the run: a stop, a lost rank, a restart
# eval.json's time-to-accuracy keys (time_to_target); None: no target / not reached
TARGET_KEYS = ("target_acc", "epochs_to_target", "time_to_target_s")


@dataclass
class Metrics:
    records: list[dict]
    torn: bool = False  # a last line cut short by a killed write was left out


def parse_lines(text: str, path: str, check: Callable[[Any], str]) -> tuple[list[dict], bool]:
    """A JSON-lines file's text as its records and whether a torn last line was left out; a
    bad line other than a torn last one is a ReportError naming it (``check``: what a record
    lacks, "" when it is one)."""
    lines = text.split("\n")
    last = lines.pop()  # "" when the file ends in a newline, as a whole write leaves it
    records = [_record(line, number, path, check) for number, line in enumerate(lines, 1) if line.strip()]
    torn = False
    if last.strip():
        try:
            records.append(_record(last, len(lines) + 1, path, check))
        except ReportError:
            torn = True
    return records, torn


def _record(line: str, number: int, path: str, check: Callable[[Any], str]) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: line {number} is not valid JSON ({exc.msg})") from None
    if lacks := check(record):
        raise ReportError(f"{path}: line {number} is not {lacks}")
    return record


def _epoch_record(record: Any) -> str:
    ok = isinstance(record, dict) and isinstance(record.get("epoch"), int)
    return "" if ok else "an epoch record (needs an integer 'epoch')"


def _event_record(record: Any) -> str:
    return "" if isinstance(record, dict) and isinstance(record.get("event"), str) else "an event (needs an 'event' name)"


def parse_metrics(text: str, path: str = METRICS) -> Metrics:
    """metrics.jsonl's text as epoch records (``parse_lines``)."""
    return Metrics(*parse_lines(text, path, _epoch_record))


def read_events(run_dir: str) -> list[dict]:
    """RUN_DIR/events.jsonl's events (none without the file; a torn last line left out)."""
    path = os.path.join(run_dir, EVENTS)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot be read ({exc})") from None
    return parse_lines(text, path, _event_record)[0]


def read_metrics(run_dir: str, missing_ok: bool = False) -> Metrics:
    """RUN_DIR/metrics.jsonl (no file: no records when ``missing_ok``, else a ReportError)."""
    path = os.path.join(run_dir, METRICS)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        if missing_ok:
            return Metrics([])
        raise ReportError(f"{run_dir or '.'}: no metrics.jsonl (not a run folder, "
                          f"or no epoch finished yet)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot be read ({exc})") from None
    return parse_metrics(text, path)


@dataclass
class Run:
    path: str
    name: str
    metrics: list[dict]
    config: dict = field(default_factory=dict)   # read_config's: config.yaml and resolved.yaml, {} if absent
    meta: dict = field(default_factory=dict)     # meta.json, {} if absent
    evaluation: dict | None = None               # eval.json, None if absent
    torn: bool = False                           # metrics.jsonl's torn last line was left out


def _read_optional(path: str, parse: Callable[[Any], Any]) -> Any:
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return parse(f)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ReportError(f"{path}: cannot be read ({str(exc).splitlines()[0]})") from None


def read_config(run_dir: str) -> dict:
    """The run's config as every reader sees it (the module's doc); {} without config.yaml. A
    file that is not a mapping, or a resolved.yaml without its two, is a ReportError."""
    path = os.path.join(run_dir, CONFIG)
    config = _read_optional(path, yaml.safe_load) or {}
    if not isinstance(config, dict):
        raise ReportError(f"{path}: must hold a mapping of keys to values")
    try:
        config = aliases.read(config)[0]
    except ConfigError as exc:
        raise ReportError(f"{path}: {exc}") from None
    path = os.path.join(run_dir, RESOLVED)
    resolved = _read_optional(path, yaml.safe_load)
    if resolved is None:
        return config
    if not (isinstance(resolved, dict) and isinstance(resolved.get("values"), dict)
            and isinstance(resolved.get("how"), dict)):
        raise ReportError(f"{path}: must hold 'values' and 'how', each a mapping of keys")
    return {**config, **resolved["values"]}


def read_meta(run_dir: str) -> Any:
    """RUN_DIR/meta.json ({} if absent; a mapping unless the file is wrong: the caller checks)."""
    return _read_optional(os.path.join(run_dir, "meta.json"), json.load) or {}


def load_run(path: str) -> Run:
    """A run folder with at least one whole epoch record; anything unusable is a ReportError."""
    if not os.path.isdir(path):
        raise ReportError(f"{path}: no such run folder")
    metrics = read_metrics(path)
    if not metrics.records:
        raise ReportError(f"{os.path.join(path, METRICS)}: holds no epoch records"
                          + (" (its only line is torn: the run was killed while writing it)" if metrics.torn else ""))
    config = read_config(path)
    meta = read_meta(path)
    evaluation = _read_optional(os.path.join(path, "eval.json"), json.load)
    if not isinstance(meta, dict):
        raise ReportError(f"{path}: meta.json must hold a mapping")
    name = os.path.basename(os.path.normpath(os.path.abspath(path)))
    return Run(os.path.abspath(path), name, metrics.records, config, meta, evaluation, metrics.torn)


def time_to_target(records: list[dict], target: float) -> dict:
    """The first epoch whose test accuracy reached ``target``: its count and elapsed time."""
    reached = next((r for r in records if target and r["test_acc"] >= target), None)
    return {"target_acc": target or None,
            "epochs_to_target": reached["epoch"] + 1 if reached else None,
            "time_to_target_s": reached.get("elapsed_s") if reached else None}
