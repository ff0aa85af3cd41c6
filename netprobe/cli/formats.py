"""Result output: the four formats and where they go.

Formats:

* ``human``: the summary table (and intervals, in a file) for people.
* ``json``: exactly one JSON document (:func:`netprobe.convert.to_json`).
* ``jsonl``: one line of JSON per result; ``-o FILE`` appends a line.
* ``csv``: a header and one row per flow direction; columns are :data:`CSV_COLUMNS`.

Files other than JSON lines are written atomically: a temporary file in the same
directory, flushed and synced, then renamed over the target with ``os.replace``, so a
reader never sees a half-written file and a failed write leaves the old one intact.
"""
from __future__ import annotations

import contextlib
import csv
import io
import os
import sys
import tempfile
from typing import Any

from netprobe.convert import to_json
from netprobe.errors import NetprobeError
from netprobe.plugin import NullReporter, Reporter
from netprobe.schema import FlowSummary, Result, SideSummary

FORMATS = ("human", "json", "jsonl", "csv")
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


class OutputError(NetprobeError):
    """The result could not be written (exit code 6)."""


def format_result(result: Result, fmt: str, per_stream: bool = False) -> str:
    """The text of ``result`` in format ``fmt`` (one of :data:`FORMATS`), newline-terminated."""
    if fmt == "json":
        return to_json(result) + "\n"
    if fmt == "jsonl":
        return to_json(result, indent=None) + "\n"
    if fmt == "csv":
        return format_csv([result])
    if fmt == "human":
        from netprobe.cli.render import human_text  # rich only when a person reads it

        return human_text(result, per_stream)
    raise ValueError(f"unknown format {fmt!r}")


def format_csv(results: list[Result], header: bool = True) -> str:
    """CSV text: the header (if asked) and the rows of each result."""
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
    return ["" if value is None else str(value) for value in values]


def _get(side: SideSummary | None, name: str) -> Any:
    return getattr(side, name) if side is not None else None


def _cpu(side: SideSummary | None, which: str) -> float | None:
    usage = getattr(side.cpu, which) if side is not None and side.cpu is not None else None
    return usage.total_percent if usage is not None else None


# --- writing -----------------------------------------------------------------------------


def write_atomic(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` atomically; OutputError if it cannot be done, in which
    case any previous file is untouched and no temporary file is left behind."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.",
                                    suffix=".tmp")
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, _file_mode(path))
        os.replace(temp, path)
    except BaseException as exc:  # also Ctrl-C: never leave the temporary file behind
        _remove_quietly(temp)
        if isinstance(exc, OSError):
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise


def append_text(path: str, text: str) -> None:
    """Append ``text`` (a JSON line) to ``path`` in one write; if that write fails part-way,
    cut the file back to its old length so that it never ends in half a line."""
    data = text.encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(28, "short write (disk full?)")
            os.fsync(fd)
        except OSError as exc:
            os.ftruncate(fd, size)
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


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


class Output:
    """Where a result goes.

    * stdout gets it in ``fmt``: for ``human`` the live interval lines, then the summary;
      a machine format is alone there (one JSON document, one JSON line, or CSV).
    * ``path``, if given, gets it too (JSON lines appended, others replaced atomically).
    * ``quiet`` leaves stdout empty (errors still go to stderr), e.g. for cron with ``-o``.
    """

    def __init__(self, fmt: str = "human", path: str | None = None, quiet: bool = False,
                 per_stream: bool = False) -> None:
        self.fmt = fmt
        self.path = path
        self.quiet = quiet
        self.per_stream = per_stream

    @property
    def live(self) -> bool:
        """True if interval lines are printed while the test runs."""
        return self.fmt == "human" and not self.quiet

    def reporter(self, spec: Any) -> Reporter:
        """A LiveReporter when interval lines are shown, else a NullReporter."""
        if not self.live:
            return NullReporter()
        from netprobe.cli.render import LiveReporter

        return LiveReporter(spec, per_stream=self.per_stream)

    def emit(self, result: Result, intervals_shown: bool = False) -> None:
        """Deliver ``result`` to stdout and to the file (OutputError if that fails; stdout
        gets the result all the same, so nothing measured is lost).

        ``intervals_shown`` says the live lines were already printed, so the human summary
        does not repeat them; otherwise (``parse``, or a tool that reported nothing live)
        the result's own intervals are drawn.
        """
        text = None if self.fmt == "human" else format_result(result, self.fmt)
        try:
            if self.path is not None:
                self._to_file(text or format_result(result, self.fmt, self.per_stream))
        finally:
            if not self.quiet:
                self._to_stdout(result, text, intervals_shown)

    def _to_file(self, text: str) -> None:
        assert self.path is not None
        if self.fmt == "jsonl":
            append_text(self.path, text)
        else:
            write_atomic(self.path, text)

    def _to_stdout(self, result: Result, text: str | None, intervals_shown: bool) -> None:
        if text is not None:
            sys.stdout.write(text)
            sys.stdout.flush()
            return
        from netprobe.cli.render import print_result, stdout_console

        print_result(stdout_console(), result, intervals=not intervals_shown,
                     per_stream=self.per_stream)
