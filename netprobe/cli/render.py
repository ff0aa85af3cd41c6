"""Everything netprobe draws for people, with rich: live interval lines, the summary table
of a result, the ``netprobe tools`` table and error lines.

Results go to the stdout console, errors and progress notes to the stderr console (as
httpie and pip do). Only the CLI imports this module, and only when it has something to
draw, so ``netprobe --version`` never pays for importing rich.
"""
from __future__ import annotations

import errno
import io
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from netprobe.cli.textsafe import for_terminal
from netprobe.cli.units import (
    Units,
    format_bytes,
    format_length,
    format_ms_from_us,
    format_percent,
)
from netprobe.redact import redact
from netprobe.schema import Interval, Latency, Result, SideSummary, TestSpec

FILE_WIDTH = 120
"""Width of human output written to a file or a pipe (no terminal to measure)."""

_DIRECTION_LABELS = {"client_to_server": "c->s", "server_to_client": "s->c"}
_STATUS_STYLES = {"ok": "bold green", "failed": "bold red", "interrupted": "bold yellow"}


class _Console(Console):
    """A rich Console that lets a closed pipe reach the CLI as BrokenPipeError (exit code 6),
    where rich would raise SystemExit(1) by itself, and that treats every text as data:
    markup and emoji codes are not parsed, and whatever it draws passes through
    :func:`for_terminal` (a tool name or an agent's reply once cleared the screen)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("markup", False)  # "[/]" from a far end crashed `tools HOST`
        kwargs.setdefault("emoji", False)
        super().__init__(*args, **kwargs)

    def _render_buffer(self, buffer: Any) -> str:
        # The last step before the terminal: the text of every segment, whichever view
        # made it; rich's own control segments (cursor moves of a progress bar) stay.
        return super()._render_buffer(
            Segment(for_terminal(text), style, control) if control is None else
            Segment(text, style, control) for text, style, control in buffer)

    def on_broken_pipe(self) -> None:
        """Stop writing and report the closed pipe."""
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")


def stdout_console() -> Console:
    """The console for results (stdout)."""
    return _Console(highlight=False, width=_width(sys.stdout))


def stderr_console() -> Console:
    """The console for errors and notes (stderr)."""
    return _Console(stderr=True, highlight=False, width=_width(sys.stderr))


def _width(stream: Any) -> int | None:
    # Off a terminal rich assumes 80 columns, which folds the summary table; a pipe or a
    # log file reads better wide. COLUMNS, when set, still wins (rich reads it itself).
    is_tty = getattr(stream, "isatty", None)
    if (is_tty is not None and is_tty()) or "COLUMNS" in os.environ:
        return None
    return FILE_WIDTH


def plain(text: Any, style: str = "", one_line: bool = True) -> Text:
    """Foreign text (a far end's, a saved file's) as a rich Text: never markup, every
    control character shown as its escape (see :mod:`netprobe.cli.textsafe`)."""
    return Text(for_terminal(str(text), one_line=one_line), style=style)


def print_error(message: str) -> None:
    """One line on stderr: ``netprobe: error: message`` (never wrapped, never markup)."""
    line = Text("netprobe: ")
    line.append("error: ", style="bold red")
    line.append(plain(redact(" ".join(message.split()))))  # one line, no password
    stderr_console().print(line, soft_wrap=True)


def print_warning(message: str) -> None:
    """``warning: message`` on stderr, one line."""
    stderr_console().print(Text.assemble(("warning: ", "bold yellow"),
                                         plain(redact(message))),
                           soft_wrap=True)


def print_note(message: str) -> None:
    """A progress or status line on stderr, dimmed."""
    stderr_console().print(plain(message, "dim"), soft_wrap=True)


def print_line(message: str) -> None:
    """A plain line on stdout (server log lines)."""
    stdout_console().print(plain(message), soft_wrap=True)


# --- interval lines ----------------------------------------------------------------------


class IntervalFilter:
    """Decides which interval samples become lines.

    One stream: each time span once per direction and side (a tool may report the stream
    and the identical sum). Several streams: the sums, plus each stream with ``per_stream``.
    """

    def __init__(self, streams: int, per_stream: bool = False) -> None:
        self.show_ids = streams > 1
        self._per_stream = per_stream
        self._last: dict[tuple[str, str], Interval] = {}

    def wants(self, sample: Interval) -> bool:
        """True if ``sample`` should be shown."""
        if sample.end_s <= sample.start_s:  # an empty closing span says nothing
            return False
        if self.show_ids:
            return sample.stream_id is None or self._per_stream
        key = (sample.direction, sample.role)
        # Samples of one direction and side arrive in time order, so a repeat is adjacent.
        # The same bytes over the same span, give or take a millisecond: iperf3 stamps
        # a --bidir test's reverse sum with the forward sum's end (1.000475 s where its
        # one stream ended at 1.000481).
        last = self._last.get(key)
        self._last[key] = sample
        return last is None or not _same_span(last, sample)


def _same_span(a: Interval, b: Interval) -> bool:
    return (a.bytes == b.bytes and abs(a.start_s - b.start_s) < 1e-3
            and abs(a.end_s - b.end_s) < 1e-3)


def interval_header(show_ids: bool) -> Text:
    """The column titles printed above the first interval line."""
    ids = "[ ID] " if show_ids else ""
    return Text(f"{ids}{'Interval':<15}{'Dir':<5}{'Role':<9}{'Transfer':>14} {'Bitrate':>13}",
                style="bold")


def interval_line(sample: Interval, show_ids: bool, units: Units | None = None,
                  width: int | None = None) -> Text:
    """One interval as a line: span, direction, side, bytes, rate, then what is known, as
    much of it as fits ``width`` columns (all of it without a width)."""
    ids = ""
    if show_ids:
        ids = "[SUM] " if sample.stream_id is None else f"[{sample.stream_id:>3}] "
    span = f"{sample.start_s:6.2f}-{sample.end_s:<6.2f}s "
    line = Text(f"{ids}{span}{_DIRECTION_LABELS[sample.direction]:<5}{sample.role:<9}")
    units = units or Units()
    line.append(f"{units.bytes(sample.bytes):>14} ")
    line.append(f"{units.rate(sample.bits_per_second):>13}", style="bold")
    tail = [*_interval_extras(sample), *(["(omitted)"] if sample.omitted else [])]
    for extra in tail:
        if width is not None and len(line) + 2 + len(extra) > width:
            continue  # the figures that fit: a wider terminal or -V shows the rest
        line.append("  " + extra, style="dim" if extra == "(omitted)" else "")
    return line


def _interval_extras(sample: Interval) -> list[str]:
    extras = []
    if sample.retransmits is not None:
        extras.append(f"retr {sample.retransmits}")
    if sample.rtt_us is not None:
        extras.append(f"rtt {format_ms_from_us(sample.rtt_us)}")
    if sample.cwnd_bytes is not None:
        extras.append(f"cwnd {format_bytes(sample.cwnd_bytes)}")
    if sample.lost_packets is not None:
        total = f"/{sample.packets + sample.lost_packets}" if sample.packets is not None else ""
        extras.append(f"lost {sample.lost_packets}{total}")
    elif sample.packets is not None:
        extras.append(f"packets {sample.packets}")
    if sample.jitter_ms is not None:
        extras.append(f"jitter {sample.jitter_ms:.3f} ms")
    if sample.out_of_order_packets:
        extras.append(f"ooo {sample.out_of_order_packets}")
    if sample.latency_p50_us is not None:  # netprobe's latency probes (--latency)
        extras.append(f"latency {format_ms_from_us(sample.latency_p50_us)} "
                      f"(max {format_ms_from_us(sample.latency_max_us)})")
    return extras


class LiveReporter:
    """A Reporter (see netprobe.plugin) that prints interval lines as the tool sends them.

    Lines come in a fixed order whichever end reported first: per interval and direction,
    each stream's sender then receiver line, then the sums. An interval is drawn once
    every side the spec has reported it, or once a side is past it (a tool that reports
    one side only); :meth:`finish` draws what is left. Each line fits the console's width
    (``wide``: every figure, however long).

    Tools may report from their own threads, so printing is serialised by a lock. It never
    raises into the tool: if the terminal or pipe goes away, it stops printing and the
    test runs on (writing the result then fails, and the CLI exits 6).
    """

    def __init__(self, spec: TestSpec, per_stream: bool = False,
                 console: Console | None = None, notes: Console | None = None,
                 units: Units | None = None, wide: bool = False) -> None:
        self._units = units or Units()
        self._console = console or stdout_console()
        self._notes = notes or stderr_console()
        self._width = None if wide else self._console.width
        self._filter = IntervalFilter(spec.streams, per_stream)
        self._sides = {(d, r) for d in spec.flow_directions() for r in ("sender", "receiver")}
        self._summed = spec.streams > 1
        self._pending: dict[float, list[Interval]] = {}
        self._latest: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.lines = 0
        """Interval lines printed so far."""

    def interval(self, sample: Interval) -> None:
        """Take ``sample``; draw the intervals it completes."""
        with self._lock:
            if self._closed or not self._filter.wants(sample):
                return
            key = round(sample.start_s, 3)
            self._pending.setdefault(key, []).append(sample)
            side = (sample.direction, sample.role)
            self._latest[side] = max(self._latest.get(side, key), key)
            for start in sorted(self._pending):
                if not (self._complete(start) or self._passed(start)):
                    break
                self._draw(self._pending.pop(start))

    def finish(self) -> None:
        """Draw the intervals still held back (the test is over)."""
        with self._lock:
            for start in sorted(self._pending):
                self._draw(self._pending.pop(start))

    def _complete(self, start: float) -> bool:
        # Every side of the spec has its last line of this interval (the sum, with -P).
        done = {(s.direction, s.role) for s in self._pending[start]
                if s.stream_id is None or not self._summed}
        return self._sides <= done

    def _passed(self, start: float) -> bool:
        # Every side heard from has reported a later interval: nothing more will come.
        return bool(self._latest) and all(latest > start for latest in self._latest.values())

    def _draw(self, samples: list[Interval]) -> None:
        order = {"sender": 0, "receiver": 1}
        samples.sort(key=lambda s: (s.direction, s.stream_id is None, s.stream_id or 0,
                                    order.get(s.role, 2)))
        for sample in samples:
            if self.lines == 0:
                self._print(self._console, interval_header(self._filter.show_ids))
            self._print(self._console, interval_line(sample, self._filter.show_ids,
                                                     self._units, self._width))
            self.lines += 1

    def note(self, message: str) -> None:
        """Print a progress message, dimmed, on stderr."""
        with self._lock:
            if not self._closed:
                self._print(self._notes, Text(message, style="dim"))

    def _print(self, console: Console, line: Text) -> None:
        try:
            console.print(line, soft_wrap=True)
        except OSError:  # closed pipe, full disk: not the tool's problem
            self._closed = True


# --- the result --------------------------------------------------------------------------


def print_result(console: Console, result: Result, *, intervals: bool = False,
                 per_stream: bool = False, units: Units | None = None) -> None:
    """Draw a result: a title, optionally its intervals, the summary table, then warnings,
    errors and the status."""
    console.print(_title(result), soft_wrap=True)
    if intervals:  # drawn as the live lines would have been
        reporter = LiveReporter(result.spec, per_stream, console=console, notes=console,
                                units=units)
        for sample in result.intervals:
            reporter.interval(sample)
        reporter.finish()
    if result.summaries or result.streams:
        console.print(summary_table(result, per_stream, units, console.width))
    _print_sparkline(console, result)
    if result.latency is not None and result.latency.phases:
        from netprobe.cli.latencyview import print_latency

        print_latency(console, result)
    elif result.latency is not None:
        console.print(latency_text(result.latency), soft_wrap=True)
    if result.tool_latency is not None:
        own = result.tool_latency
        console.print(latency_text(own, f"{own.measured_by or result.tool.name}'s own latency"),
                      soft_wrap=True)
    for warning in result.warnings:
        console.print(Text.assemble(("warning: ", "bold yellow"), plain(warning)),
                      soft_wrap=True)
    for error in result.errors:
        console.print(Text.assemble(("error: ", "bold red"), plain(error)), soft_wrap=True)
    console.print(Text.assemble("status: ", (result.status, _STATUS_STYLES[result.status])))


_METRICS = {"round_trip": "round trip", "tcp_srtt": "TCP sender's smoothed RTT under load"}
"""What a Latency's samples are, in words (its ``metric``)."""


def latency_text(latency: Latency, label: str = "latency") -> Text:
    """``latency (iperf2, round trip): 31,250 samples, mean 17.4 us, ...`` (known figures
    only; who measured it and what when the record says)."""
    metric = _METRICS.get(latency.metric or "")
    if label == "latency":
        said = [w for w in (latency.measured_by, metric) if w]
        label += f" ({', '.join(said)})" if said else ""
    elif metric:
        label += f" ({metric})"
    parts = [f"{latency.count:,} samples"]
    for name, value in (("min", latency.min_us), ("mean", latency.mean_us),
                        ("p50", latency.p50_us), ("p90", latency.p90_us),
                        ("p99", latency.p99_us), ("max", latency.max_us)):
        if value is not None:
            parts.append(f"{name} {value:.1f} us")
    return Text.assemble((f"{label}: ", "bold"), ", ".join(parts))


def _print_sparkline(console: Console, result: Result) -> None:
    # Throughput over time at a glance, when there are enough intervals to draw.
    from netprobe.cli.report import sparkline_text

    line = sparkline_text(result)
    if line:
        console.print(line, soft_wrap=True)


def human_text(result: Result, per_stream: bool = False, units: Units | None = None) -> str:
    """The human rendering of a result, with its intervals, as plain text (for files)."""
    buffer = io.StringIO()
    console = _Console(file=buffer, width=FILE_WIDTH, color_system=None, highlight=False,
                       force_terminal=False)
    print_result(console, result, intervals=True, per_stream=per_stream, units=units)
    return buffer.getvalue()


def _title(result: Result) -> Text:
    spec = result.spec
    tool = " ".join(x for x in (result.tool.name, result.tool.version) if x)
    if result.tool.data_path:
        tool += f" ({result.tool.data_path} data path)"
    streams = f"{spec.streams} stream{'s' if spec.streams > 1 else ''}"
    far = result.remote.address or result.remote.host or spec.host or "unknown"
    port = f":{result.remote.port}" if result.remote.port else ""
    took = f"{result.duration_s:.2f} s" if result.duration_s is not None else "-"
    parts = [tool, spec.protocol, spec.direction, streams, f"server {far}{port}", took]
    return plain(" | ".join(parts) + f" | started {result.start_time or '-'}", "bold")


_COLUMNS = ("Dir", "Role", "Transfer", "Bitrate", "Call len", "CPU", "Retr", "RTT mean/min",
            "Lost", "Jitter", "OOO")


def summary_table(result: Result, per_stream: bool = False, units: Units | None = None,
                  width: int | None = None) -> Table:
    """Per direction: sender and receiver totals (and per stream if asked). Columns that
    no row knows anything about are left out; when the table would not fit ``width``
    columns, the cells shrink (CPU of the process only, the mean RTT only) rather than
    being cut."""
    titles, rows = _summary_cells(result, per_stream, units, compact=False)
    if width is not None and _natural_width(titles, rows) > width:
        titles, rows = _summary_cells(result, per_stream, units, compact=True)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  collapse_padding=True)
    for i, title in enumerate(titles):
        table.add_column(title, justify="left" if i < 2 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


def _summary_cells(result: Result, per_stream: bool, units: Units | None, compact: bool
                   ) -> tuple[list[str], list[tuple[str, ...]]]:
    rows: list[tuple[str, ...]] = []
    for flow in result.summaries:
        for side in (flow.sender, flow.receiver):
            if side is not None:
                rows.append(_summary_row(_DIRECTION_LABELS[flow.direction], side, units,
                                         compact))
    if per_stream:
        for stream in result.streams:
            label = f"{_DIRECTION_LABELS[stream.direction]} #{stream.stream_id}"
            for side in (stream.sender, stream.receiver):
                if side is not None:
                    rows.append(_summary_row(label, side, units, compact))
    keep = [i for i in range(len(_COLUMNS)) if i < 4 or any(row[i] != "-" for row in rows)]
    titles = [("RTT" if compact and _COLUMNS[i].startswith("RTT") else _COLUMNS[i])
              for i in keep]
    return titles, [tuple(row[i] for i in keep) for row in rows]


def _natural_width(titles: Sequence[str], rows: Sequence[tuple[str, ...]]) -> int:
    widths = [max(len(cell) for cell in column) for column in zip(titles, *rows)]
    return sum(widths) + 2 * (len(widths) - 1)  # a space of padding, the box's space


def _summary_row(label: str, side: SideSummary, units: Units | None = None,
                 compact: bool = False) -> tuple[str, ...]:
    units = units or Units()
    cpu = side.cpu.process if side.cpu else None
    return (
        label,
        side.role,
        units.bytes(side.bytes),
        units.rate(side.bits_per_second),
        _call_cell(side),
        format_percent(cpu.total_percent if cpu else None) if compact else _cpu_cell(side),
        _retransmits_cell(side),
        format_ms_from_us(side.rtt_us) if compact else _rtt_cell(side),
        _lost_cell(side),
        "-" if side.jitter_ms is None else f"{side.jitter_ms:.3f} ms",
        "-" if side.out_of_order_packets is None else str(side.out_of_order_packets),
    )


def _call_cell(side: SideSummary) -> str:
    # TCP: the length, what most often explains two tools' rates. UDP: the datagrams a
    # message carried, which says whether the packet rate was the path's (1) or not.
    per = side.datagrams_per_message
    if per is not None:
        return f"{per:g} dgram{'' if per == 1 else 's'}"
    return format_length(side.call_length_bytes)


def _cpu_cell(side: SideSummary) -> str:
    # Process CPU first (like nuttcp's %TX/%RX), the whole host in brackets when known.
    cpu = side.cpu
    process = cpu.process.total_percent if cpu and cpu.process else None
    host = cpu.host.total_percent if cpu and cpu.host else None
    if host is None:
        return format_percent(process)
    if process is None:
        return f"host {format_percent(host)}"
    return f"{format_percent(process)} (host {format_percent(host)})"


def _retransmits_cell(side: SideSummary) -> str:
    if side.retransmits is None:
        return "-"
    return f"{side.retransmits} (host-wide)" if side.retransmits_scope == "host" else str(
        side.retransmits)


def _rtt_cell(side: SideSummary) -> str:
    if side.rtt_us is None and side.min_rtt_us is None:
        return "-"
    return f"{format_ms_from_us(side.rtt_us)} / {format_ms_from_us(side.min_rtt_us)}"


def _lost_cell(side: SideSummary) -> str:
    if side.lost_packets is None:
        return "-"
    if side.lost_percent is None:
        return str(side.lost_packets)
    return f"{side.lost_packets} ({side.lost_percent:.2f}%)"


# --- netprobe tools ----------------------------------------------------------------------


def tools_table(rows: Sequence[dict[str, Any]]) -> Table:
    """The ``netprobe tools`` table from the rows the CLI builds (see ``tool_rows``)."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for title in ("Tool", "Status", "Version", "Path / details", "Why not / error"):
        table.add_column(title, overflow="fold")
    styles = {"available": "green", "unavailable": "yellow", "failed": "red"}
    for row in rows:
        details = "; ".join(x for x in [row.get("path") or "", *row.get("details", ())] if x)
        why = row.get("error") or "; ".join(row.get("reasons", ()))
        status = row["status"] if row["status"] in styles else "failed"
        table.add_row(plain(row["name"]), Text(row["status"], style=styles[status]),
                      plain(row.get("version") or "-"), plain(details or "-"), plain(why or ""))
    return table


_HELP_STYLES = (
    (r"(?m)^[A-Za-z][\w ]*:$", "bold"),  # section headings: "options:", "exit codes:"
    (r"(?m)^usage:", "bold"),
    (r"(?<![\w-])--?[A-Za-z][\w-]*", "cyan"),  # -t, --time
    (r"(?<![\w-])[A-Z][A-Z_]{2,}(?![\w-])", "green"),  # metavars: HOST, RATE
)


def print_help(text: str, stream: Any = None) -> None:
    """argparse's help text with options, metavars and headings highlighted (colour only
    on a terminal; piped help stays plain text)."""
    console = Console(file=stream or sys.stdout, highlight=False, soft_wrap=True)
    styled = Text(text.rstrip("\n"))
    for pattern, style in _HELP_STYLES:
        styled.highlight_regex(pattern, style)
    console.print(styled)
