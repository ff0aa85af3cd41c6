"""What the iperf2 and iperf3 adapters share: one run as a
:class:`~netprobe.driven.DrivenSession` (:class:`IperfSession`), whose figures
(:class:`~netprobe.driven.Figures`) become a Result by the one assembler of every driven
tool (:func:`~netprobe.driven.to_result`), and the readers' common helpers.

Private to the built-in iperf adapters; the public helpers for driven tools are in
:mod:`netprobe.driven`.
"""

from __future__ import annotations

import abc
import re
import socket
from collections.abc import Sequence
from typing import Any, Callable, ClassVar

import attrs

from netprobe.driven import (
    SERVER_READY_S,
    SERVER_REPORT_S,
    DrivenProcess,
    DrivenSession,
    DrivenTool,
    client_deadline,
    free_port,
    is_local_host,
    local_server_wanted,
    printed,
    read_version,
    run_once,
)
from netprobe.driven.figures import Figures, to_result
from netprobe.errors import NetprobeError
from netprobe.host import utc_now_iso
from netprobe.latency.figures import as_run, distribution
from netprobe.plugin import Availability, Reporter
from netprobe.schema import (
    Cpu,
    CpuUsage,
    Interval,
    Latency,
    LatencySample,
    Result,
    SideSummary,
    TestSpec,
    ToolInfo,
)


class IperfSession(DrivenSession):
    """One run of iperf 2 or iperf3 through the one lifecycle of every driven tool
    (:class:`~netprobe.driven.DrivenSession`): a one-off local server when the adapter starts
    it (ready once it says "Server listening on"), the client until it exits or its
    deadline (:func:`~netprobe.driven.client_deadline`), the server's last report; then the
    Result from the figures the readers collected (:func:`~netprobe.driven.to_result`).

    A subclass sets the command lines and line readers in its constructor and supplies
    :meth:`parts` (the figures so far), :meth:`problem` (what went wrong, in the tool's
    words) and :meth:`server_done`.
    """

    def __init__(self, spec: TestSpec, reporter: Reporter, *, tool: str, version: str,
                 mode: str | None, launch: Launch) -> None:
        super().__init__(spec, reporter, tool=tool, version=version)
        self.start_time = launch.start_time
        self.launch = launch
        """Where the client connects and whether a local server is started."""
        self.mode = mode
        """``ToolInfo.mode`` of the Result."""
        self.client_argv: Sequence[str] = ()
        self.server_argv: Sequence[str] | None = None
        self.on_client_line: Callable[[str], None] | None = None
        self.on_server_line: Callable[[str], None] | None = None
        self.client: DrivenProcess | None = None
        self.server: DrivenProcess | None = None

    def start_server(self) -> bool:
        """Start the local server, if this run has one, and wait until it listens."""
        if self.server_argv is None:
            return True
        self.server = self.driven.start("server", self.server_argv, self.on_server_line)
        ready = printed(lambda line: "Server listening on" in line)
        return self.driven.wait_ready(self.server, ready, SERVER_READY_S)

    def run_client(self) -> None:
        """The client, to its exit or its deadline; then the local server's last report."""
        self.client = self.driven.start("client", self.client_argv, self.on_client_line)
        self.driven.wait_exit(self.client, client_deadline(self.spec))
        if self.server is not None:
            self.driven.wait(self.server_done, SERVER_REPORT_S)

    def server_done(self) -> bool:
        """True once the local server has printed all it will (default: it exited)."""
        return self.server is None or self.server.returncode is not None

    def failures(self) -> list[str]:
        """What went wrong: the deadline, else :meth:`problem`."""
        if self.driven.timed_out:
            return [f"no result {client_deadline(self.spec):g} s after the start; stopped it"]
        problem = self.problem()
        return [problem] if problem else []

    @abc.abstractmethod
    def problem(self) -> str | None:
        """Why the run failed in the tool's own words (None: it did not)."""

    @abc.abstractmethod
    def parts(self) -> Figures:
        """The figures read so far (also of a partial run)."""

    def result(self, status: str, errors: list[str]) -> Result:
        """The Result of the run so far: :meth:`parts` put together, the tool's own errors
        not already said in ``errors`` first."""
        parts = self.parts()
        parts.warnings.extend([*self.warnings, *self.driven.warnings])
        said = " ".join(errors)
        tool = ToolInfo(name=self.tool, version=self.version, mode=self.mode)
        return to_result(parts, tool=tool, spec=self.spec, start_time=self.start_time,
                         status=status, errors=[*(e for e in parts.errors if e not in said),
                                                *errors],
                         raw=tuple(p.raw() for p in (self.client, self.server) if p is not None))


def tcp_rtt_latency(intervals: Sequence[Interval], measured_by: str) -> Latency | None:
    """The TCP senders' smoothed RTT over the test as a latency distribution: one sample
    per stream and interval (each read at the interval's end, so under the test's own load;
    summary lines are left out: their RTT is read as the connection closes). None when no
    interval carries one (UDP, a receiving client alone, no intervals)."""
    read = sorted((i for i in intervals if i.role == "sender" and i.stream_id is not None
                   and i.rtt_us is not None and not i.omitted), key=lambda i: i.end_s)
    if not read:
        return None
    # Consecutive samples come from different streams: their difference is no jitter.
    return as_run(
        attrs.evolve(distribution([float(i.rtt_us or 0) for i in read]), jitter_us=None),
        measured_by=measured_by,
        metric="tcp_srtt",
        samples=tuple(LatencySample(t_s=i.end_s, rtt_us=float(i.rtt_us or 0)) for i in read),
        test_start_s=0.0,
    )


def process_cpu(total: float | None, user: float | None, system: float | None) -> Cpu | None:
    """A Cpu record for a tool's own process usage, or None when nothing is known."""
    if total is None and user is None and system is None:
        return None
    return Cpu(process=CpuUsage(user_percent=user, system_percent=system, total_percent=total))


def with_cpu(side: SideSummary | None, cpu: Cpu | None) -> SideSummary | None:
    """``side`` with ``cpu`` attached (unchanged when either is missing)."""
    if side is None or cpu is None:
        return side
    return attrs.evolve(side, cpu=cpu)


def side_of(sample: Interval, **figures: Any) -> SideSummary:
    """A side's summary from its final report line, read like an interval: span, bytes,
    rate, retransmits (of the test's own connections), UDP packets, loss and jitter as the
    line gives them; ``figures`` add what the tool knows besides."""
    side = SideSummary(
        role=sample.role,
        start_s=sample.start_s,
        end_s=sample.end_s,
        bytes=sample.bytes,
        bits_per_second=sample.bits_per_second,
        retransmits=sample.retransmits,
        retransmits_scope="connection" if sample.retransmits is not None else None,
        packets=sample.packets,
        lost_packets=sample.lost_packets,
        jitter_ms=sample.jitter_ms,
    )
    return attrs.evolve(side, **figures) if figures else side


def side_directions(process_is_client: bool, role: str) -> str:
    """The flow direction of data that this process sent (role sender) or received."""
    sends_forward = process_is_client == (role == "sender")
    return "client_to_server" if sends_forward else "server_to_client"


class StreamNumbers:
    """Gives the tool's stream labels (socket numbers, transfer ids) stable numbers from 1,
    per direction, in order of first appearance."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, str], int] = {}

    def number(self, direction: str, label: str) -> int:
        """The stream number for ``label`` in ``direction``."""
        key = (direction, label)
        if key not in self._ids:
            self._ids[key] = 1 + sum(1 for d, _ in self._ids if d == direction)
        return self._ids[key]


def whole_seconds(value: float | None) -> bool:
    """True when ``value`` is None or a whole number of seconds."""
    return value is None or float(value).is_integer()


def arg_number(value: float) -> str:
    """A plain decimal number for a command line: no exponent, no needless ``.0``."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.6f}".rstrip("0").rstrip(".")


PROBE_TIMEOUT_S = 5.0


@attrs.frozen
class Probed:
    """An iperf binary found and asked who it is: its path, version and --help text."""

    path: str
    version: str
    help_text: str = ""

    def has(self, option: str) -> bool:
        """True if ``--help`` lists ``option`` (feature detection beats version tables)."""
        return re.search(rf"(^|[\s,]){re.escape(option)}\b", self.help_text, re.M) is not None


TCP_ONLY = {
    "--mss": lambda spec: spec.mss_bytes is not None,
    "--nodelay": lambda spec: spec.nodelay,
    "--congestion": lambda spec: spec.congestion is not None,
    "--zerocopy": lambda spec: spec.zerocopy,
}
"""netprobe's TCP socket options, and whether a spec asks for each."""


@attrs.frozen
class Launch:
    """Where a run starts: when, where the client connects, and whether this adapter
    starts the server itself (``local``)."""

    start_time: str
    host: str
    port: int
    local: bool


class IperfTool(DrivenTool):
    """What the iperf2 and iperf3 adapters share as tools: the binary found once with its
    version and --help text (what it can do is read from there), and the refusals that
    depend on them. A subclass sets DrivenTool's ``program``/``env_var``/``install_hint``
    and how its version is asked for."""

    version_args: ClassVar[tuple[str, ...]]
    """The arguments that make the binary print its version."""
    version_pattern: ClassVar[str]
    """A regular expression whose first group is the version in what it prints."""
    label: ClassVar[str]
    """The program's name in messages (``iperf 2``, ``iperf3``)."""
    found_type: ClassVar[type[Probed]] = Probed
    """The record of a probed binary (a subclass may add what its options tell)."""
    default_port: ClassVar[int]
    """The port the tool's server listens on by default."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self._found: Probed | None = None

    def identify(self, path: str) -> Availability:
        """Read the version, then the --help text that tells this build's options."""
        available, _ = read_version(path, self.version_args, self.version_pattern, self.label,
                                    timeout_s=PROBE_TIMEOUT_S)
        if available.available and available.version is not None:
            _, help_text = run_once([path, "--help"], PROBE_TIMEOUT_S)
            self._found = self.found_type(path, available.version, help_text)
            available = attrs.evolve(available, details=self.details(self._found))
        return available

    def details(self, found: Probed) -> tuple[str, ...]:
        """What ``probe()`` says of the binary beyond its version (none by default)."""
        return ()

    def found(self) -> Probed:
        """The binary this tool runs; ToolUnavailable (the probe's reasons) if none."""
        self.binary()
        assert self._found is not None  # identify() sets it whenever binary() succeeds
        return self._found

    def launch(self, spec: TestSpec) -> Launch:
        """The start of ``run``: the spec checked (SpecError), the binary found
        (ToolUnavailable), the client's target chosen."""
        self.check(spec)
        self.found()
        local = local_server_wanted(spec, self.options)
        host, port = client_target(spec, local, self.default_port)
        return Launch(utc_now_iso(), host, port, local)

    def tcp_only_refusals(self, spec: TestSpec, flags: Sequence[str]) -> list[str]:
        """Those of ``flags`` (keys of TCP_ONLY) that a UDP spec asks for: the binary would
        ignore them, so they are refused."""
        if spec.protocol != "udp":
            return []
        return [f"{self.name} cannot honour {flag}: TCP only in {self.label} (ignored for UDP)"
                for flag in flags if TCP_ONLY[flag](spec)]

    def missing_options(self, wanted: Sequence[tuple[str, bool, str, str]]) -> list[str]:
        """Refusals for what this binary's --help does not list. ``wanted`` holds
        (netprobe flag, asked for, the binary's option, what has it or "")."""
        try:
            found = self.found()
        except NetprobeError:
            return []  # run() reports the missing binary itself
        return [
            f"{self.name} cannot honour {flag}: this {self.label} ({found.version}) has no "
            f"{option}" + (f" (needs {needs})" if needs else "")
            for flag, asked, option, needs in wanted
            if asked and not found.has(option)
        ]


def client_target(spec: TestSpec, local: bool, default_port: int) -> tuple[str, int]:
    """Where the client connects: the spec's host (loopback for ``localhost`` on this
    machine, so that a server bound to it is reached) and port, else a free port when
    this adapter starts the server (``local``), else the tool's default port."""
    host = spec.host.strip("[]") if spec.host is not None else None
    if host is None or (is_local_host(host) and host.lower().startswith("localhost")):
        host = "::1" if spec.ip_version == 6 else "127.0.0.1"
    if spec.port:
        return host, spec.port
    if not local:
        return host, default_port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return host, free_port(family=family, host=host)
