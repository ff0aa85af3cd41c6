"""Bounds that more than one layer applies: the spec's validator (which a server runs on
every request) and the command line's types, so that both refuse the same values.

It imports nothing of netprobe: the CLI reads it before it loads the schema.
"""

from __future__ import annotations

import os
import stat
from typing import Any

LONGEST_S = 7 * 86_400.0
"""The longest time a test's durations (``-t``, ``-O``, ``-i``) or a command's waits may
take: a week. Past any one test, and far inside what the waits built on them can take
(poll() counts milliseconds in a C int, 24.8 days; a timed wait's time_t overflows at
about 1e19 s, which is where a huge ``-i`` used to end in a traceback mid-test)."""

SECRET_MAX_BYTES = 4096
"""Longest shared secret file: a secret is a line (``openssl rand -hex 32`` is 65 bytes)."""
FLEET_FILE_MAX_BYTES = 16 << 20
"""Longest fleet file (thousands of agents take well under a MiB)."""
SAVED_RESULTS_MAX_BYTES = 256 << 20
"""Most text ``netprobe report`` reads from one file of saved results. A result keeps a
bounded number of intervals, so a file past this is thousands of results: an archive's job
(``--archive``), not one file's."""


class InputTooLarge(ValueError):
    """A file read with :func:`read_at_most` holds more than its limit."""


def read_at_most(handle: Any, limit: int) -> Any:
    """All of ``handle`` (text or bytes), but never more than ``limit`` units of it: a
    file a user names may be /dev/zero or a FIFO that never ends, and reading it whole
    would take all the memory there is. InputTooLarge past the limit."""
    data = handle.read(limit + 1)
    if len(data) > limit:
        unit = "characters" if isinstance(data, str) else "bytes"
        raise InputTooLarge(f"more than {limit} {unit}")
    return data


def read_regular_file(path: str, limit: int) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` (InputTooLarge past
    it). It is opened without blocking, so that a FIFO nobody writes is refused at once
    rather than waited on forever, and a device or a directory before a byte is read:
    OSError whose strerror says what it is (``not a regular file (a FIFO)``)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a special file")
        raise OSError(0, f"not a regular file ({kind})", path)
    with os.fdopen(fd, "rb") as handle:
        return bytes(read_at_most(handle, limit))
