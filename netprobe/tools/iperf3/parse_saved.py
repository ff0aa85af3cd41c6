"""Saved iperf3 output as a Result: ``-J`` documents, ``--json-stream`` lines or human
output, of the client and/or the server (the same test seen from both ends is merged).
Also the warm-up's time line (:func:`shift_after_warmup`), which a live run's figures
share.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from netprobe.driven.figures import Figures, to_result
from netprobe.errors import ParseError
from netprobe.resultops import fill_missing
from netprobe.schema import Interval, RawOutput, Result, SideSummary, TestSpec, ToolInfo
from netprobe.tools._bounded import SpooledLog, kept_raw
from netprobe.tools.iperf3 import parse_output as p3


def parse_sources(name: str, sources: Sequence[tuple[str, str]]) -> Result:
    """Saved iperf3 outputs ``[(file name, text), ...]`` of one test as one Result (the
    tool called ``name``). Raises ParseError on unreadable input."""
    if not sources:
        raise ParseError("nothing to parse")
    readings = [_read_source(source, text) for source, text in sources]
    main = next((r for r in readings if r.is_client), readings[0])
    spec = main.spec or TestSpec(tool="iperf3", duration_s=main.parts.duration_s or 10.0,
                                 direction=_direction_of(main.parts),
                                 streams=_streams_of(main.parts))
    result = _assembled(name, main, spec)
    for other in readings:
        if other is not main:  # the same test seen from the other end
            result = fill_missing(result, _assembled(name, other, spec))
    warnings = [w for r in readings for w in r.parts.warnings]
    errors = list(dict.fromkeys(e for r in readings for e in r.parts.errors))
    return attrs.evolve(result, status="failed" if errors else "ok", errors=tuple(errors),
                        warnings=tuple(dict.fromkeys([*warnings, *result.warnings])),
                        raw=tuple(r.raw for r in readings))


def _assembled(name: str, reading: _Reading, spec: TestSpec) -> Result:
    shift_after_warmup(reading.parts, spec.omit_s)
    tool = ToolInfo(name=name, version=reading.parts.version)
    return to_result(reading.parts, tool=tool, spec=spec, start_time=reading.parts.start_time)


def _direction_of(parts: Figures) -> str:
    """A human output's test direction, from the flows it reported (it does not say)."""
    flows = {flow.direction for flow in parts.summaries}
    if len(flows) > 1:
        return "bidir"
    return "reverse" if flows == {"server_to_client"} else "normal"


def _streams_of(parts: Figures) -> int:
    """A human output's streams per direction, from the streams it reported (a server's
    text does not say how many the client asked for)."""
    directions = [stream.direction for stream in parts.streams]
    return max((directions.count(d) for d in set(directions)), default=1)


def shift_after_warmup(parts: Figures, omit_s: float) -> None:
    """iperf3 restarts its clock when the warm-up (-O) ends: put the intervals after it and
    the summaries (which cover only the time after it) on the test's own time line."""
    if omit_s <= 0:
        return
    # The warm-up ends when its last interval does (a few microseconds after omit_s).
    omit_s = max([omit_s, *(i.end_s for i in parts.intervals if i.omitted)])
    parts.intervals = [
        sample if sample.omitted else attrs.evolve(
            sample, start_s=sample.start_s + omit_s, end_s=sample.end_s + omit_s)
        for sample in _mend_first_after_warmup(parts.intervals)
    ]
    parts.summaries = [
        attrs.evolve(f, sender=_shifted(f.sender, omit_s), receiver=_shifted(f.receiver, omit_s))
        for f in parts.summaries
    ]
    parts.streams = [
        attrs.evolve(s, sender=_shifted(s.sender, omit_s), receiver=_shifted(s.receiver, omit_s))
        for s in parts.streams
    ]


def _mend_first_after_warmup(intervals: Sequence[Interval]) -> list[Interval]:
    """The first interval after the warm-up of each series, as iperf3 meant it.

    At the end of -O, iperf3 resets each stream's clock and byte counts but keeps the end
    of the last interval it reported as the next one's start, and takes the distance
    between the two as absolute. When the warm-up ends just before an interval report is
    due, that report is skipped and the next one comes out with a start near the interval
    length, a duration of two intervals and the bytes of one (3.12: "0.50-0.50 sec, 1.20
    GBytes"). Its bytes are counted from the reset: it starts at 0 on the new clock, and
    its rate is bytes over its end.
    """
    seen: set[tuple[str, str, int | None]] = set()
    mended = []
    for sample in intervals:
        series = (sample.direction, sample.role, sample.stream_id)
        if not sample.omitted and series not in seen:
            seen.add(series)
            if sample.start_s > 0 and sample.end_s > 0:
                bps = sample.bits_per_second
                if sample.bytes is not None:
                    bps = sample.bytes * 8 / sample.end_s
                sample = attrs.evolve(sample, start_s=0.0, bits_per_second=bps)
        mended.append(sample)
    return mended


def _shifted(side: SideSummary | None, omit_s: float) -> SideSummary | None:
    if side is None:
        return None
    return attrs.evolve(side, start_s=side.start_s + omit_s, end_s=side.end_s + omit_s)


# --- parse(): several saved outputs ------------------------------------------------------------


@attrs.define
class _Reading:
    parts: Figures
    spec: TestSpec | None
    is_client: bool
    raw: RawOutput


def _read_source(name: str, text: str) -> _Reading:
    raw = RawOutput(name=name, text=kept_raw(text))
    if isinstance(text, SpooledLog) and text.strip().startswith("{"):
        text = text.text()  # a -J document is read whole (json.loads needs it all)
    stripped = text.lstrip() if isinstance(text, str) else ""
    if stripped.startswith("{"):
        doc, warnings = p3.parse_json_text(stripped, name)
        parts = p3.parse_document(doc, name)
        parts.warnings.extend(warnings)
        spec = p3.spec_from_document(doc, parts) if doc.get("start") else None
        start = doc.get("start")
        is_client = p3.context_from_start(start if isinstance(start, dict) else {}).is_client
        return _Reading(parts, spec, is_client, raw)
    parts = p3.parse_human_text(text, name)
    return _Reading(parts, None, "Connecting to host" in text, raw)
