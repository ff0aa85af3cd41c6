"""OpenWrt's UCI configuration files (``/etc/config/NAME``), read without OpenWrt's tools.

A router's service reads its settings from such a file; ``netprobe server --uci FILE``
takes the server's from one, so that the package's init script needs no shell code of its
own to turn options into arguments (and that mapping can be tested where there is no
OpenWrt userland). The syntax, as OpenWrt documents it::

    # a comment
    package netprobe                 (optional; uci export writes it)
    config TYPE ['NAME']             a section; the name is optional
        option KEY 'VALUE'           one value; a later one replaces it
        list KEY 'VALUE'             one more value of a list

A word is unquoted, ``'single quoted'`` (taken as it is) or ``"double quoted"`` (where a
backslash takes the next character as it is); quoted and unquoted parts written together
make one word, as in the shell. A quote must end on its line.

Only the syntax is checked here: which types and keys mean something is the reader's
business. Every error is a :class:`netprobe.errors.ParseError` naming the file and line.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from netprobe.errors import ParseError

MAX_BYTES = 64 * 1024
"""Largest file read: a router's config file is a few hundred bytes; more is not one."""

_NAME = re.compile(r"[A-Za-z0-9_]+\Z")  # section types, names and keys, as uci allows them


class Option(NamedTuple):
    """One ``option`` or ``list`` line (a list's lines are merged into one Option)."""

    key: str
    values: tuple[str, ...]
    """The value of an option (one), or every value of a list, in file order."""
    is_list: bool
    line: int
    """The line of the option, or of the list's last value."""


class Section(NamedTuple):
    """One ``config`` section and its options, in file order."""

    type: str
    name: str | None
    line: int
    options: tuple[Option, ...]


def load(path: str, max_bytes: int = MAX_BYTES) -> list[Section]:
    """The sections of the UCI file at ``path`` (ParseError if it cannot be read or parsed)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise ParseError(f"cannot read: {exc.strerror or exc}", path) from None
    if len(data) > max_bytes:
        raise ParseError(f"larger than {max_bytes} bytes: not a UCI config file", path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ParseError("not UTF-8 text", path, line) from None
    return parse(text, path)


def parse(text: str, source: str = "<uci>") -> list[Section]:
    """The sections of UCI ``text`` (``source`` names it in errors)."""
    sections: list[Section] = []
    current: _Builder | None = None
    for number, raw in enumerate(text.split("\n"), start=1):
        try:
            words = split_words(raw)
        except ValueError as exc:
            raise ParseError(str(exc), source, number) from None
        if not words:
            continue
        keyword, rest = words[0], words[1:]
        if keyword == "package":
            _need(rest, 1, 1, "package NAME", source, number)
        elif keyword == "config":
            _need(rest, 1, 2, "config TYPE ['NAME']", source, number)
            if current is not None:
                sections.append(current.section())
            current = _Builder(rest[0], rest[1] if len(rest) > 1 else None, number)
        elif keyword in ("option", "list"):
            _need(rest, 2, 2, f"{keyword} KEY 'VALUE'", source, number)
            if current is None:
                raise ParseError(f"{keyword} {rest[0]!r} before any config section", source,
                                 number)
            current.add(rest[0], rest[1], keyword == "list", source, number)
        else:
            raise ParseError(f"expected config, option or list, not {_shown(keyword)}",
                             source, number)
    if current is not None:
        sections.append(current.section())
    return sections


def split_words(line: str) -> list[str]:
    """The words of one line, quotes removed and ``#`` comments dropped (ValueError for an
    unterminated quote or a control character)."""
    words: list[str] = []
    word: list[str] | None = None  # None between words; [] is a word begun ('' is a word)
    index = 0
    while index < len(line):
        char = line[index]
        if char in " \t\r":
            if word is not None:
                words.append("".join(word))
            word, index = None, index + 1
        elif char == "#" and word is None:
            break
        elif char in "'\"":
            end, text = _quoted(line, index)
            word, index = [*(word or []), text], end
        elif ord(char) < 32 or ord(char) == 127:
            raise ValueError(f"control character {char!r} outside quotes")
        else:
            word, index = [*(word or []), char], index + 1
    if word is not None:
        words.append("".join(word))
    return words


def _quoted(line: str, start: int) -> tuple[int, str]:
    """(index after the closing quote, the text inside) of the quote opening at ``start``."""
    quote, index = line[start], start + 1
    text: list[str] = []
    while index < len(line):
        char = line[index]
        if char == quote:
            return index + 1, "".join(text)
        if char == "\\" and quote == '"' and index + 1 < len(line):
            index += 1
            char = line[index]
        text.append(char)
        index += 1
    raise ValueError(f"unterminated {quote} quote (a value must end on its line)")


def _need(words: list[str], least: int, most: int, form: str, source: str, line: int
          ) -> None:
    """ParseError unless the line has ``least`` to ``most`` words after its keyword, the
    names among them (all but an option's value) letters, digits and _."""
    if not least <= len(words) <= most:
        raise ParseError(f"expected {form}", source, line)
    for word in words[:1] if form.startswith(("option", "list")) else words:
        if not _NAME.match(word):
            raise ParseError(f"{_shown(word)} is not a name (letters, digits and _ only)",
                             source, line)


def _shown(word: str) -> str:
    """A word of the file for an error message: quoted, control characters escaped, cut."""
    return repr(word[:40] + ("..." if len(word) > 40 else ""))


class _Builder:
    """A section being read: options by key, lists merged, a repeated option replaced."""

    def __init__(self, kind: str, name: str | None, line: int) -> None:
        self.kind, self.name, self.line = kind, name, line
        self.options: dict[str, Option] = {}

    def add(self, key: str, value: str, is_list: bool, source: str, line: int) -> None:
        before = self.options.get(key)
        if before is not None and before.is_list != is_list:
            what = "a list" if before.is_list else "an option"
            raise ParseError(f"{key!r} is {what} (line {before.line}): not both", source, line)
        values = (*before.values, value) if before is not None and is_list else (value,)
        self.options.pop(key, None)  # a replaced option moves to where it was last said
        self.options[key] = Option(key, values, is_list, line)

    def section(self) -> Section:
        return Section(self.kind, self.name, self.line, tuple(self.options.values()))


__all__ = ["MAX_BYTES", "Option", "Section", "load", "parse", "split_words"]
