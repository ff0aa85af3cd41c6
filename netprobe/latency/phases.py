"""The one runner of a probed run: idle, the loaded phases, idle again, probes throughout.

``netprobe run --latency`` (one loaded phase: the test), ``netprobe bufferbloat`` (download,
upload, both) and ``netprobe rrul`` (both at once) are this lifecycle with different
phases and a different way of making the Result (:mod:`netprobe.latency.beside`,
:mod:`netprobe.latency.bufferbloat`): one probe session opened at the far end, an idle
baseline, each phase marked on the probes' clock and its test run with a
:class:`~netprobe.latency.probing.LatencyReporter`, an optional idle tail, the session
closed whatever happens. A phase that fails ends the run: its TestFailed carries what the
phases before it, the failed one's partial result and the probes measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable, Optional

import attrs

from netprobe.errors import TestFailed
from netprobe.latency import figures as latency
from netprobe.latency.probing import LatencyReporter, ProbeOptions, far_end, open_prober, pause
from netprobe.plugin import Reporter
from netprobe.schema import Result, TestSpec


@attrs.frozen
class Loaded:
    """One loaded phase to run: its name on the probes' clock, the note that announces it
    (None: none) and the test, given the reporter that adds the probes' latency."""

    name: str
    run: Callable[[LatencyReporter], Result]
    note: str | None = None


@attrs.frozen
class Done:
    """A loaded phase that ran (or failed with a partial result): its test's result and the
    reporter that saw its intervals."""

    name: str
    result: Result
    live: LatencyReporter

    @property
    def zero_s(self) -> float:
        """When this phase's test began, on the probes' clock."""
        return self.live.zero_s or 0.0


Finish = Callable[[Sequence[Done], Callable[[], latency.ProbeLog], Optional[str]],
                  Optional[Result]]
"""Makes the run's Result of the phases done, the probes' log (what stopping them gives:
called only when it makes a Result, since stopping waits for the echoes and the far end's
report) and why the run failed (None: it did not); None when a failed run has nothing to
make one of (its TestFailed keeps its own partial)."""


@attrs.frozen
class Plan:
    """What one probed run is: the far end's spec, the phases, the idle spans and notes."""

    spec: TestSpec
    """Where the probes go (its host and port)."""
    phases: Sequence[Loaded]
    idle_s: float
    """The idle baseline before the first loaded phase."""
    tail_s: float | None
    """The idle phase after the last (None: the run ends with the load)."""
    session_s: float
    """How long the far end keeps the probe session at most."""
    idle_note: str
    tail_note: str | None = None


def run_probed(plan: Plan, reporter: Reporter, options: ProbeOptions,
               secret: bytes | None, finish: Finish) -> Result:
    """Run ``plan`` with the probes beside it; ``finish`` makes the Result (see
    :data:`Finish`). A TestFailed of a phase is raised again, its partial made by
    ``finish`` where it makes one."""
    done: list[Done] = []
    with far_end(plan.spec, options) as (host, port):
        prober = open_prober(host, port, secret, options, plan.session_s)
        try:
            reporter.note(plan.idle_note)
            pause(prober, plan.idle_s)
            for phase in plan.phases:
                prober.mark(phase.name, True)
                if phase.note is not None:
                    reporter.note(phase.note)
                live = LatencyReporter(reporter, prober)
                try:
                    result = phase.run(live)
                except TestFailed as exc:
                    if isinstance(exc.partial, Result):
                        done.append(Done(phase.name, exc.partial, live))
                    prober.mark("idle_tail", False)
                    partial = finish(done, prober.stop, str(exc))
                    if partial is not None:
                        exc.partial = partial
                    raise
                done.append(Done(phase.name, result, live))
            if plan.tail_s is not None:
                prober.mark("idle_tail", False)
                if plan.tail_note is not None:
                    reporter.note(plan.tail_note)
                pause(prober, plan.tail_s)
            made = finish(done, prober.stop, None)
            if made is None:  # a finish that makes nothing of a run that ran: a bug here
                raise RuntimeError("a probed run ended without a result")
            return made
        finally:
            prober.close()
