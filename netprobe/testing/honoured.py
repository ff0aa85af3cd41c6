"""What an honoured option looks like in a Result (directions, streams, byte count,
rate, warm-up, interval width)."""
from __future__ import annotations

import statistics

from netprobe.schema import (
    Result,
    SideSummary,
    TestSpec,
)
from netprobe.testing.validation import _sides

# --- what an honoured option looks like in the result ----------------------------------


THROUGHPUT = frozenset({"throughput"})
"""What a tool measures unless it declares otherwise (``Tool.measures``)."""


def honoured_problems(result: Result, spec: TestSpec,
                      measures: frozenset[str] = THROUGHPUT) -> list[str]:
    """Ways ``result`` shows that options of ``spec`` were not honoured (empty if none).
    The throughput figures (a summary per direction sent, streams, byte count, rate,
    warm-up) are looked for only when ``measures`` (the tool's declaration) has
    ``throughput``."""
    if not isinstance(result, Result):
        return []
    problems = []
    if result.status != "ok":
        problems.append(f"status is {result.status!r}: {'; '.join(result.errors)}")
    for name in ("protocol", "direction", "streams", "bytes_total"):
        if getattr(result.spec, name) != getattr(spec, name):
            problems.append(f"result.spec.{name} is {getattr(result.spec, name)!r}, "
                            f"asked {getattr(spec, name)!r}")
    if "throughput" in measures:
        problems += _direction_problems(result, spec)
        problems += _stream_count_problems(result, spec)
        problems += _byte_count_problems(result, spec)
        problems += _rate_limit_problems(result, spec)
        problems += _omit_problems(result, spec)
    if "latency" in measures:
        problems += _latency_measured_problems(result)
    problems += _interval_width_problems(result, spec)
    return problems


def _latency_measured_problems(result: Result) -> list[str]:
    if result.latency is None:
        return ["the tool declares it measures latency, but the result has no latency"]
    if result.latency.count <= 0:
        return ["the tool declares it measures latency, but the result's latency holds no "
                "sample"]
    return []


def _direction_problems(result: Result, spec: TestSpec) -> list[str]:
    have = {f.direction for f in result.summaries if f.sender or f.receiver}
    missing = [d for d in spec.flow_directions() if d not in have]
    extra = sorted(have - set(spec.flow_directions()))
    problems = [f"no summary for the {d} flow" for d in missing]
    return problems + [f"a summary for {d}, which this spec does not send" for d in extra]


def _stream_count_problems(result: Result, spec: TestSpec) -> list[str]:
    problems = []
    for direction in spec.flow_directions():
        ids = {s.stream_id for s in result.streams if s.direction == direction}
        if ids and len(ids) != spec.streams:
            problems.append(f"{len(ids)} streams reported for {direction}, {spec.streams} asked")
    return problems


def _main_side(result: Result, direction: str) -> SideSummary | None:
    flow = result.summary(direction)
    if flow is None:
        return None
    return flow.sender or flow.receiver


def _byte_count_problems(result: Result, spec: TestSpec) -> list[str]:
    if spec.bytes_total is None:
        return []
    problems = []
    expected = spec.bytes_total * spec.streams
    for direction in spec.flow_directions():
        side = _main_side(result, direction)
        if side is not None and not 0.95 * expected <= side.bytes <= 1.05 * expected + 65536:
            problems.append(f"{direction}: {side.bytes} bytes moved in byte-count mode, "
                            f"{expected} asked")
    return problems


def _rate_limit_problems(result: Result, spec: TestSpec) -> list[str]:
    rate = spec.rate_bits_per_second
    if rate is None:
        return []
    problems = []
    for direction in spec.flow_directions():
        side = _main_side(result, direction)
        limit = rate * spec.streams
        if side is not None and side.bits_per_second > 1.10 * limit:
            problems.append(f"{direction}: {side.bits_per_second:.4g} bit/s at a limit of "
                            f"{limit:.4g}")
    return problems


def _omit_problems(result: Result, spec: TestSpec) -> list[str]:
    if spec.omit_s <= 0:
        return []
    problems = []
    if result.intervals and not any(i.omitted for i in result.intervals):
        problems.append("omit asked but no interval is marked omitted")
    for what, _slot, side in _sides(result):
        if side.start_s < spec.omit_s * 0.9:
            problems.append(f"{what} starts at {side.start_s:g} s, inside the {spec.omit_s:g} s "
                            "warm-up")
    return problems


def _interval_width_problems(result: Result, spec: TestSpec) -> list[str]:
    if spec.interval_s is None or spec.duration_s is None:
        return []
    if spec.duration_s < 2 * spec.interval_s:
        return []
    if not result.intervals:
        return [f"interval reports every {spec.interval_s:g} s asked, none in the result"]
    widths = [i.end_s - i.start_s for i in result.intervals]
    typical = statistics.median(widths)
    if not 0.5 * spec.interval_s <= typical <= 1.5 * spec.interval_s:
        return [f"intervals are typically {typical:.3g} s long, {spec.interval_s:g} s asked"]
    return []
