"""nuttcp driven as a netprobe tool.

The client always runs with ``-v -fparse``: with ``-v`` the client prints both sides' totals,
CPU and socket settings (nuttcp servers print nothing; the receiver's half arrives on the
client), and ``-fparse`` makes every figure a key=value pair. For a test on this machine
the adapter starts a one-shot server (``-1 --nofork``: never ``-S``, and not ``-1`` alone,
which both fork a detached daemon out of reach of our process group) on free ports and
stops it by its PID afterwards.

Option mapping (netprobe -> nuttcp): reverse ``-r``; streams ``-N`` (nuttcp sums them and
prints no per-stream figures); duration ``-T``; bytes per stream ``-n`` buffers in total
(``-n`` counts buffers over all streams, so the byte count must be a whole number of
buffers); interval ``-i``; length ``-l``; window ``-w`` in KB (1024 bytes; it sets the
sender's send and the receiver's receive buffer); rate ``-R`` in Kbps for all streams
together (nuttcp's rate is the aggregate, netprobe's is per stream); MSS ``-M``; nodelay
``-D``; DSCP ``-c``; ``-4``/``-6``; port ``-P`` (control) with the data port one above it.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from netprobe.bottleneck import with_cpu_warnings
from netprobe.driven import (
    DrivenProcess,
    DrivenRun,
    family_for,
    find_binary,
    free_port,
    is_local_host,
    is_numeric,
    listening,
    not_found,
    port_is_free,
    run_once,
    system_name,
)
from netprobe.errors import ParseError, TestFailed, TestInterrupted, ToolUnavailable
from netprobe.plugin import Availability, Capabilities, Reporter, Tool, utc_now_iso
from netprobe.schema import Endpoint, Interval, RawOutput, Result, TestSpec, ToolInfo
from netprobe.tools.nuttcp import parse_output as p

MAX_STREAMS = 128
"""nuttcp's MAXSTREAM: it silently lowers larger -N values to this."""
DEFAULT_CONTROL_PORT = 5000
"""nuttcp's control port (6.x and 8.x)."""
DEFAULT_LENGTH = {"tcp": 65536, "udp": 8192}
"""nuttcp's buffer length when -l is not given."""
_START_TIMEOUT_S = 5.0
_SERVER_EXIT_S = 2.0
_GRACE_S = 15.0
_BYTES_TIMEOUT_S = 600.0


class NuttcpTool(Tool):
    """nuttcp (6.x, 8.x): drives the nuttcp client, and a one-shot server for local tests.

    Options: ``path`` (the binary), ``timeout_s`` (limit for byte-count tests),
    ``data_port`` (data port against a remote server; default control port + 1, or the
    server's default when no port is given), ``start_server`` (False: never start a server,
    even for this machine; a nuttcp server must already listen).
    """

    name: ClassVar[str] = "nuttcp"
    description: ClassVar[str] = "nuttcp 6.x/8.x (client driven; one-shot server for local tests)"
    capabilities: ClassVar[Capabilities] = Capabilities.all_but(
        "omit", "congestion", "bind", "zerocopy", "skip_rx_copy",
        directions=frozenset({"normal", "reverse"}),
        max_streams=MAX_STREAMS, min_interval_s=0.1,
    )

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self._availability: Availability | None = None

    # -- probe --------------------------------------------------------------------------

    def probe(self) -> Availability:
        """Find the binary and ask its version (``nuttcp -V``). Never raises."""
        if self._availability is None:
            try:
                self._availability = self._probe()
            except Exception as exc:  # probe must never raise
                self._availability = Availability(False, reasons=(f"nuttcp probe failed: {exc}",))
        return self._availability

    def _probe(self) -> Availability:
        override = self.options.get("path")
        path = find_binary("nuttcp", override, "NETPROBE_NUTTCP")
        if path is None:
            why = not_found("nuttcp", override, "NETPROBE_NUTTCP", "install the nuttcp package")
            return Availability(False, reasons=(why,))
        try:
            code, text = run_once([path, "-V"], timeout=5.0)
        except ToolUnavailable as exc:
            return Availability(False, reasons=(str(exc),), path=path)
        found = re.search(r"nuttcp-(\d+(?:\.\d+)+)", text)
        if not found:
            first = text.strip().splitlines()[0] if text.strip() else "nothing"
            why = f"{path} -V printed no nuttcp version (exit code {code}): {first}"
            return Availability(False, reasons=(why,), path=path)
        version = found.group(1)
        major = p.version_major(version) or 0
        if major < 6:
            why = f"nuttcp {version} is too old: netprobe needs 6.x or later (-fparse -v output)"
            return Availability(False, version=version, reasons=(why,), path=path)
        return Availability(True, version=version, path=path)

    # -- refusals -----------------------------------------------------------------------

    def refusals(self, spec: TestSpec) -> list[str]:
        """Capability refusals plus the ones nuttcp's option units impose."""
        found = super().refusals(spec)

        def refuse(option: str, why: str) -> None:
            found.append(f"nuttcp cannot honour {option}: {why}")

        if spec.window_bytes is not None and spec.window_bytes % 1024:
            refuse(f"--window {spec.window_bytes}", "nuttcp -w takes whole KB (1024 bytes)")
        if spec.protocol == "udp" and spec.mss_bytes is not None:
            refuse("--mss", "MSS is a TCP setting")
        if spec.protocol == "udp" and spec.nodelay:
            refuse("--nodelay", "TCP_NODELAY is a TCP setting")
        rate = spec.rate_bits_per_second
        if rate is not None and rate * spec.streams < 1000:
            refuse("--bitrate", "nuttcp's smallest rate is 1 Kbps (for all streams together)")
        if _unsteady_udp_reverse_reports(spec, self.probe().version):
            refuse(
                f"--interval {spec.interval_s:g} with UDP and --reverse",
                "nuttcp 6.x then stops now and then with 'Error: not receiving data from "
                "server' (3 runs in 16 at 0.5 s here; none at 0.8 s or 1 s): use 1 s or more",
            )
        if spec.bytes_total is not None:
            length = spec.length_bytes or DEFAULT_LENGTH[spec.protocol]
            if spec.bytes_total % length:
                refuse(
                    f"--bytes {spec.bytes_total}",
                    f"nuttcp counts whole buffers of {length} bytes (-n); "
                    "give a byte count that is a multiple of the length",
                )
        return found

    # -- run ----------------------------------------------------------------------------

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        """Run the test (starting a one-shot server first when the host is this machine)."""
        self.check(spec)
        available = self.probe()
        if not available.available or available.path is None:
            raise ToolUnavailable("; ".join(available.reasons) or "nuttcp is not available")
        plan = make_plan(spec, available.path, self.options)
        return _Session(spec, plan, reporter, available.version).run()

    # -- parse --------------------------------------------------------------------------

    def far_end_argv(self, spec: TestSpec, address: str, port: int) -> list[str] | None:
        """A one-shot ``nuttcp -1 --nofork`` with its control port on ``port``; the client
        names the data port (``port + 1``). nuttcp's client prints both sides already."""
        availability = self.probe()
        if not availability.available or availability.path is None:
            raise ToolUnavailable("; ".join(availability.reasons) or "nuttcp is not available")
        family = ["-6"] if ":" in address else []
        return [availability.path, "-1", "--nofork", f"-P{port}", *family]

    def parse(self, sources: Sequence[tuple[str, str]]) -> Result:
        """Read saved nuttcp client output (-fparse or plain, brief or -v; 6.x or 8.x)."""
        return parse_sources(sources)


# --- planning: addresses, ports, command lines ---------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Everything decided before anything runs."""

    local: bool
    """True when the adapter starts the server itself."""
    family: int
    """AF_INET or AF_INET6."""
    connect_host: str
    """What the client connects to."""
    control_port: int | None
    data_port: int | None
    client_argv: tuple[str, ...]
    server_argv: tuple[str, ...] | None
    timeout_s: float
    """How long the client may run before it is taken as hung."""


def _unsteady_udp_reverse_reports(spec: TestSpec, version: str | None) -> bool:
    """True for the combination nuttcp 6.x fails now and then: a UDP receiver on the
    client (-u -r) reporting more often than every second."""
    return (
        spec.protocol == "udp"
        and spec.direction == "reverse"
        and spec.interval_s is not None
        and spec.interval_s < 1.0
        and p.version_major(version) == 6
    )


def make_plan(spec: TestSpec, binary: str, options: dict[str, Any]) -> Plan:
    """Choose ports and build both command lines."""
    local = bool(options.get("start_server", True)) and is_local_host(spec.host)
    family = family_for(spec)
    loopback = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    control: int | None
    if local:
        # A port the user asked for is used as given (the data port is the next one).
        control = spec.port or free_port(family)
        data: int | None = (
            spec.port + 1 if spec.port else free_port_block(spec.streams, family, avoid=control)
        )
        # A name ("localhost") might resolve to the other family than the server's.
        host = spec.host if spec.host and is_numeric(spec.host) else loopback
        server: tuple[str, ...] | None = (binary, "-1", "--nofork", f"-P{control}") + (
            ("-6",) if family == socket.AF_INET6 else ()
        )
    else:
        control = spec.port
        data = options.get("data_port") or (control + 1 if control else None)
        host = spec.host or loopback
        server = None
    argv = (binary, *client_args(spec, control, data), host)
    return Plan(local, family, host, control, data, argv, server, _timeout(spec, options))


def _timeout(spec: TestSpec, options: dict[str, Any]) -> float:
    if spec.bytes_total is not None or spec.duration_s is None:
        return float(options.get("timeout_s", _BYTES_TIMEOUT_S))
    return spec.duration_s + _GRACE_S + 0.2 * spec.duration_s


def _number(value: float) -> str:
    """A number as nuttcp reads it: no exponent, no needless decimals."""
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def client_args(spec: TestSpec, control: int | None, data: int | None) -> list[str]:
    """nuttcp client options for ``spec`` (without the binary and the host)."""
    args = ["-v", "-fparse"]
    if control is not None:
        args.append(f"-P{control}")
    if data is not None:
        args.append(f"-p{data}")
    args += _amount_args(spec)
    if spec.interval_s is not None:
        args.append(f"-i{_number(spec.interval_s)}")
    args += _option_args(spec)
    return args


def _amount_args(spec: TestSpec) -> list[str]:
    if spec.bytes_total is not None:
        length = spec.length_bytes or DEFAULT_LENGTH[spec.protocol]
        # -n counts buffers over all streams together; netprobe's bytes are per stream.
        return [f"-n{spec.bytes_total // length * spec.streams}"]
    assert spec.duration_s is not None  # TestSpec guarantees a duration or a byte count
    return [f"-T{_number(spec.duration_s)}"]


def _option_args(spec: TestSpec) -> list[str]:
    args: list[str] = []
    flags = [
        (spec.protocol == "udp", "-u"),
        (spec.direction == "reverse", "-r"),
        (spec.nodelay, "-D"),
        (spec.ip_version == 6, "-6"),
        (spec.ip_version == 4, "-4"),
    ]
    args += [flag for wanted, flag in flags if wanted]
    if spec.streams > 1:
        args.append(f"-N{spec.streams}")
    length = spec.length_bytes or (DEFAULT_LENGTH[spec.protocol] if spec.bytes_total else None)
    if length is not None:
        args.append(f"-l{length}")
    if spec.window_bytes is not None:
        args.append(f"-w{spec.window_bytes // 1024}")
    if spec.rate_bits_per_second is not None:
        # nuttcp's -R is in Kbps (10**3) and limits all streams together.
        args.append(f"-R{_number(spec.rate_bits_per_second * spec.streams / 1000)}")
    elif spec.protocol == "udp":
        args.append("-R0")  # no rate in the spec is unlimited; nuttcp's own UDP default is 1M
    if spec.mss_bytes is not None:
        args.append(f"-M{spec.mss_bytes}")
    if spec.dscp is not None:
        args.append(f"-c{spec.dscp}")
    return args


def free_port_block(count: int, family: int, avoid: int) -> int:
    """The first of ``count`` consecutive ports free for TCP and UDP (nuttcp -N uses the
    data port and the ones above it)."""
    for _ in range(100):
        start = free_port(family)
        ports = range(start, start + count)
        if start + count - 1 > 65535 or avoid in ports:
            continue
        if all(port_is_free(port, family) for port in ports[1:]):
            return start
    raise TestFailed(f"no block of {count} free ports found for nuttcp's data streams")




# --- one run ---------------------------------------------------------------------------


class _Session:
    """One run: the processes, the live parser, and the result built from both."""

    def __init__(self, spec: TestSpec, plan: Plan, reporter: Reporter, version: str | None) -> None:
        self.spec = spec
        self.plan = plan
        self.version = version
        self.direction = "server_to_client" if spec.direction == "reverse" else "client_to_server"
        self.parser = p.NuttcpParser()
        self.lock = threading.Lock()  # the parser's state, read by the result builder
        self.driven = DrivenRun(reporter, tool="nuttcp")
        self.next_start = 0.0
        self.start_time = utc_now_iso()
        self.server: DrivenProcess | None = None
        self.client: DrivenProcess | None = None
        self.problems: list[str] = []

    def run(self) -> Result:
        """Run the processes; the Result, or TestFailed/TestInterrupted with the partial."""
        code = None
        with self.driven as run:
            if self._start_server():
                self.client = run.start("client", self.plan.client_argv, on_line=self._on_line)
                code = run.wait_exit(self.client, self.plan.timeout_s)
                if run.timed_out:
                    self.problems.append(
                        f"nuttcp did not finish within {self.plan.timeout_s:g} s and was stopped"
                    )
                # The one-shot server exits after its test: its output is then complete.
                server = self.server
                if server is not None:
                    run.wait(lambda: server.returncode is not None, _SERVER_EXIT_S)
        if run.interrupted:
            partial = self._result("interrupted", ["interrupted by the user"])
            raise TestInterrupted("interrupted: nuttcp stopped", partial)
        if self.client is None:
            raise self._server_failed()
        return self._finish(code)

    # -- processes ----------------------------------------------------------------------

    def _start_server(self) -> bool:
        """Start the local server, if the plan has one; False if it did not listen."""
        if self.plan.server_argv is None:
            return True
        assert self.plan.control_port is not None
        self.server = self.driven.start("server", self.plan.server_argv)
        ready = listening([(self.plan.control_port, False)], self.plan.family)
        return self.driven.wait_ready(self.server, ready, _START_TIMEOUT_S)

    def _server_failed(self) -> TestFailed:
        assert self.server is not None and self.plan.server_argv is not None
        why = self.server.text.strip() or f"exit code {self.server.returncode}"
        return TestFailed(
            f"nuttcp server did not start listening on port {self.plan.control_port}: "
            f"{why} (command: {' '.join(self.plan.server_argv)})",
            self._result("failed", ["nuttcp server did not start"]),
        )

    # -- live output --------------------------------------------------------------------

    def _on_line(self, line: str) -> None:
        """Called by the reader thread for each line: parse, queue interval samples."""
        with self.lock:
            sample = self.parser.feed(line)
            if sample is None:
                return
            retrans_ok = self._retrans_ok()
            item = p.to_interval(sample, self.next_start, self.direction, retrans_ok)
            self.next_start = item.end_s
            if self._after_end(item):
                return
        self.driven.emit(item)

    def _retrans_ok(self) -> bool:
        major = p.version_major(self.parser.out.version or self.version)
        return major is not None and major >= 7

    def _after_end(self, item: Interval) -> bool:
        end = self.spec.duration_s if self.spec.bytes_total is None else None
        return end is not None and item.bytes == 0 and item.start_s >= end - 1e-6

    # -- result -------------------------------------------------------------------------

    def _finish(self, code: int | None) -> Result:
        out = self.parser.out
        if self.client is not None and self.client.callback_error is not None:
            self.problems.append(f"nuttcp output could not be read: {self.client.callback_error}")
        message = p.failure_message(out)
        # nuttcp can exit 0 and still have failed (-xt does): trust what it printed too.
        if code == 0 and not message and not self.problems and out.has_summary:
            return self._result("ok", [])
        reasons = [reason for reason in (message, *self.problems) if reason]
        why = "; ".join(reasons) or "nuttcp printed no result"
        if code not in (0, None):
            why = f"{why} (exit code {code})"
        command = " ".join(self.plan.client_argv)
        raise TestFailed(f"nuttcp failed: {why}; command: {command}", self._result("failed", [why]))

    def _result(self, status: str, errors: list[str]) -> Result:
        with self.lock:
            out = self.parser.out
            summaries, streams, warnings = p.flows(
                out, self.direction, self.spec.protocol, self.spec.streams
            )
            intervals = tuple(self.driven.collected())
        receiver = summaries[0].receiver if summaries else None
        return with_cpu_warnings(Result(
            tool=ToolInfo(name="nuttcp", version=out.version or self.version),
            spec=self.spec,
            start_time=self.start_time,
            local=Endpoint(role="client", host=None, system=system_name()),
            remote=self._remote(),
            status=status,
            duration_s=receiver.end_s if receiver else None,
            summaries=summaries,
            streams=streams,
            intervals=intervals,
            warnings=(*warnings, *self.driven.warnings),
            errors=tuple(errors),
            raw=self._raw(),
        ))

    def _remote(self) -> Endpoint:
        port = self.plan.control_port or DEFAULT_CONTROL_PORT
        address = self.plan.connect_host if is_numeric(self.plan.connect_host) else None
        system = system_name() if self.plan.local else None
        return Endpoint(
            role="server", host=self.spec.host, address=address, port=port, system=system
        )

    def _raw(self) -> tuple[RawOutput, ...]:
        found = [proc.raw() for proc in (self.client, self.server) if proc is not None]
        return tuple(found)


# --- parse saved output ---------------------------------------------------------------


def parse_sources(sources: Sequence[tuple[str, str]]) -> Result:
    """A Result from saved nuttcp outputs; empty files (servers print nothing) are skipped."""
    readable = [(name, text) for name, text in sources if text.strip()]
    if not readable:
        where = sources[0][0] if sources else None
        raise ParseError("no nuttcp output: the input is empty (servers print nothing)", where)
    name, text = readable[0]
    out = p.parse_lines(text)
    _check_parsed(name, text, out)
    warnings = [f"{other}: ignored (only one nuttcp output is read)" for other, _ in readable[1:]]
    return _parsed_result(name, text, out, warnings)


def _first_text_line(text: str) -> int:
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            return number
    return 1


def _check_parsed(name: str, text: str, out: p.NuttcpOutput) -> None:
    if out.recognized == 0:
        line = out.unknown[0] if out.unknown else _first_text_line(text)
        raise ParseError("not nuttcp output", source=name, line=line)
    if not out.has_summary and not out.intervals and not p.failure_message(out):
        raise ParseError("no nuttcp results in the output (truncated?)", name, out.last_line)


def _parsed_spec(out: p.NuttcpOutput) -> tuple[TestSpec, list[str]]:
    tx, rx = out.sides.get("t"), out.sides.get("r")
    known = [side for side in (tx, rx) if side is not None]
    mode = next((s.mode for s in known if s.mode), None)
    udp = mode == "udp" or any(s.pkt is not None for s in known)
    udp = udp or any(s.pkt is not None for s in out.intervals)
    if out.brief is not None and out.brief.pkt is not None:
        udp = True
    warnings = [
        "test options reconstructed from the output; options it does not show "
        "are left at their defaults"
    ]
    if out.first_side is None and out.has_summary:
        warnings.append("the output does not say the direction: assumed normal (client sends)")
    duration = next((s.time_limit for s in known if s.time_limit), None)
    if duration is None and out.brief is not None and out.brief.seconds > 0:
        duration = out.brief.seconds
    interval = next((s.interval_s for s in known if s.interval_s), None)
    if interval is None and out.intervals:
        interval = out.intervals[0].seconds or None
    spec = TestSpec(
        tool="nuttcp",
        host=next((s.host for s in known if s.host), None),
        protocol="udp" if udp else "tcp",
        direction="reverse" if out.first_side == "r" else "normal",
        streams=next((s.nstream for s in known if s.nstream), 1),
        duration_s=duration or 10.0,
        interval_s=interval,
        length_bytes=next((s.buflen for s in known if s.buflen), None),
    )
    return spec, warnings


def _parsed_result(name: str, text: str, out: p.NuttcpOutput, extra: list[str]) -> Result:
    spec, warnings = _parsed_spec(out)
    direction = "server_to_client" if spec.direction == "reverse" else "client_to_server"
    summaries, streams, flow_warnings = p.flows(out, direction, spec.protocol, spec.streams)
    end = summaries[0].receiver.end_s if summaries and summaries[0].receiver else None
    warnings += flow_warnings + extra
    if out.unknown:
        warnings.append(
            f"{name}: {len(out.unknown)} line(s) not understood, first at line {out.unknown[0]}"
        )
    if not out.has_summary:
        warnings.append(f"{name}: no final summary: the output is incomplete")
    message = p.failure_message(out)
    return with_cpu_warnings(Result(
        tool=ToolInfo(name="nuttcp", version=out.version),
        spec=spec,
        start_time=None,
        local=Endpoint(role="client"),
        remote=Endpoint(role="server", host=spec.host),
        status="failed" if message else "ok",
        duration_s=end,
        summaries=summaries,
        streams=streams,
        intervals=p.intervals(out, direction, end, summaries[0] if summaries else None),
        warnings=tuple(warnings),
        errors=(message,) if message else (),
        raw=(RawOutput(name=name, text=text),),
    ))
