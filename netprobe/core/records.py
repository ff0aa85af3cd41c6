"""Records and argument rules shared by both data paths (compiled and pure Python).

Both implementations return these classes and check their arguments with
:class:`LoopArgs`, so a caller cannot tell them apart by their results or their errors.
"""
from __future__ import annotations

import math
from typing import Any

import attrs

from netprobe.record import Record

#: Datagram header: sequence number and send time, 8 bytes each, network byte order.
UDP_HEADER_BYTES = 16
#: Largest UDP payload over IPv4 (65535 - 8 UDP - 20 IP).
UDP_MAX_PAYLOAD = 65507
#: The compiled UDP sender's buffer at most: one call's datagrams (csrc NP_TX_CALL_BYTES).
UDP_SEND_CALL_BYTES = 256 * 1024
#: Largest write/read size a loop accepts (1 GiB).
MAX_LENGTH = 1 << 30
#: Most datagrams per sendmmsg/recvmmsg call (the kernel's UIO_MAXIOV).
MAX_BATCH = 1024
#: What a TCP receive loop lets queue before it is woken when the caller does not say
#: (csrc NP_WAKE_BYTES; np_tcp.c says why): a default-length reader's longest call.
WAKE_BYTES = 1 << 20


@attrs.frozen(repr=False, eq=False)
class TcpInfo(Record):
    """A TCP connection's kernel figures (TCP_INFO). None: this kernel does not report it."""

    retransmits: int | None
    """Segments retransmitted over the connection's life (tcpi_total_retrans)."""
    rtt_us: int | None
    """Smoothed round-trip time, microseconds."""
    rttvar_us: int | None
    """Round-trip time variation, microseconds."""
    min_rtt_us: int | None
    """Lowest round-trip time seen, microseconds (None also before the first sample)."""
    snd_cwnd_bytes: int | None
    """Congestion window in bytes (segments times the send MSS)."""
    snd_mss_bytes: int | None
    """Sender maximum segment size, bytes."""
    pmtu_bytes: int | None
    """Path MTU, bytes."""
    delivery_rate_bps: int | None
    """Kernel's most recent delivery rate estimate, bits per second."""
    bytes_acked: int | None
    """Bytes the peer has acknowledged."""
    bytes_retrans: int | None
    """Bytes retransmitted."""


@attrs.frozen(repr=False, eq=False)
class Rusage(Record):
    """CPU time used by this process or thread (getrusage)."""

    user_s: float
    """Time in user mode, seconds."""
    system_s: float
    """Time in the kernel on our behalf, seconds."""


@attrs.frozen(repr=False, eq=False)
class HostCpu(Record):
    """The host's cumulative CPU time (first "cpu" line of /proc/stat), in clock ticks.

    Running totals: diff two snapshots with :meth:`busy_fraction_since`.
    """

    user: int
    """Ticks in user mode."""
    nice: int
    """Ticks in user mode at low priority."""
    system: int
    """Ticks in the kernel."""
    idle: int
    """Ticks idle."""
    iowait: int
    """Ticks idle with I/O outstanding."""
    irq: int
    """Ticks servicing hardware interrupts."""
    softirq: int
    """Ticks servicing softirqs (most of the network stack's receive work)."""
    steal: int
    """Ticks a hypervisor gave to other guests."""

    @property
    def ticks_total(self) -> int:
        """All ticks counted, busy or not."""
        return (self.user + self.nice + self.system + self.idle + self.iowait + self.irq
                + self.softirq + self.steal)

    def busy_fraction_since(self, earlier: HostCpu) -> float:
        """Share of the host's CPU time spent busy (not idle or iowait) since ``earlier``.

        0.0 when no tick has elapsed in between.
        """
        total = self.ticks_total - earlier.ticks_total
        if total <= 0:
            return 0.0
        idle = (self.idle + self.iowait) - (earlier.idle + earlier.iowait)
        return min(1.0, max(0.0, (total - idle) / total))


def _optional(check: Any) -> Any:
    return attrs.validators.optional(check)


def _int_at_least(low: int) -> Any:
    return attrs.validators.and_(attrs.validators.instance_of(int), attrs.validators.ge(low))


def _positive_finite(_inst: Any, attr: attrs.Attribute[Any], value: float) -> None:
    if not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise ValueError(f"{attr.name} must be a positive finite number, not {value!r}")


def _not_nan(_inst: Any, attr: attrs.Attribute[Any], value: float) -> None:
    if not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{attr.name} must be a number, not {value!r}")


@attrs.frozen(repr=False, eq=False)
class LoopArgs(Record):
    """The arguments of one stream loop, checked the same way for both data paths."""

    length: int = attrs.field(validator=[_int_at_least(1), attrs.validators.le(MAX_LENGTH)])
    """Bytes per write/read, or per datagram."""
    deadline: float | None = attrs.field(default=None, validator=_optional(_not_nan))
    """End time on the monotonic clock (seconds); None: no deadline."""
    max_bytes: int | None = attrs.field(default=None, validator=_optional(_int_at_least(0)))
    """Stop after this many payload bytes; None: unbounded."""
    max_packets: int | None = attrs.field(
        default=None, validator=_optional(_int_at_least(0)))
    """Stop after this many datagrams; None: unbounded."""
    rate_bps: float | None = attrs.field(default=None, validator=_optional(_positive_finite))
    """Pace to this many payload bits per second; None: as fast as possible."""
    rate_pps: float | None = attrs.field(default=None, validator=_optional(_positive_finite))
    """Pace to this many datagrams per second; None: as fast as possible."""
    batch: int = attrs.field(
        default=32, validator=[_int_at_least(1), attrs.validators.le(MAX_BATCH)])
    """Messages per sendmmsg/recvmmsg call (a message: one datagram, or many where the
    kernel segments or coalesces them)."""
    zerocopy: bool = False
    """TCP sender: sendfile() from a memory file instead of send() from a buffer."""
    skip_copy: bool = False
    """TCP receiver: recv(MSG_TRUNC), the kernel discards the data instead of copying it."""
    udp_gro: bool = True
    """UDP receiver: ask the kernel for coalesced datagrams (UDP_GRO), walked one by one."""
    udp_gso: bool = True
    """UDP sender: send many datagrams a message, cut by the kernel (UDP_SEGMENT), where
    the data path can; False: one datagram a message."""
    wake_bytes: int | None = attrs.field(default=None, validator=_optional(_int_at_least(1)))
    """TCP receiver: bytes let queue before a sleeping loop is woken (SO_RCVLOWAT; the read
    length where that is longer), within a quarter of the buffer and 10 ms of the flow;
    None: :data:`WAKE_BYTES`."""

    def __attrs_post_init__(self) -> None:
        if self.rate_bps is not None and self.rate_pps is not None:
            raise ValueError("give rate_bps or rate_pps, not both")

    def check_udp(self) -> LoopArgs:
        """Self, after checking the datagram size fits our header and one UDP datagram."""
        if not UDP_HEADER_BYTES <= self.length <= UDP_MAX_PAYLOAD:
            raise ValueError(
                f"UDP length must be {UDP_HEADER_BYTES}..{UDP_MAX_PAYLOAD} bytes "
                f"(the datagram header takes {UDP_HEADER_BYTES}), not {self.length}")
        return self

    @property
    def packets_per_s(self) -> float:
        """UDP pacing as datagrams per second; 0.0 when unpaced."""
        if self.rate_pps is not None:
            return float(self.rate_pps)
        if self.rate_bps is not None:
            return self.rate_bps / (8.0 * self.length)
        return 0.0


def check_fd(fd: int) -> int:
    """``fd`` itself, after checking it is a plausible file descriptor number."""
    if isinstance(fd, bool) or not isinstance(fd, int):
        raise TypeError(f"fd must be an int file descriptor, not {type(fd).__name__}")
    if fd < 0:
        raise ValueError(f"fd must be >= 0, not {fd}")
    return fd


def pattern(length: int) -> bytes:
    """The payload byte pattern both data paths send: i % 251, never all zeros."""
    return (bytes(range(251)) * (length // 251 + 1))[:length]
