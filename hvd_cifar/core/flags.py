"""The trainer's command line, read by argparse: each config key is a flag (``--batch-size 64``,
``--batch-size=64``; a boolean also ``--flag``, ``--no-flag``, ``--flag true|false``), and
``--config FILE`` names a YAML file. The values come back as the words given: the config types
them (core.config), so a flag and a YAML file read alike. Every mistake is one ConfigError
naming the key (an unknown one with the nearest known, a missing value, a stray word)."""
from __future__ import annotations

import argparse
import difflib
from typing import Iterable, Mapping

from hvd_cifar.core.errors import ConfigError


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def unknown(key: str, known: Iterable[str]) -> ConfigError:
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"{key}: unknown config key{hint}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # what exit_on_error=False still hands here
        raise ConfigError(f"command line: {message}")


def parser(keys: Mapping[str, bool]) -> argparse.ArgumentParser:
    """A parser of ``keys`` ({key: whether it is a boolean}) and ``--config``; a flag not given
    is absent from the namespace (the defaults are the config's, not the parser's)."""
    p = _Parser(prog="hvd_cifar.train", add_help=False, allow_abbrev=False, exit_on_error=False,
                argument_default=argparse.SUPPRESS)
    p.add_argument("--config", dest="config")
    for key, boolean in keys.items():
        if boolean:
            p.add_argument(flag(key), dest=key, nargs="?", const="true")
            p.add_argument(flag(f"no_{key}"), dest=key, action="store_const", const="false")
        else:
            p.add_argument(flag(key), dest=key)
    return p


def parse(argv: list[str], keys: Mapping[str, bool]) -> tuple[str | None, dict[str, str]]:
    """``argv`` as (the --config file or None, {key: the word given}), the last of a key's
    flags winning."""
    names = {flag(key): key for key in keys} | {flag(f"no_{key}"): key for key, boolean in keys.items() if boolean}
    try:
        given, rest = parser(keys).parse_known_args(argv)
    except argparse.ArgumentError as exc:
        key = names.get(exc.argument_name or "", "config")
        if exc.message.startswith("ignored explicit argument"):
            raise ConfigError(f"{key}: {exc.argument_name} takes no value") from None
        if exc.message.startswith("expected one argument"):
            raise ConfigError(f"{key}: {exc.argument_name} needs a value") from None
        raise ConfigError(f"{key}: {exc.message}") from None
    if rest:
        word = rest[0]
        if word.startswith("--") and word != "--":
            raise unknown(word[2:].partition("=")[0].replace("-", "_"), keys)
        raise ConfigError(f"command line: unexpected argument {word!r} (flags look like --batch-size 64)")
    values = vars(given)
    return values.pop("config", None), values
