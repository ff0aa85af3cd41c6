"""The server's view of one iperf3 test as a netprobe Result: its own byte counts on one
side of each flow, the client's (from the results it sent) on the other."""

from __future__ import annotations

import socket
from typing import Any

import attrs

from netprobe.engine.iperf3 import wire
from netprobe.schema import (
    Endpoint,
    FlowSummary,
    Result,
    SideSummary,
    StreamResult,
    TestSpec,
    ToolInfo,
)


def server_result(p: wire.Params, peer: tuple, conn: socket.socket, streams: list[Any],
                  started: str, duration: float, cpu: float, theirs: dict | None,
                  error: str | None) -> Result:
    """A Result of the test the server just served (``theirs``: the client's results)."""
    client_bytes, their_time = _their_counts(theirs)
    flows, rows = [], []
    for direction in p.directions:
        mine = [s for s in streams if s.direction == direction]
        ours_role = "sender" if direction == "server_to_client" else "receiver"
        their_role = "receiver" if ours_role == "sender" else "sender"
        total = sum(s.counted for s in mine)
        ours = _side(ours_role, total, duration)
        if p.udp and ours_role == "receiver":
            ours = attrs.evolve(ours, packets=sum(s.packets for s in mine),
                                lost_packets=sum(s.errors for s in mine),
                                out_of_order_packets=sum(s.out_of_order for s in mine),
                                jitter_ms=max((s.jitter_s for s in mine), default=0.0) * 1e3)
        theirs_total = sum(client_bytes.get(s.stream_id, 0) for s in mine)
        # The client's side over the client's own time (its -J divides by that one).
        other = (_side(their_role, theirs_total, their_time or duration)
                 if theirs is not None else None)
        if ours_role == "sender":
            ours = _with_retransmits(ours, mine)
        sending = ours_role == "sender"
        flows.append(FlowSummary(direction=direction, sender=ours if sending else other,
                                 receiver=other if sending else ours))
        for s in mine:
            side = _side(ours_role, s.counted, duration)
            rows.append(StreamResult(stream_id=s.stream_id, direction=direction,
                                     sender=side if sending else None,
                                     receiver=None if sending else side))
    direction = "bidir" if p.bidirectional else "reverse" if p.reverse else "normal"
    spec = TestSpec(tool="iperf3", host=peer[0], protocol="udp" if p.udp else "tcp",
                    direction=direction,
                    streams=p.parallel, duration_s=float(p.time) if p.time else None,
                    bytes_total=_bytes_per_stream(p),
                    omit_s=float(p.omit), length_bytes=p.length,
                    window_bytes=p.window or None,
                    rate_bits_per_second=float(p.bandwidth) if p.bandwidth else None)
    local = conn.getsockname() if _open(conn) else ("", 0)
    return Result(
        tool=ToolInfo(name="iperf3", mode="copy"), spec=spec,
        start_time=started or None,
        local=Endpoint(role="server", address=local[0], port=local[1]),
        remote=Endpoint(role="client", address=peer[0], port=peer[1]),
        status="failed" if error else "ok", duration_s=duration,
        summaries=tuple(flows), streams=tuple(rows),
        errors=(error,) if error else ())


def _bytes_per_stream(p: wire.Params) -> int | None:
    """The byte count of a -n (num) or -k (blockcount) test, per stream as netprobe's spec
    counts it (iperf3's is the whole test's); None for a timed test."""
    total = p.num or p.blockcount * p.length
    if p.time or total <= 0:
        return None
    return max(1, -(-total // max(1, p.parallel)))


def _side(role: str, count: int, duration: float) -> SideSummary:
    return SideSummary(role=role, start_s=0.0, end_s=duration, bytes=int(count),
                       bits_per_second=count * 8 / duration if duration > 0 else 0.0)


def _with_retransmits(side: SideSummary, streams: list[Any]) -> SideSummary:
    counts = [s.retransmits for s in streams if s.retransmits is not None]
    if not counts:
        return side
    return attrs.evolve(side, retransmits=sum(counts), retransmits_scope="connection")


def _their_counts(theirs: dict | None) -> tuple[dict[int, int], float | None]:
    """The client's bytes by stream id, and its longest stream time (None if not told)."""
    found: dict[int, int] = {}
    longest: float | None = None
    rows = theirs.get("streams") if isinstance(theirs, dict) else None
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict):
            continue
        ident, count = row.get("id"), row.get("bytes")
        # Foreign numbers: only finite, non-negative ones below 2^63 are taken.
        if (isinstance(ident, int) and isinstance(count, (int, float))
                and not isinstance(count, bool) and 0 <= count < 2**63):
            found[ident] = int(count)
        end = row.get("end_time")
        if isinstance(end, (int, float)) and not isinstance(end, bool) and 0 < end < 1e7:
            longest = max(longest or 0.0, float(end))
    return found, longest


def _open(conn: socket.socket) -> bool:
    try:
        conn.getsockname()
    except OSError:
        return False
    return True
