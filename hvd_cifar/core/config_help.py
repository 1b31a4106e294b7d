"""``--help`` of the training command, made from the one typed config: every key of ``Config``
as its flag, type, default and meaning, as each field's metadata declares them (a core key's
``key(default, meaning)``; a sync method's or a scheme's ``Setting`` in its registry), in the
fields' groups (data, ..., then ``sync: NAME`` and ``compression: NAME`` for each method and
scheme with keys of its own), which is also how docs/CONFIG.md's tables are grouped
(tests/test_cli.py holds the three to the same keys). The flags themselves are argparse's
(core.flags), built from the same fields."""
from __future__ import annotations

import dataclasses
import textwrap

from hvd_cifar.core import config

USAGE = ("usage: python -m hvd_cifar.train [--config FILE] [--KEY VALUE | --FLAG | --no-FLAG ...]\n"
         "       (hvd-cifar-train; under horovodrun -np N -H HOSTS or mpirun -np N, every rank runs it)")


def groups() -> dict[str, list[tuple[str, str]]]:
    """{group: [(key, meaning)]}, in the fields' order."""
    out: dict[str, list[tuple[str, str]]] = {}
    for key, f in config.FIELDS.items():
        out.setdefault(f.metadata["group"], []).append((key, f.metadata["meaning"]))
    return out


def type_name(key: str) -> str:
    """INT, FLOAT, BOOL, FLOAT|null, INT|STR ...; a choice key's choices."""
    if key in config.CHOICES:
        return "|".join(config.CHOICES[key])
    kinds, optional = config.value_kinds(key)
    return "|".join([k.__name__.upper() for k in kinds] + (["null"] if optional else []))


def _default(key: str) -> str:
    f = config.FIELDS[key]
    value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return '""' if value == "" else str(value)


def help_text(width: int = 100) -> str:
    """The whole ``--help`` page."""
    lines = [USAGE, "",
             "Data-parallel training of a CNN on CIFAR-style data. Every config key is a flag (docs/CONFIG.md):",
             "--batch-size 64 sets batch_size; booleans take --flag, --no-flag or --flag true|false; a key",
             "that may be null takes null. Precedence: the defaults below < a YAML file (--config FILE) <",
             "flags; --resume RUN starts from that run's saved config. Older spellings still read:",
             "--fp16-allreduce (compression: fp16), --local-sgd-steps N alone (compression: local-sgd).", ""]
    for group, keys in groups().items():
        lines.append(f"{group}:")
        for key, meaning in keys:
            lines.append(f"  --{key.replace('_', '-')} {type_name(key)}  (default {_default(key)})")
            lines += textwrap.wrap(meaning, width - 6, initial_indent="      ", subsequent_indent="      ")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def asks_for_help(argv: list[str]) -> bool:
    return any(arg in ("-h", "--help") for arg in argv)
