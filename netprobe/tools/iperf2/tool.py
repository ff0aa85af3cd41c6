"""The iperf 2 adapter: drives the installed ``iperf`` (2.x) binary and maps its output
into the result schema.

Both ends print enhanced reports (``-e``) in plain bytes and bits (``-f b``), so every
figure is exact; iperf 2 flushes each report line, so intervals are read live from the
client (and from the local server, which this adapter starts when the host is this
machine and stops by its PID afterwards: iperf 2 servers never exit by themselves).

iperf 2 exits 0 on most failures (connection refused, unknown options are only warned
about): the output is checked for those messages and they fail the test.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

import attrs

from netprobe.driven import DrivenProcess, DrivenRun
from netprobe.errors import NetprobeError, ParseError
from netprobe.plugin import Capabilities, Reporter, fill_missing
from netprobe.schema import RawOutput, Result, TestSpec, ToolInfo
from netprobe.tools._iperf_common import (
    DriveSpec,
    IperfTool,
    Launch,
    Outcome,
    Parts,
    Probed,
    assemble,
    deadline_for,
    drive,
    finish,
)
from netprobe.tools.iperf2 import parse_output as p2
from netprobe.tools.iperf2.command import DEFAULT_PORT, client_argv, server_argv

ENV_VAR = "NETPROBE_IPERF2"
"""Environment variable naming the iperf 2 binary to use."""


Iperf2Binary = Probed
"""What probing found: the binary, its version and its --help text."""


class Iperf2Tool(IperfTool):
    """iperf 2 driven as an external program; one Result like every other tool.

    Options: ``path`` (the binary), ``start_server`` (default True: for a local host,
    start an iperf 2 server and stop it afterwards; False to use one already running).
    """

    name = "iperf2"
    aliases = ("iperf",)
    description = "iperf 2, the installed binary driven by netprobe"
    # The client is done 0.2 s after its test (server started, listening, report read),
    # stopping the server takes about 1 s more: 1.1-1.4 s a trial on loopback here.
    overhead_s = 1.2
    capabilities = Capabilities.all_but(
        "omit",  # no warm-up exclusion in iperf 2.1
        "zerocopy", "skip_rx_copy",  # iperf 2 always copies
        max_streams=None, min_interval_s=0.01,
    )

    program, env_var, install_hint = "iperf", ENV_VAR, "iperf 2.x: apt install iperf"
    version_args = ("-v",)  # iperf 2 prints its version to stderr and exits 1
    version_pattern, label = r"iperf version (2\.\d+(?:\.\d+)?\S*)", "iperf 2"
    default_port = DEFAULT_PORT

    # --- refusing what cannot be honoured -------------------------------------------------

    def refusals(self, spec: TestSpec) -> list[str]:
        """The base checks plus iperf 2's own limits."""
        found = super().refusals(spec)
        if spec.bytes_total is not None and spec.direction != "normal":
            found.append("iperf2 cannot honour --bytes: iperf 2 counts -n on the client's own "
                         "sends only")
        found.extend(_endless_byte_counts(spec))
        found.extend(self.tcp_only_refusals(spec, ("--mss", "--nodelay", "--congestion")))
        found.extend(self.missing_options([
            ("--reverse", spec.direction == "reverse", "--reverse", ""),
            ("--bidir", spec.direction == "bidir", "--full-duplex", ""),
        ]))
        return found

    # --- running ---------------------------------------------------------------------------

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        """Run the test; start a local server (stopped by PID afterwards) when the host is
        this machine."""
        go = self.launch(spec, reporter)
        binary, host, port, live = self.found(), go.host, go.port, go.live
        keys = p2.StreamKeys()
        on = spec.interval_s is not None
        client = p2.TextReader(True, keys, intervals=on)
        server = p2.TextReader(False, keys, intervals=on)
        expected = spec.streams * len(spec.flow_directions())
        job = DriveSpec(
            client_argv=client_argv(binary, spec, host, port),
            on_client_line=_live(client, live),
            server_argv=server_argv(binary, spec, host, port) if go.local else None,
            on_server_line=_live(server, live),
            server_ready=lambda line: "Server listening on" in line,
            server_done=lambda proc: _finished(server) >= expected or proc.returncode is not None,
            deadline_s=deadline_for(spec),
        )
        return self._result(spec, binary, go, drive(job, reporter, live), client, server)

    def _result(
        self,
        spec: TestSpec,
        binary: Iperf2Binary,
        go: Launch,
        outcome: Outcome,
        client: p2.TextReader,
        server: p2.TextReader,
    ) -> Result:
        parts = p2.merge(client.parts(), server.parts())
        parts.local, parts.remote = p2.endpoints(client)
        parts.remote = attrs.evolve(
            parts.remote, host=spec.host or go.host, port=parts.remote.port or go.port
        )
        parts.start_time = client.start_time
        parts.latency = p2.latency(parts)
        problem = _problem(outcome, client, server, parts, spec)
        parts.warnings.extend(_server_warnings(outcome.server, server, problem))
        if outcome.client is not None and outcome.client.callback_error is not None:
            parts.warnings.append(f"live interval display failed: {outcome.client.callback_error}")
        tool = ToolInfo(name=self.name, version=binary.version, mode="copy")
        return finish(
            parts, tool=tool, spec=spec, start_time=go.start_time, outcome=outcome, problem=problem
        )

    # --- parsing saved output -----------------------------------------------------------------

    def far_end_argv(self, spec: TestSpec, address: str, port: int) -> list[str] | None:
        """``iperf -s`` on ``address:port`` with the client's report format."""
        return server_argv(self.found(), spec, address, port)

    def merge_far_end(self, result: Result, far_end: RawOutput) -> Result:
        """iperf 2's client does not print the receiver's figures over TCP: read them from
        the server's own output and fill what the client's result lacks."""
        sources = [(raw.name, raw.text) for raw in result.raw if raw.name == "client"]
        try:
            both = self.parse([*sources, ("server", far_end.text)])
        except NetprobeError as exc:
            return attrs.evolve(result, raw=(*result.raw, far_end),
                                warnings=(*result.warnings, f"far end output unreadable: {exc}"))
        return fill_missing(result, both, far_end)

    def split_tests(self, lines: Iterable[str]) -> Iterator[str]:
        """Each test of a log that holds several (see p2.split_tests). A test past
        p2.SPOOL_CHARS comes as a p2.SpooledLog, which this tool's parse reads as it reads
        a str: the parse command passes each test from split_tests to parse untouched."""
        yield from cast(Iterator[str], p2.split_tests(lines))

    def parse(self, sources: Sequence[tuple[str, str]]) -> Result:
        """Saved iperf 2 output (``-e`` or legacy text, or ``-y C`` CSV, with or without
        the 2.2 header; client and/or server) as one Result. Raises ParseError when a
        source holds no iperf 2 report."""
        if not sources:
            raise ParseError("nothing to parse")
        keys = p2.StreamKeys()
        readings = [_read_source(name, text, keys) for name, text in sources]
        clients = [r for r in readings if r[1]]
        servers = [r for r in readings if not r[1]]
        parts = clients[0][0] if clients else servers[0][0]
        for other, _, _ in readings:
            if other is not parts:
                parts = p2.merge(parts, other)
        parts.latency = p2.latency(parts)
        status = "failed" if parts.errors else "ok"
        spec = _spec_from(sources, parts)
        raw = tuple(RawOutput(name=name, text=p2.kept_raw(text)) for name, text in sources)
        return assemble(
            parts,
            tool=ToolInfo(name=self.name),
            spec=spec,
            start_time=parts.start_time,
            status=status,
            raw=raw,
        )


# --- live reading and the outcome ------------------------------------------------------------


def _live(reader: p2.TextReader, live: DrivenRun) -> Any:
    def on_line(line: str) -> None:
        sample = reader.feed(line)
        if sample is not None:
            live.emit(sample)

    return on_line


def _finished(reader: p2.TextReader) -> int:
    """How many per-stream final reports a reader has seen."""
    parts = reader.parts()
    return sum((s.sender is not None) + (s.receiver is not None) for s in parts.streams)


def _problem(
    outcome: Outcome, client: p2.TextReader, server: p2.TextReader, parts: Parts, spec: TestSpec
) -> str | None:
    if outcome.server_failed:
        return f"the local iperf server did not start: {outcome.server_failed}"
    if outcome.timed_out:
        return f"no result {deadline_for(spec)} s after the start; stopped it"
    if client.failures:
        return "; ".join(dict.fromkeys(client.failures))  # in order, without repeats
    code = outcome.client.returncode if outcome.client is not None else None
    if code not in (0, None):
        return _last_line(outcome.client) or f"exited with code {code}"
    if not any(f.sender or f.receiver for f in parts.summaries):
        return f"no report in the output: {_last_line(outcome.client) or 'nothing printed'}"
    return None


def _last_line(proc: DrivenProcess | None) -> str:
    lines = [line.strip() for line in proc.lines if line.strip()] if proc else []
    return lines[-1] if lines else ""


def _server_warnings(
    proc: DrivenProcess | None, reader: p2.TextReader, problem: str | None
) -> list[str]:
    if proc is None or problem:
        return []
    found = [f"local iperf server: {f}" for f in dict.fromkeys(reader.failures)]
    if proc.callback_error is not None:
        found.append(f"live interval display failed: {proc.callback_error}")
    code = proc.returncode
    if code is not None and code > 0:
        # Debian's iperf 2.1.8 server has been seen to abort after a -P 2 test.
        found.append(
            f"the local iperf server exited with code {code}; the receiver's figures may be missing"
        )
    return found


# --- parse(): saved outputs ------------------------------------------------------------------


def _read_source(name: str, text: str, keys: p2.StreamKeys) -> tuple[Parts, bool, str]:
    guessed = p2.guess_is_client(text, name)
    is_client = guessed is not False
    if p2.looks_like_csv(text):
        parts = p2.parse_csv(text, is_client, name)
    else:
        reader = p2.read_text(text, is_client, keys)
        if not reader.records and not reader.failures:
            raise ParseError("no iperf 2 report lines found", name)
        parts = reader.parts()
        parts.local, parts.remote = p2.endpoints(reader)
        parts.start_time = reader.start_time
        parts.errors.extend(dict.fromkeys(reader.failures))
    if guessed is None:
        parts.warnings.append(
            f"{name}: could not tell whether this is the client's or the "
            f"server's output; read it as the client's"
        )
    return parts, is_client, name


def _spec_from(sources: Sequence[tuple[str, str]], parts: Parts) -> TestSpec:
    directions = {f.direction for f in parts.summaries}
    direction = (
        "bidir"
        if len(directions) > 1
        else ("reverse" if directions == {"server_to_client"} else "normal")
    )
    forward = [
        s
        for s in parts.streams
        if s.direction == ("server_to_client" if direction == "reverse" else "client_to_server")
    ]
    intervals = [i for i in parts.intervals if i.stream_id is not None]
    udp = any("UDP port" in text for _, text in sources) or any(
        i.jitter_ms is not None for i in parts.intervals)
    return TestSpec(
        tool="iperf2",
        host=parts.remote.host if parts.remote else None,
        protocol="udp" if udp else "tcp",
        direction=direction,
        streams=max(1, len(forward)),
        duration_s=round(parts.duration_s, 1) if parts.duration_s else 10.0,
        interval_s=round(intervals[0].end_s - intervals[0].start_s, 4) if intervals else None,
        port=parts.remote.port if parts.remote else None,
    )


TCP_MIN_BYTES = 60
"""The smallest TCP ``-n`` iperf 2.1.8 stops at: below it the client sends without end
(measured on loopback: 59 bytes ran for as long as it was let run, 60 stopped at 60)."""
UDP_DEFAULT_LENGTH = 1470
"""iperf 2's UDP datagram payload when ``-l`` is not given."""


def _endless_byte_counts(spec: TestSpec) -> list[str]:
    """A byte count iperf 2 would never reach the end of: refused before it runs.

    iperf 2.1.8 stops a byte-count test only once the count is at least its TCP threshold,
    or, for UDP, one whole datagram; below that it sends until it is killed (a fuzz of
    ``-n`` found 94 GB sent in 96 s for ``-n 1``)."""
    if spec.bytes_total is None:
        return []
    if spec.protocol == "udp":
        floor = spec.length_bytes or UDP_DEFAULT_LENGTH
        what = f"one datagram ({floor} bytes)"
    else:
        floor, what = TCP_MIN_BYTES, f"{TCP_MIN_BYTES} bytes"
    if spec.bytes_total >= floor:
        return []
    return [f"iperf2 cannot honour --bytes {spec.bytes_total}: iperf 2 never stops for a "
            f"count below {what}; ask for at least that"]
