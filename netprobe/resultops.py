"""Operations on one Result that tools and the engine share: merging what a far end (or
another output of the same test) reported, the sender-total check, call lengths, a rate.

Beside the results, below the plugin contract: a tool reaches them through the contract's
re-exports or directly; nothing here imports a tool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Callable

import attrs

from netprobe.schema import FlowSummary, RawOutput, Result, SideSummary


def fill_missing(result: Result, other: Result, far_end: RawOutput | None = None) -> Result:
    """``result`` with the sender/receiver figures it lacks (None) taken from ``other``,
    matched by direction and stream (flows and streams it has none of taken whole), plus
    ``other``'s intervals of roles it has none of, and ``other``'s latency when ``result``
    has none (the far end may be the one that measured it). For merging what a far end
    (or another output of the same test) reported into what the client saw."""
    summaries = _filled(result.summaries, other.summaries, lambda f: f.direction)
    merged_streams = _filled(result.streams, other.streams, lambda s: (s.stream_id, s.direction))
    have = {(i.direction, i.role) for i in result.intervals}
    extra = [i for i in other.intervals if (i.direction, i.role) not in have]
    intervals = tuple(sorted([*result.intervals, *extra], key=lambda i: (i.end_s, i.role)))
    raw = (*result.raw, far_end) if far_end is not None else result.raw
    return attrs.evolve(result, summaries=summaries, streams=merged_streams,
                        intervals=intervals, raw=raw, latency=result.latency or other.latency)


def _filled(mine: tuple[Any, ...], theirs: tuple[Any, ...], key: Callable[[Any], Any]
            ) -> tuple[Any, ...]:
    """``mine`` with their sides filled in, then those of ``theirs`` that ``mine`` lacks."""
    by_key = {key(item): item for item in theirs}
    have = {key(item) for item in mine}
    return (*(_fill(item, by_key.get(key(item))) for item in mine),
            *(item for item in theirs if key(item) not in have))


def _fill(mine: Any, theirs: Any) -> Any:
    if theirs is None:
        return mine
    return attrs.evolve(mine, sender=_side_filled(mine.sender, theirs.sender),
                        receiver=_side_filled(mine.receiver, theirs.receiver))


def _side_filled(mine: SideSummary | None, theirs: SideSummary | None
                 ) -> SideSummary | None:
    # The call length is the one figure a side's own output may lack while the other
    # process's says it (iperf 2's client knows what its server writes with).
    if mine is None:
        return theirs
    if mine.call_length_bytes is None and theirs is not None and theirs.call_length_bytes:
        return attrs.evolve(mine, call_length_bytes=theirs.call_length_bytes)
    return mine


def short_sender_totals(tool: str, protocol: str, flows: Iterable[FlowSummary]) -> list[str]:
    """A warning for each TCP flow whose receiver total is above its sender's. TCP delivers
    no byte that was not sent, so the sender's figure was taken early (iperf3 3.16+ and
    ntttcp read their counters while a thread still finishes one more write). Both figures
    stay the tool's; the warning says which one is short, and by how much. None for UDP:
    there a receiver may count what the sender did not report."""
    if protocol != "tcp":
        return []
    out = []
    for flow in flows:
        sent, received = flow.sender, flow.receiver
        if sent and received and sent.bytes is not None and received.bytes is not None \
                and received.bytes > sent.bytes:
            out.append(f"{tool}'s {flow.direction} sender total is "
                       f"{received.bytes - sent.bytes} bytes below what its receiver got: "
                       "its sender figure was taken before the last write(s) were counted")
    return out


CallLengths = Mapping[tuple[str, str], int]
"""Bytes a data loop asked of each send() or recv() call, by (direction, role): what a
tool's output says its processes used (see :func:`with_call_lengths`)."""


def with_call_lengths(result: Result, lengths: CallLengths) -> Result:
    """``result`` with ``SideSummary.call_length_bytes`` set from ``lengths`` on each side
    (flow totals and streams) that has none and whose (direction, role) is there. TCP only:
    over UDP the length is the datagram's, which the spec says, so a UDP result is returned
    unchanged. For a driven tool that prints the read/write length each end used."""
    if not lengths or result.spec.protocol != "tcp":
        return result

    def side(direction: str, found: SideSummary | None) -> SideSummary | None:
        if found is None or found.call_length_bytes is not None:
            return found
        length = lengths.get((direction, found.role))
        return found if length is None else attrs.evolve(found, call_length_bytes=length)

    def filled(item: Any) -> Any:
        return attrs.evolve(item, sender=side(item.direction, item.sender),
                            receiver=side(item.direction, item.receiver))

    return attrs.evolve(result, summaries=tuple(filled(f) for f in result.summaries),
                        streams=tuple(filled(s) for s in result.streams))



def bits_per_second(nbytes: int, seconds: float) -> float:
    """Throughput of ``nbytes`` over ``seconds`` (0.0 for an empty span)."""
    return nbytes * 8 / seconds if seconds > 0 else 0.0

