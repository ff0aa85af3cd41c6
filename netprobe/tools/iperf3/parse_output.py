"""Pure parsers for iperf3 output: ``-J`` documents (3.x, including the 3.16+ keys),
``--json-stream`` lines (3.17+) and the human interval/summary lines.

Meaning of iperf3's ``"sender"`` flags: in a stream or interval block it says whether the
process that wrote the document sent that stream. Direction then follows from which
process wrote it (the client's document has ``start.connecting_to``). The flags on
``sum_sent``/``sum_received`` are not trusted (iperf3 3.12 hard-codes them for UDP);
those sums are placed by ``test_start.reverse`` and the ``*_bidir_reverse`` keys instead.

Unknown stays None: iperf3 writes 0 for the RTT and congestion window it does not know
(e.g. the client's sender figures with ``-R``), and those zeros become None here.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Iterable
from typing import Any

import attrs

from netprobe import plugin
from netprobe.driven.figures import Figures
from netprobe.errors import ParseError
from netprobe.resultops import short_sender_totals
from netprobe.schema import (
    Cpu,
    Endpoint,
    FlowSummary,
    Interval,
    SideSummary,
    SocketInfo,
    StreamResult,
    TestSpec,
)
from netprobe.tools import _bounded
from netprobe.tools._bounded import SpooledLog, Text
from netprobe.tools._iperf_common import (
    StreamNumbers,
    process_cpu,
    side_directions,
    side_of,
    with_cpu,
)
from netprobe.units import binary_factor, si_factor

C2S = "client_to_server"
S2C = "server_to_client"


# --- context --------------------------------------------------------------------------


@attrs.frozen
class DocContext:
    """What a document says about itself: who wrote it and how the test ran."""

    is_client: bool = True
    reverse: bool = False
    bidir: bool = False
    udp: bool = False

    @property
    def primary(self) -> str:
        """Direction of ``sum_sent``/``sum_received``: the writer's sending streams in a
        bidirectional test, else the test's one flow."""
        if self.bidir:
            return side_directions(self.is_client, "sender")
        return S2C if self.reverse else C2S

    @property
    def secondary(self) -> str:
        """Direction of the ``*_bidir_reverse`` sums."""
        return S2C if self.primary == C2S else C2S


def context_from_start(start: dict[str, Any], bidir: bool = False) -> DocContext:
    """The context of a document from its ``start`` object."""
    test = _obj(start.get("test_start"))
    return DocContext(
        is_client="connecting_to" in start or "accepted_connection" not in start,
        reverse=bool(test.get("reverse")),
        bidir=bidir or bool(test.get("bidir")),
        udp=str(test.get("protocol", "")).upper() == "UDP",
    )


def _is_bidir(doc: dict[str, Any]) -> bool:
    end = _obj(doc.get("end"))
    if any(key.endswith("_bidir_reverse") for key in end):
        return True
    if any("sum_bidir_reverse" in _obj(b) for b in _list(doc.get("intervals"))):
        return True
    return len(_writer_flags(_end_stream_blocks(end))) == 2


def _end_stream_blocks(end: dict[str, Any]) -> list[dict[str, Any]]:
    """Each ``end.streams`` element's own block (its ``udp``, else its ``sender``)."""
    blocks = []
    for item in _list(end.get("streams")):
        item = _obj(item)
        blocks.append(_obj(item.get("udp") or item.get("sender") or item.get("receiver")))
    return blocks


def _writer_flags(blocks: list[dict[str, Any]]) -> set[bool]:
    return {b["sender"] for b in blocks if isinstance(b.get("sender"), bool)}


def with_bidir_sums(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with a --bidir test's sums rebuilt from its streams where iperf3 wrote one
    direction's only.

    iperf3 3.9 has no ``*_bidir_reverse`` keys: its ``sum``/``sum_sent``/``sum_received``
    (at the end and in each interval) hold whichever direction it summed last, so a
    client's c->s flow read as the s->c stream's bytes and the s->c flow had none. Its
    streams are right (each flagged with whether the writer sent it): the sums of each
    direction are made from them, in the keys later versions write."""
    end = _obj(doc.get("end"))
    if any(key.endswith("_bidir_reverse") for key in end) or \
            len(_writer_flags(_end_stream_blocks(end))) != 2:
        return doc
    udp = any(isinstance(_obj(item).get("udp"), dict) for item in _list(end.get("streams")))
    new_end = {k: v for k, v in end.items() if not k.startswith("sum")}
    for flag, suffix in ((True, ""), (False, "_bidir_reverse")):
        items = [_obj(i) for i in _list(end.get("streams"))]
        if udp:
            # A stream the writer sent: its count, and the far receiver's loss and jitter
            # (3.9 merges them in); one it received: its own receiver's figures. The far
            # end's own count is not in the document: unknown.
            mine = [_obj(i.get("udp")) for i in items if _obj(i.get("udp")).get("sender") is flag]
            if flag:
                new_end["sum_sent"] = _summed(mine, flag, udp=False)
                new_end["sum"] = _summed(mine, flag, udp=True)
            else:
                new_end["sum_received" + suffix] = _summed(mine, flag, udp=True)
        else:
            senders = [_obj(i.get("sender")) for i in items
                       if _obj(i.get("sender")).get("sender") is flag]
            receivers = [_obj(i.get("receiver")) for i in items
                         if _obj(i.get("receiver")).get("sender") is flag]
            new_end["sum_sent" + suffix] = _summed(senders, flag, udp=False)
            new_end["sum_received" + suffix] = _summed(receivers, flag, udp=False)
    intervals = []
    for block in _list(doc.get("intervals")):
        block = _obj(block)
        streams = [_obj(s) for s in _list(block.get("streams"))]
        intervals.append({**{k: v for k, v in block.items() if not k.startswith("sum")},
                          "sum": _summed([s for s in streams if s.get("sender") is True],
                                         True, udp=udp),
                          "sum_bidir_reverse": _summed(
                              [s for s in streams if s.get("sender") is False], False,
                              udp=udp)})
    return {**doc, "end": new_end, "intervals": intervals}


def _summed(blocks: list[dict[str, Any]], flag: bool, udp: bool) -> dict[str, Any]:
    """One direction's sum of stream ``blocks``, as iperf3 writes a sum: span, bytes and
    the counters every block has (jitter only of one stream: a mean of several would be
    made up)."""
    spans = [_span(b) for b in blocks]
    start = min((s[0] for s in spans), default=0.0)
    end = max((s[1] for s in spans), default=0.0)
    total: dict[str, Any] = {"start": start, "end": end, "seconds": end - start,
                             "bytes": sum(s[2] for s in spans), "sender": flag}
    if any("omitted" in b for b in blocks):
        total["omitted"] = any(b.get("omitted") for b in blocks)
    for key in ("packets", "lost_packets", "out_of_order") if udp else ("retransmits", "packets"):
        counts = [_count(b, key) for b in blocks]
        if counts and None not in counts:
            total[key] = sum(c for c in counts if c is not None)
    if udp and len(blocks) == 1 and _num(blocks[0], "jitter_ms") is not None:
        total["jitter_ms"] = blocks[0]["jitter_ms"]
    if udp and total.get("packets"):
        total["lost_percent"] = 100.0 * total.get("lost_packets", 0) / total["packets"]
    return total


# --- small value helpers ----------------------------------------------------------------


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _num(block: dict[str, Any], key: str) -> float | None:
    value = block.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # a JSON integer of hundreds of digits: no figure at all
        return None


def _int(block: dict[str, Any], key: str) -> int | None:
    # A count that is not a number (NaN, 1e999: Python's JSON reader takes both) is unknown.
    value = _num(block, key)
    return None if value is None or not math.isfinite(value) else int(value)


def _known_int(block: dict[str, Any], key: str) -> int | None:
    """An integer that iperf3 reports as 0 (or less) when it does not know it."""
    value = _int(block, key)
    return value if value is not None and value > 0 else None


def _count(block: dict[str, Any], key: str) -> int | None:
    """A counter; iperf3 uses -1 for 'not available'."""
    value = _int(block, key)
    return value if value is not None and value >= 0 else None


def _span(block: dict[str, Any]) -> tuple[float, float, int, float]:
    start = _num(block, "start") or 0.0
    end = _num(block, "end")
    seconds = _num(block, "seconds")
    if end is None:
        end = start + (seconds or 0.0)
    nbytes = _int(block, "bytes") or 0
    bps = _num(block, "bits_per_second")
    if bps is None:
        span = seconds if seconds else end - start
        bps = nbytes * 8 / span if span > 0 else 0.0
    return start, end, nbytes, bps


def _role_of(block: dict[str, Any], default_sender: bool) -> str:
    flag = block.get("sender")
    sent = flag if isinstance(flag, bool) else default_sender
    return "sender" if sent else "receiver"


# --- intervals ----------------------------------------------------------------------------


def intervals_from_block(
    block: dict[str, Any], ctx: DocContext, numbers: StreamNumbers
) -> list[Interval]:
    """Every sample of one element of ``intervals`` (or one ``interval`` stream event)."""
    default_sender = ctx.is_client != ctx.reverse
    found = []
    for stream in _list(block.get("streams")):
        stream = _obj(stream)
        role = _role_of(stream, default_sender)
        direction = side_directions(ctx.is_client, role)
        number = numbers.number(direction, str(stream.get("socket", "?")))
        found.append(_interval(stream, direction, role, number))
    for key, secondary in (("sum", False), ("sum_bidir_reverse", True)):
        total = block.get(key)
        if isinstance(total, dict):
            fallback = default_sender != secondary
            role = _role_of(total, fallback)
            found.append(_interval(total, side_directions(ctx.is_client, role), role, None))
    return found


def _interval(block: dict[str, Any], direction: str, role: str, stream: int | None) -> Interval:
    start, end, nbytes, bps = _span(block)
    sender = role == "sender"
    rtt = _known_int(block, "rtt") if sender else None
    return Interval(
        direction=direction,
        role=role,
        stream_id=stream,
        start_s=start,
        end_s=end,
        bytes=nbytes,
        bits_per_second=bps,
        omitted=bool(block.get("omitted", False)),
        retransmits=_count(block, "retransmits") if sender else None,
        rtt_us=rtt,
        rttvar_us=_int(block, "rttvar") if rtt is not None else None,
        cwnd_bytes=_known_int(block, "snd_cwnd") if sender else None,
        packets=_count(block, "packets") if sender else _received(block),
        lost_packets=None if sender else _count(block, "lost_packets"),
        out_of_order_packets=None if sender else _count(block, "out_of_order"),
        jitter_ms=None if sender else _num(block, "jitter_ms"),
    )


def _received(block: dict[str, Any]) -> int | None:
    """Datagrams a UDP receiver got. iperf3's receiver ``packets`` is the count expected
    (the highest sequence number seen), lost ones included; the schema's is what arrived,
    as for every other tool."""
    expected, lost = _count(block, "packets"), _count(block, "lost_packets")
    if expected is None or lost is None:
        return expected
    return max(0, expected - lost)


# --- end: per stream ------------------------------------------------------------------------


def _tcp_sender(block: dict[str, Any]) -> SideSummary:
    retransmits = _count(block, "retransmits")
    if block.get("sender") is False:
        # The writer did not send this stream: iperf3 fills the RTT/cwnd fields from the
        # writer's own receiving socket (or zeros), not from the sender. Unknown.
        block = {k: v for k, v in block.items() if k not in _SENDER_TCP_INFO}
    return _plain_side(
        block,
        "sender",
        retransmits=retransmits,
        retransmits_scope="connection" if retransmits is not None else None,
        rtt_us=_known_int(block, "mean_rtt"),
        min_rtt_us=_known_int(block, "min_rtt"),
        max_rtt_us=_known_int(block, "max_rtt"),
        cwnd_bytes=_known_int(block, "max_snd_cwnd"),
    )


_SENDER_TCP_INFO = ("mean_rtt", "min_rtt", "max_rtt", "max_snd_cwnd")


def _plain_side(block: dict[str, Any], role: str, **figures: Any) -> SideSummary:
    """A side's summary of ``block``'s span, bytes and rate, with ``figures`` besides."""
    start, end, nbytes, bps = _span(block)
    return SideSummary(role=role, start_s=start, end_s=end, bytes=nbytes, bits_per_second=bps,
                       **figures)


def _udp_receiver(block: dict[str, Any], totals: dict[str, Any] | None) -> SideSummary:
    """Receiver figures of a UDP stream or flow: loss and jitter from ``block``, bytes
    from ``totals`` (the receiver's own count) when given."""
    counted = totals if totals is not None else block
    return _plain_side(
        counted,
        "receiver",
        packets=_received({**counted, "lost_packets": block.get("lost_packets")}),
        lost_packets=_count(block, "lost_packets"),
        lost_percent=_num(block, "lost_percent"),
        out_of_order_packets=_count(block, "out_of_order"),
        jitter_ms=_num(block, "jitter_ms"),
    )


def _udp_sender(block: dict[str, Any]) -> SideSummary:
    return _plain_side(block, "sender", packets=_count(block, "packets"))


@attrs.define
class _EndStreams:
    streams: list[StreamResult] = attrs.Factory(list)
    udp_blocks: dict[str, list[dict[str, Any]]] = attrs.Factory(dict)


def streams_from_end(
    end: dict[str, Any], ctx: DocContext, numbers: StreamNumbers, congestion: str | None
) -> _EndStreams:
    """Per-stream results of ``end.streams``; UDP receiver bytes are filled in later."""
    out = _EndStreams()
    default_sender = ctx.is_client != ctx.reverse
    for item in _list(end.get("streams")):
        item = _obj(item)
        if isinstance(item.get("udp"), dict):
            udp = item["udp"]
            direction = side_directions(ctx.is_client, _role_of(udp, default_sender))
            number = numbers.number(direction, str(udp.get("socket", "?")))
            out.udp_blocks.setdefault(direction, []).append(udp)
            out.streams.append(StreamResult(number, direction, sender=_udp_sender(udp)))
            continue
        sender, receiver = _obj(item.get("sender")), _obj(item.get("receiver"))
        role = _role_of(sender or receiver, default_sender)
        direction = side_directions(ctx.is_client, role)
        number = numbers.number(direction, str((sender or receiver).get("socket", "?")))
        out.streams.append(
            StreamResult(
                number,
                direction,
                sender=_tcp_sender(sender) if sender else None,
                receiver=_plain_side(receiver, "receiver") if receiver else None,
                socket=SocketInfo(congestion=congestion) if congestion else None,
            )
        )
    return out


# --- end: summed flows ------------------------------------------------------------------------


def flows_from_end(end: dict[str, Any], ctx: DocContext, found: _EndStreams) -> list[FlowSummary]:
    """The summed figures per direction."""
    flows = []
    for suffix, direction in (("", ctx.primary), ("_bidir_reverse", ctx.secondary)):
        sent = end.get("sum_sent" + suffix)
        received = end.get("sum_received" + suffix)
        plain = end.get("sum" + suffix)
        if not any(isinstance(b, dict) for b in (sent, received, plain)):
            continue
        streams = [s for s in found.streams if s.direction == direction]
        if ctx.udp:
            flows.append(_udp_flow(direction, _obj(sent), _obj(received), _obj(plain), streams))
        else:
            flows.append(_tcp_flow(direction, _obj(sent), _obj(received), streams))
    return flows


def _tcp_flow(
    direction: str, sent: dict[str, Any], received: dict[str, Any], streams: list[StreamResult]
) -> FlowSummary:
    sender = _tcp_sender(sent) if sent else None
    if sender is not None:
        sender = _rtt_over_streams(sender, [s.sender for s in streams if s.sender])
    receiver = _plain_side(received, "receiver") if received else None
    return FlowSummary(direction, sender=sender, receiver=receiver)


def _rtt_over_streams(total: SideSummary, sides: list[SideSummary]) -> SideSummary:
    """RTT and cwnd for a flow: min/max over its streams are exact; a mean or a window
    of several streams would be made up, so those stay None unless there is one stream."""
    mins = [s.min_rtt_us for s in sides if s.min_rtt_us is not None]
    maxes = [s.max_rtt_us for s in sides if s.max_rtt_us is not None]
    one = sides[0] if len(sides) == 1 else None
    return attrs.evolve(
        total,
        min_rtt_us=min(mins) if mins else None,
        max_rtt_us=max(maxes) if maxes else None,
        rtt_us=one.rtt_us if one else None,
        cwnd_bytes=one.cwnd_bytes if one else None,
    )


def _udp_flow(
    direction: str,
    sent: dict[str, Any],
    received: dict[str, Any],
    plain: dict[str, Any],
    streams: list[StreamResult],
) -> FlowSummary:
    sender = _udp_sender(sent or plain) if (sent or plain) else None
    receiver = None
    if received:
        # Loss and jitter as iperf3 totals them in "sum"; bytes as the receiver counted.
        receiver = _udp_receiver(plain or received, received)
    return FlowSummary(direction, sender=sender, receiver=receiver)


def _with_stream_ooo(flows: list[FlowSummary], streams: list[StreamResult]) -> list[FlowSummary]:
    """iperf3 counts out-of-order datagrams per stream only; a flow's count is their sum."""
    out = []
    for flow in flows:
        mine = [s.receiver for s in streams if s.direction == flow.direction and s.receiver]
        counts = [r.out_of_order_packets for r in mine]
        receiver = flow.receiver
        if (
            receiver is None
            or receiver.out_of_order_packets is not None
            or not counts
            or None in counts
        ):
            out.append(flow)
            continue
        total = sum(c for c in counts if c is not None)
        receiver = attrs.evolve(receiver, out_of_order_packets=total)
        out.append(attrs.evolve(flow, receiver=receiver))
    return out


def _fill_udp_receivers(
    found: _EndStreams, flows: list[FlowSummary], intervals: list[Interval], ctx: DocContext
) -> list[str]:
    """Per-stream UDP receiver summaries. iperf3 reports a stream's loss and jitter but
    not the bytes its receiver counted; those come from the flow total (one stream) or
    from the writer's own receive intervals. Returns warnings for what stays unknown."""
    warnings = []
    for direction, blocks in found.udp_blocks.items():
        flow = next((f for f in flows if f.direction == direction), None)
        indexes = [i for i, s in enumerate(found.streams) if s.direction == direction]
        for index, block in zip(indexes, blocks):
            totals = _receiver_totals(found.streams[index], flow, len(blocks), intervals)
            if totals is None:
                warnings.append(
                    f"iperf3 does not report the bytes each UDP stream's receiver "
                    f"counted ({direction}); see the flow summary"
                )
                continue
            side = _udp_receiver(block, totals)
            found.streams[index] = attrs.evolve(found.streams[index], receiver=side)
    return sorted(set(warnings))


def _receiver_totals(
    stream: StreamResult, flow: FlowSummary | None, count: int, intervals: list[Interval]
) -> dict[str, Any] | None:
    if count == 1 and flow is not None and flow.receiver is not None:
        r = flow.receiver
        return {
            "start": r.start_s,
            "end": r.end_s,
            "bytes": r.bytes,
            "bits_per_second": r.bits_per_second,
            "packets": r.packets,
        }
    mine = [
        i
        for i in intervals
        if i.direction == stream.direction
        and i.role == "receiver"
        and i.stream_id == stream.stream_id
        and not i.omitted
    ]
    if not mine:
        return None
    nbytes = sum(i.bytes for i in mine)
    packets = [i.packets for i in mine if i.packets is not None]
    start, end = mine[0].start_s, mine[-1].end_s
    return {
        "start": start,
        "end": end,
        "bytes": nbytes,
        "bits_per_second": nbytes * 8 / (end - start) if end > start else 0.0,
        "packets": sum(packets) if packets else None,
    }


def _cpu(cpu: dict[str, Any], prefix: str) -> Cpu | None:
    values = [_num(cpu, f"{prefix}_{k}") for k in ("total", "user", "system")]
    if not any(values):
        return None  # all zero: a server's document written before the client's figures came
    return process_cpu(*values)


def _attach_cpu(
    flows: list[FlowSummary], end: dict[str, Any], ctx: DocContext
) -> list[FlowSummary]:
    cpu = _obj(end.get("cpu_utilization_percent"))
    local, remote = _cpu(cpu, "host"), _cpu(cpu, "remote")
    out = []
    for flow in flows:
        local_sends = flow.direction == side_directions(ctx.is_client, "sender")
        out.append(
            attrs.evolve(
                flow,
                sender=with_cpu(flow.sender, local if local_sends else remote),
                receiver=with_cpu(flow.receiver, remote if local_sends else local),
            )
        )
    return out


# --- whole documents ------------------------------------------------------------------------


def parse_document(doc: dict[str, Any], source: str = "<input>") -> Figures:
    """Everything an iperf3 ``-J`` document holds, as result parts."""
    doc = with_bidir_sums(doc)
    start = _obj(doc.get("start"))
    ctx = context_from_start(start, bidir=_is_bidir(doc))
    numbers = StreamNumbers()
    parts = Figures(version=_version(start), start_time=_start_time(start))
    parts.local, parts.remote = _endpoints(start, ctx)
    for block in _list(doc.get("intervals")):
        parts.intervals.extend(intervals_from_block(_obj(block), ctx, numbers))
    end = _obj(doc.get("end"))
    congestion = end.get("sender_tcp_congestion")
    found = streams_from_end(end, ctx, numbers, congestion if isinstance(congestion, str) else None)
    flows = flows_from_end(end, ctx, found)
    parts.warnings.extend(_fill_udp_receivers(found, flows, parts.intervals, ctx))
    parts.streams = found.streams
    parts.summaries = _attach_cpu(_with_stream_ooo(flows, found.streams), end, ctx)
    parts.warnings.extend(short_sender_totals("iperf3", "udp" if ctx.udp else "tcp",
                                              parts.summaries))
    if not ctx.is_client or doc.get("error"):
        _drop_unreported_peer_sides(parts, ctx)
    parts.duration_s = _duration(parts.summaries)
    parts.call_lengths = call_lengths(start)
    error = doc.get("error")
    if error:
        parts.errors.append(str(error))
    return parts


def call_lengths(start: dict[str, Any]) -> dict[tuple[str, str], int]:
    """iperf3's -l (``test_start.blksize``) over TCP: the client sends it to the server,
    and both ends write and read with it, either way (strace of 3.12: 16384-byte reads and
    writes on both ends with -l 16K, with and without -R)."""
    test = _obj(start.get("test_start"))
    if str(test.get("protocol", "")).upper() != "TCP":
        return {}
    return _every_end(_known_int(test, "blksize"))


def _every_end(length: int | None) -> dict[tuple[str, str], int]:
    """``length`` for both ends of both ways ({} when unknown)."""
    if length is None or length <= 0:
        return {}
    return {(direction, role): length for direction in (C2S, S2C)
            for role in ("sender", "receiver")}


def _drop_unreported_peer_sides(parts: Figures, ctx: DocContext) -> None:
    """Figures of the other process arrive only when a test completes: a server's document
    (written before they come) or a failed client's has zeros there, meaning unknown."""

    def peer_role(direction: str) -> str:
        writer_sends = direction == side_directions(ctx.is_client, "sender")
        return "receiver" if writer_sends else "sender"

    def known(side: SideSummary | None) -> SideSummary | None:
        return None if side is not None and side.bytes == 0 else side

    for index, flow in enumerate(parts.summaries):
        if peer_role(flow.direction) == "sender":
            parts.summaries[index] = attrs.evolve(flow, sender=known(flow.sender))
        else:
            parts.summaries[index] = attrs.evolve(flow, receiver=known(flow.receiver))
    for index, stream in enumerate(parts.streams):
        if peer_role(stream.direction) == "sender":
            parts.streams[index] = attrs.evolve(stream, sender=known(stream.sender))
        else:
            parts.streams[index] = attrs.evolve(stream, receiver=known(stream.receiver))


def _version(start: dict[str, Any]) -> str | None:
    text = start.get("version")
    if not isinstance(text, str):
        return None
    return text.split()[-1] if text.startswith("iperf") else text


def _start_time(start: dict[str, Any]) -> str | None:
    secs = _num(_obj(start.get("timestamp")), "timesecs")
    if secs is None:
        return None
    try:
        moment = datetime.datetime.fromtimestamp(secs, datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):  # no time a clock can show: unknown
        return None
    return moment.isoformat(timespec="milliseconds")


def _endpoints(start: dict[str, Any], ctx: DocContext) -> tuple[Endpoint, Endpoint]:
    conn = _obj((_list(start.get("connected")) or [{}])[0])
    target = _obj(start.get("connecting_to"))
    system = start.get("system_info") if isinstance(start.get("system_info"), str) else None
    near = (conn.get("local_host"), _int(conn, "local_port"))
    far = (conn.get("remote_host"), _int(conn, "remote_port"))
    client_side, server_side = (near, far) if ctx.is_client else (far, near)
    local = Endpoint(
        role="client",
        address=client_side[0],
        port=client_side[1],
        system=system if ctx.is_client else None,
    )
    remote = Endpoint(
        role="server",
        host=target.get("host"),
        address=server_side[0],
        port=_int(target, "port") or server_side[1],
        system=None if ctx.is_client else system,
    )
    return local, remote


def _duration(flows: list[FlowSummary]) -> float | None:
    ends = [f.sender.end_s - f.sender.start_s for f in flows if f.sender is not None]
    return max(ends) if ends else None


def spec_from_document(doc: dict[str, Any], parts: Figures) -> TestSpec:
    """The TestSpec a document was run with, as far as it says."""
    start = _obj(doc.get("start"))
    test = _obj(start.get("test_start"))
    ctx = context_from_start(start, bidir=_is_bidir(doc))
    nbytes = _known_int(test, "bytes")
    duration = _num(test, "duration") or None
    if nbytes is None and duration is None:
        duration = parts.duration_s or 10.0
    length = _known_int(test, "blksize")
    tos = _int(test, "tos") or 0
    return TestSpec(
        tool="iperf3",
        host=parts.remote.host if parts.remote else None,
        protocol="udp" if ctx.udp else "tcp",
        direction="bidir" if ctx.bidir else ("reverse" if ctx.reverse else "normal"),
        streams=_known_int(test, "num_streams") or 1,
        duration_s=None if nbytes else duration,
        bytes_total=nbytes,
        interval_s=_interval_length(test, parts.intervals),
        omit_s=_num(test, "omit") or 0.0,
        length_bytes=length if (length or 0) >= 16 or not ctx.udp else None,
        rate_bits_per_second=_num(test, "target_bitrate") or None,
        dscp=(tos >> 2) if tos else None,
        port=parts.remote.port if parts.remote else None,
    )


def _interval_length(test: dict[str, Any], intervals: list[Interval]) -> float | None:
    given = _num(test, "interval")
    if given:
        return given
    sums = [i for i in intervals if i.stream_id is None] or intervals
    if not sums:
        return None
    return round(sums[0].end_s - sums[0].start_s, 1) or None


# --- text entry points ------------------------------------------------------------------------


def looks_like_json_stream(text: str) -> bool:
    """True for ``--json-stream`` output: one ``{"event": ...}`` object per line."""
    first = text.lstrip().split("\n", 1)[0].strip()
    return first.startswith("{") and first.endswith("}") and '"event"' in first


def parse_json_text(text: str, source: str = "<input>") -> tuple[dict[str, Any], list[str]]:
    """A ``-J`` document or ``--json-stream`` lines turned into one document, plus
    warnings (for a truncated stream). Raises ParseError when nothing can be read."""
    if looks_like_json_stream(text):
        return document_from_stream(text, source)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        salvaged = salvage_truncated(text)
        if salvaged is not None:
            where = f"line {getattr(exc, 'lineno', '?')}"
            return salvaged, [
                f"{source}: JSON cut short at {where}: kept the start and "
                f"{len(salvaged['intervals'])} interval(s); no end section"
            ]
        line = getattr(exc, "lineno", None)
        raise ParseError(f"not an iperf3 JSON document ({exc.args[0]})", source, line) from None
    if not isinstance(doc, dict) or not ({"start", "end", "error", "intervals"} & set(doc)):
        raise ParseError("JSON, but not an iperf3 -J document", source, 1)
    return doc, []


def salvage_truncated(text: str) -> dict[str, Any] | None:
    """What can be read of a ``-J`` document that was cut off (the tool was killed): its
    ``start`` object and every complete ``intervals`` element. None if not even that."""
    decoder = json.JSONDecoder()
    doc: dict[str, Any] = {"intervals": []}
    start_at = text.find('"start"')
    if start_at < 0 or not text.lstrip().startswith("{"):
        return None
    start = _decode_after(decoder, text, text.find(":", start_at) + 1)
    if not isinstance(start, tuple) or not isinstance(start[0], dict):
        return None
    doc["start"] = start[0]
    at = text.find("[", text.find('"intervals"', start[1]))
    while at >= 0:
        item = _decode_after(decoder, text, at + 1)
        if item is None or not isinstance(item[0], dict):
            break
        doc["intervals"].append(item[0])
        at = item[1] if text[item[1] :].lstrip().startswith(",") else -1
        if at >= 0:
            at = text.index(",", at)
    return doc


def _decode_after(decoder: json.JSONDecoder, text: str, at: int) -> tuple[Any, int] | None:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    try:
        return decoder.raw_decode(text, at)
    except (ValueError, RecursionError):
        return None


def document_from_stream(text: str, source: str = "<input>") -> tuple[dict[str, Any], list[str]]:
    """Assemble the events of ``--json-stream`` output into one ``-J``-shaped document."""
    doc: dict[str, Any] = {"intervals": []}
    warnings: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            warnings.append(f"{source}:{number}: unreadable line, output cut short?")
            break
        if not isinstance(event, dict) or "event" not in event:
            raise ParseError("not an iperf3 --json-stream event", source, number)
        apply_event(doc, event)
    if "start" not in doc and "error" not in doc:
        raise ParseError("no iperf3 start event", source, 1)
    if "end" not in doc and "error" not in doc:
        warnings.append(f"{source}: no end event: the test did not finish")
    return doc, warnings


def apply_event(doc: dict[str, Any], event: dict[str, Any]) -> dict[str, Any] | None:
    """Fold one ``--json-stream`` event into ``doc``; returns the interval data if it was
    an interval event."""
    kind, data = event.get("event"), event.get("data")
    if kind == "interval" and isinstance(data, dict):
        doc.setdefault("intervals", []).append(data)
        return data
    if kind in ("start", "end") and isinstance(data, dict):
        if kind == "end" and not data and "error" in doc:
            return None  # iperf3 closes a failed run with an empty end event
        doc[kind] = data
    elif kind == "error":
        doc["error"] = data if isinstance(data, str) else json.dumps(data)
    elif kind == "server_output_json" and isinstance(data, dict):
        doc["server_output_json"] = data
    elif kind == "server_output_text":
        doc["server_output_text"] = data
    return None


# --- human output -------------------------------------------------------------------------------

_HUMAN = re.compile(
    r"^\[\s*(?P<id>\d+|SUM)\](?:\[(?P<tag>TX|RX)-(?P<who>[CS])\])?\s+"
    r"(?P<start>\d+(?:\.\d+)?)-(?P<end>\d+(?:\.\d+)?)\s+sec\s+"
    r"(?P<xfer>\d+(?:\.\d+)?)\s+(?P<xunit>[KMGT]?)Bytes\s+"
    r"(?P<rate>\d+(?:\.\d+)?)\s+(?P<runit>[KMGT]?)bits/sec(?P<rest>.*)$"
)
_RETR_CWND = re.compile(
    r"^\s+(?P<retr>\d+)(?:\s+(?P<cwnd>\d+(?:\.\d+)?)\s+(?P<cunit>[KMGT]?)Bytes)?"
)
_UDP_RX = re.compile(
    r"^\s+(?P<jitter>\d+(?:\.\d+)?)\s+ms\s+(?P<lost>-?\d+)/(?P<total>-?\d+)\s+\((?P<pct>[^)%]*)%\)"
)
_UDP_TX = re.compile(r"^\s+(?P<packets>\d+)\s*(?:\(omitted\))?\s*$")


@attrs.frozen
class HumanLine:
    """One interval or summary line of iperf3's human output."""

    label: str
    role: str
    direction: str
    summary: bool
    sample: Interval


def parse_human_line(line: str, process_is_client: bool, default_role: str) -> HumanLine | None:
    """Read one human-format line (``[  5]   0.00-1.00   sec ...``); None if it is not
    an interval or summary line. Values are as rounded as iperf3 printed them (three
    significant digits for the transfer); the rate is as precise as the ``-f`` unit."""
    match = _HUMAN.match(line.rstrip())
    if not match:
        return None
    rest = match["rest"]
    role, extra = _human_extras(match, rest, default_role)
    if match["who"]:
        process_is_client = match["who"] == "C"
    summary = bool(re.search(r"\b(sender|receiver)\s*$", rest))
    # A summary line's role word names a side of the flow, not what this process did:
    # the flow is the one this process sends (TX tag or default role) or receives.
    own_role = {"TX": "sender", "RX": "receiver"}.get(match["tag"] or "", default_role)
    direction = side_directions(process_is_client, own_role if summary else role)
    sample = Interval(
        direction=direction,
        role=role,
        stream_id=None,
        start_s=float(match["start"]),
        end_s=float(match["end"]),
        bytes=round(float(match["xfer"]) * binary_factor(match["xunit"])),
        bits_per_second=float(match["rate"]) * si_factor(match["runit"]),
        omitted="(omitted)" in rest,
        **extra,
    )
    return HumanLine(match["id"], role, direction, summary, sample)


def _human_extras(match: re.Match[str], rest: str, default_role: str) -> tuple[str, dict[str, Any]]:
    tagged = {"TX": "sender", "RX": "receiver"}.get(match["tag"] or "")
    trailing = re.search(r"\b(sender|receiver)\s*$", rest)
    found, extra = _line_kind(rest, bool(trailing))
    if trailing:  # summary line: its last word says whose figures these are
        if trailing.group(1) == "sender":  # iperf3 prints 0 jitter/loss for the sender
            extra = {k: v for k, v in extra.items() if k not in ("jitter_ms", "lost_packets")}
        return trailing.group(1), extra
    return tagged or found or default_role, extra


def _line_kind(rest: str, summary: bool) -> tuple[str | None, dict[str, Any]]:
    """The role the columns after the bitrate imply, and their values."""
    udp = _UDP_RX.match(rest)
    if udp:
        lost, total = int(udp["lost"]), int(udp["total"])
        return "receiver", {
            "jitter_ms": float(udp["jitter"]),
            "lost_packets": lost if lost >= 0 else None,
            # Lost/Total: the total is the datagrams expected; the schema counts arrivals
            "packets": total - max(lost, 0) if total >= 0 else None,
        }
    tx = _UDP_TX.match(rest)
    if tx and not summary:
        return "sender", {"packets": int(tx["packets"])}
    retr = _RETR_CWND.match(rest)
    if retr:
        cwnd = retr["cwnd"]
        size = round(float(cwnd) * binary_factor(retr["cunit"])) if cwnd else None
        return "sender", {"retransmits": int(retr["retr"]), "cwnd_bytes": size}
    return None, {}


class HumanIntervals:
    """Turns human interval lines into numbered Interval samples, one line at a time
    (for a live server's output); summary and other lines give None."""

    def __init__(self, process_is_client: bool, default_role: str) -> None:
        self._is_client = process_is_client
        self._default_role = default_role
        self._numbers = StreamNumbers()

    def feed(self, line: str) -> Interval | None:
        """The interval sample on ``line``, if any."""
        parsed = parse_human_line(line, self._is_client, self._default_role)
        if parsed is None or parsed.summary:
            return None
        return _numbered(parsed, self._numbers)


def _numbered(parsed: HumanLine, numbers: StreamNumbers) -> Interval:
    if parsed.label == "SUM":
        return parsed.sample
    return attrs.evolve(parsed.sample, stream_id=numbers.number(parsed.direction, parsed.label))


def parse_human_text(text: Text, source: str = "<input>") -> Figures:
    """Intervals and summaries of a saved human-format iperf3 output (client or server),
    read line by line: the first :data:`netprobe.plugin.MAX_INTERVALS_KEPT` intervals are
    kept and the rest counted (the summaries are iperf3's own final lines, so stay exact).
    Raises ParseError when no iperf3 line is found."""
    is_client = "Connecting to host" in text or "Server listening" not in text
    default_role = _human_own_role(text, is_client)
    numbers = StreamNumbers()
    parts = Figures()
    kept = plugin.KeptIntervals()
    sides: dict[tuple[str, int | None], dict[str, SideSummary]] = {}
    for line in _bounded.lines(text):
        parsed = parse_human_line(line.rstrip("\n"), is_client, default_role)
        if parsed is None:
            continue
        sample = _numbered(parsed, numbers)
        if parsed.summary:
            key = (sample.direction, sample.stream_id)
            sides.setdefault(key, {})[parsed.role] = side_of(sample)
        else:
            kept.add(sample)
    parts.intervals = kept.samples
    if not parts.intervals and not sides:
        raise ParseError("no iperf3 interval or summary lines found", source)
    _human_summaries(parts, sides)
    warning = _bounded.not_kept_warning(len(kept.samples), kept.dropped)
    if warning:
        parts.warnings.append(warning)
    parts.call_lengths = _human_call_lengths(text)
    return parts


_STARTING = re.compile(r"^Starting Test: protocol: (\w+), \d+ streams, (\d+) byte blocks")


def _human_call_lengths(text: Text) -> dict[tuple[str, str], int]:
    # A -V client prints "Starting Test: ... N byte blocks": the -l both ends use, as
    # test_start.blksize says it in -J output (a server's -V output has no such line).
    found = next((m for m in map(_STARTING.match, _bounded.lines(text)) if m), None)
    if found is None or found.group(1).upper() != "TCP":
        return {}
    return _every_end(int(found.group(2)))


def _human_own_role(text: Text, is_client: bool) -> str:
    """What a human output's process did in a one-way test. A client says "Reverse mode";
    a server never does, so its interval lines tell (a sender's carry Retr and Cwnd, or
    Total Datagrams): a -R test's server had its figures put on the client's flow."""
    if is_client:
        return "receiver" if "Reverse mode" in text else "sender"
    for line in _bounded.lines(text):
        parsed = parse_human_line(line.rstrip("\n"), False, "receiver")
        if parsed is not None and not parsed.summary:
            return parsed.role
    return "receiver"


def _human_summaries(
    parts: Figures, sides: dict[tuple[str, int | None], dict[str, SideSummary]]
) -> None:
    directions = {d for d, _ in sides}
    for (direction, stream), pair in sorted(sides.items(), key=lambda kv: str(kv[0])):
        if stream is not None:
            parts.streams.append(
                StreamResult(stream, direction, pair.get("sender"), pair.get("receiver"))
            )
    for direction in sorted(directions):
        total = sides.get((direction, None))
        if total is None:  # one stream: iperf3 prints no [SUM] line
            ones = [p for (d, s), p in sides.items() if d == direction and s is not None]
            total = ones[0] if len(ones) == 1 else None
        if total:
            parts.summaries.append(
                FlowSummary(direction, total.get("sender"), total.get("receiver"))
            )
    parts.duration_s = _duration(parts.summaries)
    parts.warnings.append(
        "read from iperf3's human output: transfers are rounded to three "
        "significant digits; use -J output for exact figures"
    )


def json_error(doc: dict[str, Any]) -> str | None:
    """The error message of a document (iperf3 -J exits 0 and says it only here)."""
    error = doc.get("error")
    return str(error) if error else None


# --- one test at a time from a log of many ----------------------------------------------------


def split_tests(lines: Iterable[str]) -> Iterable[Text]:
    """The text of each test in a saved iperf3 log that may hold several (a server's log,
    appended runs), read line by line so that one test at a time is in memory. A test
    begins at ``Accepted connection from`` (human output), at a ``{`` alone on a line (a
    ``-J`` document: iperf3 pretty-prints, so its top-level braces stand alone) or at a
    ``--json-stream`` start event. A last ``-J`` document that holds an error and no
    connection, after tests (the server was stopped while it waited), is no test."""
    chunk = SpooledLog()  # a test past _bounded.SPOOL_CHARS waits in a temporary file
    began, count = False, 0
    for line in lines:
        if _begins_test(line):
            if began:
                yield _bounded.held(chunk)
                chunk, count = SpooledLog(), count + 1
            began = True
        chunk.add(line)
    text = _bounded.held(chunk)
    if not isinstance(text, str):
        yield text  # too big to be a stopped server's error document
    elif text.strip() and not (count and '"error"' in text and not _connected(text)):
        yield text


def _connected(text: str) -> bool:
    return re.search(r'"connected":\s*\[\s*\{', text) is not None


def _begins_test(line: str) -> bool:
    return (line.startswith("Accepted connection from") or line.rstrip() == "{"
            or (line.startswith('{"event":') and '"event":"start"' in line[:20]))
