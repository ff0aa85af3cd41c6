"""The iperf3 adapter: drives the installed ``iperf3`` binary and maps its output into the
result schema.

How it runs: the client always writes JSON (``-J``), the authoritative record. Live
intervals come from ``--json-stream`` where the binary has it (iperf3 3.17+). Older
iperf3 (Debian's 3.12) prints its JSON only at the end, so live samples come from the
server's human output instead when this adapter starts the server itself (host omitted or
local); they are the server's view, rounded as iperf3 prints them (``-f k``), and the
Result keeps the client's exact JSON intervals. Against a remote 3.12 server nothing can be
shown live: the intervals are reported when the test ends.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

import attrs

from netprobe.driven import DrivenRun
from netprobe.errors import ParseError
from netprobe.plugin import Capabilities, Reporter, fill_missing
from netprobe.schema import (
    Endpoint,
    Interval,
    RawOutput,
    Result,
    SideSummary,
    TestSpec,
    ToolInfo,
)
from netprobe.tools._bounded import SpooledLog, kept_raw
from netprobe.tools._iperf_common import (
    DriveSpec,
    IperfTool,
    Launch,
    Outcome,
    Parts,
    Probed,
    StreamNumbers,
    assemble,
    deadline_for,
    drive,
    finish,
    whole_seconds,
)
from netprobe.tools.iperf3 import parse_output as p3
from netprobe.tools.iperf3.command import (
    DEFAULT_PORT,
    Iperf3Binary,
    client_argv,
    mode,
    server_argv,
)

ENV_VAR = "NETPROBE_IPERF3"
"""Environment variable naming the iperf3 binary to use."""
MAX_INTERVAL_S = 60.0

__all__ = ["Iperf3Binary", "Iperf3Tool"]


class Iperf3Tool(IperfTool):
    """iperf3 (ESnet) driven as an external program; one Result like every other tool.

    Options: ``path`` (the binary), ``start_server`` (default True: for a local host, start
    a one-off iperf3 server; False to use one that is already running).
    """

    name = "iperf3"
    description = "iperf3, the installed binary driven by netprobe"
    overhead_s = 0.25  # the one-off server's start and its handshake: 0.15-0.3 s here
    # 128 is iperf3's MAX_STREAMS; skip_rx_copy only with a binary that lists it (refusals()).
    capabilities = Capabilities.all_but(max_streams=128, min_interval_s=0.1)

    program, env_var, install_hint = "iperf3", ENV_VAR, "apt install iperf3"
    version_args, version_pattern = ("--version",), r"\biperf (3\.\d+(?:\.\d+)?[^\s(]*)"
    label, found_type, default_port = "iperf3", Iperf3Binary, DEFAULT_PORT

    def details(self, found: Probed) -> tuple[str, ...]:
        """Where live intervals come from with this binary."""
        stream = isinstance(found, Iperf3Binary) and found.json_stream
        live = "--json-stream" if stream else "the local server's output"
        return (f"live intervals from {live}",)

    def found(self) -> Iperf3Binary:
        """The binary this tool runs (what its --help lists included)."""
        found = super().found()
        assert isinstance(found, Iperf3Binary)
        return found

    # --- refusing what cannot be honoured -------------------------------------------------

    def refusals(self, spec: TestSpec) -> list[str]:
        """The base checks plus iperf3's own limits and those of the installed binary."""
        found = super().refusals(spec)

        def refuse(option: str, why: str) -> None:
            found.append(f"iperf3 cannot honour {option}: {why}")

        if not whole_seconds(spec.duration_s):
            refuse(f"--time {spec.duration_s}", "iperf3 -t takes whole seconds")
        if not whole_seconds(spec.omit_s):
            refuse(f"--omit {spec.omit_s}", "iperf3 -O takes whole seconds")
        if spec.interval_s is not None and spec.interval_s > MAX_INTERVAL_S:
            refuse(f"--interval {spec.interval_s}", f"longest is {MAX_INTERVAL_S:g} s")
        if spec.bytes_total is not None and (spec.streams > 1 or spec.direction == "bidir"):
            refuse("--bytes", "iperf3 -n counts the bytes of all streams together, not per stream")
        found.extend(self.tcp_only_refusals(spec, ("--mss", "--nodelay", "--congestion",
                                                   "--zerocopy")))
        found.extend(self.missing_options([
            ("--skip-rx-copy", spec.skip_rx_copy, "--skip-rx-copy", "3.19"),
            ("--bidir", spec.direction == "bidir", "--bidir", "3.7"),
            ("--congestion", spec.congestion is not None, "--congestion", "a Linux/FreeBSD build"),
        ]))
        return found

    # --- running ---------------------------------------------------------------------------

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        """Run the test; start a one-off local server when the host is this machine."""
        go = self.launch(spec, reporter)
        binary, host, port, live = self.found(), go.host, go.port, go.live
        stream_doc: dict[str, Any] = {"intervals": []}
        job = DriveSpec(
            client_argv=client_argv(binary, spec, host, port),
            on_client_line=_stream_reader(stream_doc, spec, live) if binary.json_stream else None,
            server_argv=server_argv(binary, spec, host, port) if go.local else None,
            on_server_line=None if binary.json_stream else _server_reader(spec, live),
            server_ready=lambda line: "Server listening on" in line,
            server_done=lambda server: server.returncode is not None,
            deadline_s=_deadline(spec),
        )
        if not go.local and not binary.json_stream:
            live.note(
                f"iperf3 {binary.version} prints JSON only at the end: "
                "intervals will be shown when the test ends"
            )
        return self._result(spec, binary, go, drive(job, reporter, live))

    def _result(
        self,
        spec: TestSpec,
        binary: Iperf3Binary,
        go: Launch,
        outcome: Outcome,
    ) -> Result:
        live = go.live
        parts, problem = read_client(outcome)
        if not parts.intervals:
            parts.intervals = live.collected()  # a failed run keeps what was seen live
        elif not live.collected():
            for sample in parts.intervals:  # nothing could be shown live: report them now
                live.emit(sample)
            live.deliver()
        parts.local = parts.local or Endpoint(role="client")
        if parts.remote is None or parts.remote.port is None:
            parts.remote = Endpoint(role="server", host=spec.host or go.host, port=go.port)
        parts.remote = attrs.evolve(parts.remote, host=spec.host or parts.remote.host)
        if outcome.timed_out:
            problem = f"no result {_deadline(spec):g} s after the start; stopped it"
        if outcome.server_failed:
            problem = f"the local iperf3 server did not start: {outcome.server_failed}"
        tool = ToolInfo(name=self.name, version=binary.version, mode=mode(spec))
        shift_after_warmup(parts, spec.omit_s)
        return finish(
            parts, tool=tool, spec=spec, start_time=go.start_time, outcome=outcome, problem=problem
        )

    # --- parsing saved output -----------------------------------------------------------------

    def far_end_argv(self, spec: TestSpec, address: str, port: int) -> list[str] | None:
        """A one-off ``iperf3 -s -1`` on ``address:port`` (the client's -J has both sides)."""
        return server_argv(self.found(), spec, address, port)

    def split_tests(self, lines: Iterable[str]) -> Iterator[str]:
        """Each test of a log that holds several (see p3.split_tests). A big test comes
        as a SpooledLog, which parse reads as it reads a str (see netprobe.tools._bounded)."""
        yield from cast(Iterator[str], p3.split_tests(lines))

    def parse(self, sources: Sequence[tuple[str, str]]) -> Result:
        """Saved iperf3 output (``-J`` documents, ``--json-stream`` lines or human output;
        client and/or server) as one Result. Raises ParseError on unreadable input."""
        if not sources:
            raise ParseError("nothing to parse")
        readings = [_read_source(name, text) for name, text in sources]
        main = next((r for r in readings if r.is_client), readings[0])
        spec = main.spec or TestSpec(tool="iperf3", duration_s=main.parts.duration_s or 10.0,
                                     direction=_direction_of(main.parts),
                                     streams=_streams_of(main.parts))
        result = self._assembled(main, spec)
        for other in readings:
            if other is not main:  # the same test seen from the other end
                result = fill_missing(result, self._assembled(other, spec))
        warnings = [w for r in readings for w in r.parts.warnings]
        errors = list(dict.fromkeys(e for r in readings for e in r.parts.errors))
        return attrs.evolve(result, status="failed" if errors else "ok", errors=tuple(errors),
                            warnings=tuple(dict.fromkeys([*warnings, *result.warnings])),
                            raw=tuple(r.raw for r in readings))

    def _assembled(self, reading: _Reading, spec: TestSpec) -> Result:
        shift_after_warmup(reading.parts, spec.omit_s)
        tool = ToolInfo(name=self.name, version=reading.parts.version)
        return assemble(reading.parts, tool=tool, spec=spec, start_time=reading.parts.start_time)


def _direction_of(parts: Parts) -> str:
    """A human output's test direction, from the flows it reported (it does not say)."""
    flows = {flow.direction for flow in parts.summaries}
    if len(flows) > 1:
        return "bidir"
    return "reverse" if flows == {"server_to_client"} else "normal"


def _streams_of(parts: Parts) -> int:
    """A human output's streams per direction, from the streams it reported (a server's
    text does not say how many the client asked for)."""
    directions = [stream.direction for stream in parts.streams]
    return max((directions.count(d) for d in set(directions)), default=1)


def shift_after_warmup(parts: Parts, omit_s: float) -> None:
    """iperf3 restarts its clock when the warm-up (-O) ends: put the intervals after it and
    the summaries (which cover only the time after it) on the test's own time line."""
    if omit_s <= 0:
        return
    # The warm-up ends when its last interval does (a few microseconds after omit_s).
    omit_s = max([omit_s, *(i.end_s for i in parts.intervals if i.omitted)])
    parts.intervals = [
        sample if sample.omitted else attrs.evolve(
            sample, start_s=sample.start_s + omit_s, end_s=sample.end_s + omit_s)
        for sample in _mend_first_after_warmup(parts.intervals)
    ]
    parts.summaries = [
        attrs.evolve(f, sender=_shifted(f.sender, omit_s), receiver=_shifted(f.receiver, omit_s))
        for f in parts.summaries
    ]
    parts.streams = [
        attrs.evolve(s, sender=_shifted(s.sender, omit_s), receiver=_shifted(s.receiver, omit_s))
        for s in parts.streams
    ]


def _mend_first_after_warmup(intervals: Sequence[Interval]) -> list[Interval]:
    """The first interval after the warm-up of each series, as iperf3 meant it.

    At the end of -O, iperf3 resets each stream's clock and byte counts but keeps the end
    of the last interval it reported as the next one's start, and takes the distance
    between the two as absolute. When the warm-up ends just before an interval report is
    due, that report is skipped and the next one comes out with a start near the interval
    length, a duration of two intervals and the bytes of one (3.12: "0.50-0.50 sec, 1.20
    GBytes"). Its bytes are counted from the reset: it starts at 0 on the new clock, and
    its rate is bytes over its end.
    """
    seen: set[tuple[str, str, int | None]] = set()
    mended = []
    for sample in intervals:
        series = (sample.direction, sample.role, sample.stream_id)
        if not sample.omitted and series not in seen:
            seen.add(series)
            if sample.start_s > 0 and sample.end_s > 0:
                bps = sample.bits_per_second
                if sample.bytes is not None:
                    bps = sample.bytes * 8 / sample.end_s
                sample = attrs.evolve(sample, start_s=0.0, bits_per_second=bps)
        mended.append(sample)
    return mended


def _shifted(side: SideSummary | None, omit_s: float) -> SideSummary | None:
    if side is None:
        return None
    return attrs.evolve(side, start_s=side.start_s + omit_s, end_s=side.end_s + omit_s)


def _deadline(spec: TestSpec) -> float | None:
    deadline = deadline_for(spec)
    return None if deadline is None else deadline + 10.0  # plus iperf3's connect timeout


# --- live readers ---------------------------------------------------------------------------


def _stream_reader(doc: dict[str, Any], spec: TestSpec, live: DrivenRun) -> Any:
    """on_line for ``--json-stream``: each interval event becomes live samples."""
    numbers = StreamNumbers()
    ctx = p3.DocContext(
        is_client=True,
        reverse=spec.direction == "reverse",
        bidir=spec.direction == "bidir",
        udp=spec.protocol == "udp",
    )

    def on_line(line: str) -> None:
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            return  # not an event line (e.g. a warning printed by the binary)
        if isinstance(event, dict):
            data = p3.apply_event(doc, event)
            if data is not None:
                for sample in p3.intervals_from_block(data, ctx, numbers):
                    live.emit(sample)

    return on_line


def _server_reader(spec: TestSpec, live: DrivenRun) -> Any:
    """on_line for the local server's human output (iperf3 before 3.17)."""
    role = "sender" if spec.direction == "reverse" else "receiver"
    reader = p3.HumanIntervals(process_is_client=False, default_role=role)

    def on_line(line: str) -> None:
        sample: Interval | None = reader.feed(line)
        if sample is not None:
            live.emit(sample)

    return on_line


# --- reading the client's output --------------------------------------------------------------


def read_client(outcome: Outcome) -> tuple[Parts, str | None]:
    """Result parts from the client's JSON, and what went wrong (None if nothing)."""
    client = outcome.client
    if client is None:
        return Parts(), "the client did not start"
    text = client.text
    json_at = text.find("{")
    if json_at < 0:
        said = text.strip().splitlines()[-1] if text.strip() else "no output"
        return Parts(), said.replace("iperf3: error - ", "")
    try:
        doc, warnings = p3.parse_json_text(text[json_at:], "client")
    except ParseError as exc:
        return Parts(), f"unreadable JSON output: {exc}"
    parts = p3.parse_document(doc, "client")
    parts.warnings.extend(warnings)
    if client.callback_error is not None:
        parts.warnings.append(f"live interval display failed: {client.callback_error}")
    error = p3.json_error(doc)
    if error is None and client.returncode not in (0, None):
        error = f"exited with code {client.returncode}"
    if error is None and "end" not in doc:
        error = "the output ended before the test did"
    return parts, error


# --- parse(): several saved outputs ------------------------------------------------------------


@attrs.define
class _Reading:
    parts: Parts
    spec: TestSpec | None
    is_client: bool
    raw: RawOutput


def _read_source(name: str, text: str) -> _Reading:
    raw = RawOutput(name=name, text=kept_raw(text))
    if isinstance(text, SpooledLog) and text.strip().startswith("{"):
        text = text.text()  # a -J document is read whole (json.loads needs it all)
    stripped = text.lstrip() if isinstance(text, str) else ""
    if stripped.startswith("{"):
        doc, warnings = p3.parse_json_text(stripped, name)
        parts = p3.parse_document(doc, name)
        parts.warnings.extend(warnings)
        spec = p3.spec_from_document(doc, parts) if doc.get("start") else None
        start = doc.get("start")
        is_client = p3.context_from_start(start if isinstance(start, dict) else {}).is_client
        return _Reading(parts, spec, is_client, raw)
    parts = p3.parse_human_text(text, name)
    return _Reading(parts, None, "Connecting to host" in text, raw)
