"""Merge the client's own figures and the server's report into one Result."""

from __future__ import annotations

from typing import Any

import attrs

from netprobe import convert
from netprobe.engine.conduct import Outcome
from netprobe.engine.side import Side
from netprobe.engine.summary import sum_summaries, summary_from_intervals
from netprobe.errors import NetprobeError
from netprobe.reporting import KeptIntervals, intervals_not_kept
from netprobe.schema import (
    Cpu,
    Endpoint,
    FlowSummary,
    Interval,
    Result,
    SideSummary,
    SocketInfo,
    StreamResult,
    TestSpec,
    ToolInfo,
)
from netprobe.version import __version__

Key = tuple[int, str, str]  # stream id, direction, role


def _peer_parts(
    report: dict[str, Any] | None,
) -> tuple[dict[Key, SideSummary], dict, Cpu | None]:
    """The peer's per-stream summaries and socket infos, validated; empty if unusable."""
    summaries: dict[Key, SideSummary] = {}
    sockets: dict[tuple[int, str], SocketInfo] = {}
    if not report:
        return summaries, sockets, None
    try:
        for item in report.get("streams", []):
            key = (int(item["stream_id"]), str(item["direction"]), str(item["role"]))
            summaries[key] = convert.structure(item["summary"], SideSummary)
            sockets[key[:2]] = convert.structure(item.get("socket") or {}, SocketInfo)
        cpu = convert.structure(report["cpu"], Cpu) if report.get("cpu") else None
    except (NetprobeError, KeyError, TypeError, ValueError):
        return {}, {}, None
    return summaries, sockets, cpu


def _mode(spec: TestSpec) -> str:
    modes = [
        m for m, on in (("zerocopy", spec.zerocopy), ("skip-rx-copy", spec.skip_rx_copy)) if on
    ]
    return "+".join(modes) or "copy"


def build_result(
    *,
    spec: TestSpec,
    start_time: str,
    local: Endpoint,
    remote: Endpoint,
    side: Side,
    outcome: Outcome,
    local_kept: KeptIntervals,
    status: str,
    errors: list[str],
    data_path: str,
) -> Result:
    """One Result from both ends' figures (either may be missing in a partial result)."""
    summaries: dict[Key, SideSummary] = {}
    sockets: dict[tuple[int, str], SocketInfo] = {}
    for stream, summary in side.stream_summaries():
        summaries[(stream.stream_id, stream.direction, stream.role)] = summary
        if stream.role == "sender":
            sockets[(stream.stream_id, stream.direction)] = stream.socket_info
    peer_summaries, peer_sockets, peer_cpu = _peer_parts(outcome.peer_report)
    summaries.update(peer_summaries)
    warnings = _fill_from_intervals(spec, summaries, outcome.peer_intervals)
    not_kept = intervals_not_kept(len(local_kept) + len(outcome.peer_kept),
                                  local_kept.dropped + outcome.peer_kept.dropped)
    if not_kept:
        warnings.append(not_kept)
    for key, info in peer_sockets.items():
        sockets.setdefault(key, info)
    cpu_by_role = cpu_by_role_of(spec, side.cpu(), peer_cpu)
    streams, flows = streams_and_flows(spec, summaries, sockets, cpu_by_role)
    intervals = sorted(
        _with_late_retransmits([*local_kept.samples, *outcome.peer_intervals], summaries),
        key=lambda i: (i.end_s, i.direction, i.role, i.stream_id or 1_000_000),
    )
    ends = [s.end_s for s in summaries.values()]
    return Result(
        tool=ToolInfo(name="native", version=__version__, data_path=data_path, mode=_mode(spec)),
        spec=spec,
        start_time=start_time,
        local=local,
        remote=remote,
        status=status,
        duration_s=max(ends) if ends else None,
        summaries=tuple(flows),
        streams=tuple(streams),
        intervals=tuple(intervals),
        errors=tuple(errors),
        warnings=(*side.warnings(), *warnings, *_peer_warnings(outcome.peer_report),
                  *_rcvbuf_warnings(flows), *_super_packet_warnings(flows)),
    )


def _with_late_retransmits(intervals: list[Interval],
                           summaries: dict[Key, SideSummary]) -> list[Interval]:
    """Intervals whose retransmits add up to the summary's. A sender's last write returns
    while its socket still holds data; what is retransmitted while that drains comes after
    the last interval's snapshot and is counted in the summary only: it goes to the last
    interval of its stream (and to that interval's sum)."""
    found = list(intervals)
    for (stream_id, direction, role), side in summaries.items():
        mine = [n for n, i in enumerate(found) if not i.omitted and i.retransmits is not None
                and (i.stream_id, i.direction, i.role) == (stream_id, direction, role)]
        if role != "sender" or side.retransmits is None or not mine:
            continue
        late = side.retransmits - sum(found[n].retransmits or 0 for n in mine)
        if late <= 0:
            continue
        last = found[mine[-1]]
        for n, other in enumerate(found):
            same_end = (other.direction, other.role, other.end_s) == (direction, role,
                                                                      last.end_s)
            if n == mine[-1] or (same_end and other.stream_id is None):
                found[n] = attrs.evolve(other, retransmits=(other.retransmits or 0) + late)
    return found


def _super_packet_warnings(flows: list[FlowSummary]) -> list[str]:
    """Say where UDP datagrams crossed the path in the sender's GSO messages, never cut:
    the receiver read them as many a message as were sent (veth, a router between
    namespaces, a container's path). The kernel's own Udp InDatagrams counts such a
    message once: the path carried that many packets, not the datagrams reported."""
    found = []
    for flow in flows:
        sent = flow.sender.datagrams_per_message if flow.sender else None
        got = flow.receiver.datagrams_per_message if flow.receiver else None
        # Half, not equal: datagrams queued before the receiver turned UDP_GRO on come one
        # a message and lower its mean (121 of 128 in a loaded run through a router); a
        # path that cut the messages hands over one a message.
        if sent and got and sent > 1 and got > sent / 2:
            found.append(f"{flow.direction}: the receiver read {got:g} datagrams a message "
                         f"where the sender's GSO messages held {sent:g}: they crossed the "
                         "path uncut, and the packet rate is not the path's (--no-gso sends "
                         "one datagram a packet)")
    return found


def _rcvbuf_warnings(flows: list[FlowSummary]) -> list[str]:
    """Say where loss was the tester's own: datagrams its receive buffer dropped."""
    found = []
    for flow in flows:
        receiver = flow.receiver
        drops = receiver.receive_buffer_dropped_packets if receiver else None
        if receiver and drops:
            # "at least": with UDP_GRO a coalesced group dropped whole counts once.
            found.append(f"{flow.direction}: at least {drops} of the "
                         f"{receiver.lost_packets} datagrams lost were dropped by the "
                         "receiving host's full socket buffer, not by the path")
    return found


def _fill_from_intervals(spec: TestSpec, summaries: dict[Key, SideSummary],
                         peer_intervals: list[Interval]) -> list[str]:
    """Summaries the peer's final report did not bring (a test stopped half-way), summed
    from the interval reports it did send; a warning says which."""
    filled: list[str] = []
    for direction in spec.flow_directions():
        for role in ("sender", "receiver"):
            for stream_id in range(1, spec.streams + 1):
                key = (stream_id, direction, role)
                samples = [i for i in peer_intervals if not i.omitted and
                           (i.stream_id, i.direction, i.role) == key]
                if key not in summaries and samples:
                    summaries[key] = summary_from_intervals(samples)
                    filled.append(f"{direction} {role}")
    if not filled:
        return []
    return [f"the far end's final report did not come: the {', '.join(dict.fromkeys(filled))} "
            "summary is summed from its interval reports"]


def _peer_warnings(report: dict[str, Any] | None) -> list[str]:
    """The peer's warnings, marked as its own (only strings are taken)."""
    items = (report or {}).get("warnings")
    if not isinstance(items, list):
        return []
    return [f"server: {item}" for item in items if isinstance(item, str)]


def cpu_by_role_of(spec: TestSpec, local: Cpu | None, remote: Cpu | None) -> dict:
    """CPU of the sender and receiver of each direction (client is local)."""
    return {
        ("client_to_server", "sender"): local,
        ("client_to_server", "receiver"): remote,
        ("server_to_client", "sender"): remote,
        ("server_to_client", "receiver"): local,
    }


def streams_and_flows(
    spec: TestSpec,
    summaries: dict[Key, SideSummary],
    sockets: dict,
    cpu_by_role: dict,
) -> tuple[list[StreamResult], list[FlowSummary]]:
    """Each stream's row and each direction's flow, from the summaries by (stream id,
    direction, role); a flow's sums carry the CPU of its role's end."""
    streams: list[StreamResult] = []
    flows: list[FlowSummary] = []
    for direction in spec.flow_directions():
        senders, receivers = [], []
        for stream_id in range(1, spec.streams + 1):
            sender = summaries.get((stream_id, direction, "sender"))
            receiver = summaries.get((stream_id, direction, "receiver"))
            senders += [sender] if sender else []
            receivers += [receiver] if receiver else []
            streams.append(
                StreamResult(
                    stream_id=stream_id,
                    direction=direction,
                    sender=sender,
                    receiver=receiver,
                    socket=sockets.get((stream_id, direction)),
                )
            )
        flows.append(
            FlowSummary(
                direction=direction,
                sender=sum_summaries(senders, cpu_by_role[(direction, "sender")])
                if senders
                else None,
                receiver=sum_summaries(receivers, cpu_by_role[(direction, "receiver")])
                if receivers
                else None,
            )
        )
    return streams, flows
