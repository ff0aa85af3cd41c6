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
import ctypes
import datetime
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Callable, Optional

import attrs

from netprobe import convert
from netprobe.driven import free_port
from netprobe.errors import NetprobeError, SpecError, TestFailed, TestInterrupted, ToolUnavailable
from netprobe.plugin import RANGED_CAPABILITIES, SWITCHES, Availability, Tool
from netprobe.schema import (
    DIRECTIONS,
    STATUSES,
    Interval,
    Latency,
    Result,
    SideSummary,
    TestSpec,
)

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

_POLL_S = 0.02
_STOP_BOUND_S = 10.0
"""How long a tool may take to stop after Ctrl-C or SIGTERM."""
_GONE_BOUND_S = 5.0
"""How long its processes may take to disappear after that."""
_PR_SET_CHILD_SUBREAPER = 36
_ORDER_SLACK_S = 0.05
"""Intervals of different series that start this close together count as simultaneous."""


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
    options: Optional[Mapping[str, Any]] = None,
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
    tool_cls: type[Tool], name: str, options: Optional[Mapping[str, Any]] = None, **settings: Any
) -> CheckOutcome:
    """Run one check: ConformanceError if it fails, CheckSkipped if it cannot run here."""
    outcome = Conformance(tool_cls, Settings(options=options or {}, **settings)).outcome(name)
    if outcome.status == "failed":
        raise ConformanceError(_describe_failures(tool_cls, [outcome]))
    if outcome.status == "skipped":
        raise CheckSkipped("; ".join(outcome.problems))
    return outcome


def conformance_tests(
    tool_cls: type[Tool], options: Optional[Mapping[str, Any]] = None, **settings: Any
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


# --- result validation (usable on its own, e.g. on parse() results) ----------------------


def validate_result(
    result: Any, spec: Optional[TestSpec] = None, tolerance: float = 0.01
) -> list[str]:
    """Everything wrong with ``result`` (empty when it is fine): JSON Schema, JSON round
    trip, start time, interval order (within each series, and overall by start time within
    50 ms), units (throughput = bytes * 8 / seconds within
    ``tolerance``), signs and ranges, latency ordering, and, with ``spec``, the duration."""
    if not isinstance(result, Result):
        return [f"run() returned {type(result).__name__}, not a netprobe Result"]
    problems = _schema_problems(result)
    problems += _start_time_problems(result.start_time)
    problems += _interval_problems(result.intervals, tolerance)
    problems += _summary_problems(result, tolerance)
    problems += _latency_problems(result.latency)
    if spec is not None and result.status == "ok":
        problems += _duration_problems(result, spec)
    return problems


def _schema_problems(result: Result) -> list[str]:
    import jsonschema  # netprobe[test]

    try:
        text = convert.to_json(result)
    except (TypeError, ValueError) as exc:
        return [f"result cannot be written as JSON: {exc}"]
    problems = []
    try:
        jsonschema.validate(json.loads(text), shipped_schema())
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        problems.append(f"result does not validate against the JSON Schema at {where}: "
                        f"{exc.message}")
    if convert.from_json(text) != result:
        problems.append("result changes when written to JSON and read back")
    if result.status not in STATUSES:
        problems.append(f"status {result.status!r} is not one of {STATUSES}")
    return problems


def shipped_schema() -> dict[str, Any]:
    """The JSON Schema of a Result as shipped in the package (result.schema.json)."""
    from importlib import resources

    text = resources.files("netprobe").joinpath("result.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _start_time_problems(start_time: Optional[str]) -> list[str]:
    if start_time is None:
        return []
    try:
        parsed = datetime.datetime.fromisoformat(start_time.replace("Z", "+00:00"))
    except ValueError:
        return [f"start_time {start_time!r} is not ISO 8601"]
    if parsed.utcoffset() != datetime.timedelta(0):
        return [f"start_time {start_time!r} is not UTC"]
    return []


def _rate_problem(what: str, nbytes: int, seconds: float, bps: float, tol: float) -> list[str]:
    if seconds < 0 or nbytes < 0 or bps < 0 or not math.isfinite(bps):
        return [f"{what}: negative or non-finite figure (bytes {nbytes}, "
                f"{seconds:g} s, {bps:g} bit/s)"]
    if seconds == 0:
        return [] if nbytes == 0 else [f"{what}: {nbytes} bytes in a zero-length span"]
    expected = nbytes * 8 / seconds
    if math.isclose(bps, expected, rel_tol=tol, abs_tol=1.0):
        return []
    return [f"{what}: bits_per_second {bps:.6g} but bytes * 8 / seconds = {nbytes} * 8 / "
            f"{seconds:.6g} = {expected:.6g} (off by {abs(bps / expected - 1) * 100:.2f} %)"
            if expected else f"{what}: bits_per_second {bps:g} for 0 bytes"]


def _interval_problems(intervals: Sequence[Interval], tol: float) -> list[str]:
    problems: list[str] = []
    last: dict[tuple[str, str, Optional[int]], Interval] = {}
    latest = 0.0
    for index, item in enumerate(intervals):
        what = f"interval {index} ({item.direction} {item.role} stream {item.stream_id})"
        if item.end_s <= item.start_s or item.start_s < 0:
            problems.append(f"{what}: span {item.start_s:g}..{item.end_s:g} s is empty or "
                            "negative")
        problems += _rate_problem(what, item.bytes, item.end_s - item.start_s,
                                  item.bits_per_second, tol)
        problems += _sign_problems(what, item)
        key = (item.direction, item.role, item.stream_id)
        before = last.get(key)
        if before is not None and item.start_s < before.end_s - 1e-6:
            problems.append(f"{what}: starts at {item.start_s:g} s, before the previous one of "
                            f"its series ended ({before.end_s:g} s): not in time order")
        last[key] = item
        if item.start_s < latest - _ORDER_SLACK_S:
            problems.append(f"{what}: starts at {item.start_s:g} s, after an interval that "
                            f"starts at {latest:g} s: the intervals are not in time order")
        latest = max(latest, item.start_s)
    return problems


_NON_NEGATIVE = ("retransmits", "rtt_us", "rttvar_us", "min_rtt_us", "max_rtt_us",
                 "cwnd_bytes", "packets", "lost_packets", "out_of_order_packets",
                 "duplicate_packets", "jitter_ms")


def _sign_problems(what: str, record: Any) -> list[str]:
    problems = []
    for name in _NON_NEGATIVE:
        value = getattr(record, name, None)
        if value is not None and value < 0:
            problems.append(f"{what}: {name} = {value} is negative (unknown must be None)")
    lost = getattr(record, "lost_percent", None)
    if lost is not None and not 0 <= lost <= 100:
        problems.append(f"{what}: lost_percent = {lost} is not a percentage")
    return problems


def _sides(result: Result) -> Iterator[tuple[str, str, SideSummary]]:
    for flow in result.summaries:
        for slot in ("sender", "receiver"):
            side = getattr(flow, slot)
            if side is not None:
                yield f"summary {flow.direction} {slot}", slot, side
    for stream in result.streams:
        for slot in ("sender", "receiver"):
            side = getattr(stream, slot)
            if side is not None:
                yield f"stream {stream.stream_id} {stream.direction} {slot}", slot, side


def _summary_problems(result: Result, tol: float) -> list[str]:
    problems: list[str] = []
    for what, slot, side in _sides(result):
        if side.role != slot:
            problems.append(f"{what}: role is {side.role!r}")
        problems += _rate_problem(what, side.bytes, side.end_s - side.start_s,
                                  side.bits_per_second, tol)
        problems += _sign_problems(what, side)
    for flow in result.summaries:
        sent, got = flow.sender, flow.receiver
        if result.spec.omit_s > 0 or sent is None or got is None:
            continue  # after a warm-up the two sides may count from different instants
        if got.bytes > sent.bytes * 1.01 + 65536:
            problems.append(f"summary {flow.direction}: the receiver got {got.bytes} bytes, more "
                            f"than the {sent.bytes} the sender sent")
    if len({f.direction for f in result.summaries}) != len(result.summaries):
        problems.append("two summaries for the same direction")
    return problems


def _latency_problems(latency: Optional[Latency]) -> list[str]:
    if latency is None:
        return []
    problems = [] if latency.count >= 0 else [f"latency count {latency.count} is negative"]
    order = [(n, getattr(latency, n)) for n in ("min_us", "p50_us", "p90_us", "p99_us", "max_us")]
    known = [(n, v) for n, v in order if v is not None]
    problems += [f"latency {n} = {v} is negative" for n, v in known if v < 0]
    for (n1, v1), (n2, v2) in zip(known, known[1:]):
        if v1 > v2:
            problems.append(f"latency {n1} = {v1} exceeds {n2} = {v2}")
    low, high, mean = latency.min_us, latency.max_us, latency.mean_us
    below = mean is not None and low is not None and mean < low
    if below or (mean is not None and high is not None and mean > high):
        problems.append(f"latency mean_us = {mean} lies outside min..max")
    return problems


def _duration_problems(result: Result, spec: TestSpec) -> list[str]:
    if spec.bytes_total is not None or spec.duration_s is None or result.duration_s is None:
        return []
    wanted, got = spec.duration_s, result.duration_s
    if not 0.5 * wanted <= got <= 1.5 * wanted + 1.0:
        return [f"duration_s is {got:g} for a {wanted:g} s test (seconds, not milliseconds?)"]
    return []


# --- processes, by PID through /proc -------------------------------------------------------


@attrs.frozen
class ProcessInfo:
    """One process as /proc shows it."""

    pid: int
    """Process id."""
    ppid: int
    """Parent process id."""
    start_ticks: int
    """Start time in clock ticks since boot: with the pid, names the process uniquely."""
    state: str
    """State letter (R, S, D, Z, ...)."""
    cmdline: str
    """Command line (or ``[comm]`` when it has none)."""


def _read_process(pid: int) -> Optional[ProcessInfo]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            head, tail = f.read().rsplit(")", 1)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except (OSError, ValueError):
        return None
    fields = tail.split()
    cmdline = " ".join(a.decode(errors="replace") for a in argv if a)
    comm = head.split("(", 1)[-1]
    return ProcessInfo(pid, int(fields[1]), int(fields[19]), fields[0], cmdline or f"[{comm}]")


def all_processes() -> dict[int, ProcessInfo]:
    """Every process visible in /proc, by pid."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _read_process(int(entry))
            if info is not None:
                found[info.pid] = info
    return found


def descendants(root: int) -> list[ProcessInfo]:
    """The processes below ``root`` (children, grandchildren, ...), from /proc."""
    table = all_processes()
    children: dict[int, list[ProcessInfo]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info)
    found: list[ProcessInfo] = []
    todo = [root]
    while todo and len(found) < 100_000:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.pid)
    return found


def still_running(info: ProcessInfo) -> bool:
    """True if that very process (same pid and start time) is alive and not a zombie."""
    now = _read_process(info.pid)
    return now is not None and now.start_ticks == info.start_ticks and now.state not in "ZX"


class ProcessWatch:
    """Remembers every process that appears below ``root`` while it runs (polled from a
    thread), so that processes that detach or lose their parent are still known by PID."""

    def __init__(self, root: int, ignore: Sequence[ProcessInfo] = ()) -> None:
        self.root = root
        self.seen: dict[tuple[int, int], ProcessInfo] = {}
        self._ignore = {(p.pid, p.start_ticks) for p in ignore}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="netprobe-kit-watch",
                                        daemon=True)
        self.appeared = threading.Event()

    def __enter__(self) -> ProcessWatch:
        self.scan()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self.scan()

    def _poll(self) -> None:
        while not self._stop.wait(_POLL_S * 2.5):
            self.scan()

    def scan(self) -> None:
        """Look once and remember what is new."""
        for info in descendants(self.root):
            key = (info.pid, info.start_ticks)
            if key not in self._ignore and key not in self.seen:
                self.seen[key] = info
                self.appeared.set()

    def reap(self) -> None:
        """Reap the zombies that were reparented to this process (orphans it adopted as a
        subreaper); never a child that this process started itself, which its
        :class:`subprocess.Popen` still waits for."""
        me = os.getpid()
        for info in self.seen.values():
            now = _read_process(info.pid)
            adopted = info.ppid != me and now is not None and now.ppid == me
            if adopted and now is not None and now.state == "Z":
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(info.pid, os.WNOHANG)

    def left_running(self, bound_s: float) -> list[ProcessInfo]:
        """The remembered processes still alive after waiting up to ``bound_s`` for them."""
        deadline = time.monotonic() + bound_s
        while True:
            self.scan()
            alive = [p for p in self.seen.values() if still_running(p) and p.pid != self.root]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(_POLL_S * 5)


@contextlib.contextmanager
def subreaper() -> Iterator[bool]:
    """Make this process a child subreaper (Linux) while the block runs, so that orphans of
    our descendants are reparented to us rather than to init: they stay our descendants and
    can be found. Yields whether that worked. Reap them with :meth:`ProcessWatch.reap`."""
    libc = _libc()
    ok = libc is not None and libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield ok
    finally:
        if ok and libc is not None:
            libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _libc() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _describe(processes: Sequence[ProcessInfo]) -> str:
    return "; ".join(f"pid {p.pid} ({p.cmdline[:120]})" for p in processes)


# --- the checks ----------------------------------------------------------------------------


class Conformance:
    """The checks for one tool class under one set of :class:`Settings`."""

    def __init__(self, tool_cls: type[Tool], settings: Optional[Settings] = None) -> None:
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

    def base_spec(self, protocol: Optional[str] = None, direction: Optional[str] = None,
                  **changes: Any) -> TestSpec:
        """The plainest loopback spec the capabilities allow, with ``changes``."""
        caps = self.tool_cls.capabilities
        protocol = protocol or ("tcp" if "tcp" in caps.protocols else sorted(caps.protocols)[0])
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
        from netprobe.plugin import API_VERSION, _incompatibility

        problem = _incompatibility(self.tool_cls)
        if problem:
            return [f"netprobe would not load it: {problem}"]
        name = getattr(self.tool_cls, "name", None)
        if not isinstance(name, str) or not name.strip():
            return ["the class sets no name (what users type after --tool)"]
        notes.append(f"written for plugin API {self.tool_cls.api_version}; this netprobe has "
                     f"{API_VERSION}")
        return []

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
    ) -> tuple[list[str], Optional[Availability]]:
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
                 if p not in caps.protocols]
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
                  for p in sorted(caps.protocols) if p not in caps.rate_limit]
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
        protocols = sorted(caps.protocols, key=lambda p: p != "tcp")
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
        tcp = "tcp" if "tcp" in caps.protocols else sorted(caps.protocols)[0]
        found: list[tuple[str, str, dict[str, Any], bool]] = []
        if caps.max_streams is None or caps.max_streams >= 2:
            found.append(("2 streams", tcp, {"streams": 2}, False))
        if caps.byte_count:
            found.append(("byte count", tcp, {"bytes_total": 32 << 20, "duration_s": None}, True))
        if caps.omit:
            found.append(("omit", tcp, {"omit_s": 1.0}, False))
        if caps.min_interval_s is not None:
            found.append(("interval", tcp, {"interval_s": max(caps.min_interval_s, 0.5)}, False))
        for protocol in sorted(caps.rate_limit & caps.protocols):
            rate = 100e6 if protocol == "tcp" else 50e6
            found.append((f"rate limit on {protocol}", protocol,
                          {"rate_bits_per_second": rate}, False))
        for name, change in _inside_switches(caps).items():
            protocol = "udp" if name == "length" and "udp" in caps.protocols else tcp
            found.append((name, protocol, change, name == "ipv6"))
        return found

    def run_and_verify(self, spec: TestSpec) -> tuple[list[str], Optional[Result]]:
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
        return problems + honoured_problems(result, spec), result

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
    ) -> tuple[Any, Optional[float], float]:
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


def _a_congestion_algorithm() -> Optional[str]:
    try:
        with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
            names = f.read().split()
    except OSError:
        return None
    return "cubic" if "cubic" in names else (names[0] if names else None)


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


def _fastest(result: Optional[Result]) -> float:
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


def _interrupt_problems(raised: Any, sent_at: Optional[float], ended_at: float,
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


# --- what an honoured option looks like in the result ----------------------------------


def honoured_problems(result: Result, spec: TestSpec) -> list[str]:
    """Ways ``result`` shows that options of ``spec`` were not honoured (empty if none)."""
    if not isinstance(result, Result):
        return []
    problems = []
    if result.status != "ok":
        problems.append(f"status is {result.status!r}: {'; '.join(result.errors)}")
    for name in ("protocol", "direction", "streams", "bytes_total"):
        if getattr(result.spec, name) != getattr(spec, name):
            problems.append(f"result.spec.{name} is {getattr(result.spec, name)!r}, "
                            f"asked {getattr(spec, name)!r}")
    problems += _direction_problems(result, spec)
    problems += _stream_count_problems(result, spec)
    problems += _byte_count_problems(result, spec)
    problems += _rate_limit_problems(result, spec)
    problems += _omit_problems(result, spec)
    problems += _interval_width_problems(result, spec)
    return problems


def _direction_problems(result: Result, spec: TestSpec) -> list[str]:
    have = {f.direction for f in result.summaries if f.sender or f.receiver}
    missing = [d for d in spec.flow_directions() if d not in have]
    extra = sorted(have - set(spec.flow_directions()))
    problems = [f"no summary for the {d} flow" for d in missing]
    return problems + [f"a summary for {d}, which this spec does not send" for d in extra]


def _stream_count_problems(result: Result, spec: TestSpec) -> list[str]:
    problems = []
    for direction in spec.flow_directions():
        ids = {s.stream_id for s in result.streams if s.direction == direction}
        if ids and len(ids) != spec.streams:
            problems.append(f"{len(ids)} streams reported for {direction}, {spec.streams} asked")
    return problems


def _main_side(result: Result, direction: str) -> Optional[SideSummary]:
    flow = result.summary(direction)
    if flow is None:
        return None
    return flow.sender or flow.receiver


def _byte_count_problems(result: Result, spec: TestSpec) -> list[str]:
    if spec.bytes_total is None:
        return []
    problems = []
    expected = spec.bytes_total * spec.streams
    for direction in spec.flow_directions():
        side = _main_side(result, direction)
        if side is not None and not 0.95 * expected <= side.bytes <= 1.05 * expected + 65536:
            problems.append(f"{direction}: {side.bytes} bytes moved in byte-count mode, "
                            f"{expected} asked")
    return problems


def _rate_limit_problems(result: Result, spec: TestSpec) -> list[str]:
    rate = spec.rate_bits_per_second
    if rate is None:
        return []
    problems = []
    for direction in spec.flow_directions():
        side = _main_side(result, direction)
        limit = rate * spec.streams
        if side is not None and side.bits_per_second > 1.10 * limit:
            problems.append(f"{direction}: {side.bits_per_second:.4g} bit/s at a limit of "
                            f"{limit:.4g}")
    return problems


def _omit_problems(result: Result, spec: TestSpec) -> list[str]:
    if spec.omit_s <= 0:
        return []
    problems = []
    if result.intervals and not any(i.omitted for i in result.intervals):
        problems.append("omit asked but no interval is marked omitted")
    for what, _slot, side in _sides(result):
        if side.start_s < spec.omit_s * 0.9:
            problems.append(f"{what} starts at {side.start_s:g} s, inside the {spec.omit_s:g} s "
                            "warm-up")
    return problems


def _interval_width_problems(result: Result, spec: TestSpec) -> list[str]:
    if spec.interval_s is None or spec.duration_s is None:
        return []
    if spec.duration_s < 2 * spec.interval_s:
        return []
    if not result.intervals:
        return [f"interval reports every {spec.interval_s:g} s asked, none in the result"]
    widths = [i.end_s - i.start_s for i in result.intervals]
    typical = statistics.median(widths)
    if not 0.5 * spec.interval_s <= typical <= 1.5 * spec.interval_s:
        return [f"intervals are typically {typical:.3g} s long, {spec.interval_s:g} s asked"]
    return []


# --- the environment without the binary ---------------------------------------------------


@contextlib.contextmanager
def _environment_without_binary(normal: Optional[Availability]) -> Iterator[str]:
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


# --- the child process of the timeout check ----------------------------------------------


def _import(target: str) -> Any:
    import importlib

    module, _, qualname = target.partition(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


class _ChildReporter(RecordingReporter):
    """Says ``started`` on stdout at the first sign of life, for the parent to see."""

    def _started(self) -> None:
        if not self.event.is_set():
            sys.stdout.write("started\n")
            sys.stdout.flush()

    def interval(self, sample: Interval) -> None:
        """Record one interval (and say started)."""
        self._started()
        super().interval(sample)

    def note(self, message: str) -> None:
        """Record one note (and say started)."""
        self._started()
        super().note(message)


def _child_main(argv: Sequence[str]) -> int:
    """Run one test as the timeout check's child: SIGTERM becomes SystemExit, as a host
    (the CLI, an agent) should make it, so the tool's cleanup runs."""
    target, options, spec_json = argv

    def on_sigterm(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    tool = _import(target)(json.loads(options))
    spec = convert.structure(json.loads(spec_json), TestSpec)
    sys.stdout.write("running\n")
    sys.stdout.flush()
    try:
        result = tool.run(spec, _ChildReporter())
    except SystemExit:
        sys.stdout.write("stopped: SystemExit reached the host\n")
        raise
    except TestFailed as exc:
        sys.stdout.write(f"stopped: {type(exc).__name__}: {exc}\n")
        return 1
    sys.stdout.write(f"finished: status {result.status}\n")
    return 0


__all__ = [
    "CHECKS",
    "CheckOutcome",
    "CheckSkipped",
    "Conformance",
    "ConformanceError",
    "ProcessInfo",
    "ProcessWatch",
    "RecordingReporter",
    "Settings",
    "all_processes",
    "check_tool",
    "conformance_tests",
    "descendants",
    "honoured_problems",
    "run_check",
    "shipped_schema",
    "still_running",
    "subreaper",
    "validate_result",
]
