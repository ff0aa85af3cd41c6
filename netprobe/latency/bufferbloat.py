"""``netprobe bufferbloat``: the test a person tuning SQM runs (Flent's RRUL, in spirit).

One probe session runs through five phases: idle, download (the server sends, 4 streams),
upload (the client sends, 4 streams), both at once, idle again; each 10 s by default. The
loaded phases are ordinary tests (any tool; native by default), run one after the other.
Everything comes back as ONE Result on the probes' clock (time 0 = the first probe): the
phases with their latency and throughput, the summaries of each direction measured alone
(download's for server to client, upload's for client to server), every interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable

import attrs

from netprobe.errors import TestFailed
from netprobe.latency import figures as latency
from netprobe.latency.phases import Done, Loaded, Plan, run_probed
from netprobe.latency.probing import LatencyReporter, ProbeOptions
from netprobe.plugin import Reporter, Tool
from netprobe.schema import (
    Endpoint,
    FlowSummary,
    Interval,
    LatencyPhase,
    Result,
    StreamResult,
    TestSpec,
    ToolInfo,
)
from netprobe.session import (
    NO_SECRET,
    AgentAccess,
    prepare,
    run_spec,
)

LOADED_PHASES = (("download", "reverse"), ("upload", "normal"), ("both", "bidir"))
"""The loaded phases in order, with the direction each test runs."""
GRADED_PHASES = ("download", "upload")
"""The phases the run's grade averages, as DSLReports averages its download's and its
upload's bloat (it has no phase of both at once)."""
RRUL_PHASES = (("rrul", "bidir"),)
"""``netprobe rrul``: one loaded phase, 4 streams each way at once (Flent's RRUL)."""
DEFAULT_PHASE_S = 10.0
DEFAULT_STREAMS = 4

RunTest = Callable[[TestSpec, Reporter], Result]


def phase_spec(base: TestSpec, direction: str) -> TestSpec:
    """The spec of one loaded phase: ``base`` in ``direction``."""
    return attrs.evolve(base, direction=direction)


def prepare_plan(tool: Tool, base: TestSpec, plan: Sequence[tuple[str, str]]) -> None:
    """Before anything runs: SpecError for every option ``tool`` cannot honour in any
    phase of ``plan``, then ToolUnavailable if it cannot run here."""
    for direction in dict.fromkeys(d for _, d in plan):
        prepare(tool, phase_spec(base, direction))


def run_plan(tool: Tool, base: TestSpec, plan: Sequence[tuple[str, str]], reporter: Reporter,
             options: ProbeOptions, agent: AgentAccess = NO_SECRET,
             label: str = "bufferbloat") -> Result:
    """``netprobe bufferbloat`` and ``netprobe rrul`` (the commands and the Python API):
    idle for ``options.idle_s``, each phase of ``plan`` run by ``tool`` through
    :func:`~netprobe.session.run_spec`, idle again; probes throughout; one Result.
    Call :func:`prepare_plan` first."""
    return run_phases(lambda spec, live: run_spec(tool, spec, live, agent=agent), base,
                      reporter, options, agent.secret, idle_s=options.idle_s, plan=plan,
                      label=label)


def run_phases(run: RunTest, base: TestSpec, reporter: Reporter,
               options: ProbeOptions, secret: bytes | None = None,
               idle_s: float = DEFAULT_PHASE_S,
               plan: Sequence[tuple[str, str]] = LOADED_PHASES,
               label: str = "bufferbloat") -> Result:
    """Idle, the loaded phases of ``plan`` (name, direction; default download, upload,
    both), idle, with probes throughout; one Result. ``label`` begins the notes.

    A phase that fails ends the run: TestFailed carries what the phases before it and
    the probes measured."""
    per_test = base.planned_s() or DEFAULT_PHASE_S
    idle_note = f"{label}: idle {idle_s:g} s"
    probed = Plan(
        spec=base,
        phases=tuple(Loaded(name, _settled(run, phase_spec(base, direction), per_test),
                            note=f"{label}: {name} ({direction}) {per_test:g} s")
                     for name, direction in plan),
        idle_s=idle_s, tail_s=idle_s, idle_note=idle_note, tail_note=idle_note,
        session_s=2 * idle_s + len(plan) * (per_test + 5) + 60)

    def finish(done: Sequence[Done], stop: Callable[[], latency.ProbeLog],
               failed: str | None) -> Result:
        return combine(base, done, stop(), failed=failed)

    return run_probed(probed, reporter, options, secret, finish)


def _settled(run: RunTest, spec: TestSpec,
             per_test: float) -> Callable[[LatencyReporter], Result]:
    """The phase's test, its start on the probes' clock settled when it ends."""
    def go(live: LatencyReporter) -> Result:
        try:
            result = run(spec, live)
        except TestFailed:
            _settle(live, live.prober.now_s())
            raise
        _settle(live, live.prober.now_s() - per_test)
        return result

    return go


def _settle(live: LatencyReporter, fallback_s: float) -> None:
    # A test that reported no interval live leaves its start unknown: take its planned one.
    if live.zero_s is None:
        live.zero_s = max(0.0, fallback_s)


def _receiver_rate(result: Result, direction: str) -> float | None:
    flow = result.summary(direction)
    if flow is None:
        return None
    side = flow.receiver or flow.sender
    return side.bits_per_second if side is not None else None


def _with_rates(phases: Sequence[LatencyPhase], done: Sequence[Done]) -> tuple:
    by_name = {d.name: d.result for d in done}
    out = []
    for phase in phases:
        result = by_name.get(phase.name)
        if result is not None:
            phase = attrs.evolve(
                phase,
                client_to_server_bits_per_second=_receiver_rate(result, "client_to_server"),
                server_to_client_bits_per_second=_receiver_rate(result, "server_to_client"),
            )
        out.append(phase)
    return tuple(out)


def _shifted(intervals: Sequence[Interval], by: float) -> list[Interval]:
    return [attrs.evolve(i, start_s=round(i.start_s + by, 6), end_s=round(i.end_s + by, 6))
            for i in intervals]


def _alone(done: Sequence[Done]) -> tuple[list[FlowSummary], list[StreamResult]]:
    """Each direction's summary and streams from the phase where it ran alone (else from
    the first phase that carried it: ``rrul`` runs both directions at once only)."""
    flows, streams = [], []
    for name, direction in (("upload", "client_to_server"), ("download", "server_to_client")):
        carried = [d for d in done if d.result.summary(direction) is not None]
        chosen = next((d for d in carried if d.name == name), carried[0] if carried else None)
        if chosen is not None:
            flow = chosen.result.summary(direction)
            flows += [flow] if flow is not None else []
            streams += [s for s in chosen.result.streams if s.direction == direction]
    return flows, streams


def combine(base: TestSpec, done: Sequence[Done], log: latency.ProbeLog,
            failed: str | None = None) -> Result:
    """One Result of the phases run so far and the probes' log (times on the probes' clock)."""
    named = {p.name for p in log.phases}
    graded = [name for name in GRADED_PHASES if name in named] or None
    summary = latency.summarize(log, graded)
    summary = attrs.evolve(summary, phases=_with_rates(summary.phases, done), test_start_s=0.0)
    intervals: list[Interval] = []
    for each in done:
        samples = list(log.samples)
        intervals += _shifted([each.live.add(i, samples) for i in each.result.intervals],
                              each.zero_s)
    flows, streams = _alone(done)
    first = done[0].result if done else None
    warnings = [f"{d.name}: {w}" for d in done for w in d.result.warnings]
    errors = [f"{d.name}: {e}" for d in done for e in d.result.errors]
    if failed and not errors:
        errors.append(failed)
    bad = ", ".join(f"{count} {why}" for why, count in log.bad)
    if bad:
        warnings.append(f"latency probes ignored as bad: {bad}")
    status = "failed" if failed or any(d.result.status != "ok" for d in done) else "ok"
    phases = summary.phases
    return Result(
        tool=first.tool if first else ToolInfo(name=base.tool),
        spec=phase_spec(base, "bidir"),
        start_time=first.start_time if first else None,
        local=first.local if first else Endpoint(role="client"),
        remote=first.remote if first else Endpoint(role="server", host=base.host),
        status=status,
        duration_s=round(phases[-1].end_s, 6) if phases else None,
        summaries=tuple(flows),
        streams=tuple(streams),
        intervals=tuple(sorted(intervals, key=lambda i: (i.end_s, i.direction, i.role,
                                                          i.stream_id or 1_000_000))),
        latency=summary,
        warnings=tuple(warnings),
        errors=tuple(errors),
        raw=tuple(r for d in done for r in d.result.raw),
    )
