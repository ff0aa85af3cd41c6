"""Reading saved results back: JSON documents (``--json``, ``netprobe parse --json``), JSON
lines (``--format jsonl``, ``-o results.jsonl``), a JSON list of results (``compare --json``),
JSON-stream events (``run --format json-stream``: each run's ``end`` event is its result)
and any mix of these concatenated in one file (``>>`` appends are common).

A stream cut short before its ``end`` event (the client killed, a lost disk) is read as a
partial result (status ``interrupted``) of its spec and the intervals it streamed, the
first :data:`netprobe.reporting.MAX_INTERVALS_KEPT` of them, with a warning.

A record that is not JSON, or not a result, is an error naming the file and line. A file
whose last record is cut short (a run killed while writing, a disk that filled) gives the
records before it and a warning: what was measured is not thrown away for a torn tail.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from attrs import frozen

from netprobe.convert import structure
from netprobe.errors import ParseError
from netprobe.reporting import KeptIntervals, intervals_not_kept
from netprobe.schema import Endpoint, Interval, Result, TestSpec, ToolInfo

T = TypeVar("T")
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
    """The results in one file's ``text``, and a warning if its last record is cut short
    (or a stream lacks its end)."""
    decoder = json.JSONDecoder()
    results: list[Result] = []
    stream = _Stream(source)
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
                results += stream.close()
                return results, (f"{source}:{line}: the last record is incomplete (file cut "
                                 f"short?); read the {len(results)} before it")
            raise ParseError(f"not JSON: {exc.msg} (line {exc.lineno} column {exc.colno})",
                             source, line) from None
        if isinstance(value, dict) and "event" in value:
            results += stream.event(value, line)
        else:
            results += stream.close()
            results.extend(_results(value, source, line))
        pos = _skip_space(text, pos)
    results += stream.close()
    return results, stream.problem


class _Stream:
    """The run of a JSON stream being read: its start, its kept intervals, until its end."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problem: str | None = None
        """A warning for a run that ended without its end event."""
        self._start: dict[str, Any] | None = None
        self._line = 0
        self._kept = KeptIntervals()

    def event(self, value: dict[str, Any], line: int) -> list[Result]:
        """Take one event; the results it completes (an end, or a run left without one)."""
        kind, data = value.get("event"), value.get("data")
        if kind == "start":
            done = self.close()
            if not isinstance(data, dict):
                raise ParseError("a stream's start event without its data", self.source, line)
            self._start, self._line = data, line
            return done
        if kind == "interval" and self._start is not None:
            self._kept.add(_record(data, Interval, self.source, line))
        elif kind == "end":
            self._start, self._kept = None, KeptIntervals()
            return [_result(data, self.source, line)]
        return []  # other events (iperf3 writes "error" ones) carry no figures

    def close(self) -> list[Result]:
        """The partial result of a run whose end never came (none if there is no such run)."""
        start, self._start = self._start, None
        if start is None:
            return []
        kept, self._kept = self._kept, KeptIntervals()
        spec = _record(start.get("spec"), TestSpec, self.source, self._line)
        self.problem = (f"{self.source}:{self._line}: a stream without its end (the run was "
                        f"cut short): read as a partial result of {len(kept)} intervals")
        not_kept = intervals_not_kept(len(kept), kept.dropped)
        return [Result(
            tool=ToolInfo(str(start.get("tool") or spec.tool)), spec=spec,
            start_time=start.get("start_time") if isinstance(start.get("start_time"), str)
            else None,
            local=Endpoint("client"), remote=Endpoint("server", host=spec.host, port=spec.port),
            status="interrupted", intervals=tuple(kept.samples),
            warnings=(not_kept,) if not_kept else (),
            errors=("the stream ended before its end event: the run was cut short",))]


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
    return _record(record, Result, source, line)


def _record(record: Any, cls: type[T], source: str, line: int) -> T:
    if not isinstance(record, dict):
        kind = _JSON_TYPES.get(type(record), type(record).__name__)
        what = "result" if cls is Result else cls.__name__.lower()
        raise ParseError(f"not a netprobe {what} but a JSON {kind}", source, line)
    try:
        return structure(record, cls)
    except ParseError as exc:  # re-raised with the file and line it came from
        raise ParseError(exc.detail, source, line) from None
