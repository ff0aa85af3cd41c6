"""THE plugin contract: the Tool base class, capabilities, the Reporter protocol, and the
registry that finds tools through the ``netprobe.tools`` entry-point group (stevedore).

A tool plugin is a subclass of :class:`Tool` published under that group; built-in tools
register the same way. A plugin that fails to import or is not a compatible Tool is kept
as a :class:`LoadFailure` so that ``netprobe tools`` can show it while everything else works.
"""

from __future__ import annotations

import abc
import importlib
import os
import queue
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Callable, ClassVar, Optional, Protocol

import attrs
from attrs import frozen

from netprobe.errors import NetprobeError, SpecError, ToolNotFound
from netprobe.record import Record
from netprobe.schema import FlowSummary, Interval, RawOutput, Result, SideSummary, TestSpec

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
    max_streams: Optional[int] = 1
    """Most parallel streams; None for no limit."""
    byte_count: bool = False
    """Can stop after a byte count instead of a duration."""
    min_interval_s: Optional[float] = None
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
    def all_but(cls, *missing: str, max_streams: Optional[int],
                min_interval_s: Optional[float], **narrower: frozenset) -> Capabilities:
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
    version: Optional[str] = None
    """The tool's version as it reports it."""
    reasons: tuple[str, ...] = ()
    """Why it cannot run (empty when available)."""
    path: Optional[str] = None
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


MAX_INTERVALS_KEPT = 20_000
"""Interval samples of each end a Result keeps: a one-hour test at the default 1 s interval
with 4 streams and their sum fits. Past it, samples still reach the reporter as they come
(and ``--format json-stream`` writes every one), but the Result holds no more, and says
so; the whole-test summaries never come from the kept samples alone, so they stay exact."""


class KeptIntervals:
    """The interval samples a run keeps for its Result: the first :data:`MAX_INTERVALS_KEPT`,
    and a count of the rest (memory stays bounded, however long the test)."""

    def __init__(self, limit: Optional[int] = None) -> None:
        self.limit = MAX_INTERVALS_KEPT if limit is None else limit
        """How many samples are kept (the module's limit unless given)."""
        self.samples: list[Interval] = []
        """The samples kept, in arrival order."""
        self.dropped = 0
        """Samples given past the limit, not kept."""

    def add(self, sample: Interval) -> bool:
        """Keep ``sample`` unless the limit is reached (False then: it is only counted)."""
        if len(self.samples) >= self.limit:
            self.dropped += 1
            return False
        self.samples.append(sample)
        return True

    def take(self) -> tuple[list[Interval], int]:
        """The samples kept and the count not kept since the last take; both start afresh
        (a queue bounded the same way: what waits for a consumer)."""
        taken, dropped = self.samples, self.dropped
        self.samples, self.dropped = [], 0
        return taken, dropped

    def __len__(self) -> int:
        return len(self.samples)


def intervals_not_kept(kept: int, dropped: int) -> Optional[str]:
    """The Result's warning for ``dropped`` samples not kept beside ``kept`` (None: none)."""
    if not dropped:
        return None
    return (f"{kept} interval reports kept in the result, {dropped} more not kept (they "
            "went to the live output as they came; --format json-stream writes every one); "
            "the summaries cover the whole test")


class RelayReporter:
    """Calls a reporter from one thread of its own, in the order events were given, with
    the reporter's errors contained (the Reporter contract, for a tool whose events arise
    on several threads). Use as a context manager around the run; :attr:`warnings` then
    says whether the reporter failed."""

    def __init__(self, reporter: Reporter) -> None:
        self.warnings: list[str] = []
        """One line if the reporter raised (it is not called again after that)."""
        self._reporter: Optional[Reporter] = reporter
        self._events: queue.SimpleQueue[Optional[tuple[str, Any]]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._relay, name="netprobe-reporter",
                                        daemon=True)

    def interval(self, sample: Interval) -> None:
        """Queue ``sample`` for the reporter."""
        self._events.put(("interval", sample))

    def note(self, message: str) -> None:
        """Queue ``message`` for the reporter."""
        self._events.put(("note", message))

    def _relay(self) -> None:
        while True:
            event = self._events.get()
            if event is None:
                return
            if self._reporter is None:
                continue
            try:
                getattr(self._reporter, event[0])(event[1])
            except Exception as exc:  # outside code: it must not cost the test
                self._reporter = None
                self.warnings.append(f"the live reporter failed and was not called again: "
                                     f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> RelayReporter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._events.put(None)
        self._thread.join()  # every event given is delivered before the run returns


class NullReporter:
    """A reporter that ignores everything: for tests and for ``--json`` output."""

    def interval(self, sample: Interval) -> None:
        """Ignore the sample."""

    def note(self, message: str) -> None:
        """Ignore the message."""


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

    def __init__(self, options: Optional[dict[str, Any]] = None) -> None:
        self.options: dict[str, Any] = dict(options or {})

    @abc.abstractmethod
    def probe(self) -> Availability:
        """Say whether the tool can run here. Must not raise."""

    @abc.abstractmethod
    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        """Run the test described by ``spec``, sending live samples to ``reporter``."""

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

    def far_end_argv(self, spec: TestSpec, address: str, port: int) -> Optional[list[str]]:
        """The command that runs this tool's server (receiver) side for ``spec`` on this
        host, listening on ``address`` and ``port``: what a netprobe agent starts when a
        client asks it to. None if the tool has no such side to start."""
        return None

    def merge_far_end(self, result: Result, far_end: RawOutput) -> Result:
        """Fold the far end's output into the client's result. The default keeps it raw;
        tools whose client does not report the far side's figures parse it here."""
        return attrs.evolve(result, raw=(*result.raw, far_end))


@frozen(repr=False, eq=False)
class LoadFailure(Record):
    """A plugin that could not be used, and why."""

    name: str
    """Entry-point name."""
    error: str
    """One line saying what went wrong."""
    target: Optional[str] = None
    """What the entry point points at (module:attr)."""


@attrs.define
class Registry:
    """The tools found through entry points, and the ones that failed to load."""

    tools: dict[str, type[Tool]] = attrs.Factory(dict)
    failures: list[LoadFailure] = attrs.Factory(list)

    def names(self) -> list[str]:
        """Loaded tool names, sorted."""
        return sorted(self.tools)

    def get(self, name: str) -> type[Tool]:
        """The tool class for ``name`` or one of its aliases; ToolNotFound otherwise."""
        if name in self.tools:
            return self.tools[name]
        for cls in self.tools.values():
            if name in cls.aliases:
                return cls
        for failure in self.failures:
            if failure.name == name:
                raise ToolNotFound(
                    f"tool {name!r} is installed but failed to load: {failure.error}"
                )
        known = ", ".join(self.names()) or "none"
        raise ToolNotFound(f"no tool named {name!r} (installed: {known})")


def make_manager(
    on_failure: Callable[[Any, Any, BaseException], None], names: Optional[Sequence[str]] = None
) -> Any:
    """Build the manager of the tool group's extensions (the one place tests can substitute).

    With ``names``, only those entry points are imported: a run needs one tool, and
    importing every plugin costs start-up time that matters on a router. Names that
    netprobe's own distribution publishes (the built-in tools) are read from its own
    metadata (:func:`own_entry_points`) without scanning the others; any other name goes
    through stevedore, which reads every installed distribution's entry points, so a
    third-party plugin is found exactly as before.
    """
    if names is not None:
        own = own_entry_points()
        if own and all(name in own for name in names):
            loaded = (_load_own(name, own[name], on_failure) for name in names)
            return [ext for ext in loaded if ext is not None]
    from stevedore import ExtensionManager, NamedExtensionManager  # imported late: start-up

    if names is not None:
        return NamedExtensionManager(
            namespace=ENTRY_POINT_GROUP, names=list(names), invoke_on_load=False,
            on_load_failure_callback=on_failure,
        )
    return ExtensionManager(
        namespace=ENTRY_POINT_GROUP,
        invoke_on_load=False,
        on_load_failure_callback=on_failure,
    )


@frozen(repr=False, eq=False)
class EntryPoint(Record):
    """One entry point of netprobe's own distribution (what ``LoadFailure.target`` names)."""

    name: str
    """Its name in the group (the tool's name)."""
    value: str
    """``module:attribute``, what it points at."""


@frozen(repr=False, eq=False)
class _OwnExtension(Record):
    # What load_registry reads of a stevedore Extension: name, plugin, entry_point.value.
    name: str
    entry_point: EntryPoint
    plugin: Any


DISTRIBUTION = "netprobe-meter"
"""netprobe's name on the package index (``pip install netprobe-meter``); the command and
the import package are ``netprobe``. The plain name there is an unrelated project."""
_METADATA_NAME = DISTRIBUTION.replace("-", "_")  # how wheels and egg-info spell it on disk


def own_entry_points(group: str = ENTRY_POINT_GROUP) -> dict[str, str]:
    """The entry points netprobe's own distribution publishes in ``group`` (name -> value).

    Read straight from its ``entry_points.txt``: the first netprobe metadata directory on
    ``sys.path`` (the one ``importlib.metadata.distribution(DISTRIBUTION)`` would pick), and
    only when its version is this netprobe's, so stale metadata of another copy is never
    trusted. Empty when there is none (a bare source tree): callers then scan with stevedore.
    This skips importing importlib.metadata and stevedore, and stevedore's read of every
    distribution's entry points, for the one tool a ``netprobe run`` names.
    """
    found = _own_metadata_dir()
    if found is None:
        return {}
    try:
        with open(os.path.join(found, "entry_points.txt"), encoding="utf-8") as handle:
            return _entry_points_in(handle.read(), group)
    except OSError:
        return {}


def _own_metadata_dir() -> Optional[str]:
    # The package is imported already (this module is in it); no import statement, so the
    # package's lazy attributes (netprobe.run -> session -> plugin) make no cycle.
    version = sys.modules["netprobe"].__version__
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip file, a missing directory: not where metadata is read from
            continue
        for name in names:
            low = name.lower()
            if low.endswith((".dist-info", ".egg-info")) and low.split("-")[0].split(".")[0] \
                    == _METADATA_NAME:
                path = os.path.join(entry or ".", name)
                return path if _metadata_version(path) == version else None
    return None


def _metadata_version(path: str) -> Optional[str]:
    for filename in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(path, filename), encoding="utf-8") as handle:
                for line in handle:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
                    if not line.strip():  # the headers end at the first blank line
                        break
        except OSError:
            continue
    return None


def _entry_points_in(text: str, group: str) -> dict[str, str]:
    # The entry_points.txt format: INI sections named after groups, "name = value" lines.
    found: dict[str, str] = {}
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section == group and "=" in line:
            name, value = (part.strip() for part in line.split("=", 1))
            found[name] = value
    return found


def _load_own(name: str, value: str,
              on_failure: Callable[[Any, Any, BaseException], None]) -> Optional[_OwnExtension]:
    entry_point = EntryPoint(name, value)
    try:
        module, _, attr = value.split("[", 1)[0].strip().partition(":")
        plugin: Any = importlib.import_module(module.strip())
        for part in attr.strip().split(".") if attr else ():
            plugin = getattr(plugin, part)
    except Exception as exc:  # as stevedore does: a broken plugin is a failure, not a crash
        on_failure(None, entry_point, exc)
        return None
    return _OwnExtension(name, entry_point, plugin)


def load_registry(
    manager_factory: Callable[..., Any] = make_manager, only: Optional[str] = None
) -> Registry:
    """Load every tool plugin (or just the one named ``only``); collect failures, never raise.

    When ``only`` matches no entry point (an alias, or a typo), everything is loaded so that
    aliases resolve and the error can list what is installed.
    """
    registry = Registry()

    def on_failure(_manager: Any, entry_point: Any, exc: BaseException) -> None:
        registry.failures.append(
            LoadFailure(entry_point.name, _one_line(exc), getattr(entry_point, "value", None))
        )

    manager = manager_factory(on_failure, [only]) if only else manager_factory(on_failure)
    targets: dict[str, str] = {}  # the entry point each loaded name came from
    for ext in manager:
        problem = _incompatibility(ext.plugin)
        if problem:
            registry.failures.append(LoadFailure(ext.name, problem, ext.entry_point.value))
        else:
            _take(registry, targets, ext.name, ext.plugin, ext.entry_point.value)
    if only and not registry.tools and not registry.failures:
        return load_registry(manager_factory)
    return registry


def _take(registry: Registry, targets: dict[str, str], name: str, plugin: type[Tool],
          target: str) -> None:
    # Two entry points of one name: netprobe's own tool keeps it, else the first found (as
    # an import would), whatever order the distributions were read in; the other is listed
    # as not used. Before, the last one loaded took the name, so `netprobe tools` could show
    # a third-party plugin while `netprobe run` (which loads netprobe's own directly) ran
    # the built-in one.
    held = registry.tools.get(name)
    if held is None or held is plugin:
        registry.tools[name], targets[name] = plugin, targets.get(name, target)
        return
    if _is_built_in(plugin) and not _is_built_in(held):
        registry.tools[name] = plugin
        targets[name], target = target, targets[name]
    why = "netprobe's built-in tool" if _is_built_in(registry.tools[name]) else \
        "another plugin of this name, found first"
    registry.failures.append(LoadFailure(
        name, f"not used: the name is taken by {why} ({targets[name]})", target))


def _is_built_in(plugin: type[Tool]) -> bool:
    return plugin.__module__.startswith("netprobe.tools.")


def _incompatibility(plugin: Any) -> Optional[str]:
    if not (isinstance(plugin, type) and issubclass(plugin, Tool)):
        return f"not a netprobe Tool subclass: {plugin!r}"
    wanted = getattr(plugin, "api_version", None)
    if not isinstance(wanted, int) or wanted > API_VERSION:
        return f"incompatible: needs plugin API {wanted}, this netprobe has {API_VERSION}"
    return None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def fill_missing(result: Result, other: Result, far_end: Optional[RawOutput] = None) -> Result:
    """``result`` with the sender/receiver figures it lacks (None) taken from ``other``,
    matched by direction and stream (flows and streams it has none of taken whole), plus
    ``other``'s intervals of roles it has none of, and ``other``'s latency when ``result``
    has none (the far end may be the one that measured it). For merging what a far end
    (or another output of the same test) reported into what the client saw."""
    summaries = _filled(result.summaries, other.summaries, lambda f: f.direction)
    merged_streams = _filled(result.streams, other.streams, lambda s: (s.stream_id, s.direction))
    have = {(i.direction, i.role) for i in result.intervals}
    extra = [i for i in other.intervals if (i.direction, i.role) not in have]
    intervals = tuple(sorted([*result.intervals, *extra], key=lambda i: (i.end_s, i.role)))
    raw = (*result.raw, far_end) if far_end is not None else result.raw
    return attrs.evolve(result, summaries=summaries, streams=merged_streams,
                        intervals=intervals, raw=raw, latency=result.latency or other.latency)


def _filled(mine: tuple[Any, ...], theirs: tuple[Any, ...], key: Callable[[Any], Any]
            ) -> tuple[Any, ...]:
    """``mine`` with their sides filled in, then those of ``theirs`` that ``mine`` lacks."""
    by_key = {key(item): item for item in theirs}
    have = {key(item) for item in mine}
    return (*(_fill(item, by_key.get(key(item))) for item in mine),
            *(item for item in theirs if key(item) not in have))


def _fill(mine: Any, theirs: Any) -> Any:
    if theirs is None:
        return mine
    return attrs.evolve(mine, sender=_side_filled(mine.sender, theirs.sender),
                        receiver=_side_filled(mine.receiver, theirs.receiver))


def _side_filled(mine: Optional[SideSummary], theirs: Optional[SideSummary]
                 ) -> Optional[SideSummary]:
    # The call length is the one figure a side's own output may lack while the other
    # process's says it (iperf 2's client knows what its server writes with).
    if mine is None:
        return theirs
    if mine.call_length_bytes is None and theirs is not None and theirs.call_length_bytes:
        return attrs.evolve(mine, call_length_bytes=theirs.call_length_bytes)
    return mine


def short_sender_totals(tool: str, protocol: str, flows: Iterable[FlowSummary]) -> list[str]:
    """A warning for each TCP flow whose receiver total is above its sender's. TCP delivers
    no byte that was not sent, so the sender's figure was taken early (iperf3 3.16+ and
    ntttcp read their counters while a thread still finishes one more write). Both figures
    stay the tool's; the warning says which one is short, and by how much. None for UDP:
    there a receiver may count what the sender did not report."""
    if protocol != "tcp":
        return []
    out = []
    for flow in flows:
        sent, received = flow.sender, flow.receiver
        if sent and received and sent.bytes is not None and received.bytes is not None \
                and received.bytes > sent.bytes:
            out.append(f"{tool}'s {flow.direction} sender total is "
                       f"{received.bytes - sent.bytes} bytes below what its receiver got: "
                       "its sender figure was taken before the last write(s) were counted")
    return out


CallLengths = Mapping[tuple[str, str], int]
"""Bytes a data loop asked of each send() or recv() call, by (direction, role): what a
tool's output says its processes used (see :func:`with_call_lengths`)."""


def with_call_lengths(result: Result, lengths: CallLengths) -> Result:
    """``result`` with ``SideSummary.call_length_bytes`` set from ``lengths`` on each side
    (flow totals and streams) that has none and whose (direction, role) is there. TCP only:
    over UDP the length is the datagram's, which the spec says, so a UDP result is returned
    unchanged. For a driven tool that prints the read/write length each end used."""
    if not lengths or result.spec.protocol != "tcp":
        return result

    def side(direction: str, found: Optional[SideSummary]) -> Optional[SideSummary]:
        if found is None or found.call_length_bytes is not None:
            return found
        length = lengths.get((direction, found.role))
        return found if length is None else attrs.evolve(found, call_length_bytes=length)

    def filled(item: Any) -> Any:
        return attrs.evolve(item, sender=side(item.direction, item.sender),
                            receiver=side(item.direction, item.receiver))

    return attrs.evolve(result, summaries=tuple(filled(f) for f in result.summaries),
                        streams=tuple(filled(s) for s in result.streams))


def utc_now_iso() -> str:
    """The current time, UTC, ISO 8601 with milliseconds (for ``Result.start_time``), as
    ``datetime.now(timezone.utc).isoformat(timespec="milliseconds")`` writes it:
    ``2024-05-01T12:00:00.123+00:00``."""
    # time, not datetime: importing datetime (a Python module over _datetime) is ~1 ms of
    # every run's start-up, for this one timestamp.
    now_ns = time.time_ns()
    seconds, rest_ns = divmod(now_ns, 1_000_000_000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{stamp}.{rest_ns // 1_000_000:03d}+00:00"


def system_name() -> str:
    """This machine as ``Endpoint.system`` names it: ``uname`` system, release, machine."""
    # os.uname, not platform.uname: the same three fields, without importing platform
    # (it compiles a dozen regular expressions at import, start-up time on a router).
    uname = os.uname()
    return f"{uname.sysname} {uname.release} {uname.machine}"


def bits_per_second(nbytes: int, seconds: float) -> float:
    """Throughput of ``nbytes`` over ``seconds`` (0.0 for an empty span)."""
    return nbytes * 8 / seconds if seconds > 0 else 0.0


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
    "LoadFailure",
    "NetprobeError",
    "NullReporter",
    "Registry",
    "RelayReporter",
    "Reporter",
    "Switch",
    "Tool",
    "bits_per_second",
    "fill_missing",
    "intervals_not_kept",
    "load_registry",
    "make_manager",
    "short_sender_totals",
    "system_name",
    "utc_now_iso",
    "with_call_lengths",
]
