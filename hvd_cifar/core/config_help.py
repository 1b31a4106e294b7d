"""``--help`` of the training command, made from the one typed config: every key of ``Config``
as its flag, type, default and one line of meaning (the comment beside the field), grouped as
the dataclass groups them (``# --- data ---`` ...), which is also how docs/CONFIG.md's tables
are grouped (tests/test_cli.py holds the three to the same keys)."""
from __future__ import annotations

import dataclasses
import inspect
import re
import textwrap

from hvd_cifar.compress import registry
from hvd_cifar.core import config

_GROUP = re.compile(r"^\s*# --- (?P<name>.+?) ---\s*$")
_FIELD = re.compile(r"^    (?P<key>\w+): [^=]+?=.*?(?:#\s*(?P<meaning>.*))?$")
USAGE = ("usage: python -m hvd_cifar.train [--config FILE] [--KEY VALUE | --FLAG | --no-FLAG ...]\n"
         "       (hvd-cifar-train; under horovodrun -np N -H HOSTS or mpirun -np N, every rank runs it)")


def groups() -> dict[str, list[tuple[str, str]]]:
    """{group: [(key, meaning)]} in the dataclass's order, from its source; then a group per
    compression scheme with keys of its own (``compression: NAME``), from the registry."""
    out: dict[str, list[tuple[str, str]]] = {}
    current = "other"
    for line in inspect.getsource(config.CoreConfig).splitlines():
        if m := _GROUP.match(line):
            current = m["name"]
        elif (m := _FIELD.match(line)) and m["key"] in config.FIELDS:
            out.setdefault(current, []).append((m["key"], (m["meaning"] or "").strip()))
    for key, (scheme, setting) in registry.settings().items():
        out.setdefault(f"compression: {scheme}", []).append((key, setting.meaning))
    return out


def _type_name(key: str) -> str:
    if key in config.CHOICES:
        return "|".join(config.CHOICES[key])
    hint = str(config.typing.get_type_hints(config.Config)[key])
    return re.sub(r"<class '(\w+)'>", r"\1", hint).replace(" | None", " or null")


def _default(key: str) -> str:
    field = config.FIELDS[key]
    value = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return '""' if value == "" else str(value)


def help_text(width: int = 100) -> str:
    """The whole ``--help`` page."""
    lines = [USAGE, "",
             "Data-parallel training of a CNN on CIFAR-style data. Every config key is a flag (docs/CONFIG.md):",
             "--batch-size 64 sets batch_size; booleans take --flag, --no-flag or --flag true|false.",
             "Precedence: the defaults below < a YAML file (--config FILE) < flags; --resume RUN starts",
             "from that run's saved config.yaml.", ""]
    for group, keys in groups().items():
        lines.append(f"{group}:")
        for key, meaning in keys:
            flag = f"  --{key.replace('_', '-')} {_type_name(key).upper() if key not in config.CHOICES else _type_name(key)}"
            head = f"{flag}  (default {_default(key)})"
            lines.append(head)
            lines += textwrap.wrap(meaning, width - 6, initial_indent="      ", subsequent_indent="      ")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def asks_for_help(argv: list[str]) -> bool:
    return any(arg in ("-h", "--help") for arg in argv)
