"""Latency under load, the arithmetic: what the probes' raw samples become in the result.

Pure functions over :class:`ProbeLog` (what :mod:`netprobe.engine.probes` records), with
nothing of sockets or threads, so that every figure can be checked by hand:

* round trip = time at the client between sending a probe and its echo arriving, minus
  the time the echo spent inside the server (its two timestamps);
* one-way delay variation = each direction's delay (far clock minus near clock) minus the
  smallest seen that way over the whole run: the clocks' offset cancels, the queueing
  remains (the offset is constant; a drifting clock would show up as a slow slope);
* percentiles by linear interpolation between closest ranks;
* RPM = 60 / the trimmed mean loaded round trip in seconds, the worst 5 % dropped (the
  trimming the IETF "Responsiveness under Working Conditions" draft uses);
* the grade on the DSLReports scale, of what DSLReports grades (its FAQ 17930): the
  "bloat", the *mean* loaded round trip minus the idle baseline, averaged over the
  download and the upload phases (``(mean bloat up + mean bloat down) / 2``). The idle
  baseline is the idle phase's median (DSLReports does not say which statistic; the
  median keeps one slow idle probe from moving every grade). Kept as ``grade``, the
  DSLReports-compatible figure;
* the verdict, the grade a person reads: the worst, over the loaded phases (each direction
  loaded alone, and both), of the phase's own bloat grade, the grade of its tail (the p99
  round trip over the idle median, on the same scale), and a cap set by its probe loss
  (:data:`LOSS_GRADE_CAPS`). An average of download and upload hides the worse direction,
  and a mean hides the tail and the probes that never came back.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Sequence
from typing import Any

import attrs

from netprobe.schema import GRADES, Interval, Latency, LatencyPhase, LatencySample, LatencyStats

GRADE_LIMITS_MS = ((5.0, "A+"), (30.0, "A"), (60.0, "B"), (200.0, "C"), (400.0, "D"))
"""Upper bounds (exclusive) of the latency increase for each grade; F from 400 ms."""
LOSS_GRADE_CAPS = ((21.0, "F"), (13.5, "D"), (8.0, "C"), (4.0, "B"), (1.0, "A"))
"""The best verdict a phase can have at a probe loss (percent, from this up): the loss at
which a voice call falls to each class of the ITU-T G.107 E-model (R 90, 80, 70, 60, 50:
ITU-T G.109's very satisfied .. nearly all dissatisfied; below 50 not recommended), for
G.711 with packet loss concealment (G.113 Appendix I: Ie 0, Bpl 25.1) and random loss,
where Ie,eff = 95 Ppl / (Ppl + 25.1) and R = 93.2 - Ie,eff. 22.5 % loss gives R 51 - 42 =
a call nearly no one can use: F, whatever the queue."""
TRIM_FRACTION = 0.05
"""Share of the slowest loaded round trips the RPM figure leaves out."""


@attrs.frozen
class ProbeSample:
    """One probe as the client saw it (times in seconds since the probes started)."""

    seq: int
    """Probe number, from 0."""
    phase: int
    """Index of the phase the probe was sent in."""
    sent_s: float
    """When it was sent (client's monotonic clock, seconds since the start)."""
    rtt_us: float | None = None
    """Round trip, the server's turnaround taken out; None if no echo came back."""
    up_ns: int | None = None
    """Raw one-way delay client to server: server receive stamp minus client send stamp
    (includes the clocks' offset)."""
    down_ns: int | None = None
    """Raw one-way delay server to client (includes the clocks' offset, negated)."""

    @property
    def answered_s(self) -> float | None:
        """When the echo arrived (seconds since the start), or None."""
        return None if self.rtt_us is None else self.sent_s + self.rtt_us / 1e6


@attrs.frozen
class Phase:
    """A span of the run named by the caller: idle, loaded, ..."""

    name: str
    loaded: bool
    start_s: float
    end_s: float | None = None


@attrs.frozen
class ProbeLog:
    """Everything one probe session recorded: the samples, the phases, what the server saw."""

    samples: tuple[ProbeSample, ...]
    """Every probe sent, answered or not, in order of ``seq``."""
    phases: tuple[Phase, ...]
    """The phases in time order (each probe names its phase by index)."""
    transport: str
    """``udp`` or ``tcp``."""
    server_received: frozenset[int] | None = None
    """Sequence numbers the server received (None when it did not say): splits the loss
    between the two directions."""
    bad: tuple[tuple[str, int], ...] = ()
    """Probes ignored as bad, by reason (both ends): foreign, replayed, truncated, ..."""

    @property
    def measured_by(self) -> str:
        """The ``measured_by`` name of these probes."""
        return f"netprobe-{self.transport}"


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ascending values, linear between closest ranks."""
    if not ordered:
        raise ValueError("percentile of no values")
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def trimmed_mean(values: Sequence[float], drop: float = TRIM_FRACTION) -> float:
    """Mean of the values without the largest ``drop`` share (at least one value kept)."""
    ordered = sorted(values)
    keep = max(1, len(ordered) - math.floor(len(ordered) * drop))
    return statistics.fmean(ordered[:keep])


def rpm(rtts_us: Sequence[float]) -> float | None:
    """Round trips per minute: 60 s / the trimmed mean round trip (None without samples)."""
    if not rtts_us:
        return None
    mean_us = trimmed_mean(rtts_us)
    return 60e6 / mean_us if mean_us > 0 else None


def grade(increase_us: float) -> str:
    """The bufferbloat grade of a latency increase, the bloat (negative counts as none)."""
    for limit_ms, name in GRADE_LIMITS_MS:
        if increase_us < limit_ms * 1000:
            return name
    return "F"


def worst_grade(*grades: str | None) -> str | None:
    """The worst of the grades given (None ones left out; None if none is given)."""
    known = [g for g in grades if g is not None]
    return max(known, key=GRADES.index) if known else None


def loss_cap(lost_percent: float | None) -> str | None:
    """The best grade a probe loss allows (None: no cap), by :data:`LOSS_GRADE_CAPS`."""
    if lost_percent is None:
        return None
    return next((cap for limit, cap in LOSS_GRADE_CAPS if lost_percent >= limit), None)


def tail_increase(phase: LatencyPhase) -> float | None:
    """A loaded phase's p99 round trip over the idle median (None when unknown), from its
    own record: the idle median is its median minus its increase."""
    rtt = phase.rtt
    if rtt is None or rtt.p99_us is None or rtt.p50_us is None or phase.increase_us is None:
        return None
    return rtt.p99_us - (rtt.p50_us - phase.increase_us)


def phase_verdict(phase: LatencyPhase) -> str | None:
    """A loaded phase's verdict: the worst of its bloat's grade, its tail's grade and the
    cap of its probe loss (None for an idle phase or without figures)."""
    if not phase.loaded:
        return None
    tail = tail_increase(phase)
    bloat = grade(phase.bloat_us) if phase.bloat_us is not None else None
    if bloat is None and tail is None:
        return None
    return worst_grade(bloat, grade(tail) if tail is not None else None,
                       loss_cap(phase.rtt.lost_percent if phase.rtt else None))


def run_verdict(phases: Sequence[LatencyPhase]) -> str | None:
    """The run's verdict: its worst loaded phase's (:func:`phase_verdict`)."""
    return worst_grade(*(phase_verdict(p) for p in phases))


def jitter(values: Sequence[float]) -> float | None:
    """Mean absolute difference between consecutive values, in their order."""
    if len(values) < 2:
        return None
    return statistics.fmean(abs(b - a) for a, b in zip(values, values[1:]))


def distribution(values: Sequence[float], lost: int | None = None,
                 sent: int | None = None) -> LatencyStats:
    """The statistics of the values (in their time order), with loss if known."""
    ordered = sorted(values)
    lost_percent = None if lost is None or not sent else 100.0 * lost / sent
    if not ordered:
        return LatencyStats(count=0, lost=lost, lost_percent=lost_percent)
    return LatencyStats(
        count=len(ordered),
        min_us=ordered[0],
        mean_us=statistics.fmean(ordered),
        p50_us=percentile(ordered, 50),
        p90_us=percentile(ordered, 90),
        p99_us=percentile(ordered, 99),
        max_us=ordered[-1],
        lost=lost,
        lost_percent=lost_percent,
        jitter_us=jitter(values),
    )


def _answered(samples: Sequence[ProbeSample]) -> list[ProbeSample]:
    return [s for s in samples if s.rtt_us is not None]


def _one_way(samples: Sequence[ProbeSample], name: str, base: int | None,
             lost: int | None, sent: int | None) -> LatencyStats | None:
    """One direction's delay variation of the answered ``samples``; its loss is of the
    ``sent`` probes that set out that way (not of those answered, which left the lost
    ones out of the count they were a share of)."""
    raw = [getattr(s, name) for s in samples]
    known = [v for v in raw if v is not None]
    lost_percent = None if lost is None or not sent else 100.0 * lost / sent
    if base is None or not known:
        return None if lost is None else LatencyStats(count=0, lost=lost,
                                                      lost_percent=lost_percent)
    return attrs.evolve(distribution([(v - base) / 1000.0 for v in known]), lost=lost,
                        lost_percent=lost_percent)


def _baseline(samples: Sequence[ProbeSample], name: str) -> int | None:
    known = [getattr(s, name) for s in samples if getattr(s, name) is not None]
    return min(known) if known else None


def _direction_loss(samples: Sequence[ProbeSample],
                    received: frozenset[int] | None) -> tuple[int | None, int | None]:
    """Probes lost on the way out and echoes lost on the way back (None: unknown)."""
    if received is None:
        return None, None
    up = sum(1 for s in samples if s.seq not in received)
    down = sum(1 for s in samples if s.seq in received and s.rtt_us is None)
    return up, down


def phase_record(log: ProbeLog, index: int, idle_p50_us: float | None,
                 bases: tuple[int | None, int | None]) -> LatencyPhase:
    """One phase's figures: round trip, both directions, loss, and against idle."""
    phase = log.phases[index]
    samples = [s for s in log.samples if s.phase == index]
    answered = _answered(samples)
    rtts = [s.rtt_us for s in answered if s.rtt_us is not None]
    up_lost, down_lost = _direction_loss(samples, log.server_received)
    rtt = distribution(rtts, lost=len(samples) - len(answered), sent=len(samples))
    end = phase.end_s if phase.end_s is not None else max((s.sent_s for s in samples),
                                                          default=phase.start_s)
    increase = bloat = None
    if phase.loaded and idle_p50_us is not None and rtt.p50_us is not None:
        increase = rtt.p50_us - idle_p50_us
    if phase.loaded and idle_p50_us is not None and rtt.mean_us is not None:
        bloat = rtt.mean_us - idle_p50_us
    record = LatencyPhase(
        name=phase.name,
        loaded=phase.loaded,
        start_s=round(phase.start_s, 6),
        end_s=round(end, 6),
        rtt=rtt,
        # out: every probe sent; back: the probes that reached the server
        client_to_server=_one_way(answered, "up_ns", bases[0], up_lost, len(samples)),
        server_to_client=_one_way(answered, "down_ns", bases[1], down_lost,
                                  None if up_lost is None else len(samples) - up_lost),
        increase_us=increase,
        bloat_us=bloat,
        rpm=rpm(rtts) if phase.loaded else None,
        grade=grade(bloat) if bloat is not None else None,
    )
    return attrs.evolve(record, tail_increase_us=tail_increase(record),
                        verdict=phase_verdict(record))


def idle_p50(log: ProbeLog) -> float | None:
    """Median round trip of the idle phases before the first loaded one (else of all idle)."""
    first_loaded = next((i for i, p in enumerate(log.phases) if p.loaded), len(log.phases))
    for last in (first_loaded, len(log.phases)):
        idle = {i for i, p in enumerate(log.phases[:last]) if not p.loaded}
        rtts = sorted(s.rtt_us for s in log.samples if s.phase in idle and s.rtt_us is not None)
        if rtts:
            return percentile(rtts, 50)
    return None


def run_bloat(phases: Sequence[LatencyPhase],
              graded: Collection[str] | None = None) -> float | None:
    """The run's bloat: the mean of the loaded phases' bloat (those named in ``graded``,
    default all), as DSLReports averages its download's and its upload's."""
    bloats = [p.bloat_us for p in phases
              if p.bloat_us is not None and (graded is None or p.name in graded)]
    return statistics.fmean(bloats) if bloats else None


def summarize(log: ProbeLog, graded: Collection[str] | None = None) -> Latency:
    """The run's Latency: the loaded round trips (all loaded phases), the phases, RPM, grade.

    ``graded`` names the loaded phases the run's bloat and grade average (default: all).
    Without a loaded phase the distribution is the idle one and there is no grade."""
    bases = (_baseline(log.samples, "up_ns"), _baseline(log.samples, "down_ns"))
    baseline = idle_p50(log)
    phases = tuple(phase_record(log, i, baseline, bases) for i in range(len(log.phases)))
    loaded = {i for i, p in enumerate(log.phases) if p.loaded}
    chosen = [s for s in log.samples if s.phase in loaded] if loaded else list(log.samples)
    rtts = [s.rtt_us for s in chosen if s.rtt_us is not None]
    top = distribution(rtts, lost=len(chosen) - len(rtts), sent=len(chosen))
    increases = [p.increase_us for p in phases if p.increase_us is not None]
    increase = max(increases) if increases else None
    bloat = run_bloat(phases, graded)
    tails = [p.tail_increase_us for p in phases if p.tail_increase_us is not None]
    return as_run(
        top,
        metric="round_trip",
        measured_by=log.measured_by,
        tail_increase_us=max(tails) if tails else None,
        verdict=run_verdict(phases),
        phases=phases,
        increase_us=increase,
        bloat_us=bloat,
        rpm=rpm(rtts) if loaded else None,
        grade=grade(bloat) if bloat is not None else None,
        samples=series(log.samples, bases),
    )


def as_run(stats: LatencyStats, **run: Any) -> Latency:
    """A run's :class:`Latency` of a distribution and the run-level fields in ``run``."""
    return Latency(count=stats.count, min_us=stats.min_us, mean_us=stats.mean_us,
                   p50_us=stats.p50_us, p90_us=stats.p90_us, p99_us=stats.p99_us,
                   max_us=stats.max_us, lost=stats.lost, lost_percent=stats.lost_percent,
                   jitter_us=stats.jitter_us, **run)


def _above(raw: int | None, base: int | None) -> float | None:
    return None if raw is None or base is None else round((raw - base) / 1000.0, 1)


def series(samples: Sequence[ProbeSample],
           bases: tuple[int | None, int | None]) -> tuple[LatencySample, ...]:
    """Every probe as a LatencySample (0.1 us and 0.1 ms resolution keep the JSON small)."""
    return tuple(
        LatencySample(
            t_s=round(s.sent_s, 4),
            rtt_us=None if s.rtt_us is None else round(s.rtt_us, 1),
            client_to_server_us=_above(s.up_ns, bases[0]),
            server_to_client_us=_above(s.down_ns, bases[1]),
        )
        for s in samples
    )


PROBLEM_QUEUE_US = 30_000.0
"""A direction whose median queue passes this is a problem: past it the grade is worse
than A (the scale's own line between "fine" and "noticeable")."""


def bloated_direction(record: Latency, threshold_us: float = PROBLEM_QUEUE_US) -> str | None:
    """Which direction's queue is the problem under load: ``client_to_server``,
    ``server_to_client``, ``both``, or None (neither median queue reached ``threshold_us``
    in any loaded phase, or unknown).

    The one-way figures say where the queue is, which the round trip alone cannot."""
    grown = set()
    for phase in record.phases:
        if not phase.loaded:
            continue
        for name in ("client_to_server", "server_to_client"):
            one_way = getattr(phase, name)
            if one_way is not None and (one_way.p50_us or 0.0) >= threshold_us:
                grown.add(name)
    if len(grown) == 2:
        return "both"
    return grown.pop() if grown else None


def answered_between(samples: Sequence[ProbeSample], start_s: float,
                     end_s: float) -> list[float]:
    """Round trips of the probes whose echo arrived in [start_s, end_s)."""
    found = []
    for sample in samples:
        at = sample.answered_s
        if at is not None and sample.rtt_us is not None and start_s <= at < end_s:
            found.append(sample.rtt_us)
    return found


def with_interval_latency(sample: Interval, rtts_us: Sequence[float]) -> Interval:
    """The interval with the p50 and max round trip of ``rtts_us`` (unchanged if none)."""
    if not rtts_us:
        return sample
    ordered = sorted(rtts_us)
    return attrs.evolve(sample, latency_p50_us=percentile(ordered, 50),
                        latency_max_us=ordered[-1])
