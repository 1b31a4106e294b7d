"""Files written whole or not at all: atomic_write (temp file, fsync, rename) for every file a
run or a report writes, and whole-line appends for the line logs. A failed write is a RunError
naming the file and the OS's reason; the temp file of a write cut short by a kill is removed by
the next writer there (``remove_stale_temps``). No torch here: readers and reports use it too."""
from __future__ import annotations

import errno
import json
import os
import re
import socket
import tempfile
import time
from typing import Any

# atomic_write's temp file: ".NAME.PID@HOST.XXXXXXXX.tmp" (XXXXXXXX: mkstemp's 8 characters), so
# a later writer can tell whether the process that made it is still at work. An older temp
# (".NAME.XXXXXXXX.tmp") names no writer.
_TEMP = re.compile(r"^\.(?P<name>.+?)(?:\.(?P<pid>\d+)@(?P<host>[A-Za-z0-9._-]+))?\.[A-Za-z0-9_]{8}\.tmp$")
STALE_TEMP_AGE_S = 3600.0  # a temp of another host (or naming no writer) untouched this long is dead


class RunError(RuntimeError):
    """A run folder or checkpoint problem; the message is one line saying what is wrong."""


def write_error(path: str, exc: BaseException) -> RunError | None:
    """The one line for a failed write of ``path`` (the file and the OS's reason), or None when
    ``exc`` holds no OS error (a bug of the writer, which keeps its traceback)."""
    cause = exc
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return None
    reason = cause.strerror or str(cause)
    if cause.errno in errno.errorcode:
        reason += f", {errno.errorcode[cause.errno]}"
    return RunError(f"cannot write {path} ({reason})")


class _WriteRecorder:
    """The temp file as a writer sees it, keeping the OS error of a failed write. torch.save
    writes from C++ and reports a failed write as RuntimeError('[enforce fail at
    inline_container.cc ...] unexpected pos ...'); whether the OSError stays attached to it is
    up to torch's bindings, so it is kept here, where the write happened."""

    def __init__(self, file):
        self._file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self._file.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self._file.flush()

    def tell(self) -> int:
        return self._file.tell()


def atomic_write(path: str, write) -> None:
    """Write via ``write(file_object)`` to a temp file in the same folder, fsync, then rename over
    ``path``: a reader (or a crash) sees the old file or the new one, never half of one. A write
    that fails (no space left, read-only, permission) removes the temp file, leaves ``path`` as
    it was, and raises RunError naming ``path`` and the OS's reason."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp, recorder = None, None
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.{os.getpid()}@{_host()}.",
                                   suffix=".tmp")
        os.fchmod(fd, _new_file_mode())  # mkstemp's 0600 would hide reports and runs from others
        with os.fdopen(fd, "wb") as f:
            recorder = _WriteRecorder(f)
            write(recorder)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        _remove_quietly(tmp)
        error = write_error(path, recorder.error if recorder and recorder.error else exc)
        if error is None or not isinstance(exc, (OSError, RuntimeError)):
            raise
        raise error from None


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64] or "host"


def remove_stale_temps(folder: str, locked: bool = False) -> list[str]:
    """Remove the temp files that atomic_write left in ``folder`` when its process died mid-write
    (killed, host down); returns their names. ``locked``: the caller holds a lock that every
    writer into ``folder`` takes, so no temp there can be in flight and all of them go. Otherwise
    a temp goes when its writer, named in it, was a process of this host that is gone, or when
    it is untouched for STALE_TEMP_AGE_S (another host's in a shared folder, one naming no
    writer): a live atomic_write writes, fsyncs and renames without pause, so a temp another
    process is writing is never removed from under it."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []  # no folder yet: nothing left behind
    removed = []
    for name in names:
        match = _TEMP.match(name)
        if match and (locked or _writer_gone(os.path.join(folder, name), match)):
            _remove_quietly(os.path.join(folder, name))
            removed.append(name)
    return removed


def _writer_gone(path: str, match: re.Match) -> bool:
    """Whether the temp's writer is dead: a process of this host that no longer exists, or any
    writer at all once the temp is untouched for STALE_TEMP_AGE_S (a pid used again since)."""
    if match["pid"] and match["host"] == _host():
        try:
            os.kill(int(match["pid"]), 0)
        except ProcessLookupError:
            return True
        except OSError:
            pass  # it exists, another user's
    return _untouched(path)


def _untouched(path: str) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime > STALE_TEMP_AGE_S
    except OSError:
        return False  # gone already (its writer renamed it)


def _new_file_mode() -> int:
    """The mode open() gives a new file: 0666 less the umask (read without changing it, which
    os.umask cannot do, from /proc where there is one)."""
    try:
        with open("/proc/self/status") as f:
            umask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        umask = 0o022
    return 0o666 & ~umask


def _remove_quietly(path: str | None) -> None:
    """Remove a temp file if it is there; a failure to (a read-only folder) must not hide the
    error that got us here."""
    try:
        if path:
            os.unlink(path)
    except OSError:
        pass


def write_json(path: str, obj: Any) -> None:
    atomic_write(path, lambda f: f.write((json.dumps(obj, indent=2) + "\n").encode()))


def write_text(path: str, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


def append_whole(path: str, data: bytes, fd: int | None = None, durable: bool = True) -> None:
    """Append ``data`` to ``path`` (or its open ``fd``) whole or not at all: a write that fails
    part-way (no space left) is cut off again, so the file never ends in a torn line that a
    later append would bury in the middle. ``durable``: fsync. Raises OSError as the OS did."""
    own = fd is None
    if own:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:  # a short write is followed by one that says why it stopped
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        except OSError:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass  # the reader drops a last line without its newline anyway
            raise
    finally:
        if own:
            os.close(fd)
