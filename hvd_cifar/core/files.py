"""Files written whole or not at all: atomic_write (temp file, fsync, rename) for every file a
run or a report writes, and whole-line appends for the line logs. A failed write is a RunError
naming the file and the OS's reason. No torch here: readers and reports use it too."""
from __future__ import annotations

import errno
import json
import os
import tempfile
from typing import Any


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
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
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
