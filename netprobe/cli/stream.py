"""``--format json-stream``: one test as JSON lines while it runs (iperf3 ``--json-stream``).

Each line is one event, an object with ``event`` and ``data``, written as it happens::

    {"event": "start", "data": {"schema_version": "...", "tool": "native", "spec": {...},
                                "start_time": "..."}}
    {"event": "interval", "data": {...one Interval, as in a result's "intervals"...}}
    ...
    {"event": "end", "data": {...the Result, as --format jsonl writes it...}}

Every interval sample goes out the moment the tool reports it, however many there are: a
long test at a short interval is written as it runs, while the Result keeps at most
:data:`netprobe.reporting.MAX_INTERVALS_KEPT` samples of each end (and says so in its
warnings). The ``end`` event carries the whole Result; its summaries cover the whole test.

``-o FILE`` gets the same lines, appended one ``write`` per line as ``jsonl`` is (so a
file can hold many runs, and a reader never sees half a line but the last one of a run
killed mid-write). :mod:`netprobe.results.saved` reads a stream back: each ``end`` event is a
result; a run cut short before its ``end`` (SIGKILL, a lost disk) becomes a partial result
of the intervals it streamed.
"""
from __future__ import annotations

import json

from netprobe import convert
from netprobe.cli.outfile import AppendFile, write_stdout
from netprobe.host import utc_now_iso
from netprobe.schema import SCHEMA_VERSION, Interval, Result, TestSpec

FORMAT = "json-stream"
"""The ``--format`` name of the stream."""


def event_line(event: str, data: object) -> str:
    """One event of the stream, as its line (newline-terminated)."""
    return json.dumps({"event": event, "data": data}, allow_nan=False,
                      separators=(",", ":")) + "\n"


def start_data(spec: TestSpec, tool: str, start_time: str | None) -> dict:
    """The ``start`` event's data: what runs, and since when."""
    return {"schema_version": SCHEMA_VERSION, "tool": tool,
            "spec": convert.unstructure(spec), "start_time": start_time}


def stream_text(result: Result) -> str:
    """A whole result as a stream: its start, its kept intervals, its end (``parse``)."""
    lines = [event_line("start", start_data(result.spec, result.tool.name,
                                            result.start_time))]
    lines += [event_line("interval", convert.unstructure(i)) for i in result.intervals]
    lines.append(event_line("end", convert.unstructure(result)))
    return "".join(lines)


class StreamReporter:
    """A Reporter (see netprobe.plugin) that writes the stream as the test runs: the start
    at once, every interval as it comes, the end when :meth:`end` is given the Result.

    Lines go to stdout (unless ``to_stdout`` is False, ``-q``) and to ``path`` (``-o``).
    A failing write raises (OutputError): the tool contains it (the test goes on, the
    reporter is not called again) and the end's write then fails the command (exit 6)."""

    def __init__(self, spec: TestSpec, to_stdout: bool, path: str | None) -> None:
        self._stdout = to_stdout
        self._file = AppendFile(path) if path is not None else None
        self.lines = 0
        """Interval lines written so far."""
        self._write(event_line("start", start_data(spec, spec.tool, utc_now_iso())))

    def interval(self, sample: Interval) -> None:
        """Write the sample's line now."""
        self._write(event_line("interval", convert.unstructure(sample)))
        self.lines += 1

    def note(self, message: str) -> None:
        """Progress notes are for people: not in the stream."""

    def end(self, result: Result) -> None:
        """Write the end event (the whole Result) and close the file."""
        try:
            self._write(event_line("end", convert.unstructure(result)))
        finally:
            if self._file is not None:
                self._file.close()

    def _write(self, line: str) -> None:
        if self._file is not None:
            self._file.write(line)
        if self._stdout:
            write_stdout(line)


__all__ = ["FORMAT", "StreamReporter", "event_line", "start_data", "stream_text"]
