"""The errors that more than one layer raises, each meaning "bad input: one line, exit 2".

Kept apart so that a low module (the network meter, runs) can raise what a high one (config, report,
predict, bench) catches, without importing it: dependencies point one way.
"""


class ConfigError(ValueError):
    """A bad config key, type, value or combination; the message is one line naming the key.

    ``fixes``: what the user can do instead, each alternative the flags that, added to the
    command line, make it one the validator accepts. The message ends with them ("; give
    --no-topk-local-clip, or --grad-clip 1.0"), so the hint printed is exactly what the tests
    apply and see accepted (tests/test_cli.py)."""

    def __init__(self, message: str, fixes: tuple[tuple[str, ...], ...] = ()):
        self.fixes = tuple(tuple(fix) for fix in fixes)
        if self.fixes:
            message += "; give " + ", or ".join(" ".join(fix) for fix in self.fixes)
        super().__init__(message)


class ReportError(RuntimeError):
    """An unusable run folder or report input; the message is one line saying which file and what is wrong."""


class PredictError(RuntimeError):
    """A scaling question that cannot be answered from the inputs given; one line saying why."""
