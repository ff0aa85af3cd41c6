"""Result validation: schema, units that agree, intervals in order (usable on its own,
e.g. on what a tool's parse() returns)."""
from __future__ import annotations

import datetime
import functools
import json
import math
from collections.abc import Iterator, Sequence
from typing import Any

from netprobe import convert
from netprobe.schema import (
    STATUSES,
    Interval,
    Latency,
    LatencyStats,
    Result,
    SideSummary,
    TestSpec,
)

_ORDER_SLACK_S = 0.05
"""Intervals of different series that start this close together count as simultaneous."""


# --- result validation (usable on its own, e.g. on parse() results) ----------------------


def validate_result(
    result: Any, spec: TestSpec | None = None, tolerance: float = 0.01
) -> list[str]:
    """Everything wrong with ``result`` (empty when it is fine): JSON Schema, JSON round
    trip, start time, interval order (within each series, and overall by start time within
    50 ms), units (throughput = bytes * 8 / seconds within
    ``tolerance``), signs and ranges, latency ordering, and, with ``spec``, the duration."""
    if not isinstance(result, Result):
        return [f"run() returned {type(result).__name__}, not a netprobe Result"]
    problems = _schema_problems(result)
    problems += _start_time_problems(result.start_time)
    problems += _interval_problems(result.intervals, tolerance)
    problems += _summary_problems(result, tolerance)
    problems += _latency_problems(result)
    if spec is not None and result.status == "ok":
        problems += _duration_problems(result, spec)
    return problems


def _schema_problems(result: Result) -> list[str]:
    import jsonschema  # netprobe-meter[test]

    try:
        text = convert.to_json(result)
    except (TypeError, ValueError) as exc:
        return [f"result cannot be written as JSON: {exc}"]
    problems = []
    try:
        validate_document(json.loads(text))
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        problems.append(f"result does not validate against the JSON Schema at {where}: "
                        f"{exc.message}")
    if convert.from_json(text) != result:
        problems.append("result changes when written to JSON and read back")
    if result.status not in STATUSES:
        problems.append(f"status {result.status!r} is not one of {STATUSES}")
    return problems


def validate_document(document: Any) -> None:
    """Check a Result's JSON document (parsed) against the shipped schema; raises
    ``jsonschema.ValidationError`` at the first problem. Works with every jsonschema the
    ``test`` extra allows (4.17 and later), which ``jsonschema.validate`` with the shipped
    schema does not (see :func:`_schema_validator`)."""
    _schema_validator().validate(document)


@functools.cache
def _schema_validator() -> Any:
    """The shipped schema, checked and compiled once, without its ``$id``.

    The ``$id`` (``urn:netprobe:result:<version>``) names the schema for its readers; the
    references inside it are all to the same document (``#/$defs/...``). jsonschema before
    4.18 joins such a reference to its base with urllib, which does not join under a
    ``urn:``: it then asks for the empty URL and fails (RefResolutionError: unknown url
    type: ''). 4.17 is what pip installs where 4.18's compiled dependency has no wheel
    (musllinux armv7l: an OpenWrt router). Without the ``$id`` every version resolves them
    against the document itself."""
    import jsonschema  # netprobe-meter[test]

    document = {key: value for key, value in shipped_schema().items() if key != "$id"}
    validator_class = jsonschema.validators.validator_for(document)
    validator_class.check_schema(document)
    return validator_class(document)


def shipped_schema() -> dict[str, Any]:
    """The JSON Schema of a Result as shipped in the package (result.schema.json)."""
    from importlib import resources

    text = resources.files("netprobe").joinpath("result.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _start_time_problems(start_time: str | None) -> list[str]:
    if start_time is None:
        return []
    try:
        parsed = datetime.datetime.fromisoformat(start_time.replace("Z", "+00:00"))
    except ValueError:
        return [f"start_time {start_time!r} is not ISO 8601"]
    if parsed.utcoffset() != datetime.timedelta(0):
        return [f"start_time {start_time!r} is not UTC"]
    return []


def _rate_problem(what: str, nbytes: int, seconds: float, bps: float, tol: float) -> list[str]:
    if seconds < 0 or nbytes < 0 or bps < 0 or not math.isfinite(bps):
        return [f"{what}: negative or non-finite figure (bytes {nbytes}, "
                f"{seconds:g} s, {bps:g} bit/s)"]
    if seconds == 0:
        return [] if nbytes == 0 else [f"{what}: {nbytes} bytes in a zero-length span"]
    expected = nbytes * 8 / seconds
    if math.isclose(bps, expected, rel_tol=tol, abs_tol=1.0):
        return []
    return [f"{what}: bits_per_second {bps:.6g} but bytes * 8 / seconds = {nbytes} * 8 / "
            f"{seconds:.6g} = {expected:.6g} (off by {abs(bps / expected - 1) * 100:.2f} %)"
            if expected else f"{what}: bits_per_second {bps:g} for 0 bytes"]


def _interval_problems(intervals: Sequence[Interval], tol: float) -> list[str]:
    problems: list[str] = []
    last: dict[tuple[str, str, int | None], Interval] = {}
    latest = 0.0
    for index, item in enumerate(intervals):
        what = f"interval {index} ({item.direction} {item.role} stream {item.stream_id})"
        if item.end_s <= item.start_s or item.start_s < 0:
            problems.append(f"{what}: span {item.start_s:g}..{item.end_s:g} s is empty or "
                            "negative")
        problems += _rate_problem(what, item.bytes, item.end_s - item.start_s,
                                  item.bits_per_second, tol)
        problems += _sign_problems(what, item)
        problems += _ordered(what, item, ("latency_p50_us", "latency_max_us"))
        key = (item.direction, item.role, item.stream_id)
        before = last.get(key)
        if before is not None and item.start_s < before.end_s - 1e-6:
            problems.append(f"{what}: starts at {item.start_s:g} s, before the previous one of "
                            f"its series ended ({before.end_s:g} s): not in time order")
        last[key] = item
        if item.start_s < latest - _ORDER_SLACK_S:
            problems.append(f"{what}: starts at {item.start_s:g} s, after an interval that "
                            f"starts at {latest:g} s: the intervals are not in time order")
        latest = max(latest, item.start_s)
    return problems


_NON_NEGATIVE = ("retransmits", "rtt_us", "rttvar_us", "min_rtt_us", "max_rtt_us",
                 "cwnd_bytes", "packets", "lost_packets", "out_of_order_packets",
                 "duplicate_packets", "jitter_ms")


def _ordered(what: str, record: Any, names: Sequence[str]) -> list[str]:
    """Problems if the known figures ``names`` of ``record`` are negative or decrease."""
    known = [(n, getattr(record, n)) for n in names if getattr(record, n, None) is not None]
    problems = [f"{what}: {n} = {v:g} is negative" for n, v in known if v < 0]
    return problems + [f"{what}: {n1} = {v1:g} exceeds {n2} = {v2:g}"
                       for (n1, v1), (n2, v2) in zip(known, known[1:]) if v1 > v2]


def _sign_problems(what: str, record: Any) -> list[str]:
    problems = []
    for name in _NON_NEGATIVE:
        value = getattr(record, name, None)
        if value is not None and value < 0:
            problems.append(f"{what}: {name} = {value} is negative (unknown must be None)")
    lost = getattr(record, "lost_percent", None)
    if lost is not None and not 0 <= lost <= 100:
        problems.append(f"{what}: lost_percent = {lost} is not a percentage")
    return problems


def _sides(result: Result) -> Iterator[tuple[str, str, SideSummary]]:
    for flow in result.summaries:
        for slot in ("sender", "receiver"):
            side = getattr(flow, slot)
            if side is not None:
                yield f"summary {flow.direction} {slot}", slot, side
    for stream in result.streams:
        for slot in ("sender", "receiver"):
            side = getattr(stream, slot)
            if side is not None:
                yield f"stream {stream.stream_id} {stream.direction} {slot}", slot, side


def _summary_problems(result: Result, tol: float) -> list[str]:
    problems: list[str] = []
    for what, slot, side in _sides(result):
        if side.role != slot:
            problems.append(f"{what}: role is {side.role!r}")
        problems += _rate_problem(what, side.bytes, side.end_s - side.start_s,
                                  side.bits_per_second, tol)
        problems += _sign_problems(what, side)
        problems += _ordered(what, side, ("min_rtt_us", "max_rtt_us"))
    for flow in result.summaries:
        sent, got = flow.sender, flow.receiver
        if result.spec.omit_s > 0 or sent is None or got is None:
            continue  # after a warm-up the two sides may count from different instants
        if got.bytes > sent.bytes * 1.01 + 65536:
            problems.append(f"summary {flow.direction}: the receiver got {got.bytes} bytes, more "
                            f"than the {sent.bytes} the sender sent")
        lost, count = got.lost_packets, sent.packets
        if lost is not None and count is not None and lost > count * 1.01 + 1:
            problems.append(f"summary {flow.direction}: the receiver lost {lost} datagrams, "
                            f"more than the {count} the sender sent")
    if len({f.direction for f in result.summaries}) != len(result.summaries):
        problems.append("two summaries for the same direction")
    return problems


def _latency_records(result: Result) -> Iterator[tuple[str, LatencyStats]]:
    """Every latency distribution in ``result``, named as a problem names it."""
    for what, latency in (("latency", result.latency), ("tool_latency", result.tool_latency)):
        if latency is None:
            continue
        yield what, latency
        for phase in latency.phases:
            for part in ("rtt", "client_to_server", "server_to_client"):
                inner = getattr(phase, part)
                if inner is not None:
                    yield f"{what} phase {phase.name} {part}", inner


_LATENCY_ORDER = ("min_us", "p50_us", "p90_us", "p99_us", "max_us")
"""Figures of a distribution that can never decrease along this order."""
_LATENCY_FIGURES = (*_LATENCY_ORDER, "mean_us", "jitter_us")


def _latency_problems(result: Result) -> list[str]:
    problems: list[str] = []
    for what, latency in _latency_records(result):
        problems += _distribution_problems(what, latency)
    for what, top in (("latency", result.latency), ("tool_latency", result.tool_latency)):
        if top is not None:
            problems += _phase_order_problems(what, top)
    return problems


def _distribution_problems(what: str, latency: LatencyStats) -> list[str]:
    """What cannot be true of one distribution: a percentile above the maximum, a mean
    outside min..max, negative times or counts, loss that is no percentage, figures of
    no sample."""
    problems = [] if latency.count >= 0 else [f"{what}: count {latency.count} is negative"]
    figures = {n: getattr(latency, n) for n in _LATENCY_FIGURES if getattr(latency, n) is not None}
    problems += [f"{what}: {n} = {v:g} is negative" for n, v in figures.items() if v < 0]
    if latency.count == 0 and figures:
        problems.append(f"{what}: figures from a count of 0 samples "
                        f"({', '.join(sorted(figures))})")
    known = [(n, figures[n]) for n in _LATENCY_ORDER if n in figures]
    for (n1, v1), (n2, v2) in zip(known, known[1:]):
        if v1 > v2:
            problems.append(f"{what}: {n1} = {v1:g} exceeds {n2} = {v2:g}")
    low, high, mean = latency.min_us, latency.max_us, latency.mean_us
    if mean is not None and ((low is not None and mean < low)
                             or (high is not None and mean > high)):
        shown = "..".join("?" if v is None else f"{v:g}" for v in (low, high))
        problems.append(f"{what}: mean_us = {mean:g} lies outside min_us..max_us ({shown})")
    if latency.lost is not None and latency.lost < 0:
        problems.append(f"{what}: lost = {latency.lost} is negative")
    if latency.lost_percent is not None and not 0 <= latency.lost_percent <= 100:
        problems.append(f"{what}: lost_percent = {latency.lost_percent:g} is not a percentage")
    return problems


def _phase_order_problems(what: str, latency: Latency) -> list[str]:
    problems = []
    before = None
    for phase in latency.phases:
        if phase.end_s < phase.start_s or phase.start_s < 0:
            problems.append(f"{what} phase {phase.name}: span {phase.start_s:g}.."
                            f"{phase.end_s:g} s is negative")
        if before is not None and phase.start_s < before.end_s - 1e-3:
            problems.append(f"{what} phase {phase.name}: starts at {phase.start_s:g} s, before "
                            f"the phase before it ended ({before.end_s:g} s)")
        before = phase
    return problems


def _duration_problems(result: Result, spec: TestSpec) -> list[str]:
    if spec.bytes_total is not None or spec.duration_s is None or result.duration_s is None:
        return []
    wanted, got = spec.duration_s, result.duration_s
    if not 0.5 * wanted <= got <= 1.5 * wanted + 1.0:
        return [f"duration_s is {got:g} for a {wanted:g} s test (seconds, not milliseconds?)"]
    return []
