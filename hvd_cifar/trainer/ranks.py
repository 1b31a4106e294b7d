"""One error, every rank: how a failure seen by some ranks stops all of them together, with one line.

A user error (bad config, missing data, an unwritable run folder) met by one rank alone would
leave the others waiting in their next collective. ``on_main`` and ``on_every_rank`` hand it to
every rank, which raise it together; ``say_once`` then has rank 0 alone say it. ``before_loop``
is how the set-up before the training loop runs them, since under elastic training no rank may
wait on another there.
"""
from __future__ import annotations

import signal
import sys
import time

from hvd_cifar.core.errors import ConfigError
from hvd_cifar.core.files import RunError
from hvd_cifar.workload.data import DataError

USER_ERRORS = (ConfigError, DataError, RunError)
SILENT_RANK_EXIT_DELAY_S = 5.0


def _user_error(name_and_message: tuple[str, str]) -> Exception:
    """A user error rebuilt on this rank from (class name, message) sent by another."""
    name, message = name_and_message
    return {cls.__name__: cls for cls in USER_ERRORS}[name](message)


def on_main(sync, fn):
    """Run ``fn`` on rank 0 only and hand its result, or its user error, to every rank, so that
    a failure seen by rank 0 alone still stops all ranks together instead of leaving them hung."""
    result, error = None, None
    if sync.rank == 0:
        try:
            result = fn()
        except USER_ERRORS as exc:
            error = (type(exc).__name__, str(exc))
    result, error = sync.broadcast_object((result, error))
    if error:
        raise _user_error(error)
    return result


def on_every_rank(sync, fn):
    """Run ``fn`` on every rank; a user error on any rank (a data set missing on one host only)
    is raised on all of them, so they stop together with one message instead of hanging."""
    result, error = None, None
    try:
        result = fn()
    except USER_ERRORS as exc:
        error = (type(exc).__name__, str(exc))
    errors = [e for e in sync.allgather_object(error) if e]
    if errors:
        raise _user_error(errors[0])
    return result


def before_loop(sync, fn, together=on_main, others=None):
    """A set-up step before the training loop: ``together(sync, fn)`` (``on_main`` or
    ``on_every_rank``). Elastic: nothing before the elastic loop may wait on another rank (a
    worker that joins later runs it alone), so each worker answers for itself: rank 0 with
    ``fn``, the others with ``others`` (default: ``fn`` too); the training state's first sync
    carries rank 0's answer to them where it matters. A worker that fails here drops out, and
    Horovod's driver carries on without it."""
    if sync.elastic:
        return fn() if sync.rank == 0 or others is None else others()
    return together(sync, fn)


def speak(line: str) -> None:
    """Rank 0's line about what every rank knows alike, in one write (launchers that tag output
    lines would tag a lone newline too)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def say_once(rank: int, line: str, code: int) -> int:
    """What every rank knows alike is said once, by rank 0; returns ``code``."""
    if rank == 0:
        speak(line)
    else:
        # Launchers stop the whole job when the first rank exits non-zero. A silent rank that
        # got there first would have rank 0 killed before it said why; so the others give
        # rank 0 time to speak. Normally rank 0 exits first and the launcher ends the job
        # then, so this wait costs nothing. A SIGTERM during the wait is a launcher ending the
        # job (horovodrun --gloo does so at the first exit): obey it at once, where the run's
        # stop handler would only note it and the launcher wait 5 s before its SIGKILL.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        time.sleep(SILENT_RANK_EXIT_DELAY_S)
    return code
