"""Reading saved results back: JSON documents (``--json``, ``netprobe parse --json``), JSON
lines (``--format jsonl``, ``-o results.jsonl``), a JSON list of results (``compare --json``)
and any mix of these concatenated in one file (``>>`` appends are common).

A record that is not JSON, or not a result, is an error naming the file and line. A file
whose last record is cut short (a run killed while writing, a disk that filled) gives the
records before it and a warning: what was measured is not thrown away for a torn tail.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from attrs import frozen

from netprobe.convert import structure
from netprobe.errors import ParseError
from netprobe.schema import Result

_JSON_TYPES = {str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


@frozen
class Loaded:
    """Results read from saved files, and what the reader should know about them."""

    results: tuple[Result, ...]
    """Every result read, in file order."""
    warnings: tuple[str, ...] = ()
    """One line each: a file cut short, a file without results."""


def load_texts(sources: Sequence[tuple[str, str]]) -> Loaded:
    """Read ``[(name, text), ...]``; ParseError (naming file and line) on a bad record."""
    results: list[Result] = []
    warnings: list[str] = []
    for name, text in sources:
        found, problem = read_results(text, name)
        results.extend(found)
        if problem:
            warnings.append(problem)
        elif not found:
            warnings.append(f"{name}: no results in this file")
    return Loaded(tuple(results), tuple(warnings))


def read_results(text: str, source: str) -> tuple[list[Result], str | None]:
    """The results in one file's ``text``, and a warning if its last record is cut short."""
    decoder = json.JSONDecoder()
    results: list[Result] = []
    pos = _skip_space(text, 0)
    while pos < len(text):
        line = text.count("\n", 0, pos) + 1
        try:
            value, pos = decoder.raw_decode(text, pos)
        except RecursionError:
            raise ParseError("JSON nested too deeply to be a netprobe result", source,
                             line) from None
        except json.JSONDecodeError as exc:
            if _cut_short(text, exc):
                return results, (f"{source}:{line}: the last record is incomplete (file cut "
                                 f"short?); read the {len(results)} before it")
            raise ParseError(f"not JSON: {exc.msg} (line {exc.lineno} column {exc.colno})",
                             source, line) from None
        results.extend(_results(value, source, line))
        pos = _skip_space(text, pos)
    return results, None


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _cut_short(text: str, exc: json.JSONDecodeError) -> bool:
    # The decoder ran out of text: it failed at the end, or inside a string that never
    # closed (a string cannot hold a raw newline, so such a string reaches the end).
    return exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")


def _results(value: Any, source: str, line: int) -> list[Result]:
    records = value if isinstance(value, list) else [value]
    return [_result(record, source, line) for record in records]


def _result(record: Any, source: str, line: int) -> Result:
    if not isinstance(record, dict):
        kind = _JSON_TYPES.get(type(record), type(record).__name__)
        raise ParseError(f"not a netprobe result but a JSON {kind}", source, line)
    try:
        return structure(record, Result)
    except ParseError as exc:  # re-raised with the file and line it came from
        raise ParseError(exc.detail, source, line) from None
