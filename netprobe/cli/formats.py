"""Result output: the four formats and where they go.

Formats:

* ``human``: the summary table (and intervals, in a file) for people.
* ``json``: exactly one JSON document (:func:`netprobe.convert.to_json`).
* ``jsonl``: one line of JSON per result; ``-o FILE`` appends a line.
* ``csv``: a header and one row per flow direction; columns are :data:`CSV_COLUMNS`.
* ``json-stream`` (``run``): JSON lines of events as the test runs, every interval as it
  comes, then the result (:mod:`netprobe.cli.stream`); ``-o FILE`` appends them.

Where and how a file is written (atomically, in place for a device or FIFO, the format
from the extension) is :mod:`netprobe.cli.outfile`'s business.
"""
from __future__ import annotations

import io
from typing import Any

from netprobe.cli.outfile import (
    OutputError,
    append_text,
    check_target,
    write_stdout,
    write_text,
)
from netprobe.cli.textsafe import for_csv
from netprobe.convert import to_json
from netprobe.plugin import Reporter
from netprobe.reporting import NullReporter
from netprobe.schema import FlowSummary, Result, SideSummary

FORMATS = ("human", "json", "jsonl", "csv", "json-stream")
"""Names accepted by ``--format``."""

CSV_COLUMNS = (
    "start_time",            # Result.start_time (UTC, ISO 8601)
    "tool",                  # ToolInfo.name
    "tool_version",          # ToolInfo.version
    "status",                # ok / failed / interrupted
    "host",                  # TestSpec.host (empty: loopback self-test)
    "protocol",              # tcp / udp
    "direction",             # client_to_server / server_to_client (this row's flow)
    "streams",               # TestSpec.streams
    "duration_s",            # Result.duration_s
    "sender_bytes",
    "sender_bits_per_second",
    "receiver_bytes",
    "receiver_bits_per_second",
    "retransmits",           # sender's count
    "retransmits_scope",     # connection / host
    "rtt_us",                # sender's mean smoothed RTT
    "min_rtt_us",
    "sender_cpu_percent",    # sender process, percent of one core
    "receiver_cpu_percent",  # receiver process, percent of one core
    "sender_host_cpu_percent",
    "receiver_host_cpu_percent",
    "packets",               # UDP datagrams received
    "lost_packets",
    "lost_percent",
    "jitter_ms",
    "out_of_order_packets",
)
"""CSV columns, one row per flow direction of the spec; an unknown figure is an empty cell."""


def format_result(result: Result, fmt: str, per_stream: bool = False,
                  units: Any = None) -> str:
    """The text of ``result`` in format ``fmt`` (one of :data:`FORMATS`), newline-terminated."""
    if fmt == "json":
        return to_json(result) + "\n"
    if fmt == "jsonl":
        return to_json(result, indent=None) + "\n"
    if fmt == "csv":
        return format_csv([result])
    if fmt == "json-stream":
        from netprobe.cli.stream import stream_text

        return stream_text(result)
    if fmt == "human":
        from netprobe.cli.render import human_text  # rich only when a person reads it

        return human_text(result, per_stream, units)
    raise ValueError(f"unknown format {fmt!r}")


def format_csv(results: list[Result], header: bool = True) -> str:
    """CSV text: the header (if asked) and the rows of each result."""
    import csv  # only here: a run writing JSON or the table has no use for it

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if header:
        writer.writerow(CSV_COLUMNS)
    for result in results:
        writer.writerows(csv_rows(result))
    return buffer.getvalue()


def csv_rows(result: Result) -> list[list[str]]:
    """One row per flow direction of the spec; a direction without figures (a test that
    failed early) still gets its row, so every run leaves a line in a log."""
    return [_csv_row(result, direction, result.summary(direction))
            for direction in result.spec.flow_directions()]


def _csv_row(result: Result, direction: str, flow: FlowSummary | None) -> list[str]:
    sender = flow.sender if flow else None
    receiver = flow.receiver if flow else None
    spec = result.spec
    values: list[Any] = [
        result.start_time, result.tool.name, result.tool.version, result.status, spec.host,
        spec.protocol, direction, spec.streams, result.duration_s,
        _get(sender, "bytes"), _get(sender, "bits_per_second"),
        _get(receiver, "bytes"), _get(receiver, "bits_per_second"),
        _get(sender, "retransmits"), _get(sender, "retransmits_scope"),
        _get(sender, "rtt_us"), _get(sender, "min_rtt_us"),
        _cpu(sender, "process"), _cpu(receiver, "process"),
        _cpu(sender, "host"), _cpu(receiver, "host"),
        _get(receiver, "packets"), _get(receiver, "lost_packets"),
        _get(receiver, "lost_percent"), _get(receiver, "jitter_ms"),
        _get(receiver, "out_of_order_packets"),
    ]
    # for_csv: a tool name or version from a far end or a saved file could be a formula
    return ["" if value is None else str(for_csv(value)) for value in values]


def _get(side: SideSummary | None, name: str) -> Any:
    return getattr(side, name) if side is not None else None


def _cpu(side: SideSummary | None, which: str) -> float | None:
    usage = getattr(side.cpu, which) if side is not None and side.cpu is not None else None
    return usage.total_percent if usage is not None else None


class Output:
    """Where a result goes.

    * stdout gets it in ``fmt``: for ``human`` the live interval lines, then the summary;
      a machine format is alone there (one JSON document, one JSON line, or CSV).
    * ``path``, if given, gets it too, in ``file_fmt`` (default: ``fmt``; the CLI takes it
      from :func:`netprobe.cli.outfile.choose_formats`): JSON lines appended, the others
      written by :func:`netprobe.cli.outfile.write_text`.
    * ``quiet`` leaves stdout empty (errors still go to stderr), e.g. for cron with ``-o``.
    """

    def __init__(self, fmt: str = "human", path: str | None = None, quiet: bool = False,
                 per_stream: bool = False, file_fmt: str | None = None,
                 units: Any = None, wide: bool = False) -> None:
        self.wide = wide
        """Interval lines with every figure, whatever the width (``-V``)."""
        self.units = units
        """How human output shows rates and byte counts (netprobe.cli.units.Units)."""
        self.fmt = fmt
        self.path = path
        self.file_fmt = file_fmt or fmt
        self.quiet = quiet
        self.per_stream = per_stream
        self._stream: Any = None  # the StreamReporter of the run in progress (json-stream)

    @property
    def live(self) -> bool:
        """True if interval lines are printed while the test runs."""
        return self.fmt == "human" and not self.quiet

    def check(self) -> None:
        """OutputError now if the file cannot be written (before a test is run for it)."""
        if self.path is not None:
            check_target(self.path)

    def reporter(self, spec: Any) -> Reporter:
        """A LiveReporter when interval lines are shown, a StreamReporter for json-stream
        (it writes the start at once), else a NullReporter."""
        to_stdout = self.fmt == "json-stream" and not self.quiet
        to_file = self.path if self.file_fmt == "json-stream" else None
        if to_stdout or to_file:
            from netprobe.cli.stream import StreamReporter

            self._stream = StreamReporter(spec, to_stdout, to_file)
            return self._stream
        if not self.live:
            return NullReporter()
        from netprobe.cli.render import LiveReporter

        return LiveReporter(spec, per_stream=self.per_stream, units=self.units,
                            wide=self.wide)

    def emit(self, result: Result, intervals_shown: bool = False) -> None:
        """Deliver ``result`` to stdout and to the file (OutputError if that fails; stdout
        gets the result all the same, so nothing measured is lost).

        ``intervals_shown`` says the live lines were already printed, so the human summary
        does not repeat them; otherwise (``parse``, or a tool that reported nothing live)
        the result's own intervals are drawn.
        """
        if self._stream is not None:  # json-stream: the run's start and intervals are out
            stream, self._stream = self._stream, None
            stream.end(result)
            return
        try:
            if self.path is not None:
                self._to_file(format_result(result, self.file_fmt, self.per_stream,
                                            self.units))
        finally:
            if not self.quiet:
                self._to_stdout(result, intervals_shown)

    def _to_file(self, text: str) -> None:
        assert self.path is not None
        if self.file_fmt in ("jsonl", "json-stream"):
            append_text(self.path, text)
        else:
            write_text(self.path, text)

    def _to_stdout(self, result: Result, intervals_shown: bool) -> None:
        if self.fmt != "human":
            write_stdout(format_result(result, self.fmt))
            return
        from netprobe.cli.render import print_result, stdout_console

        try:
            print_result(stdout_console(), result, intervals=not intervals_shown,
                         per_stream=self.per_stream, units=self.units)
        except BrokenPipeError:
            raise
        except OSError as exc:  # a full disk or a failing device behind stdout: exit 6
            raise OutputError(f"cannot write stdout: {exc.strerror or exc}") from None
