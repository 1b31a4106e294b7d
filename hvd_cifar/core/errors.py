"""The errors that more than one layer raises, each meaning "bad input: one line, exit 2".

Kept apart so that a low module (netstats, runs) can raise what a high one (config, report,
predict, bench) catches, without importing it: dependencies point one way.
"""


class ConfigError(ValueError):
    """A bad config key, type, value or combination; the message is one line naming the key."""


class ReportError(RuntimeError):
    """An unusable run folder or report input; the message is one line saying which file and what is wrong."""


class PredictError(RuntimeError):
    """A scaling question that cannot be answered from the inputs given; one line saying why."""
