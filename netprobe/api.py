"""The Python API (docs/api.md), what ``import netprobe`` offers: :func:`run` (one test, as
``netprobe run``; ``latency=`` as ``run --latency``), :func:`run_bufferbloat` and
:func:`run_rrul` (as ``netprobe bufferbloat`` and ``netprobe rrul``). Each returns the Result
the command renders and raises what the command turns into its exit codes; a TestFailed's
``partial`` is the Result ``--json`` writes for the same failure. Nothing here prints.

It sits above the run road (:mod:`netprobe.session`) and the latency features
(:mod:`netprobe.latency.probing`, :mod:`netprobe.latency.bufferbloat`), which it puts
together as the commands do; ``run_trials`` is :func:`netprobe.results.trials.run_trials`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from netprobe.errors import SpecError
from netprobe.host import utc_now_iso
from netprobe.latency.beside import run_with_latency
from netprobe.latency.bufferbloat import (
    DEFAULT_PHASE_S,
    DEFAULT_STREAMS,
    LOADED_PHASES,
    RRUL_PHASES,
    phase_spec,
    prepare_plan,
    run_plan,
)
from netprobe.latency.probing import ProbeOptions
from netprobe.plugin import Reporter
from netprobe.registry import make_tool
from netprobe.reporting import NullReporter
from netprobe.results.trials import run_trials
from netprobe.schema import Result
from netprobe.session import (
    NO_SECRET,
    AgentAccess,
    check_call,
    failure_recorded,
    run_spec,
    spec_of,
)

FIXED_FIELDS = frozenset({"tool", "host", "protocol", "direction"})
"""TestSpec fields the phased tests set themselves (TCP; each phase its direction)."""


def run(host: str | None = None, *, tool: str = "native", from_host: str | None = None,
        reporter: Reporter | None = None, agent: AgentAccess = NO_SECRET,
        tool_options: dict[str, Any] | None = None, latency: Any = False,
        **spec: Any) -> Result:
    """Run one test and return its :class:`~netprobe.schema.Result` (``netprobe.run``).

    ``host`` is the far end (None: both ends on this machine over loopback); ``tool`` the
    plugin's name; every other keyword is a :class:`~netprobe.schema.TestSpec` field
    (``duration_s=5``, ``protocol="udp"``, ``streams=4``, ...). ``from_host``,
    ``reporter`` (live intervals; none by default) and ``agent`` are as for
    :func:`netprobe.session.run_spec`; ``tool_options`` go to the tool's constructor (e.g.
    ``path``).
    ``latency``: True, or a :class:`netprobe.latency.probing.ProbeOptions`, runs netprobe's
    latency probes beside the test, as ``netprobe run --latency`` does.

    Raises what the command line turns into its exit codes: SpecError (bad or refused
    spec), ToolNotFound, ToolUnavailable, TestFailed (TestInterrupted on Ctrl-C), whose
    ``partial`` is the Result ``netprobe run --json`` writes for the same failure (with no
    figures when none came back). A result comes back only when the test completed.
    """
    check_call(tool, from_host, reporter, agent, tool_options)
    probes = _probe_options(latency, agent)
    if probes is not None and from_host is not None:
        raise SpecError("latency cannot be combined with from_host (as --latency with --from)")
    if probes is not None and (tool_options or {}).get("iperf3"):
        # A stock iperf3 server has no echo: its probes are TCP handshakes to its port
        # while the test runs, the client's own (as ``run --iperf3 --latency``).
        tool_options = {**(tool_options or {}), "iperf3_latency_hz": probes.rate_hz}
        probes = None
    test = spec_of(tool, host, spec)
    chosen = make_tool(tool, tool_options)
    live = reporter or NullReporter()
    started = utc_now_iso()
    with failure_recorded(chosen.name, test, started):
        if probes is None:
            return run_spec(chosen, test, live, from_host=from_host, agent=agent)
        return run_with_latency(lambda each: run_spec(chosen, test, each, agent=agent),
                                test, live, probes, agent.secret)


def _probe_options(latency: Any, agent: AgentAccess) -> ProbeOptions | None:
    """The ProbeOptions ``latency`` asks for (None: no probes); the agents' port by default,
    as ``--agent-port`` is the probes' port on the command line."""
    if latency is False or latency is None:
        return None
    if latency is True:
        return ProbeOptions(port=agent.port)
    if isinstance(latency, ProbeOptions):
        return latency
    raise SpecError(f"latency must be True, False or a ProbeOptions, got {repr(latency)[:40]}")


def run_bufferbloat(host: str | None = None, *, tool: str = "native", idle_s: float = 10.0,
                    probes: ProbeOptions | None = None, reporter: Reporter | None = None,
                    agent: AgentAccess = NO_SECRET, tool_options: dict[str, Any] | None = None,
                    **spec: Any) -> Result:
    """``netprobe bufferbloat`` from Python (``netprobe.run_bufferbloat``): idle
    ``idle_s``, download, upload, both (``duration_s`` each, default 10 s, ``streams``
    TCP streams, default 4), idle; the one Result the command renders, with the phases,
    the grade and the verdict in ``result.latency``.

    ``probes`` sets the probes' rate, transport and port (its ``idle_s`` is ``idle_s``);
    the other arguments and the errors are :func:`netprobe.run`'s: TestFailed's
    ``partial`` holds the phases measured before the failure (or, when none was, the
    record ``--json`` writes)."""
    return _api_phases(LOADED_PHASES, "bufferbloat", host, tool, idle_s, probes, reporter,
                       agent, tool_options, {"duration_s": DEFAULT_PHASE_S, **spec})


def run_rrul(host: str | None = None, *, tool: str = "native", idle_s: float = 5.0,
             probes: ProbeOptions | None = None, reporter: Reporter | None = None,
             agent: AgentAccess = NO_SECRET, tool_options: dict[str, Any] | None = None,
             **spec: Any) -> Result:
    """``netprobe rrul`` from Python (``netprobe.run_rrul``): idle ``idle_s`` (Flent's
    ``--delay``, default 5 s), both directions at once for ``duration_s`` (default 60 s,
    ``streams`` each way, default 4), idle; otherwise as :func:`run_bufferbloat`."""
    return _api_phases(RRUL_PHASES, "rrul", host, tool, idle_s, probes, reporter, agent,
                       tool_options, {"duration_s": RRUL_LENGTH_S, **spec})


RRUL_LENGTH_S = 60.0
"""Flent's default test length (``-l``): ``netprobe rrul``'s loaded phase."""


def _api_phases(plan: Sequence[tuple[str, str]], label: str, host: str | None, tool: str,
                idle_s: float, probes: ProbeOptions | None, reporter: Reporter | None,
                agent: AgentAccess, tool_options: dict[str, Any] | None,
                fields: dict[str, Any]) -> Result:
    check_call(tool, None, reporter, agent, tool_options)
    if probes is not None and not isinstance(probes, ProbeOptions):
        raise SpecError(f"probes must be a ProbeOptions, got {repr(probes)[:40]}")
    if isinstance(idle_s, bool) or not isinstance(idle_s, (int, float)) or not 0 <= idle_s < 1e6:
        raise SpecError(f"idle_s must be seconds (0 or more), got {repr(idle_s)[:40]}")
    fixed = sorted(set(fields) & FIXED_FIELDS)
    if fixed:
        raise SpecError(f"{label} sets {', '.join(fixed)} itself (TCP, each phase its "
                        "direction)")
    base = spec_of(tool, host, {"streams": DEFAULT_STREAMS, **fields})
    chosen = make_tool(tool, tool_options)
    prepare_plan(chosen, base, plan)
    options = attrs.evolve(probes or ProbeOptions(), idle_s=idle_s)
    with failure_recorded(chosen.name, phase_spec(base, "bidir")):
        return run_plan(chosen, base, plan, reporter or NullReporter(), options, agent, label)


__all__ = ["run", "run_bufferbloat", "run_rrul", "run_trials"]
