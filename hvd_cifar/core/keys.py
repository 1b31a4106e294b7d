"""One config key declared by a registry entry (a compression scheme's in ``core.schemes``, a
sync method's in ``core.methods``): its type, default, meaning and rule. The config makes a
field, a flag, a ``--help`` line and a check of each; plain data, no torch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Setting:
    """One config key of a registry entry."""
    kind: type                          # int, float, bool or str
    default: Any
    meaning: str                        # its line in --help
    allowed: Callable[[Any], bool] = lambda value: True
    rule: str = ""                      # what ``allowed`` asks, as the error says it ("must be >= 1")
    bytes: bool = False                 # changes the bytes an update sends: predict takes it as a flag
    optional: bool = False              # the key may be null (someone else's setting: the launcher's)

    @property
    def annotation(self):
        """The config field's type: ``kind``, or ``kind | None`` when the key may be null."""
        return self.kind | None if self.optional else self.kind

    def problem(self, value: Any) -> str:
        """Why ``value`` breaks the rule ('' when it does not); null passes where allowed."""
        if value is None and self.optional:
            return ""
        return "" if self.allowed(value) else self.rule


def at_least(n: float) -> Callable[[Any], bool]:
    return lambda value: value >= n


def above(n: float) -> Callable[[Any], bool]:
    return lambda value: value > n
