"""Conformance kit for tool plugins: run it from a plugin's own test suite.

One line in a pytest module runs every check, one test per check::

    from netprobe.testing import conformance_tests
    from netprobe_qperf import QperfTool

    test_qperf_conformance = conformance_tests(QperfTool)

or, without pytest, ``check_tool(QperfTool)`` runs them all and raises
:class:`ConformanceError` listing every failure (a check that cannot run here, e.g. because
the tool's binary is not installed, is skipped and says why).

The checks (names in :data:`CHECKS`):

``api_version``
    The class is a :class:`~netprobe.plugin.Tool` with a ``name`` and declares a plugin API
    (``api_version``) this netprobe has: otherwise ``netprobe tools`` lists it as
    incompatible and never loads it.
``probe_without_binary``
    ``probe()`` answers (never raises) with PATH emptied and with the ``path`` option
    pointing nowhere; when it says unavailable it says why, and ``run()`` then raises
    :class:`~netprobe.errors.ToolUnavailable` instead of crashing.
``refuses_outside_capabilities``
    For every option the declared :class:`~netprobe.plugin.Capabilities` leave out, a spec
    using it is refused by ``check()`` and by ``run()`` (SpecError) before anything runs.
``honours_capabilities``
    Every option inside the capabilities is run on loopback (a few combined runs) unless
    ``refusals()`` refuses it with a reason (allowed: the installed binary may lack it); the
    result must reflect it: directions, stream count, byte count, rate, warm-up, intervals.
``loopback_run``
    A plain loopback run returns a Result that validates against the shipped JSON Schema,
    with intervals in time order and units that agree (bits_per_second equals
    bytes * 8 / seconds within 1 %, for intervals and summaries).
``reporter_contract``
    The Reporter contract (:class:`netprobe.plugin.Reporter`): in a loopback run whose
    reporter raises at its first interval, every interval call comes from one thread, the
    run still returns its Result (status ``ok``) with a warning about the reporter, and
    the Result keeps at least the intervals the reporter was handed.
``interrupt``
    Ctrl-C (SIGINT to this process) in the middle of a run raises TestInterrupted with the
    partial Result, promptly, and no process the run started is left alive.
``timeout``
    The same in a child process stopped from outside (SIGTERM, turned into SystemExit as a
    host should): the child exits promptly and leaves no process behind.

Processes are tracked by PID (and start time) through /proc while the run goes on; this
process becomes a child subreaper for the duration, so that a tool process that detaches
from its parent still counts as a descendant. Nothing is ever killed by name. Linux only.
Needs ``jsonschema`` (netprobe's ``test`` extra).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Callable

import attrs

from netprobe import convert
from netprobe.driven import free_port
from netprobe.errors import NetprobeError, SpecError, TestFailed, TestInterrupted, ToolUnavailable
from netprobe.plugin import (
    API_VERSION,
    MEASURES,
    RANGED_CAPABILITIES,
    SWITCHES,
    Availability,
    Tool,
)
from netprobe.schema import (
    DIRECTIONS,
    Interval,
    Result,
    TestSpec,
)
from netprobe.testing.honoured import honoured_problems
from netprobe.testing.processes import (
    _POLL_S,
    ProcessWatch,
    _describe,
    descendants,
    subreaper,
)
from netprobe.testing.validation import _sides, validate_result

CHECKS: tuple[str, ...] = (
    "api_version",
    "probe_without_binary",
    "refuses_outside_capabilities",
    "honours_capabilities",
    "loopback_run",
    "reporter_contract",
    "interrupt",
    "timeout",
)
"""Names of the checks, in the order :func:`check_tool` runs them."""

KNOWN_CAPABILITIES = RANGED_CAPABILITIES | {switch.capability for switch in SWITCHES}
"""Capabilities fields this kit knows how to exercise; others are reported as unchecked."""

_STOP_BOUND_S = 10.0
"""How long a tool may take to stop after Ctrl-C or SIGTERM."""
_GONE_BOUND_S = 5.0
"""How long its processes may take to disappear after that."""


class ConformanceError(AssertionError):
    """A tool failed one or more checks; the message lists each failure."""


class CheckSkipped(Exception):
    """A check cannot run here (tool unavailable, not in the main thread, ...)."""


@attrs.frozen
class Settings:
    """How the kit drives the tool under test."""

    options: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)
    """Options passed to the tool's constructor."""
    duration_s: float = 2.0
    """Length of each loopback run."""
    long_duration_s: float = 30.0
    """Length of the runs that get interrupted (they are stopped long before)."""
    interrupt_after_s: float = 0.5
    """How long after the tool visibly started (a child process, a note or an interval)
    the interrupt is sent."""
    tolerance: float = 0.01
    """Relative tolerance of bits_per_second against bytes * 8 / seconds."""
    udp_rate_bits_per_second: float = 200e6
    """Rate of UDP runs when the tool can limit it (keeps a 2-core machine responsive)."""


@attrs.frozen
class CheckOutcome:
    """What one check found."""

    name: str
    """The check (one of :data:`CHECKS`)."""
    status: str
    """``passed``, ``failed`` or ``skipped``."""
    problems: tuple[str, ...] = ()
    """Why it failed (or, for ``skipped``, why it could not run)."""
    notes: tuple[str, ...] = ()
    """Facts worth knowing that are not failures (e.g. options refused by this install)."""


class RecordingReporter:
    """A Reporter that keeps every interval and note it is given, and the threads used."""

    def __init__(self) -> None:
        self.intervals: list[Interval] = []
        self.notes: list[str] = []
        self.threads: set[int] = set()
        self.event = threading.Event()

    def interval(self, sample: Interval) -> None:
        """Record one interval sample."""
        self.intervals.append(sample)
        self.threads.add(threading.get_ident())
        self.event.set()

    def note(self, message: str) -> None:
        """Record one progress message."""
        self.notes.append(message)
        self.threads.add(threading.get_ident())
        self.event.set()


class _FailingReporter:
    """Raises at its first interval (as a broken screen would); records every call's thread."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def interval(self, sample: Interval) -> None:
        self.calls.append(threading.get_ident())
        if len(self.calls) == 1:
            raise RuntimeError("reporter failure injected by the conformance kit")

    def note(self, message: str) -> None:
        pass


def _reporter_problems(result: Result, reporter: _FailingReporter) -> list[str]:
    problems = []
    if len(set(reporter.calls)) > 1:
        problems.append(f"intervals reached the reporter from {len(set(reporter.calls))} "
                        "threads; the contract is one thread per run")
    if result.status != "ok":
        problems.append(f"a failing reporter changed the status to {result.status!r}")
    if not any("reporter" in warning for warning in result.warnings):
        problems.append("the reporter's failure is not in the result's warnings")
    if len(result.intervals) < len(reporter.calls):
        problems.append(f"the result keeps {len(result.intervals)} intervals; the reporter "
                        f"was handed {len(reporter.calls)}")
    return problems


# --- public entry points -------------------------------------------------------------------


def check_tool(
    tool_cls: type[Tool],
    options: Mapping[str, Any] | None = None,
    checks: Sequence[str] = CHECKS,
    **settings: Any,
) -> list[CheckOutcome]:
    """Run ``checks`` on ``tool_cls``; raise ConformanceError naming every failure.

    ``settings`` are fields of :class:`Settings` (``duration_s``, ``tolerance``, ...).
    Returns the outcomes (passed and skipped ones) when nothing failed.
    """
    kit = Conformance(tool_cls, Settings(options=options or {}, **settings))
    outcomes = [kit.outcome(name) for name in checks]
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        raise ConformanceError(_describe_failures(tool_cls, failed))
    return outcomes


def run_check(
    tool_cls: type[Tool], name: str, options: Mapping[str, Any] | None = None, **settings: Any
) -> CheckOutcome:
    """Run one check: ConformanceError if it fails, CheckSkipped if it cannot run here."""
    outcome = Conformance(tool_cls, Settings(options=options or {}, **settings)).outcome(name)
    if outcome.status == "failed":
        raise ConformanceError(_describe_failures(tool_cls, [outcome]))
    if outcome.status == "skipped":
        raise CheckSkipped("; ".join(outcome.problems))
    return outcome


def conformance_tests(
    tool_cls: type[Tool], options: Mapping[str, Any] | None = None, **settings: Any
) -> Callable[[str], None]:
    """A pytest test function, parametrized over :data:`CHECKS`, for ``tool_cls``.

    Assign it to a ``test_*`` name in a test module; a check that cannot run here is
    reported by pytest as skipped, with the reason.
    """
    import pytest  # only when called from a test suite

    @pytest.mark.parametrize("check", CHECKS)
    def test_conformance(check: str) -> None:
        try:
            run_check(tool_cls, check, options, **settings)
        except CheckSkipped as exc:
            pytest.skip(str(exc))

    test_conformance.__doc__ = f"netprobe conformance of {tool_cls.__name__}"
    return test_conformance


def declared(tool_cls: type[Tool]) -> frozenset[str]:
    """What ``tool_cls`` declares it measures (``Tool.measures``), as a set of names."""
    found = getattr(tool_cls, "measures", None)
    return frozenset(found) if isinstance(found, (set, frozenset, tuple, list)) else frozenset()


def declaration_problems(tool_cls: type[Tool]) -> list[str]:
    """What is wrong with what ``tool_cls`` declares it measures."""
    found = getattr(tool_cls, "measures", None)
    known = ", ".join(sorted(MEASURES))
    if not isinstance(found, (set, frozenset)) or not all(isinstance(m, str) for m in found):
        return [f"measures must be a frozenset of names ({known}), not {found!r}"[:200]]
    if not found:
        return [f"measures declares nothing: a tool measures one or more of {known}"]
    return [f"measures declares {name!r}: not one of {known}"
            for name in sorted(found - MEASURES)]


def _unexpected(exc: BaseException) -> str:
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"unexpected {type(exc).__name__}: {exc}{where}"


def _describe_failures(tool_cls: type[Tool], failed: Sequence[CheckOutcome]) -> str:
    lines = [f"{tool_cls.__name__} ({getattr(tool_cls, 'name', '?')}) fails netprobe conformance:"]
    for outcome in failed:
        lines += [f"  {outcome.name}: {problem}" for problem in outcome.problems]
    return "\n".join(lines)


# --- the checks ----------------------------------------------------------------------------


class Conformance:
    """The checks for one tool class under one set of :class:`Settings`."""

    def __init__(self, tool_cls: type[Tool], settings: Settings | None = None) -> None:
        self.tool_cls = tool_cls
        self.settings = settings or Settings()
        self.name = str(getattr(tool_cls, "name", tool_cls.__name__))

    def tool(self, **extra: Any) -> Tool:
        """A fresh instance with the kit's options (plus ``extra``)."""
        return self.tool_cls({**self.settings.options, **extra})

    def outcome(self, check: str) -> CheckOutcome:
        """Run one check and say how it went (never raises for a tool's failure)."""
        method = getattr(self, f"check_{check}", None)
        if check not in CHECKS or method is None:
            raise ValueError(f"no conformance check named {check!r} (known: {CHECKS})")
        notes: list[str] = []
        try:
            problems = method(notes)
        except CheckSkipped as exc:
            return CheckOutcome(check, "skipped", (str(exc),), tuple(notes))
        except Exception as exc:  # the tool raised where the contract says it must not
            return CheckOutcome(check, "failed", (_unexpected(exc),), tuple(notes))
        status = "failed" if problems else "passed"
        return CheckOutcome(check, status, tuple(problems), tuple(notes))

    # -- helpers --------------------------------------------------------------------------

    def require_available(self) -> Availability:
        """The tool's probe() answer; CheckSkipped when it cannot run here."""
        try:
            found = self.tool().probe()
        except Exception as exc:
            raise CheckSkipped(f"probe() raised {type(exc).__name__}: {exc}") from None
        if not isinstance(found, Availability) or not found.available:
            why = "; ".join(getattr(found, "reasons", ())) or "no reason given"
            raise CheckSkipped(f"{self.name} cannot run here: {why}")
        return found

    def base_spec(self, protocol: str | None = None, direction: str | None = None,
                  **changes: Any) -> TestSpec:
        """The plainest loopback spec the capabilities allow, with ``changes``."""
        caps = self.tool_cls.capabilities
        protocols = caps.spec_protocols
        protocol = protocol or ("tcp" if "tcp" in protocols else sorted(protocols)[0])
        direction = direction or (
            "normal" if "normal" in caps.directions else sorted(caps.directions)[0]
        )
        interval = None if caps.min_interval_s is None else max(caps.min_interval_s, 0.5)
        fields: dict[str, Any] = {
            "tool": self.name, "protocol": protocol, "direction": direction,
            "duration_s": self.settings.duration_s, "interval_s": interval,
        }
        if protocol in caps.rate_limit and protocol == "udp":
            fields["rate_bits_per_second"] = self.settings.udp_rate_bits_per_second
        fields.update(changes)
        return TestSpec(**fields)

    # -- api_version ----------------------------------------------------------------------

    def check_api_version(self, notes: list[str]) -> list[str]:
        """The plugin is a Tool, named, for a plugin API this netprobe has."""
        from netprobe.registry import _incompatibility

        problem = _incompatibility(self.tool_cls)
        if problem:
            return [f"netprobe would not load it: {problem}"]
        name = getattr(self.tool_cls, "name", None)
        if not isinstance(name, str) or not name.strip():
            return ["the class sets no name (what users type after --tool)"]
        notes.append(f"written for plugin API {self.tool_cls.api_version}; this netprobe has "
                     f"{API_VERSION}")
        return declaration_problems(self.tool_cls)

    # -- probe_without_binary -------------------------------------------------------------

    def check_probe_without_binary(self, notes: list[str]) -> list[str]:
        """probe() answers without raising when the binary cannot be found, and says why."""
        problems, normal = self._probe_once("as installed", {})
        with _environment_without_binary(normal) as where:
            more, hidden = self._probe_once(f"with PATH={where}", {})
            problems += more
            if hidden is not None and not hidden.available:
                problems += self._run_unavailable()
            elif hidden is not None and normal is not None and normal.path:
                notes.append(f"still available without PATH (path {hidden.path!r})")
        missing = os.path.join(tempfile.gettempdir(), "netprobe-kit-nowhere", self.name)
        problems += self._probe_once(f"with option path={missing!r}", {"path": missing})[0]
        return problems

    def _probe_once(
        self, how: str, extra: dict[str, Any]
    ) -> tuple[list[str], Availability | None]:
        started = time.monotonic()
        try:
            found = self.tool(**extra).probe()
        except Exception as exc:
            return [f"probe() {how} raised {type(exc).__name__}: {exc}"], None
        took = time.monotonic() - started
        if not isinstance(found, Availability):
            return [f"probe() {how} returned {type(found).__name__}, not Availability"], None
        problems = []
        if not found.available and not [r for r in found.reasons if str(r).strip()]:
            problems.append(f"probe() {how} says unavailable without a reason")
        if found.available and found.path and not os.path.exists(found.path):
            problems.append(f"probe() {how} says available with a path that does not exist: "
                            f"{found.path}")
        if took > 15:
            problems.append(f"probe() {how} took {took:.1f} s")
        return problems, found

    def _run_unavailable(self) -> list[str]:
        spec = self.base_spec()
        try:
            self.tool().run(spec, RecordingReporter())
        except ToolUnavailable:
            return []
        except NetprobeError as exc:
            return [f"run() without its binary raised {type(exc).__name__}, "
                    f"not ToolUnavailable: {exc}"]
        except Exception as exc:
            return [f"run() without its binary crashed with {type(exc).__name__}: {exc}"]
        return ["run() without its binary returned a result although probe() said unavailable"]

    # -- refuses_outside_capabilities -----------------------------------------------------

    def check_refuses_outside_capabilities(self, notes: list[str]) -> list[str]:
        """Every option outside the capabilities is refused by check() and run()."""
        unknown = sorted({f.name for f in attrs.fields(type(self.tool_cls.capabilities))}
                         - KNOWN_CAPABILITIES)
        if unknown:
            notes.append(f"capabilities not checked by this kit: {', '.join(unknown)}")
        problems = []
        for label, spec in self.outside_specs():
            problems += self._refused(label, spec)
        if not problems and not self.outside_specs():
            notes.append("the capabilities leave nothing out")
        return problems

    def outside_specs(self) -> list[tuple[str, TestSpec]]:
        """One spec per option the capabilities leave out, labelled with that option."""
        caps = self.tool_cls.capabilities
        base = self.base_spec()
        found = [(f"protocol {p}", self.base_spec(protocol=p)) for p in ("tcp", "udp")
                 if p not in caps.spec_protocols]
        found += [(f"direction {d}", attrs.evolve(base, direction=d)) for d in DIRECTIONS
                  if d not in caps.directions]
        if caps.max_streams is not None:
            found.append((f"{caps.max_streams + 1} streams",
                          attrs.evolve(base, streams=caps.max_streams + 1)))
        if not caps.byte_count:
            found.append(("byte count", attrs.evolve(base, bytes_total=1 << 20, duration_s=None)))
        found += self._outside_intervals(base)
        if not caps.omit:
            found.append(("omit", attrs.evolve(base, omit_s=1.0)))
        found += [(f"rate limit on {p}", self.base_spec(protocol=p, rate_bits_per_second=1e6))
                  for p in sorted(caps.spec_protocols) if p not in caps.rate_limit]
        found += [(name, attrs.evolve(base, **change)) for name, change in _SWITCHES.items()
                  if not getattr(caps, name)]
        return found

    def _outside_intervals(self, base: TestSpec) -> list[tuple[str, TestSpec]]:
        shortest = self.tool_cls.capabilities.min_interval_s
        if shortest is None:
            return [("interval reports", attrs.evolve(base, interval_s=1.0))]
        if shortest >= 0.002:
            return [(f"interval {shortest / 2:g} s", attrs.evolve(base, interval_s=shortest / 2))]
        return []

    def _refused(self, label: str, spec: TestSpec) -> list[str]:
        tool = self.tool()
        try:
            tool.check(spec)
        except SpecError as exc:
            if not str(exc).strip():
                return [f"{label}: check() refused it without saying why"]
        except Exception as exc:
            return [f"{label}: check() raised {type(exc).__name__}, not SpecError: {exc}"]
        else:
            return [f"{label} is outside the capabilities but check() accepts it"]
        return self._run_refuses(label, spec)

    def _run_refuses(self, label: str, spec: TestSpec) -> list[str]:
        reporter = RecordingReporter()
        with ProcessWatch(os.getpid(), descendants(os.getpid())) as watch:
            try:
                self.tool().run(spec, reporter)
            except SpecError:
                return self._nothing_ran(label, reporter, watch)
            except ToolUnavailable as exc:
                if not self.tool().probe().available:  # refused all the same, for another reason
                    return self._nothing_ran(label, reporter, watch)
                return [f"{label}: run() raised ToolUnavailable, not SpecError: {exc}"]
            except Exception as exc:
                return [f"{label}: run() raised {type(exc).__name__}, not SpecError: {exc}"]
        return [f"{label} is outside the capabilities but run() ran it"]

    @staticmethod
    def _nothing_ran(label: str, reporter: RecordingReporter, watch: ProcessWatch) -> list[str]:
        problems = []
        if reporter.intervals or reporter.notes:
            problems.append(f"{label}: run() reported progress before refusing it")
        if watch.seen:
            problems.append(f"{label}: run() started processes before refusing it: "
                            f"{_describe(list(watch.seen.values()))}")
        return problems

    # -- honours_capabilities -------------------------------------------------------------

    def check_honours_capabilities(self, notes: list[str]) -> list[str]:
        """Every option inside the capabilities is run, and the result reflects it."""
        self.require_available()
        plan, refused = self.inside_plan()
        notes += [f"refused by this install (allowed, it says why): {r}" for r in refused]
        problems: list[str] = []
        fastest = 0.0
        # Byte-count runs go last, sized to last about duration_s at the speed seen so far:
        # a tool that prints seconds with two decimals cannot be checked to 1 % on 40 ms.
        for labels, spec in sorted(plan, key=lambda item: item[1].bytes_total is not None):
            if spec.bytes_total is not None:
                spec = self._sized(spec, fastest, notes)
            found, result = self.run_and_verify(spec)
            problems += [f"[{', '.join(labels)}] {p}" for p in found]
            fastest = max(fastest, _fastest(result))
        return problems

    def _sized(self, spec: TestSpec, bits_per_second: float, notes: list[str]) -> TestSpec:
        if bits_per_second <= 0:
            return spec
        mib = 1 << 20
        wanted = bits_per_second * self.settings.duration_s / 8 / spec.streams
        sized = attrs.evolve(spec, bytes_total=int(min(max(wanted, 4 * mib), 4 << 30)) // mib * mib)
        if self.tool().refusals(sized):
            return spec
        notes.append(f"byte count sized to {sized.bytes_total} bytes per stream")
        return sized

    def inside_plan(self) -> tuple[list[tuple[list[str], TestSpec]], list[str]]:
        """Runs covering every option inside the capabilities (options combined where the
        tool accepts the combination), and the options its refusals() turn down."""
        groups: list[tuple[list[str], TestSpec]] = []
        refused: list[str] = []
        for label, spec in self._axis_specs():
            reasons = self.tool().refusals(spec)
            if reasons:
                refused.append(f"{label}: {'; '.join(reasons)}")
            else:
                groups.append(([label], spec))
        for label, protocol, change, alone in self._inside_options():
            if not self._join(groups, label, protocol, change, alone):
                spec = self.base_spec(protocol=protocol, **change)
                reasons = self.tool().refusals(spec)
                if reasons:
                    refused.append(f"{label}: {'; '.join(reasons)}")
                else:
                    groups.append(([label], spec))
        return groups, refused

    def _join(self, groups: list[tuple[list[str], TestSpec]], label: str, protocol: str,
              change: dict[str, Any], alone: bool) -> bool:
        if alone:
            return False
        for labels, spec in groups:
            if spec.protocol != protocol or spec.bytes_total is not None or spec.ip_version:
                continue
            if set(change) & _changed_fields(spec, self.base_spec(protocol=protocol)):
                continue
            try:
                joined = attrs.evolve(spec, **change)
            except (SpecError, ValueError):
                continue
            if not self.tool().refusals(joined):
                groups[groups.index((labels, spec))] = ([*labels, label], joined)
                return True
        return False

    def _axis_specs(self) -> list[tuple[str, TestSpec]]:
        caps = self.tool_cls.capabilities
        protocols = sorted(caps.spec_protocols, key=lambda p: p != "tcp")
        directions = sorted(caps.directions, key=lambda d: d != "normal")
        count = max(len(protocols), len(directions))
        found = []
        for index in range(count):
            protocol = protocols[index % len(protocols)]
            direction = directions[index % len(directions)]
            spec = self.base_spec(protocol=protocol, direction=direction)
            if self.tool().refusals(spec) and index:
                # the pair does not go together here: try each on its own
                found.append((f"protocol {protocol}", self.base_spec(protocol=protocol)))
                found.append((f"direction {direction}", self.base_spec(direction=direction)))
            else:
                found.append((f"{protocol} {direction}", spec))
        return found

    def _inside_options(self) -> list[tuple[str, str, dict[str, Any], bool]]:
        """(label, protocol, spec changes, must run alone) for each option inside."""
        caps = self.tool_cls.capabilities
        tcp = "tcp" if "tcp" in caps.spec_protocols else sorted(caps.spec_protocols)[0]
        found: list[tuple[str, str, dict[str, Any], bool]] = []
        if caps.max_streams is None or caps.max_streams >= 2:
            found.append(("2 streams", tcp, {"streams": 2}, False))
        if caps.byte_count:
            found.append(("byte count", tcp, {"bytes_total": 32 << 20, "duration_s": None}, True))
        if caps.omit:
            found.append(("omit", tcp, {"omit_s": 1.0}, False))
        if caps.min_interval_s is not None:
            found.append(("interval", tcp, {"interval_s": max(caps.min_interval_s, 0.5)}, False))
        for protocol in sorted(caps.rate_limit & caps.spec_protocols):
            rate = 100e6 if protocol == "tcp" else 50e6
            found.append((f"rate limit on {protocol}", protocol,
                          {"rate_bits_per_second": rate}, False))
        for name, change in _inside_switches(caps).items():
            protocol = "udp" if name == "length" and "udp" in caps.protocols else tcp
            found.append((name, protocol, change, name == "ipv6"))
        return found

    def run_and_verify(self, spec: TestSpec) -> tuple[list[str], Result | None]:
        """Run ``spec`` on loopback: what is wrong with its result (empty when fine), and
        the result (None when the run raised)."""
        reporter = RecordingReporter()
        try:
            result = self.tool().run(spec, reporter)
        except TestFailed as exc:
            return [f"run failed: {exc}"], None
        except NetprobeError as exc:
            return [f"run raised {type(exc).__name__}: {exc}"], None
        problems = validate_result(result, spec, self.settings.tolerance)
        return problems + honoured_problems(result, spec, declared(self.tool_cls)), result

    # -- loopback_run ---------------------------------------------------------------------

    def check_loopback_run(self, notes: list[str]) -> list[str]:
        """A plain loopback run gives a valid, consistent Result."""
        spec, problems = self.plain_spec()
        return problems or self.run_and_verify(spec)[0]

    def plain_spec(self) -> tuple[TestSpec, list[str]]:
        """The plainest loopback spec (the tool must be available), and problems if the
        tool refuses it."""
        self.require_available()
        spec = self.base_spec()
        return spec, self.refused_plain(spec)

    def refused_plain(self, spec: TestSpec) -> list[str]:
        """Problems if the tool refuses its own plainest spec."""
        reasons = self.tool().refusals(spec)
        return [f"the plainest loopback spec is refused: {'; '.join(reasons)}"] if reasons else []

    # -- reporter_contract ----------------------------------------------------------------

    def check_reporter_contract(self, notes: list[str]) -> list[str]:
        """A reporter that raises costs no result; intervals come from one thread."""
        spec, problems = self.plain_spec()
        if problems:
            return problems
        reporter = _FailingReporter()
        try:
            result = self.tool().run(spec, reporter)
        except TestFailed as exc:
            return [f"a reporter that raised made the run fail: {exc}"]
        if not reporter.calls:
            notes.append("no live intervals: a failing reporter was not exercised")
            return []
        return _reporter_problems(result, reporter)

    # -- interrupt ------------------------------------------------------------------------

    def check_interrupt(self, notes: list[str]) -> list[str]:
        """Ctrl-C in the middle of a run: TestInterrupted, promptly, nothing left running."""
        self.require_available()
        if threading.current_thread() is not threading.main_thread():
            raise CheckSkipped("Ctrl-C can only be simulated in the main thread")
        spec = self.base_spec(duration_s=self.settings.long_duration_s)
        problems = self.refused_plain(spec)
        if problems:
            return problems

        def interrupted(watch: ProcessWatch) -> list[str]:
            raised, sent_at, ended_at = self._interrupted_run(spec, watch)
            return _interrupt_problems(raised, sent_at, ended_at, "Ctrl-C")

        return _watched(notes, "Ctrl-C left processes running", interrupted)

    def _interrupted_run(
        self, spec: TestSpec, watch: ProcessWatch
    ) -> tuple[Any, float | None, float]:
        reporter = RecordingReporter()
        state = {"running": True, "sent": None}
        previous = signal.getsignal(signal.SIGINT)

        def on_sigint(signum: int, frame: Any) -> None:
            if state["running"]:
                raise KeyboardInterrupt

        signal.signal(signal.SIGINT, on_sigint)
        timer = threading.Thread(
            target=self._send_later, args=(state, watch, reporter, os.getpid, signal.SIGINT),
            daemon=True,
        )
        outcome: Any = None
        try:
            timer.start()
            try:
                outcome = self.tool().run(spec, reporter)
            except BaseException as exc:  # what the tool raises, Ctrl-C included, is the finding
                outcome = exc
        finally:
            state["running"] = False
            timer.join(5.0)
            signal.signal(signal.SIGINT, previous)
        return outcome, state["sent"], time.monotonic()

    def _send_later(self, state: dict[str, Any], watch: ProcessWatch,
                    reporter: RecordingReporter, target: Callable[[], int], sig: int) -> None:
        _wait_started(watch, reporter, 5.0)
        time.sleep(self.settings.interrupt_after_s)
        if state["running"]:
            state["sent"] = time.monotonic()
            os.kill(target(), sig)

    # -- timeout --------------------------------------------------------------------------

    def check_timeout(self, notes: list[str]) -> list[str]:
        """A run in a child process stopped by SIGTERM leaves no process behind."""
        self.require_available()
        spec = self.base_spec(duration_s=self.settings.long_duration_s)
        problems = self.refused_plain(spec)
        if problems:
            return problems
        return _watched(notes, "after SIGTERM, processes were left running",
                        lambda watch: self._stopped_child(spec, watch, notes))

    def _stopped_child(self, spec: TestSpec, watch: ProcessWatch, notes: list[str]) -> list[str]:
        child = subprocess.Popen(
            self._child_argv(spec), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, env=_child_env(),
        )
        try:
            return self._stop_child(child, watch, notes)
        finally:
            if child.poll() is None:
                child.kill()
            child.wait(10)
            if child.stdout is not None:
                child.stdout.close()

    def _child_argv(self, spec: TestSpec) -> list[str]:
        target = f"{self.tool_cls.__module__}:{self.tool_cls.__qualname__}"
        return [sys.executable, "-m", "netprobe.testing", "--run-child", target,
                json.dumps(self.settings.options, default=str),
                json.dumps(convert.unstructure(spec))]

    def _stop_child(self, child: subprocess.Popen[bytes], watch: ProcessWatch,
                    notes: list[str]) -> list[str]:
        lines = _Lines(child)
        if not lines.wait_for("running", 30.0):
            raise CheckSkipped(f"the child process could not run the tool: {lines.text()}"[:500])
        deadline = time.monotonic() + 5.0
        while not lines.has("started") and time.monotonic() < deadline:
            if any(p.pid != child.pid for p in watch.seen.values()):
                break
            time.sleep(_POLL_S)
        time.sleep(self.settings.interrupt_after_s)
        if child.poll() is not None:
            return [f"the run ended by itself (exit code {child.returncode}) before it could be "
                    "stopped: the tool does not run for the duration asked"]
        sent = time.monotonic()
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(_STOP_BOUND_S)
        except subprocess.TimeoutExpired:
            return [f"the child running the tool did not exit within {_STOP_BOUND_S:g} s of "
                    "SIGTERM (it was then killed)"]
        lines.close()
        notes.append(f"stopped {time.monotonic() - sent:.2f} s after SIGTERM: "
                     f"{lines.text()[-300:]}")
        return []


class _Lines:
    """The child's output, read by a thread so that waiting for a line is bounded."""

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        self._lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(child,), daemon=True)
        self._thread.start()

    def _read(self, child: subprocess.Popen[bytes]) -> None:
        assert child.stdout is not None
        for raw in iter(child.stdout.readline, b""):
            with self._cond:
                self._lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._cond.notify_all()

    def has(self, prefix: str) -> bool:
        """Has a line starting with ``prefix`` been printed?"""
        with self._cond:
            return any(line.startswith(prefix) for line in self._lines)

    def wait_for(self, prefix: str, bound_s: float) -> bool:
        """Wait (at most ``bound_s``) for a line starting with ``prefix``."""
        deadline = time.monotonic() + bound_s
        with self._cond:
            while not any(line.startswith(prefix) for line in self._lines):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(min(remaining, 0.2))
        return True

    def close(self) -> None:
        """Wait (bounded) for the end of the output."""
        self._thread.join(5.0)

    def text(self) -> str:
        """Everything printed so far."""
        with self._cond:
            return " | ".join(self._lines)


_SWITCHES: dict[str, dict[str, Any]] = {
    switch.capability: switch.example for switch in SWITCHES if switch.capability != "omit"
}
"""The spec change that asks for each on/off capability (from plugin.SWITCHES; the warm-up
has checks of its own)."""


def _inside_switches(caps: Any) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for name, change in _SWITCHES.items():
        if not getattr(caps, name):
            continue
        if name == "congestion":
            algorithm = _a_congestion_algorithm()
            if algorithm is None:
                continue
            change = {"congestion": algorithm}
        if name == "ipv6" and not _has_ipv6_loopback():
            continue
        if name == "port":
            change = {"port": free_port()}
        if name == "length":
            change = {"length_bytes": 1200}
        found[name] = change
    return found


def _a_congestion_algorithm() -> str | None:
    """A TCP congestion control algorithm this process can set: cubic where it may, else
    the first it may. Without CAP_NET_ADMIN only those of tcp_allowed_congestion_control
    are allowed, and a host may list cubic as available but not allowed (this one: bbr
    and reno), so each is tried on a socket of its own rather than read off a list."""
    names: list[str] = []
    for listed in ("tcp_allowed_congestion_control", "tcp_available_congestion_control"):
        with contextlib.suppress(OSError):
            names += Path(f"/proc/sys/net/ipv4/{listed}").read_text().split()
    for name in sorted(dict.fromkeys(names), key=lambda n: n != "cubic"):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:  # TCP_CONGESTION is Linux's 13 (the engine's sockets module names it)
                probe.setsockopt(socket.IPPROTO_TCP, getattr(socket, "TCP_CONGESTION", 13),
                                 name.encode())
            except OSError:
                continue
        return name
    return None


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


def _fastest(result: Result | None) -> float:
    if not isinstance(result, Result):
        return 0.0
    rates = [side.bits_per_second for _what, _slot, side in _sides(result)]
    return max(rates, default=0.0)


def _changed_fields(spec: TestSpec, base: TestSpec) -> set[str]:
    return {f.name for f in attrs.fields(TestSpec)
            if getattr(spec, f.name) != getattr(base, f.name)}


def _wait_started(watch: ProcessWatch, reporter: RecordingReporter, bound_s: float) -> None:
    """Wait until the tool visibly started (a new process, a note or an interval); at most
    ``bound_s``."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline and not (reporter.event.is_set() or watch.seen):
        time.sleep(_POLL_S)


def _watched(
    notes: list[str], left_what: str, body: Callable[[ProcessWatch], list[str]]
) -> list[str]:
    """Run ``body`` with this process a subreaper and its descendants watched: its
    problems, plus any process still running a while after it returned."""
    with subreaper() as reaping, ProcessWatch(os.getpid(), descendants(os.getpid())) as watch:
        if not reaping:
            notes.append("not a subreaper here: detached processes may go unseen")
        problems = body(watch)
        left = watch.left_running(_GONE_BOUND_S)
        watch.reap()
    if left:
        problems.append(f"{left_what}: {_describe(left)}")
    return problems


def _interrupt_problems(raised: Any, sent_at: float | None, ended_at: float,
                        how: str) -> list[str]:
    if sent_at is None:
        return [f"the run ended by itself before {how} could be sent: the tool does not run "
                "for the duration asked"]
    problems = []
    took = ended_at - sent_at
    if took > _STOP_BOUND_S:
        problems.append(f"the run took {took:.1f} s to stop after {how}")
    if isinstance(raised, TestInterrupted):
        partial = raised.partial
        if isinstance(partial, Result):
            if partial.status != "interrupted":
                problems.append(f"the partial result's status is {partial.status!r}, "
                                "not 'interrupted'")
            problems += [f"partial result: {p}" for p in validate_result(partial)]
    elif isinstance(raised, KeyboardInterrupt):
        problems.append(f"{how} escaped as KeyboardInterrupt: run() should raise "
                        "TestInterrupted with the partial Result")
    elif isinstance(raised, Result):
        problems.append(f"{how} was ignored: run() returned a result with status "
                        f"{raised.status!r}")
    else:
        problems.append(f"after {how}, run() raised {type(raised).__name__}: {raised}")
    return problems


# --- the environment without the binary ---------------------------------------------------


@contextlib.contextmanager
def _environment_without_binary(normal: Availability | None) -> Iterator[str]:
    """PATH set to an empty directory; variables naming the tool's binary removed."""
    saved = dict(os.environ)
    path = normal.path if normal is not None else None
    with tempfile.TemporaryDirectory(prefix="netprobe-kit-empty-") as empty:
        try:
            os.environ["PATH"] = empty
            for key, value in saved.items():
                if path and value and (value == path or os.path.basename(value) ==
                                       os.path.basename(path)):
                    del os.environ[key]
            yield empty
        finally:
            os.environ.clear()
            os.environ.update(saved)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env
