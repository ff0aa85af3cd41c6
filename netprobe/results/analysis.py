"""From results to what a test report shows: the figures of a result, results grouped (by
tool, host pair or any spec field), each group's statistics per figure with its ratio to
the first group, and the time series behind the charts.

Logic only: no printing, no rich, no charts. The CLI renders what this returns.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any, Callable, Generic, Optional, TypeVar

import attrs
from attrs import field, frozen

from netprobe.errors import SpecError
from netprobe.results.stats import DEFAULT_CONFIDENCE, Summary, summarize
from netprobe.schema import (
    FLOW_DIRECTIONS,
    FlowSummary,
    Interval,
    Latency,
    Result,
    SideSummary,
    TestSpec,
)

KINDS = ("rate", "count", "us", "ms", "percent", "grade")
"""What a figure's number is: bits per second, a count, microseconds, milliseconds, percent,
or a bloat in microseconds shown as its bufferbloat grade."""


Source = TypeVar("Source", FlowSummary, Latency)
"""What a figure is read from: a flow direction's summary, or a result's latency."""


@frozen
class Figure(Generic[Source]):
    """One number a result has per flow direction (e.g. the receiver's throughput), or, read
    from ``Result.latency``, once per result (e.g. the latency p50)."""

    key: str
    """Stable name, as in the CSV columns (``receiver_bits_per_second``)."""
    label: str
    """Words for people (``receiver throughput``)."""
    kind: str = field(validator=attrs.validators.in_(KINDS))
    """What the number is: one of :data:`KINDS`."""
    read: Callable[[Source], Optional[float]] = field(eq=False, repr=False)
    """Takes the figure out of a direction's summary or the latency (None when unknown)."""

    def value(self, source: Optional[Source]) -> Optional[float]:
        """The figure in ``source``, or None."""
        return None if source is None else self.read(source)


def _side(role: str, name: str) -> Callable[[FlowSummary], Optional[float]]:
    def read(flow: FlowSummary) -> Optional[float]:
        side: Optional[SideSummary] = getattr(flow, role)
        value = getattr(side, name) if side is not None else None
        return None if value is None else float(value)

    return read


def _cpu(role: str, which: str) -> Callable[[FlowSummary], Optional[float]]:
    def read(flow: FlowSummary) -> Optional[float]:
        side: Optional[SideSummary] = getattr(flow, role)
        usage = getattr(side.cpu, which) if side is not None and side.cpu else None
        return usage.total_percent if usage is not None else None

    return read


FIGURES: tuple[Figure[FlowSummary], ...] = (
    Figure("sender_bits_per_second", "sender throughput", "rate",
           _side("sender", "bits_per_second")),
    Figure("receiver_bits_per_second", "receiver throughput", "rate",
           _side("receiver", "bits_per_second")),
    Figure("retransmits", "retransmits", "count", _side("sender", "retransmits")),
    Figure("rtt_us", "mean RTT", "us", _side("sender", "rtt_us")),
    Figure("sender_cpu_percent", "sender CPU (process)", "percent", _cpu("sender", "process")),
    Figure("receiver_cpu_percent", "receiver CPU (process)", "percent",
           _cpu("receiver", "process")),
    Figure("sender_host_cpu_percent", "sender host CPU", "percent", _cpu("sender", "host")),
    Figure("receiver_host_cpu_percent", "receiver host CPU", "percent",
           _cpu("receiver", "host")),
    Figure("lost_percent", "UDP loss", "percent", _side("receiver", "lost_percent")),
    Figure("jitter_ms", "UDP jitter", "ms", _side("receiver", "jitter_ms")),
)
"""The figures summarised over trials, in the order reports show them. The process CPU is
percent of one core; the host CPU percent of all cores."""

LATENCY = "latency"
"""The ``direction`` of the latency figures' stats: they belong to the run, not to a flow."""

LATENCY_FIGURES: tuple[Figure[Latency], ...] = (
    Figure("latency_p50_us", "latency p50", "us", lambda lat: lat.p50_us),
    Figure("latency_p99_us", "latency p99", "us", lambda lat: lat.p99_us),
    Figure("latency_increase_us", "latency increase", "us", lambda lat: lat.increase_us),
    Figure("latency_bloat_us", "latency bloat", "us", lambda lat: lat.bloat_us),
    Figure("latency_rpm", "RPM", "count", lambda lat: lat.rpm),
    Figure("latency_lost_percent", "probe loss", "percent", lambda lat: lat.lost_percent),
    Figure("latency_grade", "bufferbloat grade", "grade", lambda lat: lat.bloat_us),
)
"""A result's round-trip latency figures (``Result.latency`` when it is a round trip:
netprobe's probes under load, their increase and bloat over idle, RPM, probe loss; qperf's
or iperf 2's bounce-back round trip). The grade's statistics are of the bloat, each shown as
its grade: the grade is monotone in the bloat, so the grade of the median bloat is the
median grade."""

SRTT_FIGURES: tuple[Figure[Latency], ...] = (
    Figure("tcp_srtt_p50_us", "sender's TCP sRTT p50", "us", lambda lat: lat.p50_us),
    Figure("tcp_srtt_mean_us", "sender's TCP sRTT mean", "us", lambda lat: lat.mean_us),
)
"""A driven tool's reading of its own connections' smoothed RTT (``metric`` tcp_srtt, e.g.
iperf 2's ``-e``), in ``Result.latency`` or, beside netprobe's probes, ``tool_latency``: a
different quantity from a probe's round trip, so it has rows of its own; a group of one
tool is never set beside another's round trip and given a ratio to it."""


def _latency_for(result: Result, figure: Figure[Latency]) -> Optional[Latency]:
    """The latency record ``figure`` reads in ``result``: a round trip for the round-trip
    figures, the kernel's sRTT for :data:`SRTT_FIGURES` (None when the result has none)."""
    wanted_srtt = figure in SRTT_FIGURES
    for latency in (result.latency, result.tool_latency):
        if latency is not None and (latency.metric == "tcp_srtt") == wanted_srtt:
            return latency
    return None


# --- grouping ----------------------------------------------------------------------------

GROUP_KEYS = ("tool", "hosts", "run")
"""Group keys besides the spec's own fields: the tool, the host pair, the run id."""


@frozen
class Group:
    """Results that belong together in a report (one tool, one host pair, ...)."""

    label: str
    """What the results share, for people (``iperf3``, ``streams=4``)."""
    results: tuple[Result, ...]
    """The results, in the order they were given."""


def spec_fields() -> tuple[str, ...]:
    """The TestSpec fields a report can group by."""
    return tuple(a.name for a in attrs.fields(TestSpec))


def check_group_keys(keys: Sequence[str]) -> None:
    """SpecError naming the first key that is neither a group key nor a spec field."""
    known = GROUP_KEYS + spec_fields()
    for key in keys:
        if key not in known:
            raise SpecError(f"cannot group by {key!r}: use {', '.join(GROUP_KEYS)} or a spec "
                            f"field ({', '.join(spec_fields())})")


def group_results(results: Iterable[Result], keys: Sequence[str]) -> list[Group]:
    """Results grouped by the values of ``keys``, groups in order of first appearance (so
    the tools of a ``compare`` keep their order, and the first is the reference)."""
    check_group_keys(keys)
    groups: dict[str, list[Result]] = {}
    for result in results:
        label = " ".join(_key_label(result, key) for key in keys) or "all"
        groups.setdefault(label, []).append(result)
    return [Group(label, tuple(members)) for label, members in groups.items()]


def _key_label(result: Result, key: str) -> str:
    if key == "tool":
        return result.tool.name
    if key == "hosts":
        return host_pair(result)
    if key == "run":
        return f"run={result.run_id or '-'}"
    return f"{key}={getattr(result.spec, key)}"


def host_pair(result: Result) -> str:
    """``client -> server`` as the result names them (``loopback`` for a self-test)."""
    near = result.local.address or result.local.host or "local"
    far = result.remote.address or result.remote.host or result.spec.host or "loopback"
    return f"{near} -> {far}"


def mixed_fields(results: Sequence[Result], ignore: Sequence[str] = ()) -> list[str]:
    """Spec fields whose values differ among ``results`` (besides ``ignore`` and the tool):
    a group that mixes them averages unlike tests, which a report should say."""
    # The port is where a server listened (a self-test records the free port it got), not
    # a condition of the test.
    names = [n for n in spec_fields() if n not in ("tool", "port", *ignore)]
    return [n for n in names if len({getattr(r.spec, n) for r in results}) > 1]


# --- statistics per group ----------------------------------------------------------------


@frozen
class FigureStats:
    """One figure of one group, in one flow direction."""

    direction: str
    """Flow direction (``client_to_server`` or ``server_to_client``)."""
    figure: Figure[Any]
    """Which figure."""
    summary: Optional[Summary]
    """Over the group's successful results; None when none of them measured it."""
    ratio: Optional[float] = None
    """This group's mean divided by the first group's (None where undefined)."""


@frozen
class GroupStats:
    """A group's figures over its successful results."""

    label: str
    """The group's label."""
    total: int
    """Results in the group."""
    ok: int
    """Results with status ``ok``: the ones the statistics are made of."""
    figures: tuple[FigureStats, ...]
    """Per direction, per figure in :data:`FIGURES` order."""

    def get(self, direction: str, key: str) -> Optional[FigureStats]:
        """The stats of figure ``key`` in ``direction`` (None if the group has no such flow)."""
        for stats in self.figures:
            if stats.direction == direction and stats.figure.key == key:
                return stats
        return None


def directions(results: Iterable[Result]) -> list[str]:
    """The flow directions any of ``results`` has, client-to-server first."""
    seen = {flow.direction for result in results for flow in result.summaries}
    return [d for d in FLOW_DIRECTIONS if d in seen]


def group_stats(groups: Sequence[Group], confidence: float = DEFAULT_CONFIDENCE
                ) -> list[GroupStats]:
    """Each group's statistics per direction and figure, with ratios to the first group."""
    wanted = directions(r for g in groups for r in g.results)
    results = [r for g in groups for r in g.results]
    latency_figures = tuple(
        figure for figure in (*LATENCY_FIGURES, *SRTT_FIGURES)
        if any(_latency_for(r, figure) is not None for r in results))
    plain = [_stats_of(group, wanted, confidence, latency_figures) for group in groups]
    if not plain:
        return []
    reference = plain[0]
    return [attrs.evolve(g, figures=tuple(_with_ratio(f, reference) for f in g.figures))
            for g in plain]


def _stats_of(group: Group, wanted: list[str], confidence: float,
              latency_figures: tuple[Figure[Latency], ...] = ()) -> GroupStats:
    good = [r for r in group.results if r.status == "ok"]
    figures = tuple(
        FigureStats(direction, figure,
                    summarize((figure.value(r.summary(direction)) for r in good), confidence))
        for direction in wanted for figure in FIGURES)
    figures += tuple(
        FigureStats(LATENCY, each,
                    summarize((each.value(_latency_for(r, each)) for r in good), confidence))
        for each in latency_figures)
    return GroupStats(group.label, len(group.results), len(good), figures)


def _with_ratio(stats: FigureStats, reference: GroupStats) -> FigureStats:
    base = reference.get(stats.direction, stats.figure.key)
    if stats.figure.kind == "grade":  # a letter has no ratio
        return stats
    if stats.summary is None or base is None or base.summary is None or base.summary.mean == 0:
        return stats
    return attrs.evolve(stats, ratio=stats.summary.mean / base.summary.mean)


def shown_figures(stats: Sequence[GroupStats]) -> list[tuple[str, Figure[Any]]]:
    """(direction, figure) pairs that at least one group measured, in report order."""
    if not stats:
        return []
    return [(f.direction, f.figure) for f in stats[0].figures
            if any(_known(g, f.direction, f.figure.key) for g in stats)]


def _known(group: GroupStats, direction: str, key: str) -> bool:
    found = group.get(direction, key)
    return found is not None and found.summary is not None


# --- time series -------------------------------------------------------------------------

Point = tuple[float, float]
"""(seconds since the test started, value): the value at the end of an interval."""


def best_role(result: Result, direction: str) -> Optional[str]:
    """The side whose intervals show the throughput: the receiver's when it reported any
    (what arrived is what the path carried), else the sender's; None without intervals."""
    roles = {s.role for s in result.intervals if s.direction == direction}
    for role in ("receiver", "sender"):
        if role in roles:
            return role
    return None


def throughput_series(result: Result, direction: str) -> list[Point]:
    """The whole flow's throughput per interval (the sum over streams), bits per second."""
    role = best_role(result, direction)
    if role is None:
        return []
    return _per_span(result, direction, role, "bits_per_second", math.fsum)


def stream_series(result: Result, direction: str) -> dict[int, list[Point]]:
    """Each stream's throughput per interval, bits per second, by stream id."""
    role = best_role(result, direction)
    series: dict[int, list[Point]] = {}
    for sample in _samples(result, direction, role):
        if sample.stream_id is not None:
            series.setdefault(sample.stream_id, []).append((sample.end_s,
                                                            sample.bits_per_second))
    return series


def retransmit_series(result: Result, direction: str) -> list[Point]:
    """Retransmitted segments per interval (sender, summed over streams)."""
    return _per_span(result, direction, "sender", "retransmits", math.fsum)


def rtt_series(result: Result, direction: str) -> list[Point]:
    """Smoothed RTT at the end of each interval, microseconds (sender, mean over streams)."""
    return _per_span(result, direction, "sender", "rtt_us", _mean)


def loss_series(result: Result, direction: str) -> list[Point]:
    """UDP datagrams lost per interval, percent of those sent (receiver, all streams)."""
    lost = dict(_per_span(result, direction, "receiver", "lost_packets", math.fsum))
    got = dict(_per_span(result, direction, "receiver", "packets", math.fsum))
    return [(t, 100.0 * n / (n + got[t])) for t, n in lost.items() if t in got and n + got[t]]


def jitter_series(result: Result, direction: str) -> list[Point]:
    """UDP jitter at the end of each interval, milliseconds (receiver, mean over streams)."""
    return _per_span(result, direction, "receiver", "jitter_ms", _mean)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _samples(result: Result, direction: str, role: Optional[str]) -> list[Interval]:
    """The samples of one direction and side, without closing slivers: a last interval
    much shorter than the others (the 0.05 s after the final full second) is a rate over
    too short a span, and would show as a spike."""
    found = [s for s in result.intervals
             if s.direction == direction and s.role == role and s.end_s > s.start_s]
    if not found:
        return found
    usual = statistics.median(s.end_s - s.start_s for s in found)
    return [s for s in found if s.end_s - s.start_s >= usual / 2]


def _per_span(result: Result, direction: str, role: str, name: str,
              combine: Callable[[list[float]], float]) -> list[Point]:
    """One value per interval span: the tool's own sum where it gave one, else ``combine``
    of the streams' values (some tools report sums, some only streams)."""
    sums: dict[tuple[float, float], float] = {}
    streams: dict[tuple[float, float], list[float]] = {}
    for sample in _samples(result, direction, role):
        value = getattr(sample, name)
        if value is None:
            continue
        span = (round(sample.start_s, 3), round(sample.end_s, 3))
        if sample.stream_id is None:
            sums[span] = float(value)
        else:
            streams.setdefault(span, []).append(float(value))
    spans = sorted(set(sums) | set(streams), key=lambda span: (span[1], span[0]))
    return [(end, sums[(start, end)] if (start, end) in sums else combine(streams[(start, end)]))
            for start, end in spans]


def mean_series(series: Sequence[Sequence[Point]]) -> list[Point]:
    """The mean of several trials' series, interval by interval (the k-th interval of each;
    trials of one tool have the same intervals, give or take the last one)."""
    longest = max((len(s) for s in series), default=0)
    points = []
    for k in range(longest):
        at_k = [s[k] for s in series if len(s) > k]
        points.append((_mean([p[0] for p in at_k]), _mean([p[1] for p in at_k])))
    return points
