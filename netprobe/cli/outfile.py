"""Writing results: the one module through which every command writes ``-o FILE`` (``run``,
``run --repeat``, ``compare``, ``parse``, ``path``, ``report --html``) and stdout.

What happens at the path depends on what is there, as a user of ``> FILE`` would expect:

* a regular file, or nothing yet: replaced atomically (a temporary file in the same
  directory, flushed and fsynced, then renamed over it), so a reader never sees half a
  result and a failed write leaves the old file intact;
* a symlink: followed, and its target replaced the same way (the link stays a link);
* a character or block device or a FIFO (``/dev/null``, ``/dev/stdout``, a named pipe):
  written in place, never replaced by a regular file;
* a directory or a socket: an error.

:func:`check_target` says, before a test starts, whether the path can be written, so an
unwritable ``-o`` costs no test. Every failure is an :class:`OutputError` (exit code 6).

The format of ``-o FILE`` follows its extension (:data:`EXTENSION_FORMATS`) unless
``--format`` names one; a file without a known extension gets JSON, so that whatever ``-o``
writes, ``netprobe report`` reads back.
"""
from __future__ import annotations

import contextlib
import os
import stat
import sys

from attrs import frozen

from netprobe.errors import NetprobeError
from netprobe.record import Record

EXTENSION_FORMATS = {".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv",
                     ".txt": "human", ".log": "human"}
"""The format a ``-o`` file gets from its extension when ``--format`` does not say."""

UNKNOWN_EXTENSION_FORMAT = "json"
"""The format of a ``-o`` file whose extension says nothing: JSON, which ``report`` reads."""


class OutputError(NetprobeError):
    """The result could not be written (exit code 6)."""


@frozen(repr=False, eq=False)
class Formats(Record):
    """The formats a command writes: to stdout and to ``-o FILE``."""

    stdout: str
    """The format on stdout (``--format``, else human)."""
    file: str | None
    """The format of ``-o FILE`` (None without ``-o``)."""
    warning: str | None = None
    """Set when ``--format`` contradicts the file's extension (the format wins)."""


def choose_formats(given: str | None, path: str | None) -> Formats:
    """stdout and file formats from ``--format`` (None: not given) and ``-o`` PATH."""
    stdout_fmt = given or "human"
    if path is None:
        return Formats(stdout_fmt, None)
    by_name = EXTENSION_FORMATS.get(os.path.splitext(path)[1].lower())
    if given is None:
        return Formats(stdout_fmt, by_name or UNKNOWN_EXTENSION_FORMAT)
    warning = None
    if by_name is not None and by_name != given and (given, by_name) != ("json-stream", "jsonl"):
        warning = (f"{path} is written as {given} (--format), although its name says "
                   f"{by_name}")
    return Formats(stdout_fmt, given, warning)


# --- what is at the path -----------------------------------------------------------------

_REPLACE = "replace"
_IN_PLACE = "in place"


def _kind(path: str) -> str:
    """How ``path`` is written: replaced, or in place; OutputError where neither will do."""
    try:
        mode = os.stat(path).st_mode  # follows symlinks: a link is judged by its target
    except FileNotFoundError:
        return _REPLACE  # a new file (or a dangling link, whose target is created)
    except OSError as exc:
        raise _error(path, exc) from None
    if stat.S_ISDIR(mode):
        raise OutputError(f"cannot write {path}: it is a directory")
    if stat.S_ISSOCK(mode):
        raise OutputError(f"cannot write {path}: it is a socket")
    if stat.S_ISREG(mode) and not _through_proc(path):
        return _REPLACE
    return _IN_PLACE


def _through_proc(path: str) -> bool:
    # /dev/stdout and /dev/fd/N are links into /proc/self/fd, whose targets are open files
    # of this process: the file descriptor is what the user means, not a rename beside it.
    return os.path.realpath(path).startswith(("/proc/", "/dev/fd/"))


def _replaced_path(path: str) -> str:
    """The file a rename must replace: the link's final target for a symlink."""
    return os.path.realpath(path) if os.path.islink(path) else path


def check_target(path: str) -> None:
    """OutputError now if ``path`` cannot be written later (checked before a test runs)."""
    if _kind(path) == _IN_PLACE:
        if not os.access(path, os.W_OK):
            raise OutputError(f"cannot write {path}: permission denied")
        return
    target = _replaced_path(path)
    directory = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(directory):
        raise OutputError(f"cannot write {path}: no such directory {directory}")
    try:  # the real test: can a file be made beside it (permissions, read-only mounts)?
        fd, temp = _temp_beside(target, directory)
    except OSError as exc:
        raise _error(path, exc) from None
    os.close(fd)
    _remove_quietly(temp)


# --- writing -----------------------------------------------------------------------------


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path``: replaced atomically, or in place for a device or FIFO
    (see the module docstring); OutputError if it cannot be done, in which case a file
    that was there is untouched and no temporary file is left behind."""
    if _kind(path) == _IN_PLACE:
        _write_in_place(path, text.encode("utf-8"), os.O_WRONLY)
    else:
        _replace(path, _replaced_path(path), text)


def append_text(path: str, text: str) -> None:
    """Append ``text`` (JSON lines) to ``path`` in one write; if that write fails part-way,
    cut a regular file back to its old length so that it never ends in half a line."""
    if _kind(path) == _IN_PLACE:
        _write_in_place(path, text.encode("utf-8"), os.O_WRONLY | os.O_APPEND)
        return
    data = text.encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as exc:
        raise _error(path, exc) from None
    try:
        size = os.fstat(fd).st_size
        try:
            _write_all(fd, data)
            os.fsync(fd)
        except OSError as exc:
            os.ftruncate(fd, size)
            raise _error(path, exc) from None
    finally:
        os.close(fd)


class AppendFile:
    """A file written line by line as a run goes (``--format json-stream``): opened for
    appending once, each :meth:`write` one ``write`` call of whole lines (a reader sees
    every line but, after a crash, the last), :meth:`close` flushes it to disk. Regular
    files are appended to, devices and FIFOs written in place; OutputError on failure."""

    def __init__(self, path: str) -> None:
        self.path = path
        flags = os.O_WRONLY | os.O_APPEND
        if _kind(path) == _REPLACE:
            flags |= os.O_CREAT
        try:
            self._fd: int | None = os.open(path, flags, 0o666)
        except OSError as exc:
            raise _error(path, exc) from None
        self._regular = stat.S_ISREG(os.fstat(self._fd).st_mode)

    def write(self, text: str) -> None:
        """Append ``text`` now (OutputError if it cannot be)."""
        if self._fd is None:
            raise OutputError(f"cannot write {self.path}: already closed")
        try:
            _write_all(self._fd, text.encode("utf-8"))
        except OSError as exc:
            raise _error(self.path, exc) from None

    def close(self) -> None:
        """Flush to disk (a regular file) and close; idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if self._regular:
                os.fsync(fd)
        except OSError as exc:
            raise _error(self.path, exc) from None
        finally:
            os.close(fd)


def write_stdout(text: str) -> None:
    """Write ``text`` to stdout and flush; a full disk or a failing device behind stdout is
    an OutputError (exit 6). A reader that went away stays a BrokenPipeError (also 6)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise _error("stdout", exc) from None


def _replace(path: str, target: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(target))
    try:
        fd, temp = _temp_beside(target, directory)
    except OSError as exc:
        raise _error(path, exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, _file_mode(target))
        os.replace(temp, target)
    except BaseException as exc:  # also Ctrl-C: never leave the temporary file behind
        _remove_quietly(temp)
        if isinstance(exc, OSError):
            raise _error(path, exc) from None
        raise


def _temp_beside(target: str, directory: str) -> tuple[int, str]:
    # tempfile (with shutil, random) only when a file is written: a run that prints to
    # stdout, as `--json` does, never needs it (start-up time on a router).
    import tempfile

    return tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(target)}.",
                            suffix=".tmp")


def _write_in_place(path: str, data: bytes, flags: int) -> None:
    # A FIFO blocks here until a reader opens it, as `> fifo` does in a shell.
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _error(path, exc) from None
    try:
        _write_all(fd, data)
    except OSError as exc:
        raise _error(path, exc) from None
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(28, "short write (disk full?)")
        view = view[written:]


def _error(path: str, exc: OSError) -> OutputError:
    return OutputError(f"cannot write {path}: {exc.strerror or exc}")


def _file_mode(path: str) -> int:
    # mkstemp makes 0600 files; give the result the mode a plain open() would (or the
    # mode of the file it replaces).
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


__all__ = ["EXTENSION_FORMATS", "AppendFile", "Formats", "OutputError", "append_text",
           "check_target", "choose_formats", "write_stdout", "write_text"]
