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
import socket
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import attrs

from netprobe.driven import DrivenRun, free_port, is_local_host, not_found
from netprobe.errors import NetprobeError, ParseError
from netprobe.plugin import Availability, Capabilities, Reporter, Tool, utc_now_iso
from netprobe.schema import (
    Endpoint,
    Interval,
    RawOutput,
    Result,
    SideSummary,
    TestSpec,
    ToolInfo,
)
from netprobe.tools._iperf_common import (
    DriveSpec,
    Outcome,
    Parts,
    Probed,
    StreamNumbers,
    arg_number,
    assemble,
    deadline_for,
    drive,
    finish,
    probe_binary,
    whole_seconds,
)
from netprobe.tools.iperf3 import parse_output as p3

DEFAULT_PORT = 5201
"""iperf3's own default server port."""
ENV_VAR = "NETPROBE_IPERF3"
"""Environment variable naming the iperf3 binary to use."""
MAX_INTERVAL_S = 60.0


@attrs.frozen
class Iperf3Binary(Probed):
    """What probing found: the binary, its version and the options its --help lists."""

    @property
    def json_stream(self) -> bool:
        """``--json-stream`` (3.17+): JSON events line by line, live."""
        return self.has("--json-stream")


class Iperf3Tool(Tool):
    """iperf3 (ESnet) driven as an external program; one Result like every other tool.

    Options: ``path`` (the binary), ``start_server`` (default True: for a local host, start
    a one-off iperf3 server; False to use one that is already running).
    """

    name = "iperf3"
    description = "iperf3, the installed binary driven by netprobe"
    # 128 is iperf3's MAX_STREAMS; skip_rx_copy only with a binary that lists it (refusals()).
    capabilities = Capabilities.all_but(max_streams=128, min_interval_s=0.1)

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self._binary: Iperf3Binary | None = None
        self._problem: str | None = None

    # --- probing ------------------------------------------------------------------------

    def probe(self) -> Availability:
        """Find the binary (option ``path``, then $NETPROBE_IPERF3, then PATH) and read its
        version and options. Never raises."""
        try:
            binary = self._find()
        except NetprobeError as exc:
            return Availability(available=False, reasons=(str(exc),))
        except Exception as exc:  # probe() must never raise
            return Availability(available=False, reasons=(f"iperf3 probe failed: {exc}",))
        live = "--json-stream" if binary.json_stream else "the local server's output"
        return Availability(
            available=True,
            version=binary.version,
            path=binary.path,
            details=(f"live intervals from {live}",),
        )

    def _find(self) -> Iperf3Binary:
        if self._binary is None:
            override = self.options.get("path")
            found = probe_binary("iperf3", override, ENV_VAR, "--version",
                                 r"\biperf (3\.\d+(?:\.\d+)?[^\s(]*)", "iperf3",
                                 not_found("iperf3", override, ENV_VAR, "apt install iperf3"))
            self._binary = Iperf3Binary(found.path, found.version, found.help_text)
        return self._binary

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
        if spec.protocol == "udp":
            for flag, wanted in _tcp_only(spec):
                if wanted:
                    refuse(flag, "TCP only in iperf3 (ignored for UDP)")
        found.extend(self._binary_refusals(spec))
        return found

    def _binary_refusals(self, spec: TestSpec) -> list[str]:
        try:
            binary = self._find()
        except NetprobeError:
            return []  # run() reports the missing binary itself
        wanted = [
            ("--skip-rx-copy", spec.skip_rx_copy, "--skip-rx-copy", "3.19"),
            ("--bidir", spec.direction == "bidir", "--bidir", "3.7"),
            ("--congestion", spec.congestion is not None, "--congestion", "a Linux/FreeBSD build"),
        ]
        return [
            f"iperf3 cannot honour {flag}: this iperf3 {binary.version} has no {option} "
            f"(needs {needs})"
            for flag, asked, option, needs in wanted
            if asked and not binary.has(option)
        ]

    # --- running ---------------------------------------------------------------------------

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        """Run the test; start a one-off local server when the host is this machine."""
        self.check(spec)
        binary = self._find()
        start_time = utc_now_iso()
        local = is_local_host(spec.host) and self.options.get("start_server", True)
        host = _target_host(spec, is_local_host(spec.host))
        port = spec.port or (_free_port(spec, host) if local else DEFAULT_PORT)
        live = DrivenRun(reporter, tool=self.name)
        stream_doc: dict[str, Any] = {"intervals": []}
        job = DriveSpec(
            client_argv=client_argv(binary, spec, host, port),
            on_client_line=_stream_reader(stream_doc, spec, live) if binary.json_stream else None,
            server_argv=server_argv(binary, spec, host, port) if local else None,
            on_server_line=None if binary.json_stream else _server_reader(spec, live),
            server_ready=lambda line: "Server listening on" in line,
            server_done=lambda server: server.returncode is not None,
            deadline_s=_deadline(spec),
        )
        if not local and not binary.json_stream:
            live.note(
                f"iperf3 {binary.version} prints JSON only at the end: "
                "intervals will be shown when the test ends"
            )
        outcome = drive(job, reporter, live)
        return self._result(spec, binary, start_time, outcome, live, (host, port))

    def _result(
        self,
        spec: TestSpec,
        binary: Iperf3Binary,
        start_time: str,
        outcome: Outcome,
        live: DrivenRun,
        target: tuple[str, int],
    ) -> Result:
        parts, problem = read_client(outcome)
        if not parts.intervals:
            parts.intervals = live.collected()  # a failed run keeps what was seen live
        elif not live.collected():
            for sample in parts.intervals:  # nothing could be shown live: report them now
                live.emit(sample)
            live.deliver()
        parts.local = parts.local or Endpoint(role="client")
        if parts.remote is None or parts.remote.port is None:
            parts.remote = Endpoint(role="server", host=spec.host or target[0], port=target[1])
        parts.remote = attrs.evolve(parts.remote, host=spec.host or parts.remote.host)
        if outcome.timed_out:
            problem = f"no result {_deadline(spec):g} s after the start; stopped it"
        if outcome.server_failed:
            problem = f"the local iperf3 server did not start: {outcome.server_failed}"
        tool = ToolInfo(name=self.name, version=binary.version, mode=_mode(spec))
        shift_after_warmup(parts, spec.omit_s)
        return finish(
            parts, tool=tool, spec=spec, start_time=start_time, outcome=outcome, problem=problem
        )

    # --- parsing saved output -----------------------------------------------------------------

    def far_end_argv(self, spec: TestSpec, address: str, port: int) -> list[str] | None:
        """A one-off ``iperf3 -s -1`` on ``address:port`` (the client's -J has both sides)."""
        return server_argv(self._find(), spec, address, port)

    def split_tests(self, lines: Iterable[str]) -> Iterator[str]:
        """Each test of a log that holds several (see p3.split_tests)."""
        yield from p3.split_tests(lines)

    def parse(self, sources: Sequence[tuple[str, str]]) -> Result:
        """Saved iperf3 output (``-J`` documents, ``--json-stream`` lines or human output;
        client and/or server) as one Result. Raises ParseError on unreadable input."""
        if not sources:
            raise ParseError("nothing to parse")
        readings = [_read_source(name, text) for name, text in sources]
        main = next((r for r in readings if r.is_client), readings[0])
        parts = main.parts
        for other in readings:
            if other is not main:
                _merge(parts, other.parts)
        spec = main.spec or TestSpec(tool="iperf3", duration_s=parts.duration_s or 10.0)
        shift_after_warmup(parts, spec.omit_s)
        status = "failed" if parts.errors else "ok"
        raw = tuple(r.raw for r in readings)
        tool = ToolInfo(name=self.name, version=parts.version)
        return assemble(
            parts, tool=tool, spec=spec, start_time=parts.start_time, status=status, raw=raw
        )


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


# --- command lines ---------------------------------------------------------------------------


def _tcp_only(spec: TestSpec) -> list[tuple[str, bool]]:
    return [
        ("--mss", spec.mss_bytes is not None),
        ("--nodelay", spec.nodelay),
        ("--congestion", spec.congestion is not None),
        ("--zerocopy", spec.zerocopy),
    ]


def client_argv(binary: Iperf3Binary, spec: TestSpec, host: str, port: int) -> list[str]:
    """The iperf3 client command line for ``spec``."""
    argv = [binary.path, "-c", host, "-p", str(port), "-J"]
    if binary.json_stream:
        argv.append("--json-stream")
    if binary.has("--connect-timeout"):
        argv += ["--connect-timeout", "10000"]
    argv += _length_of_test(spec)
    argv += ["-i", arg_number(spec.interval_s) if spec.interval_s else "0"]
    argv += ["-P", str(spec.streams)]
    argv += {"reverse": ["-R"], "bidir": ["--bidir"]}.get(spec.direction, [])
    return argv + _protocol_args(spec) + _socket_args(spec)


def _length_of_test(spec: TestSpec) -> list[str]:
    if spec.bytes_total is not None:
        return ["-n", str(spec.bytes_total)]
    args = ["-t", arg_number(spec.duration_s or 10.0)]
    if spec.omit_s:
        args += ["-O", arg_number(spec.omit_s)]
    return args


def _protocol_args(spec: TestSpec) -> list[str]:
    args: list[str] = []
    if spec.protocol == "udp":
        args.append("-u")
        # The spec's None means unlimited; iperf3's UDP default would be 1 Mbit/s.
        args += ["-b", arg_number(spec.rate_bits_per_second or 0)]
    elif spec.rate_bits_per_second is not None:
        args += ["-b", arg_number(spec.rate_bits_per_second)]
    if spec.length_bytes is not None:
        args += ["-l", str(spec.length_bytes)]
    return args


def _socket_args(spec: TestSpec) -> list[str]:
    args: list[str] = []
    options: list[tuple[bool, list[str]]] = [
        (spec.window_bytes is not None, ["-w", str(spec.window_bytes)]),
        (spec.mss_bytes is not None, ["-M", str(spec.mss_bytes)]),
        (spec.nodelay, ["-N"]),
        (spec.dscp is not None, ["-S", str((spec.dscp or 0) << 2)]),  # TOS byte = DSCP << 2
        (spec.congestion is not None, ["-C", str(spec.congestion)]),
        (spec.ip_version == 4, ["-4"]),
        (spec.ip_version == 6, ["-6"]),
        (spec.bind_address is not None, ["-B", str(spec.bind_address)]),
        (spec.zerocopy, ["-Z"]),
        (spec.skip_rx_copy, ["--skip-rx-copy"]),
    ]
    for wanted, flags in options:
        if wanted:
            args += flags
    return args


def server_argv(binary: Iperf3Binary, spec: TestSpec, host: str, port: int) -> list[str]:
    """A one-off local server bound to the test address, printing flushed human intervals
    with rates in Kbit/s (the most precise unit iperf3 offers)."""
    interval = arg_number(spec.interval_s) if spec.interval_s else "0"
    argv = [binary.path, "-s", "-1", "-p", str(port), "-B", host, "-i", interval, "-f", "k"]
    if binary.has("--forceflush"):
        argv.append("--forceflush")
    return argv


def _target_host(spec: TestSpec, local: bool) -> str:
    if spec.host is not None and not (local and spec.host.lower().startswith("localhost")):
        return spec.host.strip("[]")
    return "::1" if spec.ip_version == 6 else "127.0.0.1"


def _free_port(spec: TestSpec, host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return free_port(family=family, host=host)


def _deadline(spec: TestSpec) -> float | None:
    deadline = deadline_for(spec)
    return None if deadline is None else deadline + 10.0  # plus iperf3's connect timeout


def _mode(spec: TestSpec) -> str:
    wanted = (("zerocopy", spec.zerocopy), ("skip-rx-copy", spec.skip_rx_copy))
    modes = [mode for mode, on in wanted if on]
    return "+".join(modes) or "copy"


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
    raw = RawOutput(name=name, text=text)
    stripped = text.lstrip()
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


def _merge(parts: Parts, other: Parts) -> None:
    """Add what another output of the same test knows and ``parts`` does not: the other
    side's intervals, and summary sides left unknown."""
    have = {(i.direction, i.role) for i in parts.intervals}
    parts.intervals.extend(i for i in other.intervals if (i.direction, i.role) not in have)
    for index, flow in enumerate(parts.summaries):
        theirs = next((f for f in other.summaries if f.direction == flow.direction), None)
        if theirs is not None:
            parts.summaries[index] = attrs.evolve(
                flow, sender=flow.sender or theirs.sender, receiver=flow.receiver or theirs.receiver
            )
    if not parts.summaries:
        parts.summaries = list(other.summaries)
    parts.warnings.extend(other.warnings)
    parts.errors.extend(e for e in other.errors if e not in parts.errors)
