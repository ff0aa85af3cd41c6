"""Arithmetic of the native engine's figures: snapshots of running totals, the intervals
and summaries derived from them, sums over streams, and CPU percentages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from netprobe import core
from netprobe.record import Record
from netprobe.resultops import bits_per_second
from netprobe.schema import Cpu, CpuUsage, Interval, SideSummary


class MeasuredStream(Protocol):
    """What the arithmetic reads of a stream (side.LocalStream is one): its identity, its
    running totals, and the TCP figures gathered while it ran. A protocol, so that this
    module needs nothing of the side that runs the loops."""

    stream_id: int
    direction: str
    role: str
    rtt_samples: list
    max_cwnd_bytes: int | None
    call_length_bytes: int | None

    @property
    def is_tcp(self) -> bool:
        """Whether the stream is TCP."""

    @property
    def base(self) -> Snapshot:
        """The totals at the summary's start (after any warm-up)."""

    def snapshot(self) -> Snapshot:
        """The running totals now."""


@attrs.frozen(repr=False, eq=False)
class Snapshot(Record):
    """Running totals of one stream at one moment (TCP fields only on TCP senders)."""

    bytes: int = 0
    packets: int = 0
    messages: int = 0
    lost: int = 0
    out_of_order: int = 0
    duplicates: int = 0
    jitter_ms: float = 0.0
    retransmits: int | None = None
    rtt_us: int | None = None
    rttvar_us: int | None = None
    min_rtt_us: int | None = None
    cwnd_bytes: int | None = None


def with_tcp_info(snap: Snapshot, info: core.TcpInfo | None) -> Snapshot:
    """Add the kernel's TCP_INFO figures to a snapshot (None where unsupported)."""
    if info is None:
        return snap
    return attrs.evolve(
        snap,
        retransmits=info.retransmits,
        rtt_us=info.rtt_us,
        rttvar_us=info.rttvar_us,
        min_rtt_us=info.min_rtt_us,
        cwnd_bytes=info.snd_cwnd_bytes,
    )


def _diff(now: int | None, before: int | None) -> int | None:
    if now is None:
        return None
    return now - (before or 0)


def interval(
    stream: MeasuredStream,
    last: Snapshot,
    now: Snapshot,
    start_s: float,
    end_s: float,
    omitted: bool,
) -> Interval:
    """The interval of one stream between two snapshots."""
    # Counts never go back (a TCP receiver's: side.LocalStream.arrived_floor), so this guard
    # never cuts anything off; were one ever to, a negative interval would be a schema error.
    nbytes = max(0, now.bytes - last.bytes)
    udp = not stream.is_tcp
    receiver = stream.role == "receiver"
    return Interval(
        direction=stream.direction,
        role=stream.role,
        stream_id=stream.stream_id,
        start_s=round(start_s, 6),
        end_s=round(end_s, 6),
        bytes=nbytes,
        bits_per_second=bits_per_second(nbytes, end_s - start_s),
        omitted=omitted,
        retransmits=_diff(now.retransmits, last.retransmits),
        rtt_us=now.rtt_us,
        rttvar_us=now.rttvar_us,
        cwnd_bytes=now.cwnd_bytes,
        packets=now.packets - last.packets if udp else None,
        lost_packets=now.lost - last.lost if udp and receiver else None,
        out_of_order_packets=now.out_of_order - last.out_of_order if udp and receiver else None,
        jitter_ms=now.jitter_ms if udp and receiver else None,
    )


def note_tcp_sample(stream: MeasuredStream, snap: Snapshot) -> None:
    """Keep the RTT and cwnd samples a TCP sender's summary is made of."""
    if snap.rtt_us is not None:
        stream.rtt_samples.append(snap.rtt_us)
    if snap.cwnd_bytes is not None:
        stream.max_cwnd_bytes = max(stream.max_cwnd_bytes or 0, snap.cwnd_bytes)


def _total(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    # fsum / n is statistics.fmean without importing statistics (and fractions, decimal).
    return math.fsum(known) / len(known) if known else None


def sum_intervals(samples: Sequence[Interval]) -> list[Interval]:
    """One sum interval (stream_id None) per direction and role among the samples."""
    groups: dict[tuple[str, str], list[Interval]] = {}
    for sample in samples:
        groups.setdefault((sample.direction, sample.role), []).append(sample)
    sums = []
    for (direction, role), group in groups.items():
        first = group[0]
        nbytes = sum(s.bytes for s in group)
        rtt = _mean([s.rtt_us for s in group])
        sums.append(
            Interval(
                direction=direction,
                role=role,
                stream_id=None,
                start_s=first.start_s,
                end_s=first.end_s,
                bytes=nbytes,
                bits_per_second=bits_per_second(nbytes, first.end_s - first.start_s),
                omitted=first.omitted,
                retransmits=_total([s.retransmits for s in group]),
                rtt_us=None if rtt is None else round(rtt),
                cwnd_bytes=_total([s.cwnd_bytes for s in group]),
                packets=_total([s.packets for s in group]),
                lost_packets=_total([s.lost_packets for s in group]),
                out_of_order_packets=_total([s.out_of_order_packets for s in group]),
                jitter_ms=_mean([s.jitter_ms for s in group]),
            )
        )
    return sums


def side_summary(stream: MeasuredStream, start_s: float, end_s: float,
                 rcvbuf_drops: int | None = None,
                 base_bytes: int | None = None) -> SideSummary:
    """A stream's summary from its warm-up baseline to its final totals (``rcvbuf_drops``:
    its socket's UDP receive-buffer drops over the test, for a UDP receiver; ``base_bytes``:
    the byte count it starts after, where not its own baseline's: a TCP receiver's from
    the sender's boundary, netprobe.engine.side)."""
    final, base = stream.snapshot(), stream.base
    if base_bytes is not None:
        base = attrs.evolve(base, bytes=base_bytes)
    if stream.is_tcp and stream.role == "sender" and not stream.rtt_samples:
        note_tcp_sample(stream, final)  # a test shorter than one interval
    nbytes = final.bytes - base.bytes
    udp_rx = not stream.is_tcp and stream.role == "receiver"
    lost = final.lost - base.lost if udp_rx else None
    packets = final.packets - base.packets if not stream.is_tcp else None
    duplicates = final.duplicates - base.duplicates if udp_rx else None
    return SideSummary(
        role=stream.role,
        start_s=round(start_s, 6),
        end_s=round(end_s, 6),
        bytes=nbytes,
        bits_per_second=bits_per_second(nbytes, end_s - start_s),
        retransmits=_diff(final.retransmits, base.retransmits),
        retransmits_scope="connection" if final.retransmits is not None else None,
        rtt_us=_rounded(_mean(stream.rtt_samples)),
        min_rtt_us=final.min_rtt_us,
        max_rtt_us=max(stream.rtt_samples) if stream.rtt_samples else None,
        cwnd_bytes=stream.max_cwnd_bytes,
        packets=packets,
        lost_packets=lost,
        lost_percent=_percent(lost, _expected(packets, duplicates, lost)) if udp_rx else None,
        out_of_order_packets=final.out_of_order - base.out_of_order if udp_rx else None,
        duplicate_packets=duplicates,
        receive_buffer_dropped_packets=rcvbuf_drops if udp_rx else None,
        jitter_ms=final.jitter_ms if udp_rx else None,
        datagrams_per_message=None if stream.is_tcp else _per_message(
            packets, final.messages - base.messages),
        call_length_bytes=stream.call_length_bytes if stream.is_tcp else None,
    )


def _per_message(packets: int | None, messages: int) -> float | None:
    # None where no message moved (or a peer too old to count them).
    if not packets or messages <= 0:
        return None
    return round(packets / messages, 2)


def _total_per_message(parts: Sequence[SideSummary]) -> float | None:
    # The streams' datagrams over their messages (each stream's messages: its datagrams
    # over its own figure), not a mean of the figures.
    known = [p for p in parts if p.datagrams_per_message and p.packets]
    if not known:
        return None
    messages = math.fsum((p.packets or 0) / (p.datagrams_per_message or 1) for p in known)
    return round(sum(p.packets or 0 for p in known) / messages, 2)


def _rounded(value: float | None) -> int | None:
    return None if value is None else round(value)


def _expected(packets: int | None, duplicates: int | None, lost: int | None) -> int:
    # The datagrams the sender sent: each one that came once (a duplicate is a second
    # arrival of one, not another datagram) and each lost.
    return (packets or 0) - (duplicates or 0) + (lost or 0)


def _percent(part: int | None, whole: int) -> float | None:
    if part is None or whole <= 0:
        return None if part is None else 0.0
    return 100.0 * part / whole


def summary_from_intervals(samples: Sequence[Interval]) -> SideSummary:
    """One stream's side summed from its interval reports (those after the warm-up): the
    summary of a side whose own final report never came (a test stopped half-way)."""
    parts = [SideSummary(role=s.role, start_s=s.start_s, end_s=s.end_s, bytes=s.bytes,
                         bits_per_second=s.bits_per_second, retransmits=s.retransmits,
                         rtt_us=s.rtt_us, max_rtt_us=s.rtt_us, packets=s.packets,
                         lost_packets=s.lost_packets,
                         out_of_order_packets=s.out_of_order_packets) for s in samples]
    # Summed as streams are, except what is a level, not an amount: the largest window,
    # the jitter at the last report.
    cwnds = [s.cwnd_bytes for s in samples if s.cwnd_bytes is not None]
    return attrs.evolve(sum_summaries(parts, None), cwnd_bytes=max(cwnds) if cwnds else None,
                        jitter_ms=samples[-1].jitter_ms)


def sum_summaries(parts: Sequence[SideSummary], cpu: Cpu | None) -> SideSummary:
    """All streams of one role and direction summed into a total."""
    start = min(p.start_s for p in parts)
    end = max(p.end_s for p in parts)
    nbytes = sum(p.bytes for p in parts)
    lost = _total([p.lost_packets for p in parts])
    packets = _total([p.packets for p in parts])
    duplicates = _total([p.duplicate_packets for p in parts])
    min_rtts = [p.min_rtt_us for p in parts if p.min_rtt_us is not None]
    max_rtts = [p.max_rtt_us for p in parts if p.max_rtt_us is not None]
    return SideSummary(
        role=parts[0].role,
        start_s=start,
        end_s=end,
        bytes=nbytes,
        bits_per_second=bits_per_second(nbytes, end - start),
        retransmits=_total([p.retransmits for p in parts]),
        retransmits_scope=parts[0].retransmits_scope,
        rtt_us=_rounded(_mean([p.rtt_us for p in parts])),
        min_rtt_us=min(min_rtts) if min_rtts else None,
        max_rtt_us=max(max_rtts) if max_rtts else None,
        cwnd_bytes=_total([p.cwnd_bytes for p in parts]),
        packets=packets,
        lost_packets=lost,
        lost_percent=None if lost is None else _percent(lost, _expected(packets, duplicates,
                                                                        lost)),
        out_of_order_packets=_total([p.out_of_order_packets for p in parts]),
        duplicate_packets=duplicates,
        receive_buffer_dropped_packets=_total([p.receive_buffer_dropped_packets
                                               for p in parts]),
        jitter_ms=_mean([p.jitter_ms for p in parts]),
        datagrams_per_message=_total_per_message(parts),
        call_length_bytes=_common([p.call_length_bytes for p in parts]),
        cpu=cpu,
    )


def _common(values: Sequence[int | None]) -> int | None:
    # A level, not an amount: the total has one only where every part has the same.
    return values[0] if values and len(set(values)) == 1 else None


def process_cpu(user_s: float, system_s: float, wall_s: float) -> CpuUsage:
    """CPU of the test's own threads, in percent of one core (may exceed 100 with -P)."""
    if wall_s <= 0:
        return CpuUsage(cpu_seconds=user_s + system_s)
    return CpuUsage(
        user_percent=100 * user_s / wall_s,
        system_percent=100 * system_s / wall_s,
        total_percent=100 * (user_s + system_s) / wall_s,
        cpu_seconds=user_s + system_s,
    )


def host_cpu(start: Any, end: Any) -> CpuUsage | None:
    """Host-wide CPU between two /proc/stat readings, in percent of all cores."""
    fields = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    delta = {name: getattr(end, name) - getattr(start, name) for name in fields}
    total = sum(delta.values())
    if total <= 0:
        return None
    idle = delta["idle"] + delta["iowait"]
    return CpuUsage(
        user_percent=100 * (delta["user"] + delta["nice"]) / total,
        system_percent=100 * (delta["system"] + delta["irq"] + delta["softirq"]) / total,
        total_percent=100 * (total - idle) / total,
        softirq_percent=100 * delta["softirq"] / total,
        idle_percent=100 * idle / total,
    )
