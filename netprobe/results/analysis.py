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
    read: Callable[[Source], float | None] = field(eq=False, repr=False)
    """Takes the figure out of a direction's summary or the latency (None when unknown)."""

    def value(self, source: Source | None) -> float | None:
        """The figure in ``source``, or None."""
        return None if source is None else self.read(source)


def _side(role: str, name: str) -> Callable[[FlowSummary], float | None]:
    def read(flow: FlowSummary) -> float | None:
        side: SideSummary | None = getattr(flow, role)
        value = getattr(side, name) if side is not None else None
        return None if value is None else float(value)

    return read


def _cpu(role: str, which: str) -> Callable[[FlowSummary], float | None]:
    def read(flow: FlowSummary) -> float | None:
        side: SideSummary | None = getattr(flow, role)
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
    Figure("latency_grade", "DSLReports grade", "grade", lambda lat: lat.bloat_us),
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


def _latency_for(result: Result, figure: Figure[Latency]) -> Latency | None:
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


ARCHIVE_GROUP_KEYS = ("hosts", "protocol", "direction")
"""How a fleet archive's results are grouped unless asked otherwise: one mean per pair of
agents and kind of test, never one over TCP and UDP of different links."""


def group_results(results: Iterable[Result], keys: Sequence[str],
                  hosts: Callable[[Result], str] | None = None) -> list[Group]:
    """Results grouped by the values of ``keys``, groups in order of first appearance (so
    the tools of a ``compare`` keep their order, and the first is the reference).
    ``hosts`` names a result's pair for the ``hosts`` key (default :func:`host_pair`; a
    fleet archive's results by their agents' names)."""
    check_group_keys(keys)
    pair = hosts or host_pair
    groups: dict[str, list[Result]] = {}
    for result in results:
        label = " ".join(_key_label(result, key, pair) for key in keys) or "all"
        groups.setdefault(label, []).append(result)
    return [Group(label, tuple(members)) for label, members in groups.items()]


def _key_label(result: Result, key: str, pair: Callable[[Result], str]) -> str:
    if key == "tool":
        return result.tool.name
    if key == "hosts":
        return pair(result)
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
    summary: Summary | None
    """Over the group's successful results; None when none of them measured it."""
    ratio: float | None = None
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

    def get(self, direction: str, key: str) -> FigureStats | None:
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
"""(seconds since the test started, value): the value of one bin of the time grid, at the
bin's end."""
GappedPoint = tuple[float, Optional[float]]
"""A point of a series drawn as a chart: None where nothing was measured (a gap)."""


def best_role(result: Result, direction: str) -> str | None:
    """The side whose intervals show the throughput: the receiver's when it reported any
    (what arrived is what the path carried), else the sender's; None without intervals."""
    roles = {s.role for s in result.intervals if s.direction == direction}
    for role in ("receiver", "sender"):
        if role in roles:
            return role
    return None


def grid_step(result: Result, direction: str) -> float | None:
    """The width of the time grid a direction's series are put on: the run's interval (the
    median span of its samples); None without samples."""
    spans = [s.end_s - s.start_s for s in result.intervals
             if s.direction == direction and s.end_s > s.start_s]
    if not spans:
        return None
    usual = statistics.median(spans)
    # to the millisecond: trials whose spans differ by microseconds share one grid
    return round(usual, 3) if usual >= 0.01 else usual


def time_grid(samples: Iterable[Interval], step: float
              ) -> dict[int, list[tuple[Interval, float]]]:
    """Samples by bin of the time grid (bin k is [k * step, (k + 1) * step)), each with
    the share of it that falls in the bin.

    A sample belongs to every bin it covers more than half of (a 2 s closing interval
    fills two bins); one that covers no bin that much (a phase's 1 s intervals that began
    half a second into a bin) belongs to the bin of its midpoint. Never
    by exact end time: a tool stamps each stream's record and the sum a moment apart
    (1.999, 2.000, 2.001, 2.002 s for the same second), and grouping by end time made each
    of them an interval of its own, drawn as a drop to one stream's rate."""
    bins: dict[int, list[tuple[Interval, float]]] = {}
    for sample in samples:
        length = sample.end_s - sample.start_s
        first, last = math.floor(sample.start_s / step), math.floor(sample.end_s / step)
        covered = []
        for k in range(first, last + 1):
            overlap = min(sample.end_s, (k + 1) * step) - max(sample.start_s, k * step)
            if overlap > step / 2 + 1e-9:  # (half and half: the midpoint's bin, once)
                covered.append((k, overlap))
        if not covered:
            covered = [(math.floor((sample.start_s + sample.end_s) / 2 / step), length)]
        for k, overlap in covered:
            bins.setdefault(k, []).append((sample, overlap / length if length > 0 else 1.0))
    return bins


def _bin_time(k: int, step: float) -> float:
    return round((k + 1) * step, 6)


def throughput_series(result: Result, direction: str) -> list[Point]:
    """The whole flow's throughput per bin of the time grid (the sum over streams), bits
    per second; only the bins where something was measured."""
    role = best_role(result, direction)
    if role is None:
        return []
    return _per_span(result, direction, role, "bits_per_second", math.fsum)


def stream_series(result: Result, direction: str) -> dict[int, list[Point]]:
    """Each stream's throughput per bin of the time grid, bits per second, by stream id."""
    role = best_role(result, direction)
    step = grid_step(result, direction)
    series: dict[int, list[Point]] = {}
    if step is None:
        return series
    by_stream: dict[int, list[Interval]] = {}
    for sample in _samples(result, direction, role):
        if sample.stream_id is not None:
            by_stream.setdefault(sample.stream_id, []).append(sample)
    for stream_id, samples in by_stream.items():
        bins = time_grid(samples, step)
        series[stream_id] = [(_bin_time(k, step),
                               _mean([s.bits_per_second for s, _ in bins[k]]))
                              for k in sorted(bins)]
    return series


def retransmit_series(result: Result, direction: str) -> list[Point]:
    """Retransmitted segments per interval (sender, summed over streams)."""
    return _per_span(result, direction, "sender", "retransmits", math.fsum, counts=True)


def rtt_series(result: Result, direction: str) -> list[Point]:
    """Smoothed RTT at the end of each interval, microseconds (sender, mean over streams)."""
    return _per_span(result, direction, "sender", "rtt_us", _mean)


def loss_series(result: Result, direction: str) -> list[Point]:
    """UDP datagrams lost per interval, percent of those sent (receiver, all streams)."""
    lost = dict(_per_span(result, direction, "receiver", "lost_packets", math.fsum,
                          counts=True))
    got = dict(_per_span(result, direction, "receiver", "packets", math.fsum, counts=True))
    return [(t, 100.0 * n / (n + got[t])) for t, n in lost.items() if t in got and n + got[t]]


def jitter_series(result: Result, direction: str) -> list[Point]:
    """UDP jitter at the end of each interval, milliseconds (receiver, mean over streams)."""
    return _per_span(result, direction, "receiver", "jitter_ms", _mean)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _samples(result: Result, direction: str, role: str | None) -> list[Interval]:
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
              combine: Callable[[list[float]], float], counts: bool = False) -> list[Point]:
    """One value per bin of the time grid: the tool's own sums where it gave them, else
    ``combine`` of the streams' values (some tools report sums, some only streams; a
    stream whose last record outlasts the sum's is never taken for the whole flow).
    Several samples of one stream in a bin are merged: rates and states by their mean;
    with ``counts``, each sample's count in proportion to its share of the bin, summed (a
    2 s interval's retransmits are not counted twice)."""
    step = grid_step(result, direction)
    if step is None:
        return []
    found = _samples(result, direction, role)
    if any(sample.stream_id is None for sample in found):
        found = [sample for sample in found if sample.stream_id is None]
    points = []
    for k, samples in sorted(time_grid(found, step).items()):
        values: dict[int | None, list[float]] = {}
        for sample, share in samples:
            value = getattr(sample, name)
            if value is not None:
                values.setdefault(sample.stream_id, []).append(
                    float(value) * share if counts else float(value))
        within = math.fsum if counts else _mean
        if None in values:
            points.append((_bin_time(k, step), within(values[None])))
        elif values:
            points.append((_bin_time(k, step), combine([within(v) for v in values.values()])))
    return points


def with_gaps(points: Sequence[Point], step: float | None = None) -> list[GappedPoint]:
    """``points`` (on one time grid) with a None at each bin between them that has no
    value, so a chart breaks its line where nothing was measured instead of drawing one
    across (a bufferbloat run's download line through its upload phase). ``step``: the
    grid's width (default the smallest gap between points)."""
    if len(points) < 2:
        return list(points)
    if step is None:
        step = min(b[0] - a[0] for a, b in zip(points, points[1:]))
    if step <= 0:
        return list(points)
    out: list[GappedPoint] = [points[0]]
    for before, point in zip(points, points[1:]):
        if point[0] - before[0] > 1.5 * step:
            out.append(((before[0] + point[0]) / 2, None))
        out.append(point)
    return out


def mean_series(series: Sequence[Sequence[Point]]) -> list[Point]:
    """The mean of several trials' series, bin by bin of the time grid (a bin only some
    trials measured is the mean of those)."""
    by_time: dict[float, list[float]] = {}
    for points in series:
        for t, value in points:
            by_time.setdefault(round(t, 3), []).append(value)
    return [(t, _mean(values)) for t, values in sorted(by_time.items())]
