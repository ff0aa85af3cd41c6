"""THE result schema: one set of records that every tool, built-in or third-party, returns.

Rules (see DESIGN.md): units are in the field names; unknown is ``None``, never 0 or -1;
sender and receiver figures are separate and both kept; per-stream and summed figures;
per-interval samples. Serialization lives in one place, :mod:`netprobe.convert`.

Directions are named from the client's point of view: ``client_to_server`` is the normal
(upload) direction, ``server_to_client`` is reverse; a bidirectional test has both.

Type annotations use ``typing.Optional``/``Tuple`` so that the classes resolve on
Python 3.9, where netprobe.convert evaluates them.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import attrs
from attrs import field, frozen

from netprobe.errors import SpecError
from netprobe.limits import LONGEST_S
from netprobe.record import Record

SCHEMA_VERSION = "1.12"
"""Version of the result format; bumped on any change, minor for additions (1.1: latency
fields documented for plugins, run_id and trial; 1.2: latency under load: phases, one-way
delay variation, probe loss, RPM, grade, per-interval latency; 1.3: the probes' own samples
and the test's start on their clock; 1.4: the busiest data thread's CPU,
CpuUsage.max_thread_percent; 1.5: UDP receive-buffer drops apart from the path's loss,
SideSummary.receive_buffer_dropped_packets; 1.6: CpuUsage.cycles_per_byte; 1.7: what a
latency sample is, Latency.metric, and a driven tool's own latency kept beside the probes',
Result.tool_latency; 1.8: the bloat the grade is of, Latency.bloat_us and
LatencyPhase.bloat_us; 1.9: the length of the data loop's calls,
SideSummary.call_length_bytes; 1.10: the verdict beside the DSLReports grade, and the
tail it weighs, Latency.verdict, Latency.tail_increase_us and the same per LatencyPhase;
netprobe's probes fill Latency.metric; 1.11: how UDP datagrams travelled,
SideSummary.datagrams_per_message, and the sender's choice, TestSpec.udp_gso; 1.12: a
phase's round trip and directions are LatencyStats, the distribution alone, where they were
a whole Latency with its run-level fields empty). Results of an older minor version load
(their verdict is worked out again from their phases; a phase record's empty run-level
fields are left behind, a filled one is refused)."""

PROTOCOLS = ("tcp", "udp")
DIRECTIONS = ("normal", "reverse", "bidir")
FLOW_DIRECTIONS = ("client_to_server", "server_to_client")
ROLES = ("sender", "receiver")
STATUSES = ("ok", "failed", "interrupted")
RETRANSMIT_SCOPES = ("connection", "host")
GRADES = ("A+", "A", "B", "C", "D", "F")
"""Bufferbloat grades, best first (the DSLReports / Waveform scale of the latency increase)."""
LATENCY_METRICS = ("round_trip", "tcp_srtt")
"""What a latency sample is (see ``Latency.metric``)."""


def _one_of(choices: tuple[str, ...]) -> Any:
    return attrs.validators.in_(choices)


def _positive_or_none(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if value is not None and not (isinstance(value, (int, float)) and value > 0):
        raise SpecError(f"{attribute.name} must be positive, got {value!r}")


def _non_negative_or_none(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if value is not None and not (isinstance(value, (int, float)) and value >= 0):
        raise SpecError(f"{attribute.name} must not be negative, got {value!r}")


# What a value may be at most, whatever the tool: what the kernel's socket options take
# (an int; TCP_MAXSEG a 16-bit MSS), an IPv4 UDP payload, what one write may reasonably
# be, and what a 64-bit byte counter can reach with room to add to it.
SPEC_BOUNDS = {
    "window_bytes": (2**31 - 1, "--window"),
    "mss_bytes": (65535, "--mss"),
    "length_bytes": (1 << 30, "--length"),
    "bytes_total": (1 << 62, "--bytes"),
}
UDP_MAX_LENGTH = 65507
"""Largest UDP payload over IPv4 (65535 - 8 - 20)."""


def _check_bounds(spec: Any) -> None:
    """Refuse non-finite numbers and values past what any tool, kernel or timed wait can
    take."""
    for name in ("duration_s", "interval_s", "omit_s", "rate_bits_per_second"):
        value = getattr(spec, name)
        if value is not None and not math.isfinite(value):
            raise SpecError(f"{name} must be a finite number, got {value!r}")
    for name, flag in (("duration_s", "--time"), ("omit_s", "--omit"),
                       ("interval_s", "--interval")):
        value = getattr(spec, name)
        if value is not None and value > LONGEST_S:
            raise SpecError(f"{name} ({flag}) must be at most {LONGEST_S:g} s (a week), "
                            f"got {value:g}")
    for name, (most, flag) in SPEC_BOUNDS.items():
        value = getattr(spec, name)
        if value is not None and value > most:
            raise SpecError(f"{name} ({flag}) must be at most {most}, got {value}")
    if spec.protocol == "udp" and (spec.length_bytes or 0) > UDP_MAX_LENGTH:
        raise SpecError(f"length_bytes (--length) for UDP must be at most {UDP_MAX_LENGTH} bytes,"
                        f" got {spec.length_bytes}")


CONGESTION_MAX_CHARS = 15
"""Longest congestion control name: the kernel keeps 16 bytes with the closing NUL
(TCP_CA_NAME_MAX) and cuts a longer name, so one past 15 can never be the one in use."""
TEXT_MAX_CHARS = 255
"""Longest host name, address or tool name a spec takes (a DNS name is at most 253)."""

_KIND_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _typed(kind: type, optional: bool = False, most_chars: Optional[int] = None) -> Any:
    """A validator that ``value`` is of ``kind`` exactly as JSON would carry it (a bool is
    not an integer, "2" and 1.9 are not one; an integer is a number), and a string no
    longer than ``most_chars``: SpecError naming the field otherwise, so misuse through the
    API is told as the command line tells it, never a TypeError from deep inside."""
    allowed = (int, float) if kind is float else (kind,)

    def check(instance: object, attribute: attrs.Attribute, value: object) -> None:
        if value is None and optional:
            return
        if type(value) not in allowed:
            shown = repr(value)[:40]
            raise SpecError(f"{attribute.name} must be {_KIND_WORDS[kind]}"
                            f"{' or None' if optional else ''}, got {shown}")
        if most_chars is not None and len(str(value)) > most_chars:
            raise SpecError(f"{attribute.name} must be at most {most_chars} characters, "
                            f"got {len(str(value))}")

    return check


class _Choice:
    """A validator that a value is one of ``options`` (SpecError naming the field);
    ``options`` is also what the generated JSON Schema lists as the field's enum."""

    __slots__ = ("options",)

    def __init__(self, options: tuple[str, ...]) -> None:
        self.options = options

    def __call__(self, instance: object, attribute: attrs.Attribute, value: object) -> None:
        if not isinstance(value, str) or value not in self.options:
            raise SpecError(f"{attribute.name} must be one of {', '.join(self.options)}, "
                            f"got {repr(value)[:40]}")


def _choice(choices: tuple[str, ...]) -> Any:
    return _Choice(choices)


def _port_or_none(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if value is not None and not (isinstance(value, int) and 1 <= value <= 65535):
        raise SpecError(f"{attribute.name} must be a port number 1-65535, got {value!r}")


@frozen(repr=False, eq=False)
class TestSpec(Record):
    """What to measure: the options common to every tool, validated at construction."""

    __test__ = False  # not a pytest test class

    tool: str = field(default="native", validator=_typed(str, most_chars=TEXT_MAX_CHARS))
    """Name of the tool plugin that runs the test."""
    host: Optional[str] = field(default=None,
                                validator=_typed(str, optional=True, most_chars=TEXT_MAX_CHARS))
    """The far end; None means this machine (the tool runs both sides on loopback)."""
    protocol: str = field(default="tcp", validator=_choice(PROTOCOLS))
    """``tcp`` or ``udp``."""
    direction: str = field(default="normal", validator=_choice(DIRECTIONS))
    """``normal`` (client sends), ``reverse`` (server sends) or ``bidir`` (both at once)."""
    streams: int = field(default=1, validator=[_typed(int), _positive_or_none])
    """Parallel streams (per direction)."""
    duration_s: Optional[float] = field(
        default=10.0, validator=[_typed(float, optional=True), _positive_or_none])
    """How long to send; None when ``bytes_total`` bounds the test instead."""
    bytes_total: Optional[int] = field(
        default=None, validator=[_typed(int, optional=True), _positive_or_none])
    """Bytes to send per stream (byte-count mode, like iperf3 -n); overrides duration."""
    interval_s: Optional[float] = field(
        default=1.0, validator=[_typed(float, optional=True), _positive_or_none])
    """Interval between live reports; None for no interval reports."""
    omit_s: float = field(default=0.0, validator=[_typed(float), _non_negative_or_none])
    """Warm-up seconds before ``duration_s`` (as iperf3 -O), excluded from the summary
    (kept in the intervals, marked omitted)."""
    length_bytes: Optional[int] = field(
        default=None, validator=[_typed(int, optional=True), _positive_or_none])
    """Buffer (TCP) or datagram payload (UDP) length; None for the tool's default."""
    window_bytes: Optional[int] = field(
        default=None, validator=[_typed(int, optional=True), _positive_or_none])
    """Socket buffer size requested (SO_SNDBUF/SO_RCVBUF)."""
    rate_bits_per_second: Optional[float] = field(
        default=None, validator=[_typed(float, optional=True), _positive_or_none])
    """Rate limit per stream in bits per second (SI: 1M = 10**6); None is unlimited."""
    mss_bytes: Optional[int] = field(
        default=None, validator=[_typed(int, optional=True), _positive_or_none])
    """TCP maximum segment size to request."""
    nodelay: bool = field(default=False, validator=_typed(bool))
    """Disable Nagle (TCP_NODELAY)."""
    dscp: Optional[int] = field(default=None, validator=_typed(int, optional=True))
    """DSCP code point (0-63) for the traffic."""
    congestion: Optional[str] = field(
        default=None, validator=_typed(str, optional=True, most_chars=CONGESTION_MAX_CHARS))
    """TCP congestion control algorithm (e.g. cubic, bbr)."""
    ip_version: Optional[int] = field(default=None, validator=_typed(int, optional=True))
    """4 or 6 to force an address family; None lets the host name decide."""
    port: Optional[int] = field(default=None,
                                validator=[_typed(int, optional=True), _port_or_none])
    """Server port; None for the tool's default."""
    bind_address: Optional[str] = field(
        default=None, validator=_typed(str, optional=True, most_chars=TEXT_MAX_CHARS))
    """Local address to bind to."""
    zerocopy: bool = field(default=False, validator=_typed(bool))
    """Zero-copy send (sendfile), like iperf3 -Z."""
    skip_rx_copy: bool = field(default=False, validator=_typed(bool))
    """Discard received data in the kernel (MSG_TRUNC), like iperf3 --skip-rx-copy."""
    udp_gso: Optional[bool] = field(default=None, validator=_typed(bool, optional=True))
    """UDP sender: True sends many datagrams a message for the kernel to cut (UDP GSO, like
    iperf3 --gsro), False one datagram a message; None: the tool's default (the native
    engine's: off for datagrams under 512 bytes, where the packet rate is the figure)."""

    def __attrs_post_init__(self) -> None:
        if self.dscp is not None and not 0 <= self.dscp <= 63:
            raise SpecError(f"dscp must be 0-63, got {self.dscp}")
        if self.ip_version not in (None, 4, 6):
            raise SpecError(f"ip_version must be 4 or 6, got {self.ip_version}")
        if self.duration_s is None and self.bytes_total is None:
            raise SpecError("a test needs a duration or a byte count")
        if self.protocol == "udp" and self.length_bytes is not None and self.length_bytes < 16:
            raise SpecError("UDP payload length must be at least 16 bytes")
        _check_bounds(self)

    def planned_s(self) -> Optional[float]:
        """Seconds the test runs: the warm-up (``omit_s``), then ``duration_s``, as iperf3
        adds ``-O`` to ``-t``; None when a byte count ends the test."""
        if self.bytes_total is not None or self.duration_s is None:
            return None
        return self.omit_s + self.duration_s

    def flow_directions(self) -> tuple[str, ...]:
        """The flow directions this spec produces, client's point of view."""
        if self.direction == "bidir":
            return FLOW_DIRECTIONS
        if self.direction == "reverse":
            return ("server_to_client",)
        return ("client_to_server",)


@frozen(repr=False, eq=False)
class ToolInfo(Record):
    """Which tool produced the result."""

    name: str
    """Plugin name (``native``, ``iperf3``, ...)."""
    version: Optional[str] = None
    """The tool's own version string, as it reports it."""
    data_path: Optional[str] = None
    """For the native engine: ``c`` (compiled core) or ``python`` (pure fallback)."""
    mode: Optional[str] = None
    """Copy mode as run: ``copy``, ``zerocopy``, ``skip-rx-copy`` or both joined by ``+``."""


@frozen(repr=False, eq=False)
class Endpoint(Record):
    """One end of the test."""

    role: str = field(validator=_one_of(("client", "server")))
    """``client`` (the side that started the test) or ``server``."""
    host: Optional[str] = None
    """Host name as given by the user."""
    address: Optional[str] = None
    """Numeric address used."""
    port: Optional[int] = None
    """Port used (control port for the native engine)."""
    system: Optional[str] = None
    """Operating system and machine (``uname``) where known."""


@frozen(repr=False, eq=False)
class CpuUsage(Record):
    """CPU use over the test, in percent of one core (process) or of all cores (host)."""

    user_percent: Optional[float] = None
    """User-mode CPU."""
    system_percent: Optional[float] = None
    """Kernel-mode CPU."""
    total_percent: Optional[float] = None
    """User + system (process) or everything but idle (host)."""
    softirq_percent: Optional[float] = None
    """Host only: time in soft interrupts (network receive work lands here)."""
    idle_percent: Optional[float] = None
    """Host only: idle time."""
    cpu_seconds: Optional[float] = None
    """Process only: user + system CPU seconds used during the test."""
    max_thread_percent: Optional[float] = None
    """Process only: the busiest data thread (a stream's send or receive loop), percent of
    one core; None where the tool reports only its whole process."""
    cycles_per_byte: Optional[float] = None
    """Host only: CPU cycles the host spent per byte moved (busy cycles of all cores over
    the test's bytes; NTttcp's headline cost figure). None where the tool does not say."""


@frozen(repr=False, eq=False)
class Cpu(Record):
    """CPU cost of one end: its own process and the whole host."""

    process: Optional[CpuUsage] = None
    """The test process (user/system/total percent of one core)."""
    host: Optional[CpuUsage] = None
    """The host (percent of all cores)."""


@frozen(repr=False, eq=False)
class SocketInfo(Record):
    """What the kernel actually gave a stream's socket (may differ from what was asked)."""

    send_buffer_bytes: Optional[int] = None
    """SO_SNDBUF as read back."""
    receive_buffer_bytes: Optional[int] = None
    """SO_RCVBUF as read back."""
    mss_bytes: Optional[int] = None
    """TCP MSS in use."""
    pmtu_bytes: Optional[int] = None
    """Path MTU seen by TCP."""
    congestion: Optional[str] = None
    """Congestion control in use."""


@frozen(repr=False, eq=False)
class Interval(Record):
    """One live sample: what one side saw on one stream (or all, stream_id None) in a span."""

    direction: str = field(validator=_one_of(FLOW_DIRECTIONS))
    """Flow direction, client's point of view."""
    role: str = field(validator=_one_of(ROLES))
    """Which side measured it: ``sender`` or ``receiver``."""
    stream_id: Optional[int]
    """Stream number, or None for the sum over streams."""
    start_s: float
    """Start of the interval, seconds since the test started."""
    end_s: float
    """End of the interval, seconds since the test started."""
    bytes: int
    """Payload bytes moved in the interval."""
    bits_per_second: float
    """bytes * 8 / (end_s - start_s)."""
    omitted: bool = False
    """True when the interval falls in the warm-up (``omit_s``), excluded from summaries."""
    retransmits: Optional[int] = None
    """TCP segments retransmitted in the interval (sender)."""
    rtt_us: Optional[int] = None
    """Smoothed RTT at the end of the interval (sender, TCP)."""
    rttvar_us: Optional[int] = None
    """RTT variance at the end of the interval (sender, TCP)."""
    cwnd_bytes: Optional[int] = None
    """Congestion window at the end of the interval (sender, TCP)."""
    packets: Optional[int] = None
    """UDP datagrams sent or received in the interval."""
    lost_packets: Optional[int] = None
    """UDP datagrams lost in the interval (receiver)."""
    out_of_order_packets: Optional[int] = None
    """UDP datagrams that arrived out of order in the interval (receiver)."""
    jitter_ms: Optional[float] = None
    """UDP interarrival jitter at the end of the interval (receiver, RFC 3550)."""
    latency_p50_us: Optional[float] = None
    """Median round trip of the latency probes answered in the interval (a run with latency
    probes; the path's figure, the same on every stream of the span; None otherwise)."""
    latency_max_us: Optional[float] = None
    """Slowest round trip of the latency probes answered in the interval."""


@frozen(repr=False, eq=False)
class SideSummary(Record):
    """What one side (sender or receiver) measured over the test, for a stream or in total."""

    role: str = field(validator=_one_of(ROLES))
    """``sender`` or ``receiver``."""
    start_s: float
    """Start of the summarised span (after any omitted warm-up), seconds."""
    end_s: float
    """End of the summarised span, seconds."""
    bytes: int
    """Payload bytes moved."""
    bits_per_second: float
    """Throughput over the span."""
    retransmits: Optional[int] = None
    """TCP retransmitted segments (sender)."""
    retransmits_scope: Optional[str] = field(
        default=None, validator=attrs.validators.optional(_one_of(RETRANSMIT_SCOPES))
    )
    """``connection`` (the test's own sockets) or ``host`` (host-wide kernel counters)."""
    rtt_us: Optional[int] = None
    """Mean smoothed RTT (sender, TCP)."""
    min_rtt_us: Optional[int] = None
    """Minimum RTT (sender, TCP): the lowest the kernel saw, or, from a tool that measures
    the RTT only once on the idle connection (nuttcp, at connect), that one figure."""
    max_rtt_us: Optional[int] = None
    """Maximum smoothed RTT sampled (sender, TCP)."""
    cwnd_bytes: Optional[int] = None
    """Largest congestion window sampled (sender, TCP)."""
    packets: Optional[int] = None
    """UDP datagrams sent or received."""
    lost_packets: Optional[int] = None
    """UDP datagrams lost (receiver): numbered by the sender and never received, the last
    ones of the test too (by the sender's count)."""
    lost_percent: Optional[float] = None
    """lost_packets as a percentage of datagrams expected (receiver)."""
    out_of_order_packets: Optional[int] = None
    """UDP datagrams out of order (receiver)."""
    duplicate_packets: Optional[int] = None
    """UDP datagrams received twice (receiver)."""
    receive_buffer_dropped_packets: Optional[int] = None
    """UDP datagrams the receiving host's kernel dropped during the test because the
    receiver's socket buffer was full (receiver, native engine). They are in
    ``lost_packets`` too, but were lost in the receiving host, not on the path. Each
    stream's own socket's count (SO_MEMINFO) where the kernel gives it; else, e.g. under
    qemu-user, the host's Udp and Udp6 ``RcvbufErrors`` counters where the side has one UDP
    receiver (other sockets' drops may swell them), and None with more. With UDP_GRO a
    coalesced group of datagrams dropped whole counts once."""
    jitter_ms: Optional[float] = None
    """UDP interarrival jitter at the end (receiver)."""
    datagrams_per_message: Optional[float] = None
    """UDP: the datagrams one message carried on average, as the side handed them to its
    kernel (sender: a GSO send, cut into datagrams at the device or never, on a veth path)
    or got them from it (receiver: a GRO read). 1.0: one datagram each. A receiver's figure
    as high as its sender's says the datagrams crossed the path in the sender's
    super-packets: the packet rate is then not the path's (native engine)."""
    call_length_bytes: Optional[int] = None
    """TCP: the bytes the side's data loop asked of each send() or recv() call, as ``-l``
    set it or, left open, as the native engine's length probe chose it on this path (so
    two runs can be told apart by what each kept); for a driven tool, as it printed it
    (iperf3's blksize, nuttcp's buflen, iperf 2's buffer size headers, ntttcp's -b). A
    total has it where all its streams agree. None for UDP (the datagram length is the
    spec's) and where a tool does not say."""
    cpu: Optional[Cpu] = None
    """CPU cost of this side's process and host (totals only; None per stream)."""


@frozen(repr=False, eq=False)
class StreamResult(Record):
    """One stream in one direction: its sender's and receiver's summaries."""

    stream_id: int
    """Stream number (starting at 1)."""
    direction: str = field(validator=_one_of(FLOW_DIRECTIONS))
    """Flow direction, client's point of view."""
    sender: Optional[SideSummary] = None
    """What the sending side measured."""
    receiver: Optional[SideSummary] = None
    """What the receiving side measured."""
    socket: Optional[SocketInfo] = None
    """Socket settings as the kernel gave them (sender side)."""


@frozen(repr=False, eq=False)
class FlowSummary(Record):
    """All streams of one direction summed: sender and receiver totals."""

    direction: str = field(validator=_one_of(FLOW_DIRECTIONS))
    """Flow direction, client's point of view."""
    sender: Optional[SideSummary] = None
    """Sender total."""
    receiver: Optional[SideSummary] = None
    """Receiver total."""


@frozen(repr=False, eq=False)
class LatencyStats(Record):
    """A latency distribution in microseconds: the figures of a set of samples and their loss.

    What a :class:`LatencyPhase` keeps for its round trip and each direction (1.12; before,
    a whole :class:`Latency` with its run-level fields empty), and what :class:`Latency`
    builds on."""

    count: int
    """Samples the distribution is made of."""
    min_us: Optional[float] = None
    """Fastest sample."""
    mean_us: Optional[float] = None
    """Mean of the samples."""
    p50_us: Optional[float] = None
    """Median."""
    p90_us: Optional[float] = None
    """90th percentile."""
    p99_us: Optional[float] = None
    """99th percentile."""
    max_us: Optional[float] = None
    """Slowest sample."""
    lost: Optional[int] = None
    """Probes that got no answer (or, one way, did not arrive); never part of the figures."""
    lost_percent: Optional[float] = None
    """``lost`` as a percentage of the probes sent."""
    jitter_us: Optional[float] = None
    """Mean absolute difference between consecutive samples (packet delay variation)."""


@frozen(repr=False, eq=False)
class Latency(LatencyStats):
    """A tool's latency: the distribution (:class:`LatencyStats`) and what a run adds.

    On ``Result.latency`` the distribution is the round trip under load (the test itself);
    a run with netprobe's latency probes adds the phases (idle, loaded, ...), the increase
    over idle, RPM and the grade. A phase's own figures are :class:`LatencyStats`.
    """

    measured_by: Optional[str] = None
    """Who measured it: ``netprobe-udp`` or ``netprobe-tcp`` (netprobe's own probes over
    UDP, or over TCP where UDP is dropped), or the driven tool's name (``qperf``, ...)."""
    phases: tuple[LatencyPhase, ...] = ()
    """Per phase (idle before the load, loaded, idle after): round trip and each direction."""
    increase_us: Optional[float] = None
    """Median round trip under load minus the idle median (the queueing the load added;
    for several loaded phases, the largest)."""
    bloat_us: Optional[float] = None
    """What the grade is of: the loaded phases' bloat (mean round trip minus the idle
    median), averaged over the phases, as DSLReports averages its download's and upload's
    (``netprobe bufferbloat``: download and upload; its ``both`` phase is graded alone)."""
    rpm: Optional[float] = None
    """Responsiveness: round trips per minute under load, 60 / the trimmed mean loaded round
    trip in seconds (the worst 5 % dropped, as the IETF responsiveness draft does)."""
    grade: Optional[str] = field(default=None, validator=attrs.validators.optional(_one_of(GRADES)))
    """The DSLReports-compatible bufferbloat grade of ``bloat_us``: A+ < 5 ms, A < 30,
    B < 60, C < 200, D < 400, F from 400 (the DSLReports scale, which Waveform's test shows
    too). It averages the directions and ignores the tail and loss: see ``verdict``."""
    samples: tuple[LatencySample, ...] = ()
    """Every probe of the run in time order (the charts are drawn from these)."""
    test_start_s: Optional[float] = None
    """When the test's own clock (``Interval.start_s``) began, on the probes' clock."""
    metric: Optional[str] = field(default=None,
                                  validator=attrs.validators.optional(_one_of(LATENCY_METRICS)))
    """What a sample is: ``round_trip`` (a probe or request answered: netprobe's probes,
    qperf, iperf 2's ``--bounceback``) or ``tcp_srtt`` (the kernel's smoothed RTT of the
    test's own TCP connections, read by their sender at each interval's end: the delay the
    load itself builds, with no idle baseline). None in results before 1.7: a round trip."""
    tail_increase_us: Optional[float] = None
    """The worst loaded phase's p99 round trip minus the idle median (1.10)."""
    verdict: Optional[str] = field(default=None,
                                   validator=attrs.validators.optional(_one_of(GRADES)))
    """The grade a person reads (1.10): the worst loaded phase's ``LatencyPhase.verdict``,
    so the worse direction, its tail and its probe loss all count."""


def _stats_only(value: Optional[LatencyStats]) -> Optional[LatencyStats]:
    """A phase's figure as the distribution alone: a :class:`Latency` given (its run-level
    fields empty) becomes the LatencyStats of its figures, so a phase holds, writes and
    compares as what it loads as; SpecError when a run-level field is filled."""
    if value is None or type(value) is LatencyStats:
        return value
    stats = attrs.fields(LatencyStats)
    filled = [a.name for a in attrs.fields(type(value))
              if a not in stats and getattr(value, a.name) not in (None, ())]
    if filled:
        raise SpecError(f"a phase's latency figures carry no run-level field: {', '.join(filled)}")
    return LatencyStats(**{a.name: getattr(value, a.name) for a in stats})


@frozen(repr=False, eq=False)
class LatencySample(Record):
    """One latency probe: when it was sent and what it measured (None: it was lost)."""

    t_s: float
    """When it was sent, seconds since the probes started."""
    rtt_us: Optional[float] = None
    """Its round trip."""
    client_to_server_us: Optional[float] = None
    """Its one-way delay variation from client to server."""
    server_to_client_us: Optional[float] = None
    """Its one-way delay variation from server to client."""


@frozen(repr=False, eq=False)
class LatencyPhase(Record):
    """Latency in one phase of a run: idle (no test traffic) or loaded (traffic flowing).

    One-way figures are delay *variation*: each probe's one-way delay minus the smallest
    seen in that direction over the whole run, so the offset between the two ends' clocks
    cancels and what remains is the queueing each way.
    """

    name: str
    """``idle`` (before the load), ``loaded``, ``idle_tail`` (after it); ``netprobe
    bufferbloat`` names its loaded phases ``download``, ``upload`` and ``both``."""
    loaded: bool
    """True when test traffic flowed during the phase."""
    start_s: float
    """Start of the phase, seconds since the probes started."""
    end_s: float
    """End of the phase, seconds since the probes started."""
    rtt: Optional[LatencyStats] = field(default=None, converter=_stats_only)
    """Round trip of the probes sent in the phase (the far end's turnaround taken out)."""
    client_to_server: Optional[LatencyStats] = field(default=None, converter=_stats_only)
    """One-way delay variation from client to server."""
    server_to_client: Optional[LatencyStats] = field(default=None, converter=_stats_only)
    """One-way delay variation from server to client."""
    increase_us: Optional[float] = None
    """This phase's median round trip minus the idle median (loaded phases)."""
    bloat_us: Optional[float] = None
    """This phase's mean round trip minus the idle median (loaded phases): what DSLReports
    calls the bloat, and what the grade is of."""
    rpm: Optional[float] = None
    """Round trips per minute in this phase (trimmed mean, worst 5 % dropped)."""
    grade: Optional[str] = field(default=None, validator=attrs.validators.optional(_one_of(GRADES)))
    """DSLReports-compatible bufferbloat grade of ``bloat_us`` (loaded phases)."""
    tail_increase_us: Optional[float] = None
    """This phase's p99 round trip minus the idle median (loaded phases; 1.10)."""
    verdict: Optional[str] = field(default=None,
                                   validator=attrs.validators.optional(_one_of(GRADES)))
    """The worst of the grade of ``bloat_us``, the grade of ``tail_increase_us`` (same
    scale) and the best grade this phase's probe loss allows (1 % at most A, 4 % B, 8 % C,
    13.5 % D, 21 % F: where a G.711 call falls a class of the ITU-T G.107 E-model); 1.10."""
    client_to_server_bits_per_second: Optional[float] = None
    """Test traffic from client to server during the phase (receiver's figure), if any."""
    server_to_client_bits_per_second: Optional[float] = None
    """Test traffic from server to client during the phase (receiver's figure), if any."""


@frozen(repr=False, eq=False)
class RawOutput(Record):
    """Exactly what a driven tool printed, kept for diagnosis."""

    name: str
    """Which process: e.g. ``client``, ``server``, or a result file name."""
    text: str
    """Its output (stdout and stderr merged in arrival order)."""
    command: Optional[tuple[str, ...]] = None
    """The command line as run."""
    exit_code: Optional[int] = None
    """Exit status (negative: killed by that signal)."""


@frozen(repr=False, eq=False)
class Result(Record):
    """A complete test result: what was asked, who measured, and everything measured."""

    tool: ToolInfo
    """The tool that ran the test."""
    spec: TestSpec
    """The spec as run."""
    start_time: Optional[str]
    """When the test started: UTC, ISO 8601 (None when a parsed tool output does not say)."""
    local: Endpoint
    """This end (the client)."""
    remote: Endpoint
    """The far end (the server)."""
    status: str = field(default="ok", validator=_one_of(STATUSES))
    """``ok``, ``failed`` (errors says why) or ``interrupted`` (Ctrl-C); the last two partial."""
    duration_s: Optional[float] = None
    """How long data actually flowed."""
    summaries: tuple[FlowSummary, ...] = ()
    """Per direction: all streams summed."""
    streams: tuple[StreamResult, ...] = ()
    """Per stream and direction."""
    intervals: tuple[Interval, ...] = ()
    """Live samples, in time order, per stream and summed."""
    latency: Optional[Latency] = None
    """Latency distribution where the tool measures it."""
    tool_latency: Optional[Latency] = None
    """The driven tool's own latency figure when netprobe's probes ran beside it and took
    ``latency`` (e.g. iperf 2's TCP RTT under ``--latency``): kept apart, never mixed in."""
    warnings: tuple[str, ...] = ()
    """Things the user should know that did not stop the test."""
    errors: tuple[str, ...] = ()
    """What went wrong (status ``failed`` or ``interrupted``)."""
    raw: tuple[RawOutput, ...] = ()
    """Raw outputs of driven tools."""
    run_id: Optional[str] = None
    """Shared by the trials of one ``--repeat`` or ``compare`` run."""
    trial: Optional[int] = None
    """This result's index among the trials of its run (from 1)."""
    schema_version: str = SCHEMA_VERSION
    """Version of this format (the version the result was written with)."""

    def summary(self, direction: str = "client_to_server") -> Optional[FlowSummary]:
        """The summed figures for one direction, or None if the test had no such flow."""
        for flow in self.summaries:
            if flow.direction == direction:
                return flow
        return None
