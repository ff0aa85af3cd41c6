"""The exporter's ``/metrics``: a fleet archive's newest figures, in series whose number
grows with the fleet's hosts, not with its pairs.

A full mesh of N hosts has N(N-1) pairs: one series per pair and figure is about seven
million series for 1,000 hosts, more than a Prometheus server holds comfortably. So by
default ``/metrics`` exports, from the newest record of every pair:

* per host (labels group, agent, and role = source or target): how many of its pairs are
  ok and failed, the median and the worst of its pairs' figures, when its newest test
  started, and whether any of its pairs passed;
* per host and reference host, in a group of a reference design (each host against K
  reference hosts: N x K series, not N^2), when the fleet file tells which hosts are
  references;
* the fleet's own health: per group pairs archived, pairs failed, agents seen, newest and
  oldest test; the runs by status and the newest run's start; the archive rows skipped.
  (Runners, leases and queue depth come from an archive that keeps a schedule:
  :func:`schedule_health`.)

Per-pair series (labels group, source, target, tool) are opt-in, for small fleets, and
capped: beyond ``max_pair_series`` pairs the failed pairs are kept first, then the ok
ones from the lowest throughput up, and a gauge says how many were left out.
"""
from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Callable

import attrs

from netprobe.archives import PairRecord, figures
from netprobe.exporter_config import MetricsOptions
from netprobe.fleet import claims
from netprobe.schema import Result

# (name, help, netprobe's figure, scale to the base unit) for each per-test gauge.
GAUGES = (
    ("receiver_bits_per_second", "What arrived, in bits per second.",
     "receiver_bits_per_second", 1),
    ("sender_bits_per_second", "What was sent, in bits per second.", "sender_bits_per_second", 1),
    ("received_bytes", "Bytes that arrived during the test.", "bytes", 1),
    ("retransmits", "TCP retransmits of the test's sender.", "retransmits", 1),
    ("rtt_seconds", "Smoothed TCP round-trip time at the sender.", "rtt_us", 1e-6),
    ("lost_packets", "UDP datagrams lost.", "lost_packets", 1),
    ("jitter_seconds", "UDP jitter at the receiver.", "jitter_ms", 1e-3),
)

# The figures summarised per host and per reference, each with its worse end: the
# lowest throughput, the highest latency or loss. (Sender throughput and bytes are left
# out: what arrived is the figure of a path, and bytes follow the test's length.)
HOST_FIGURES = (("receiver_bits_per_second", "min"), ("rtt_seconds", "max"),
                ("retransmits", "max"), ("jitter_seconds", "max"), ("lost_packets", "max"))

ROLES = ("source", "target")

RUN_STATUSES = ("incomplete", "done", "interrupted", "failed")
"""A run's statuses (:class:`netprobe.archives.Run`), each exported even at 0."""

HOST_SERIES_MAX = 2 + 2 * (2 + 2 * len(HOST_FIGURES))
"""Most series one host of one group gives by default: up and newest test, and per role
its ok and failed pair counts and a median and a worst value per figure (26)."""


def values(result: Result | None) -> dict[str, float]:
    """Each gauge's value for a result, in base units; a figure that is unknown (not
    measured by this tool or protocol, or no result at all) is absent, never 0, as
    everywhere else in the schema: a UDP test's RTT of 0 would drag ``min(rtt)`` to 0."""
    return {} if result is None else values_of(figures(result))


def values_of(found: Mapping[str, Any]) -> dict[str, float]:
    """:func:`values` from a result's summary figures (an archive's columns); TypeError
    for a figure that is not a number (a damaged row)."""
    out = {}
    for name, _, key, scale in GAUGES:
        value = found.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{key} is not a number: {str(value)[:40]!r}")
        out[name] = float(value) * scale
    return out


@attrs.frozen
class Row:
    """One pair's newest record, with what every family needs computed once."""

    group: str
    source: str
    target: str
    tool: str
    ok: bool
    time: float
    """When its test started (Unix time)."""
    figures: Mapping[str, float]
    """Its gauges' values in base units (empty unless ok)."""

    @classmethod
    def of(cls, record: PairRecord, found: Mapping[str, Any]) -> Row:
        """The row of one archived record and its summary figures (ValueError or
        TypeError when a time or a figure cannot be read)."""
        ok = record.outcome == "ok"
        return cls(record.group, record.source, record.target, str(found.get("tool") or ""),
                   ok, unix(record.time), values_of(found) if ok else {})


def unix(text: str) -> float:
    """An archived ISO 8601 time as Unix time."""
    import datetime

    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _gauge(name: str, text: str, labels: Iterable[str] = ()) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(name, text, labels=list(labels))


class FleetCollector:
    """The newest record of every fleet pair in an archive, read at each scrape and
    exported as :mod:`netprobe.exporter_fleet` says."""

    def __init__(self, open_archive: Callable[[], Any],
                 options: MetricsOptions | None = None,
                 references: Mapping[str, Iterable[str]] | None = None,
                 log: Callable[[str], None] = lambda _line: None) -> None:
        self.open_archive = open_archive
        self.options = options or MetricsOptions()
        self.references = {group: frozenset(hosts)
                           for group, hosts in (references or {}).items() if hosts}
        """Reference hosts by group (from the fleet file: archive rows do not say)."""
        self.log = log
        self._omitted_said: int | None = None

    def collect(self) -> Iterator[Any]:
        """Every family: health, per host, per reference, and per pair if asked for."""
        with self.open_archive() as archive:
            rows, bad = read_rows(archive)
            runs = list(archive.runs())
            skipped = len(getattr(archive, "warnings", [])) + bad
            extra = list(schedule_health(archive))
        yield from health(rows, skipped)
        yield from run_health(runs)
        yield from extra
        yield from per_host(rows)
        if self.references:
            yield from per_reference(rows, self.references)
        if self.options.pair_series:
            kept, omitted = capped(rows, self.options.max_pair_series)
            self._say_omitted(omitted, len(rows))
            yield from per_pair(kept)
            left = _gauge("netprobe_fleet_pair_series_omitted_pairs",
                          "Pairs left out of the per-pair series by max_pair_series "
                          "(failed pairs are kept first, then the lowest throughput).")
            left.add_metric([], omitted)
            yield left

    def _say_omitted(self, omitted: int, pairs: int) -> None:
        """One log line when the number of pairs the cap leaves out changes (not one
        per scrape)."""
        if omitted != self._omitted_said and (omitted or self._omitted_said):
            self.log(f"/metrics: per-pair series for {pairs - omitted:,} of {pairs:,} pairs "
                     f"(max_pair_series = {self.options.max_pair_series:,}): {omitted:,} "
                     "left out, failed pairs and the lowest throughput kept")
        self._omitted_said = omitted


def read_rows(archive: Any) -> tuple[list[Row], int]:
    """The newest record of every pair as rows, and how many rows could not be read (a
    row is data: a damaged time or figure leaves that row out, never the whole scrape).
    An archive with ``latest_figures`` (the SQL ones) is read from its figure columns:
    decoding each pair's whole result cost 0.26 ms a pair, minutes a scrape for a
    thousand-host mesh; any other is read through ``latest``."""
    reader = getattr(archive, "latest_figures", None)
    pairs = reader() if reader is not None else [
        (record, figures(record.result)) for record in archive.latest()]
    rows, bad = [], 0
    for record, found in pairs:
        try:
            rows.append(Row.of(record, found))
        except (TypeError, ValueError):
            bad += 1
    return rows, bad


def schedule_health(archive: Any) -> Iterator[Any]:
    """The shared schedule's own health, where the archive keeps one (PostgreSQL, once a
    ``fleet run --shared`` queued a run): each of :data:`netprobe.fleet.claims.HEALTH_SERIES`
    as ``netprobe_fleet_schedule_<name>{group}`` (queued pairs, leases, runners, late
    leases, re-queued and given-up pairs of unfinished runs). Other archives keep no
    schedule, so nothing is exported: a gauge that always read 0 would say the queue is
    empty when nobody knows."""
    for name, (text, by_group) in sorted(claims.schedule_health(archive).items()):
        family = _gauge(f"netprobe_fleet_schedule_{name}", text, ["group"])
        for group, value in sorted(by_group.items()):
            family.add_metric([group], float(value))
        yield family


def health(rows: list[Row], skipped: int) -> Iterator[Any]:
    """Per group: pairs archived and failed, agents seen, newest and oldest test; and the
    archive rows skipped."""
    pairs = _gauge("netprobe_fleet_pairs", "Pairs with a test in the archive.", ["group"])
    failed = _gauge("netprobe_fleet_pairs_failed",
                    "Pairs whose newest test was not ok.", ["group"])
    agents = _gauge("netprobe_fleet_agents", "Agents in at least one archived pair.",
                    ["group"])
    newest = _gauge("netprobe_fleet_newest_test_timestamp_seconds",
                    "When the group's newest test started (Unix time).", ["group"])
    oldest = _gauge("netprobe_fleet_oldest_test_timestamp_seconds",
                    "When the oldest of its pairs' newest tests started (Unix time): "
                    "the pair tested longest ago.", ["group"])
    by_group: dict[str, list[Row]] = {}
    for row in rows:
        by_group.setdefault(row.group, []).append(row)
    for group, mine in sorted(by_group.items()):
        pairs.add_metric([group], len(mine))
        failed.add_metric([group], sum(not row.ok for row in mine))
        agents.add_metric([group], len({row.source for row in mine}
                                       | {row.target for row in mine}))
        newest.add_metric([group], max(row.time for row in mine))
        oldest.add_metric([group], min(row.time for row in mine))
    bad = _gauge("netprobe_fleet_archive_skipped_rows",
                 "Archive rows left out at this scrape: their time, outcome or figures "
                 "cannot be read.")
    bad.add_metric([], skipped)
    yield from (pairs, failed, agents, newest, oldest, bad)


def run_health(runs: list[Any]) -> Iterator[Any]:
    """The archive's runs by status (``incomplete`` ones are running, or their runner
    died before it could record their end), and when the newest started."""
    by_status = dict.fromkeys(RUN_STATUSES, 0)
    starts = []
    for run in runs:
        by_status[run.status] = by_status.get(run.status, 0) + 1
        with contextlib.suppress(ValueError):
            starts.append(unix(run.started))
    family = _gauge("netprobe_fleet_runs", "Fleet runs in the archive, by status "
                    "(incomplete: running, or its runner stopped before recording its end).",
                    ["status"])
    for status, n in sorted(by_status.items()):
        family.add_metric([status], n)
    yield family
    if starts:
        newest = _gauge("netprobe_fleet_newest_run_start_timestamp_seconds",
                        "When the newest fleet run started (Unix time).")
        newest.add_metric([], max(starts))
        yield newest


def per_host(rows: list[Row]) -> Iterator[Any]:
    """Per (group, agent): up and newest test; per (group, agent, role): pairs ok and
    failed, and the median and worst of each figure over its ok pairs."""
    up = _gauge("netprobe_fleet_agent_up",
                "1 when at least one pair the agent takes part in (either way) passed its "
                "newest test.", ["group", "agent"])
    when = _gauge("netprobe_fleet_agent_newest_test_timestamp_seconds",
                  "When the newest test the agent took part in started (Unix time).",
                  ["group", "agent"])
    names = ("group", "agent", "role")
    counts = _gauge("netprobe_fleet_agent_pairs",
                    "The agent's pairs (as source or as target) whose newest test was ok, "
                    "or not ok (state failed).", [*names, "state"])
    stats = {name: _gauge(f"netprobe_fleet_agent_{name}",
                          f"{_help(name)} Over the agent's ok pairs as source or target: "
                          f"the median, and the {worst} (the worst).", [*names, "stat"])
             for name, worst in HOST_FIGURES}
    hosts: dict[tuple[str, str], dict[str, list[Row]]] = {}
    for row in rows:
        for role, agent in zip(ROLES, (row.source, row.target)):
            hosts.setdefault((row.group, agent), {}).setdefault(role, []).append(row)
    for (group, agent), roles in sorted(hosts.items()):
        mine = [row for found in roles.values() for row in found]
        up.add_metric([group, agent], 1 if any(row.ok for row in mine) else 0)
        when.add_metric([group, agent], max(row.time for row in mine))
        for role, found in sorted(roles.items()):
            labels = [group, agent, role]
            ok = sum(row.ok for row in found)
            counts.add_metric([*labels, "ok"], ok)
            counts.add_metric([*labels, "failed"], len(found) - ok)
            _add_stats(stats, labels, found)
    yield from (up, when, counts, *stats.values())


def per_reference(rows: list[Row], references: Mapping[str, frozenset[str]]
                  ) -> Iterator[Any]:
    """Per (group, agent, reference, direction) in a group of a reference design: the
    newest test's outcome and figures between each host and each reference host (N x K
    series; direction ``to_reference`` or ``from_reference``)."""
    names = ["group", "agent", "reference", "direction"]
    up = _gauge("netprobe_fleet_reference_up",
                "1 when the newest test between the agent and the reference host was ok.",
                names)
    gauges = {name: _gauge(f"netprobe_fleet_reference_{name}",
                           f"{_help(name)} The newest test between the agent and the "
                           "reference host.", names)
              for name, _ in HOST_FIGURES}
    for row in rows:
        hosts = references.get(row.group, frozenset())
        if row.target in hosts:
            labels = [row.group, row.source, row.target, "to_reference"]
        elif row.source in hosts:
            labels = [row.group, row.target, row.source, "from_reference"]
        else:
            continue
        up.add_metric(labels, 1 if row.ok else 0)
        for name, value in row.figures.items():
            if name in gauges:
                gauges[name].add_metric(labels, value)
    yield up
    yield from gauges.values()


def capped(rows: list[Row], cap: int) -> tuple[list[Row], int]:
    """At most ``cap`` rows, and how many were left out: failed pairs first (newest test
    first), then ok pairs from the lowest throughput up: the pairs someone looking at a
    dashboard needs."""
    if len(rows) <= cap:
        return rows, 0

    def rank(row: Row) -> tuple[int, float, float]:
        rate = row.figures.get("receiver_bits_per_second")
        return (1 if row.ok else 0, -1.0 if rate is None else rate, -row.time)

    kept = sorted(rows, key=rank)[:cap]
    return kept, len(rows) - cap


def per_pair(rows: list[Row]) -> Iterator[Any]:
    """The per-pair series: labelled by group, source, target and tool; zeros where not
    ok (``netprobe_fleet_up 0``), and no figure for a test that measured none."""
    names = ("group", "source", "target", "tool")
    up = _gauge("netprobe_fleet_up", "1 when the pair's latest test was ok.", names)
    when = _gauge("netprobe_fleet_test_timestamp_seconds",
                  "When the pair's latest test started (Unix time).", names)
    gauges = {name: _gauge(f"netprobe_fleet_{name}", text, names)
              for name, text, _, _ in GAUGES}
    for row in rows:
        labels = [row.group, row.source, row.target, row.tool]
        up.add_metric(labels, 1 if row.ok else 0)
        when.add_metric(labels, row.time)
        for name, value in row.figures.items():
            gauges[name].add_metric(labels, value)
    yield up
    yield when
    yield from gauges.values()


def _add_stats(stats: Mapping[str, Any], labels: list[str], rows: list[Row]) -> None:
    """The median and the worst of each figure over ``rows`` (absent when none has it)."""
    for name, worst in HOST_FIGURES:
        found = [row.figures[name] for row in rows if name in row.figures]
        if found:
            stats[name].add_metric([*labels, "median"], statistics.median(found))
            stats[name].add_metric([*labels, worst], min(found) if worst == "min"
                                   else max(found))


def _help(name: str) -> str:
    return next(text for gauge, text, _, _ in GAUGES if gauge == name)
