"""``netprobe run --latency`` (and ``netprobe.run(latency=...)``): one test with the probes
beside it, run as the one loaded phase of :func:`netprobe.latency.phases.run_probed`:
an idle baseline (default 2 s), the test, an optional idle tail."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable

from netprobe.latency import figures as latency
from netprobe.latency.phases import Done, Loaded, Plan, run_probed
from netprobe.latency.probing import (
    BYTE_COUNT_SESSION_S,
    SESSION_MARGIN_S,
    ProbeOptions,
    attach,
)
from netprobe.plugin import Reporter
from netprobe.schema import Result, TestSpec

DEFAULT_OPTIONS = ProbeOptions()
"""The probes' defaults (a frozen record: one shared default is safe)."""


def run_with_latency(run: Callable[[Reporter], Result], spec: TestSpec, reporter: Reporter,
                     options: ProbeOptions = DEFAULT_OPTIONS,
                     secret: bytes | None = None) -> Result:
    """Run ``run`` (the test, given a reporter) with the probes beside it.

    A failed or interrupted test keeps its probes' figures in its partial result."""
    planned_s = spec.planned_s()
    test_s = BYTE_COUNT_SESSION_S if planned_s is None else planned_s
    plan = Plan(spec=spec, phases=(Loaded("loaded", run),), idle_s=options.idle_s,
                tail_s=options.tail_s if options.tail_s > 0 else None,
                session_s=test_s + options.idle_s + options.tail_s + SESSION_MARGIN_S,
                idle_note=f"latency probes: {options.idle_s:g} s idle baseline")
    return run_probed(plan, reporter, options, secret, _attached)


def _attached(done: Sequence[Done], stop: Callable[[], latency.ProbeLog],
              failed: str | None) -> Result | None:
    # The test's own result (or a failure's partial) with the probes' figures; a failure
    # without a partial result keeps what it has.
    if not done:
        return None
    return attach(done[0].result, stop(), done[0].live)
