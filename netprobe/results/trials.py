"""Trials: one test run N times (``run --repeat``), or the same test through several tools
(``compare``), interleaved A B C A B C ... so that whatever drifts on the machine or the
path (other traffic, CPU frequency, a warming cache) falls on every tool alike.

Every trial's result is kept, stamped with the run's id and its index in the run. A trial
that fails keeps its partial result (status ``failed``) and the run goes on; Ctrl-C stops
the run, keeping what was measured. Logic only: progress goes to a :class:`TrialEvents`
and the tools' live samples to the Reporter the caller hands in.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Sequence
from typing import Callable, Protocol

import attrs
from attrs import frozen

from netprobe.errors import NetprobeError, TestFailed, TestInterrupted
from netprobe.plugin import Reporter, Tool
from netprobe.registry import make_tool
from netprobe.reporting import NullReporter
from netprobe.schema import Result, TestSpec
from netprobe.session import NO_SECRET, AgentAccess, run_spec, unavailable_reasons


@frozen
class Trial:
    """One planned run of one tool."""

    index: int
    """Position in the run, from 1 (stored as ``Result.trial``)."""
    round: int
    """Which repetition, from 1: the trials of one round run each tool once."""
    tool: str
    """The tool's name."""


def interleave(tools: Sequence[str], rounds: int) -> list[Trial]:
    """The trial order: every tool once per round, in the order given (A B C A B C ...)."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    names = list(tools)
    return [Trial(index=r * len(names) + i + 1, round=r + 1, tool=name)
            for r in range(rounds) for i, name in enumerate(names)]


def new_run_id() -> str:
    """A fresh run id (random, 32 hex digits): shared by the trials of one run."""
    return uuid.uuid4().hex


# --- which tools can take part -----------------------------------------------------------


@frozen
class Skipped:
    """A tool left out of a comparison, and why."""

    tool: str
    """The tool's name."""
    reasons: tuple[str, ...]
    """Each option it cannot honour, or why it cannot run here."""


def spec_for(spec: TestSpec, tool: Tool) -> TestSpec:
    """``spec`` as ``tool`` runs it (the spec names its tool)."""
    return attrs.evolve(spec, tool=tool.name)


def screen(tools: Sequence[Tool], spec: TestSpec) -> tuple[list[Tool], list[Skipped]]:
    """Split ``tools`` into those that can run ``spec`` here and those left out, with the
    reasons: options they cannot honour first (nothing is silently dropped), then
    whether they can run on this machine at all."""
    ready: list[Tool] = []
    skipped: list[Skipped] = []
    for tool in tools:
        reasons = tool.refusals(spec_for(spec, tool)) or unavailable_reasons(tool)
        if reasons:
            skipped.append(Skipped(tool.name, tuple(reasons)))
        else:
            ready.append(tool)
    return ready, skipped


# --- call lengths ------------------------------------------------------------------------

@frozen
class CallLength:
    """How one tool's trials called the kernel: the length asked and the lengths used."""

    tool: str
    """The tool's name."""
    protocol: str
    """``tcp`` or ``udp``."""
    asked: int | None
    """The spec's length (``-l``, or compare's common one); None for the tool's own."""
    sender: tuple[int, ...]
    """TCP: the distinct write lengths the trials reported (empty where the tool does not
    say, and for UDP, whose datagram length is :attr:`asked`)."""
    receiver: tuple[int, ...]
    """TCP: the distinct read lengths the trials reported."""
    batched: bool
    """UDP: many datagrams per send call (see :attr:`netprobe.plugin.Tool.udp_batched_send`)."""


def call_lengths(results: Sequence[Result], batched: Collection[str] = ()) -> list[CallLength]:
    """Per tool, in the order first seen, the call lengths of ``results``; ``batched``
    names the tools whose UDP sender sends many datagrams per call."""
    by_tool: dict[str, list[Result]] = {}
    for result in results:
        by_tool.setdefault(result.tool.name, []).append(result)
    return [_call_length(name, group, name in batched) for name, group in by_tool.items()]


def _call_length(name: str, results: Sequence[Result], batched: bool) -> CallLength:
    spec = results[0].spec
    asked = {r.spec.length_bytes for r in results}
    # Where the trials disagree, the asked length is not one figure: say the tool's own.
    common = asked.pop() if len(asked) == 1 else None
    sides = [(flow.sender, flow.receiver) for r in results for flow in r.summaries]
    writes = sorted({s.call_length_bytes for s, _ in sides if s and s.call_length_bytes})
    reads = sorted({s.call_length_bytes for _, s in sides if s and s.call_length_bytes})
    return CallLength(name, spec.protocol, common, tuple(writes), tuple(reads), batched)


# --- running -----------------------------------------------------------------------------


class TrialEvents(Protocol):
    """Told about each trial as the run goes (the CLI prints a line per trial)."""

    def started(self, trial: Trial, total: int) -> None:
        """``trial`` of ``total`` is about to run."""

    def finished(self, trial: Trial, result: Result) -> None:
        """``trial`` produced ``result`` (status ``ok``, or ``failed`` with what it measured)."""

    def failed(self, trial: Trial, message: str) -> None:
        """``trial`` failed without measuring anything."""


class NullEvents:
    """TrialEvents that ignore everything."""

    def started(self, trial: Trial, total: int) -> None:
        """Ignore."""

    def finished(self, trial: Trial, result: Result) -> None:
        """Ignore."""

    def failed(self, trial: Trial, message: str) -> None:
        """Ignore."""


@attrs.define
class TrialRun:
    """What a run of trials produced."""

    run_id: str
    """Shared by every result of the run."""
    planned: int
    """Trials planned."""
    results: list[Result] = attrs.Factory(list)
    """Each trial's result, in the order run (partial ones included, status ``failed``)."""
    failures: list[tuple[Trial, str]] = attrs.Factory(list)
    """Trials that failed without a result, and why."""
    interrupted: bool = False
    """True if Ctrl-C stopped the run early."""

    @property
    def failed(self) -> int:
        """Trials that did not complete (with or without a partial result)."""
        return len(self.failures) + sum(r.status != "ok" for r in self.results)


def run_trials(spec: TestSpec, tools: Sequence[Tool | str], rounds: int,
               reporter: Reporter | None = None, *,
               events: TrialEvents | None = None, pause_s: float = 0.0,
               run_id: str | None = None,
               sleep: Callable[[float], None] = time.sleep,
               from_host: str | None = None, agent: AgentAccess = NO_SECRET) -> TrialRun:
    """Run ``spec`` through ``tools`` for ``rounds`` rounds, interleaved, ``pause_s``
    seconds apart; every result carries the run id and its trial index.

    ``tools`` are Tool instances or tool names (as after ``--tool``; ToolNotFound before
    anything runs for a name no plugin has). Live intervals go to ``reporter`` (none by
    default). Each trial runs as :func:`netprobe.session.run_spec` runs a test: from the
    agent at ``from_host`` when given, with the target's agent starting the far end when
    it has one.
    """
    made = [make_tool(tool) if isinstance(tool, str) else tool for tool in tools]
    by_name = {tool.name: tool for tool in made}
    reporter = reporter or NullReporter()
    plan = interleave(list(by_name), rounds)
    run = TrialRun(run_id or new_run_id(), len(plan))
    events = events or NullEvents()

    def one(tool: Tool, trial_spec: TestSpec) -> Result:
        return run_spec(tool, trial_spec, reporter, from_host=from_host, agent=agent)

    for trial in plan:
        try:  # Ctrl-C anywhere in a step (a note, the test, the pause) ends the run cleanly
            events.started(trial, len(plan))
            _one_trial(by_name[trial.tool], spec, trial, one, run, events)
            if pause_s > 0 and trial is not plan[-1] and not run.interrupted:
                sleep(pause_s)
        except KeyboardInterrupt:
            run.interrupted = True
        if run.interrupted:
            break
    return run


def _one_trial(tool: Tool, spec: TestSpec, trial: Trial,
               run_one: Callable[[Tool, TestSpec], Result], run: TrialRun,
               events: TrialEvents) -> None:
    try:
        result: Result | None = run_one(tool, spec_for(spec, tool))
    except TestFailed as exc:  # TestInterrupted too: keep what it measured
        result = exc.partial if isinstance(exc.partial, Result) else None
        run.interrupted = isinstance(exc, TestInterrupted)
        if result is None:
            _fail(trial, str(exc), run, events)
    except (NetprobeError, OSError) as exc:  # the tool could not complete this trial
        _fail(trial, f"{tool.name}: {exc}", run, events)
        return
    if result is not None:
        stamped = attrs.evolve(result, run_id=run.run_id, trial=trial.index)
        run.results.append(stamped)
        events.finished(trial, stamped)


def _fail(trial: Trial, message: str, run: TrialRun, events: TrialEvents) -> None:
    run.failures.append((trial, message))
    events.failed(trial, message)
