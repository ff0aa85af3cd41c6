"""THE plugin contract: the Tool base class, its capabilities and availability, and the
Reporter protocol. This module is what a plugin author reads; nothing else is here.

A tool plugin is a subclass of :class:`Tool` published under the ``netprobe.tools``
entry-point group; built-in tools register the same way. Finding and loading them is
:mod:`netprobe.registry`'s job. The helpers a tool uses are re-exported here from where
they live, so a plugin imports everything it needs from one module: the reporter plumbing
(:mod:`netprobe.reporting`), operations on a Result (:mod:`netprobe.resultops`) and host
facts (:mod:`netprobe.host`).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Callable, ClassVar, Protocol

import attrs
from attrs import frozen

from netprobe.errors import NetprobeError, SpecError
from netprobe.host import system_name, utc_now_iso
from netprobe.record import Record
from netprobe.reporting import (
    MAX_INTERVALS_KEPT,
    KeptIntervals,
    NullReporter,
    RelayReporter,
    intervals_not_kept,
)
from netprobe.resultops import (
    CallLengths,
    bits_per_second,
    fill_missing,
    short_sender_totals,
    with_call_lengths,
)
from netprobe.schema import Interval, RawOutput, Result, TestSpec

ENTRY_POINT_GROUP = "netprobe.tools"
"""The entry-point group tools are published under."""

API_VERSION = 1
"""Version of this contract. A plugin declaring a higher ``api_version`` is incompatible."""

MEASURES = frozenset({"throughput", "latency"})
"""What a tool can declare it measures (:attr:`Tool.measures`)."""


# The sets of Capabilities.all_but: everything netprobe knows how to ask of a tool.
_EVERY_SET: dict[str, frozenset] = {
    "protocols": frozenset({"tcp", "udp"}),
    "directions": frozenset({"normal", "reverse", "bidir"}),
    "rate_limit": frozenset({"tcp", "udp"}),
}


@frozen(repr=False, eq=False)
class Capabilities(Record):
    """What a tool can honour. Anything in a spec outside these is refused before running."""

    protocols: frozenset = frozenset({"tcp"})
    """Protocols supported: ``tcp``, ``udp``; empty for a tool that sends no TCP or UDP
    test traffic a spec could choose (a ``ping`` driver): it runs the spec's default
    protocol, TCP, which it ignores, and refuses ``--udp``."""
    directions: frozenset = frozenset({"normal"})
    """Directions supported: ``normal``, ``reverse``, ``bidir``."""
    max_streams: int | None = 1
    """Most parallel streams; None for no limit."""
    byte_count: bool = False
    """Can stop after a byte count instead of a duration."""
    min_interval_s: float | None = None
    """Shortest interval report; None if it has no interval reports."""
    omit: bool = False
    """Can exclude a warm-up from the summary."""
    rate_limit: frozenset = frozenset()
    """Protocols on which a rate limit can be set."""
    length: bool = False
    """Buffer/datagram length can be set."""
    window: bool = False
    """Socket buffer size can be set."""
    mss: bool = False
    """TCP MSS can be set."""
    nodelay: bool = False
    """TCP_NODELAY can be set."""
    dscp: bool = False
    """DSCP/TOS can be set."""
    congestion: bool = False
    """Congestion control algorithm can be chosen."""
    ipv6: bool = False
    """Can run over IPv6."""
    bind: bool = False
    """Can bind to a local address."""
    port: bool = True
    """The server port can be chosen."""
    zerocopy: bool = False
    """Zero-copy send."""
    skip_rx_copy: bool = False
    """Receive without copying into user space."""

    @classmethod
    def all_but(cls, *missing: str, max_streams: int | None,
                min_interval_s: float | None, **narrower: frozenset) -> Capabilities:
        """Every protocol, direction and option except the ``missing`` ones, with the
        tool's own limits: a tool's table names only what it lacks.

        ``missing`` names bool fields (``"omit"``, ``"zerocopy"``, ...) or ``"rate_limit"``;
        ``narrower`` gives a smaller set for ``protocols``, ``directions`` or
        ``rate_limit``. A name that is neither raises :class:`ValueError`, so a typo in a
        table fails when the tool is imported instead of granting a capability.
        """
        values: dict[str, Any] = {f.name: True for f in attrs.fields(cls)
                                  if isinstance(f.default, bool)}
        values.update(_EVERY_SET)
        for name in missing:
            if name not in values or name in ("protocols", "directions"):
                raise ValueError(f"{name!r} is not a capability a tool can lack "
                                 f"(protocols and directions are given as sets)")
            values[name] = frozenset() if name == "rate_limit" else False
        for name, given in narrower.items():
            if name not in _EVERY_SET:
                raise ValueError(f"{name!r} is not a set of protocols or directions")
            values[name] = frozenset(given)
        return cls(max_streams=max_streams, min_interval_s=min_interval_s, **values)

    def refusals(self, spec: TestSpec, tool: str) -> list[str]:
        """Reasons this tool cannot run ``spec``, each naming the option and the tool."""
        found: list[str] = []

        def refuse(option: str, why: str) -> None:
            found.append(f"{tool} cannot honour {option}: {why}")

        if spec.protocol not in self.spec_protocols:
            why = "" if self.protocols else " (it sends no TCP or UDP test traffic of its own)"
            refuse(f"--{spec.protocol}" if spec.protocol == "udp" else "tcp",
                   f"protocol not supported{why}")
        if spec.direction not in self.directions:
            flag = "--reverse" if spec.direction == "reverse" else f"--{spec.direction}"
            refuse(flag, "direction not supported")
        if self.max_streams is not None and spec.streams > self.max_streams:
            refuse(f"--parallel {spec.streams}", f"at most {self.max_streams} stream(s)")
        if spec.bytes_total is not None and not self.byte_count:
            refuse("--bytes", "no byte-count mode")
        self._check_interval(spec, refuse)
        if spec.rate_bits_per_second is not None and spec.protocol not in self.rate_limit:
            refuse("--bitrate", f"no rate limit for {spec.protocol}")
        for flag, wanted, able in self._switches(spec):
            if wanted and not able:
                refuse(flag, "option not supported")
        return found

    @property
    def spec_protocols(self) -> frozenset:
        """The protocols a spec may name: ``protocols``, or for a tool of neither (empty)
        the spec's default, TCP, which such a tool ignores."""
        return self.protocols or frozenset({"tcp"})

    def _check_interval(self, spec: TestSpec, refuse: Callable[[str, str], None]) -> None:
        if spec.interval_s is None:
            return
        if self.min_interval_s is None:
            refuse("--interval", "no interval reports")
        elif spec.interval_s < self.min_interval_s:
            refuse(f"--interval {spec.interval_s}", f"shortest is {self.min_interval_s} s")

    def _switches(self, spec: TestSpec) -> list[tuple[str, bool, bool]]:
        return [(s.flag, s.wanted(spec), getattr(self, s.capability)) for s in SWITCHES]


@frozen(repr=False, eq=False)
class Switch(Record):
    """An option a tool honours or not: the Capabilities field that says so, the flag users
    type, the TestSpec change that asks for it, and how to tell that a spec asks for it."""

    capability: str
    """The :class:`Capabilities` field (a bool)."""
    flag: str
    """The command-line flag, as refusals name it."""
    example: dict[str, Any]
    """TestSpec fields that ask for it (the conformance kit runs them)."""
    wanted: Callable[[TestSpec], bool]
    """True when a spec asks for it."""


SWITCHES: tuple[Switch, ...] = (
    Switch("omit", "--omit", {"omit_s": 1.0}, lambda s: s.omit_s > 0),
    Switch("length", "--length", {"length_bytes": 1024}, lambda s: s.length_bytes is not None),
    Switch("window", "--window", {"window_bytes": 256 * 1024},
           lambda s: s.window_bytes is not None),
    Switch("mss", "--mss", {"mss_bytes": 1400}, lambda s: s.mss_bytes is not None),
    Switch("nodelay", "--nodelay", {"nodelay": True}, lambda s: s.nodelay),
    Switch("dscp", "--dscp", {"dscp": 8}, lambda s: s.dscp is not None),
    Switch("congestion", "--congestion", {"congestion": "cubic"},
           lambda s: s.congestion is not None),
    Switch("ipv6", "-6", {"ip_version": 6}, lambda s: s.ip_version == 6),
    Switch("bind", "--bind", {"bind_address": "127.0.0.1"},
           lambda s: s.bind_address is not None),
    Switch("port", "--port", {"port": 5999}, lambda s: s.port is not None),
    Switch("zerocopy", "--zerocopy", {"zerocopy": True}, lambda s: s.zerocopy),
    Switch("skip_rx_copy", "--skip-rx-copy", {"skip_rx_copy": True}, lambda s: s.skip_rx_copy),
)
"""THE table capability -> spec field -> flag, for the on/off options: the refusals
(:meth:`Capabilities.refusals`) and the conformance kit both read it."""

RANGED_CAPABILITIES = frozenset({"protocols", "directions", "max_streams", "byte_count",
                                 "min_interval_s", "rate_limit"})
"""The Capabilities fields that are not on/off switches (each checked in its own way)."""


@frozen(repr=False, eq=False)
class Availability(Record):
    """The answer of :meth:`Tool.probe`: can the tool run here, which version, and why not."""

    available: bool
    """True if ``run`` can be called."""
    version: str | None = None
    """The tool's version as it reports it."""
    reasons: tuple[str, ...] = ()
    """Why it cannot run (empty when available)."""
    path: str | None = None
    """The binary used, for driven tools."""
    details: tuple[str, ...] = ()
    """Extra facts worth showing (e.g. the native engine's data path)."""


class Reporter(Protocol):
    """Receives live events from a running tool. Tools never print; the CLI renders these.

    The contract, for tools and reporters alike (the conformance kit checks it for every
    tool, ``reporter_contract``):

    - Thread: during one run, every call comes from one thread. Tools built on
      :class:`netprobe.driven.DrivenRun` (every driven tool) call from the thread that
      called :meth:`Tool.run`; a tool whose events arise on several threads (the native
      engine) hands them to a :class:`RelayReporter`, whose one thread calls the reporter.
      A reporter that draws on a screen needs no lock for its own state.
    - Errors: an exception from the reporter never ends or fails the test. The tool goes on
      measuring, says so once in ``Result.warnings`` (naming the reporter), keeps every
      interval (up to :data:`MAX_INTERVALS_KEPT`) in the Result, and may stop calling the
      reporter. KeyboardInterrupt is no error: it interrupts the test as Ctrl-C does.
    - Every sample reaches the reporter, however many there are; the Result keeps at most
      :data:`MAX_INTERVALS_KEPT` of each end (:class:`KeptIntervals`), so a reporter that
      streams them (``--format json-stream``) is where a long test's every interval goes.
    - Speed: calls should return quickly; a slow reporter delays a driven tool's deadline
      checks, never its measurements (the tool's output is read by other threads).
    """

    def interval(self, sample: Interval) -> None:
        """One interval sample, as soon as it is known."""

    def note(self, message: str) -> None:
        """A progress message (connected, server started, ...)."""


class Tool(abc.ABC):
    """Base class of every tool plugin.

    Subclasses set ``name`` and ``capabilities`` and implement :meth:`probe` and :meth:`run`.
    ``run`` returns a Result with status ``ok``; on failure it raises
    :class:`~netprobe.errors.TestFailed` (or ``TestInterrupted`` on Ctrl-C) carrying the
    partial Result, so nothing measured is lost.
    """

    name: ClassVar[str]
    """The name users type after ``--tool``."""
    aliases: ClassVar[tuple[str, ...]] = ()
    """Other names accepted for this tool."""
    api_version: ClassVar[int] = API_VERSION
    """The plugin contract version this tool was written for."""
    capabilities: ClassVar[Capabilities] = Capabilities()
    """What the tool can honour."""
    measures: ClassVar[frozenset[str]] = frozenset({"throughput"})
    """What its results hold (:data:`MEASURES`): ``throughput`` (a summary per direction
    the spec sends), ``latency`` (``Result.latency``: round trips), or both. The
    conformance kit checks what a tool declares and no more."""
    description: ClassVar[str] = ""
    """One line for ``netprobe tools``."""
    modes: ClassVar[frozenset[str]] = frozenset()
    """Run modes beyond a test between two ends the tool drives itself, each turned on by
    the tool option of the same name: ``receive`` (only the receiving end, on this machine,
    for a sender started elsewhere) and ``no_sync`` (no start handshake between the ends,
    for a peer run without one). The CLI refuses a mode a tool does not list."""
    udp_batched_send: ClassVar[bool] = False
    """True if the tool's UDP sender hands the kernel many datagrams per call (sendmmsg,
    GSO messages); False for one datagram per send call. ``compare`` says which, since a
    rate per call decides UDP throughput on a fast path."""
    overhead_s: ClassVar[float] = 0.5
    """Seconds a test through this tool takes on a quiet machine beyond its planned time:
    starting the far end and waiting for it to listen, handshakes, final reports, stopping
    what was started. ``compare`` and ``run --repeat`` add it to each trial to say how long
    they will take (:meth:`expected_s`). Measured on loopback; a guess for a plugin that
    does not say."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self.options: dict[str, Any] = dict(options or {})

    @abc.abstractmethod
    def probe(self) -> Availability:
        """Say whether the tool can run here. Must not raise."""

    @abc.abstractmethod
    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        """Run the test described by ``spec``, sending live samples to ``reporter``."""

    def expected_s(self, spec: TestSpec) -> float | None:
        """Seconds one test of ``spec`` takes through this tool, start to end: the planned
        time and :attr:`overhead_s`; None when unknown (a byte count ends the test)."""
        planned = spec.planned_s()
        return None if planned is None else planned + self.overhead_s

    def refusals(self, spec: TestSpec) -> list[str]:
        """Options of ``spec`` this tool cannot honour (empty if it can run it)."""
        return self.capabilities.refusals(spec, self.name)

    def check(self, spec: TestSpec) -> None:
        """Raise SpecError naming every option of ``spec`` this tool cannot honour."""
        found = self.refusals(spec)
        if found:
            raise SpecError("; ".join(found))

    def parse(self, sources: Sequence[tuple[str, str]]) -> Result:
        """Turn saved outputs ``[(name, text), ...]`` of this tool into a Result."""
        raise SpecError(f"{self.name} cannot parse saved output")

    def split_tests(self, lines: Iterable[str]) -> Iterator[str]:
        """The text of each test in one saved output that may hold several (a server's
        log, appended runs), given its lines (newlines kept) as they are read: ``parse``
        turns each into its own Result, so a tool that can tell tests apart should yield
        each as soon as it ends (one test in memory at a time). The default: one test."""
        yield "".join(lines)

    def far_end_argv(self, spec: TestSpec, address: str, port: int) -> list[str] | None:
        """The command that runs this tool's server (receiver) side for ``spec`` on this
        host, listening on ``address`` and ``port``: what a netprobe agent starts when a
        client asks it to. None if the tool has no such side to start."""
        return None

    def merge_far_end(self, result: Result, far_end: RawOutput) -> Result:
        """Fold the far end's output into the client's result. The default keeps it raw;
        tools whose client does not report the far side's figures parse it here."""
        return attrs.evolve(result, raw=(*result.raw, far_end))




__all__ = [
    "API_VERSION",
    "ENTRY_POINT_GROUP",
    "MAX_INTERVALS_KEPT",
    "MEASURES",
    "SWITCHES",
    "Availability",
    "CallLengths",
    "Capabilities",
    "KeptIntervals",
    "NetprobeError",
    "NullReporter",
    "RelayReporter",
    "Reporter",
    "Switch",
    "Tool",
    "bits_per_second",
    "fill_missing",
    "intervals_not_kept",
    "short_sender_totals",
    "system_name",
    "utc_now_iso",
    "with_call_lengths",
]
