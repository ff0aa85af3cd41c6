"""One way to run a test, for every caller: ``netprobe run``, its ``--repeat``, ``compare``,
``path``, the agent's third-party requests and the Python API (:mod:`netprobe.api`).

:func:`run_spec` refuses what the tool cannot honour, checks that it can run here, runs it
(through the far host's agent when there is one, or entirely on the agent at
``from_host``) and applies one error policy: the test's own failures come out as
:class:`~netprobe.errors.TestFailed` carrying what was measured; a refused spec stays a
:class:`~netprobe.errors.SpecError` and a tool that cannot run a
:class:`~netprobe.errors.ToolUnavailable`, both raised before anything runs.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs
from attrs import frozen

from netprobe import farend
from netprobe.bottleneck import with_cpu_warnings
from netprobe.errors import (
    NetprobeError,
    SpecError,
    TestFailed,
    TestInterrupted,
    ToolUnavailable,
)
from netprobe.host import utc_now_iso
from netprobe.plugin import Reporter, Tool
from netprobe.record import Record
from netprobe.registry import availability, make_tool
from netprobe.schema import Endpoint, Interval, Result, TestSpec, ToolInfo


@frozen(repr=False, eq=False)
class AgentAccess(Record):
    """How to reach the netprobe agents (``netprobe server``) on the far hosts."""

    secret: bytes | None = None
    """The shared secret, for agents that require one."""
    port: int | None = None
    """The agents' port; None for the tool option ``agent_port`` or netprobe's default."""
    far_end: bool = True
    """Ask the target's agent to start the tool's server side (``--no-agent``: False)."""
    target_port: int | None = None
    """In a third-party test, the port of the target's agent when it is not ``port`` (a
    fleet's agents each have their own)."""


NO_SECRET = AgentAccess()
"""Agents reached on their default port, without a secret."""


def unavailable_reasons(tool: Tool) -> list[str]:
    """Why ``tool`` cannot run here, each reason naming the tool (empty when it can)."""
    found = availability(tool)
    if found.available:
        return []
    return [f"{tool.name} cannot run here: {why}" for why in found.reasons] or [
        f"{tool.name} cannot run here: no reason given"]


def modes_of(tool: Tool) -> dict[str, bool]:
    """The modes (:attr:`Tool.modes`) ``tool``'s options turn on, for an agent to use."""
    return {mode: True for mode in sorted(type(tool).modes) if tool.options.get(mode)}


def prepare(tool: Tool, spec: TestSpec, *, from_host: str | None = None) -> None:
    """Before anything runs: SpecError for every option ``tool`` cannot honour, then
    ToolUnavailable if it cannot run here. A test run from another host's agent is not
    probed here: that agent probes its own tools and says why it cannot."""
    tool.check(spec)
    if from_host is None:
        reasons = unavailable_reasons(tool)
        if reasons:
            raise ToolUnavailable("; ".join(reasons))


def run_spec(tool: Tool, spec: TestSpec, reporter: Reporter, *,
             from_host: str | None = None, agent: AgentAccess = NO_SECRET) -> Result:
    """Run ``spec`` with ``tool``: refuse, probe, run, one error policy (see the module).

    ``from_host``: the agent there runs the whole test against ``spec.host`` (a
    third-party test). Otherwise, when ``spec.host`` runs an agent, it starts the tool's
    far end; without one the tool runs against whatever server listens there.
    """
    prepare(tool, spec, from_host=from_host)
    watch = ByteCountWatch(reporter, spec) if spec.bytes_total is not None else None
    try:
        return _said_if_nothing_sent(checked(_run(tool, spec, watch or reporter, from_host,
                                                  agent)))
    except TestInterrupted as exc:
        exc.partial = checked(exc.partial)  # what was measured must reach the output too
        if watch is None or watch.overran is None:
            raise
        raise TestFailed(f"{tool.name}: {watch.overran}",
                         _failed(exc.partial, watch.overran)) from None
    except KeyboardInterrupt:
        # The watch's stop reached us bare: the tool does not turn Ctrl-C into a partial
        # result (a plugin may not). It is still the watch's stop, never the user's Ctrl-C,
        # which would end a --repeat or compare as if someone had pressed it.
        if watch is None or watch.overran is None:
            raise
        raise TestFailed(f"{tool.name}: {watch.overran}") from None
    except TestFailed as exc:
        exc.partial = checked(exc.partial)
        raise
    except (SpecError, ToolUnavailable, BrokenPipeError):
        raise  # a closed stdout is the caller's output failing, not the test
    except (NetprobeError, OSError) as exc:  # the test did not complete
        raise TestFailed(f"{tool.name}: {exc}") from exc


OVERRUN_FACTOR = 4
"""A byte-count test is stopped once a flow's intervals add up to this many times its
count (plus :data:`OVERRUN_SLACK_BYTES`): tools round a count up to whole writes, none
by this much."""
OVERRUN_SLACK_BYTES = 64 << 20


class ByteCountWatch:
    """The reporter of a byte-count test (``-n``): passes every event on, and stops a run
    whose tool goes on well past the count asked (iperf 2.1.8 with ``-n`` below 60 bytes
    sends until it is stopped, were it let through, and a byte-count run has no deadline
    to stop it).

    It stops the run as Ctrl-C does (KeyboardInterrupt), and only on the thread that
    started the test: a driven tool calls its reporter there (the Reporter contract); the
    native engine, whose relay thread calls it, sends exactly its count anyway."""

    def __init__(self, reporter: Reporter, spec: TestSpec) -> None:
        self._reporter = reporter
        self._count = spec.bytes_total or 0
        self._streams = spec.streams
        self._thread = threading.get_ident()
        self._moved: dict[tuple[str, str, int | None], int] = {}
        self.overran: str | None = None
        """Why the run was stopped (None: it was not)."""

    def interval(self, sample: Interval) -> None:
        """Pass ``sample`` on; stop the run if its flow is far past the count."""
        self._reporter.interval(sample)
        key = (sample.direction, sample.role, sample.stream_id)
        moved = self._moved[key] = self._moved.get(key, 0) + (sample.bytes or 0)
        per = self._count * (self._streams if sample.stream_id is None else 1)
        if moved > per * OVERRUN_FACTOR + OVERRUN_SLACK_BYTES and self.overran is None:
            self.overran = (f"stopped: the tool went on past the byte count ({moved} bytes "
                            f"{'sent' if sample.role == 'sender' else 'received'} of the "
                            f"{per} asked)")
            if threading.get_ident() == self._thread:
                raise KeyboardInterrupt

    def note(self, message: str) -> None:
        """Pass ``message`` on."""
        self._reporter.note(message)


def _said_if_nothing_sent(result: Result) -> Result:
    """A complete result whose sender counted 0 bytes says why that may be (a rate so low
    that the first write fell in the warm-up, and the next after the end): the figures are
    true, and a bare 0 reads like a failure."""
    if result.status != "ok":
        return result
    spec = result.spec
    empty = [flow.direction for flow in result.summaries
             if flow.sender is not None and flow.sender.bytes == 0]
    if not empty:
        return result
    why = ""
    if spec.rate_bits_per_second and spec.length_bytes:
        every = spec.length_bytes * 8 / spec.rate_bits_per_second
        why = (f": at {spec.rate_bits_per_second:g} bit/s a {spec.length_bytes}-byte write "
               f"goes every {every:g} s")
    warm = f" after the {spec.omit_s:g} s warm-up" if spec.omit_s else ""
    note = f"the {', '.join(empty)} sender sent 0 bytes in the measured time{warm}{why}"
    return attrs.evolve(result, warnings=(*result.warnings, note))


def checked(result: Any) -> Any:
    """What the road does to every Result a tool gives (a run's, a failed run's partial, a
    parsed one), once, for every tool and plugin alike: its non-finite figures made unknown
    (see :func:`netprobe.convert.finite_figures`: every output is JSON, which has no NaN,
    and a tool's output or a plugin may hold one), then the one CPU rule
    (:func:`netprobe.bottleneck.with_cpu_warnings`: was the tester the bottleneck?), so a
    plugin's results and a merged far end's figures get it too. Anything else passes."""
    if not isinstance(result, Result):
        return result
    from netprobe.convert import finite_figures

    return with_cpu_warnings(finite_figures(result))



def _failed(partial: Any, reason: str) -> Any:
    """A partial Result of a run the watch stopped: failed, saying why (not the tool's
    "interrupted": no one pressed Ctrl-C)."""
    if not isinstance(partial, Result):
        return partial
    return attrs.evolve(partial, status="failed", errors=(reason,))


def _run(tool: Tool, spec: TestSpec, reporter: Reporter, from_host: str | None,
         agent: AgentAccess) -> Result:
    if from_host is not None:
        return farend.third_party(from_host, spec, reporter, agent.secret,
                                  agent.port or farend.protocol.DEFAULT_PORT, modes_of(tool),
                                  target_port=agent.target_port or agent.port)
    return farend.run(tool, spec, reporter, agent.secret, use_agent=agent.far_end,
                      port=agent.port)


# --- for the Python API (netprobe/api.py) and the commands --------------------------------


def failed_result(tool_name: str, spec: TestSpec, message: str, status: str = "failed",
                  started: str | None = None) -> Result:
    """The result of a test that ended before any figure came back (it could not connect,
    Ctrl-C during the start): no figures, the spec and the error, so that a machine format
    and ``TestFailed.partial`` still hold one record."""
    return Result(tool=ToolInfo(tool_name), spec=spec, start_time=started or utc_now_iso(),
                  local=Endpoint("client"),
                  remote=Endpoint("server", host=spec.host, port=spec.port),
                  status=status, errors=(" ".join(message.split()),))


@contextmanager
def failure_recorded(tool_name: str, spec: TestSpec, started: str | None = None
                     ) -> Iterator[None]:
    """A TestFailed raised in the block leaves with a Result in ``partial``: what was
    measured, or (when nothing came back) :func:`failed_result`, the record ``netprobe
    run --json`` writes for the same failure."""
    try:
        yield
    except TestFailed as exc:
        if not isinstance(exc.partial, Result):
            status = "interrupted" if isinstance(exc, TestInterrupted) else "failed"
            exc.partial = failed_result(tool_name, spec, str(exc), status, started)
        raise


def check_call(tool: Any, from_host: Any, reporter: Any, agent: Any, options: Any) -> None:
    """SpecError naming the argument of an API call (:func:`run`, ...) that is not what it
    must be: misuse is told as such, not as a TypeError from the resolver or the plugin
    loader."""
    is_reporter = all(callable(getattr(reporter, name, None)) for name in ("interval", "note"))
    checks = [
        ("tool", tool, isinstance(tool, str), "a tool name (string)"),
        ("from_host", from_host, from_host is None or isinstance(from_host, str), "a host name"),
        ("reporter", reporter, reporter is None or is_reporter,
         "a Reporter (with interval() and note())"),
        ("agent", agent, isinstance(agent, AgentAccess), "an AgentAccess"),
        ("tool_options", options, options is None or isinstance(options, dict), "a dict"),
    ]
    for name, value, right, what in checks:
        if not right:
            raise SpecError(f"{name} must be {what}, got {repr(value)[:40]}")


def spec_of(tool: str, host: str | None, fields: dict[str, Any]) -> TestSpec:
    """The TestSpec of an API call's keywords: SpecError naming those that are no field."""
    known = {field.name for field in attrs.fields(TestSpec)} - {"tool", "host"}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise SpecError(f"not a test spec field: {', '.join(unknown)} "
                        f"(known: {', '.join(sorted(known))})")
    return TestSpec(tool=tool, host=host, **fields)


__all__ = ["NO_SECRET", "AgentAccess", "availability", "check_call", "failed_result",
           "failure_recorded", "make_tool", "prepare", "run_spec", "spec_of",
           "unavailable_reasons"]
