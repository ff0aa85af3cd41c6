"""Saved logs read in bounded memory: the text of one test spooled to a temporary file
past a size, the result's raw copy cut to its head, interval lines counted past a limit.

Shared by the parsers of saved tool output (``netprobe parse``): read whole, a 20 MB log
took 47-70x its size in memory (a list of lines, then a sample object per line)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Union

SPOOL_CHARS = 8 << 20
"""Most of one test's text a :class:`SpooledLog` holds in memory; past it, a temporary file."""

RAW_KEPT_CHARS = 1 << 20
"""Most of a saved log kept as the result's raw output (its head, where the banner and the
first reports are): the rest is said, not copied."""


class SpooledLog:
    """One test's lines from a saved log, in memory up to ``spool_chars`` and in a
    temporary file past it, so that reading a log of any size holds a bounded part of it.
    Read as the parser reads a str: its lines (again and again), ``in``, ``len``."""

    def __init__(self, spool_chars: int | None = None) -> None:
        import tempfile  # only a parse of saved logs needs it (a run's start-up does not)

        self._file = tempfile.SpooledTemporaryFile(  # noqa: SIM115 (lives with the object)
            max_size=SPOOL_CHARS if spool_chars is None else spool_chars,
            mode="w+", encoding="utf-8", errors="surrogateescape")
        self.chars = 0

    def add(self, line: str) -> None:
        """Append one line (its newline kept)."""
        self._file.seek(0, 2)
        self._file.write(line)
        self.chars += len(line)

    def __len__(self) -> int:
        return self.chars

    def __iter__(self) -> Iterator[str]:
        position = 0  # each iteration its own: a guess that stops early leaves no trace
        while True:
            self._file.seek(position)
            line = self._file.readline()
            if not line:
                return
            position = self._file.tell()
            yield line

    def __contains__(self, text: object) -> bool:
        return any(str(text) in line for line in self)

    def head(self, chars: int) -> str:
        """The first ``chars`` characters."""
        self._file.seek(0)
        return self._file.read(chars)

    def text(self) -> str:
        """The whole text (for a test small enough to be held)."""
        return self.head(self.chars)

    def strip(self) -> str:
        """The first non-blank text, stripped (empty: the log holds only blanks); enough
        for the checks that ask whether a source holds anything."""
        return next((line.strip() for line in self if line.strip()), "")


Text = Union[str, SpooledLog]
"""A test's saved output as a parser takes it: a str, or a SpooledLog of a big one."""


def lines(text: Text | Iterable[str]) -> Iterable[str]:
    """The lines of ``text`` (newlines kept), one at a time: a str's splitlines() would
    hold a second copy of a big log, and a list of its lines many times its size."""
    if not isinstance(text, str):
        return text
    return (found.group() for found in re.finditer(r"[^\n]*\n|[^\n]+$", text))


def held(chunk: SpooledLog, spool_chars: int | None = None) -> Text:
    """A test that fits in memory as a str, as it always was; a bigger one stays spooled."""
    return chunk.text() if chunk.chars <= (SPOOL_CHARS if spool_chars is None
                                           else spool_chars) else chunk


def kept_raw(text: Text, limit: int | None = None) -> str:
    """``text`` for the result's raw output: whole, or its head and how much was left out."""
    limit = RAW_KEPT_CHARS if limit is None else limit
    if len(text) <= limit:
        return text if isinstance(text, str) else text.head(limit)
    head = text[:limit] if isinstance(text, str) else text.head(limit)
    return head + f"\n[netprobe: {len(text) - limit} more characters not kept]\n"


def not_kept_warning(kept: int, not_kept: int) -> str | None:
    """The Result's warning for interval lines read from a saved log and not kept."""
    if not not_kept:
        return None
    return (f"{kept} interval reports kept in the result, "
            f"{not_kept} more read and not kept; the summaries are the tool's own")
