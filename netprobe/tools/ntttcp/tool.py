"""NTTTCP for Linux driven as a netprobe tool.

The sender (``-s``) is the client; for a test on this machine the adapter first starts the
receiver (``-r``; the role is always given: without one ntttcp silently becomes a receiver)
with the same mapping, duration, protocol and ports, on a free base port whose sync port
(base - 1) is free too. Both write ``-x`` XML and ``-j`` JSON result files (read, kept in
``Result.raw`` and deleted); the console output is read live for the ~0.5 s
``Real-time throughput`` lines and for what the files lack (RTT with ``-V``).

ntttcp's receiver (and then the sender, which waits for it) often prints its whole report
and does not exit: once a report is complete and its result files are written, the
process is stopped. Traps handled: ``-h`` exits 23, no receiver exits 24, bad arguments
exit 23 or 255, errors go to stdout; UDP over IPv6 is not implemented (it hangs), so it is
refused.

Command lines: :mod:`netprobe.tools.ntttcp.command`.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import attrs

from netprobe.bottleneck import with_cpu_warnings
from netprobe.driven import (
    DrivenProcess,
    DrivenRun,
    Ready,
    family_for,
    find_binary,
    listening,
    not_found,
    run_once,
    system_name,
    tcpbytes,
)
from netprobe.errors import NetprobeError, ParseError, TestFailed, TestInterrupted, ToolUnavailable
from netprobe.plugin import Availability, Capabilities, Reporter, Tool, fill_missing, utc_now_iso
from netprobe.schema import (
    Endpoint,
    FlowSummary,
    Interval,
    RawOutput,
    Result,
    TestSpec,
    ToolInfo,
)
from netprobe.tools.ntttcp import parse_output as p
from netprobe.tools.ntttcp.command import Plan, common_args, line_buffer_prefix, make_plan
from netprobe.tools.ntttcp.intervals import (
    REALTIME_PERIOD_S,
    CounterSampler,
    IntervalBuilder,
    reconcile,
    schedule,
)
from netprobe.tools.ntttcp.parse_windows import (
    is_windows_console,
    parse_windows_console,
    windows_version,
)

MAX_STREAMS = 512
"""ntttcp's most receiver ports (MAX_NUM_SERVER_PORTS)."""
_NTTTCP_HINT = ("NTTTCP for Linux is not packaged by Debian: build it from "
                "microsoft/ntttcp-for-linux")
_START_TIMEOUT_S = 5.0
_EXIT_GRACE_S = 2.0
_FILE_GRACE_S = 2.0
_POLL_S = 0.1


class NtttcpTool(Tool):
    """NTTTCP for Linux (1.4.x): drives the sender, and a receiver for local tests.

    Options: ``path`` (the binary), ``start_server`` (False: never start a receiver, even
    for this machine), ``line_buffered`` (False: do not run ntttcp under ``stdbuf -oL``,
    which makes its console output arrive line by line through a pipe); the modes
    ``receive`` (only a receiver, here, for an outside sender: ``netprobe run --receive``)
    and ``no_sync`` (``-N`` on both roles: ``--no-sync``), for Windows NTttcp peers.
    """

    name: ClassVar[str] = "ntttcp"
    description: ClassVar[str] = (
        "NTTTCP for Linux (sender driven; receiver started for local tests)"
    )
    modes: ClassVar[frozenset[str]] = frozenset({"receive", "no_sync"})
    capabilities: ClassVar[Capabilities] = Capabilities.all_but(
        "byte_count", "window", "mss", "dscp", "congestion", "zerocopy", "skip_rx_copy",
        directions=frozenset({"normal"}),
        max_streams=MAX_STREAMS, min_interval_s=REALTIME_PERIOD_S,
    )

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self._availability: Availability | None = None
        self._help = ""

    # -- probe --------------------------------------------------------------------------

    def probe(self) -> Availability:
        """Find the binary and read its version from the first line of ``ntttcp -h``
        (it has no version option; ``-h`` exits 23). Never raises."""
        if self._availability is None:
            try:
                self._availability = self._probe()
            except Exception as exc:  # probe must never raise
                self._availability = Availability(False, reasons=(f"ntttcp probe failed: {exc}",))
        return self._availability

    def _probe(self) -> Availability:
        override = self.options.get("path")
        path = find_binary("ntttcp", override, "NETPROBE_NTTTCP")
        if path is None:
            return Availability(False, reasons=(not_found("ntttcp", override, "NETPROBE_NTTTCP",
                                                  _NTTTCP_HINT),))
        try:
            code, text = run_once([path, "-h"], timeout=5.0)
        except ToolUnavailable as exc:
            return Availability(False, reasons=(str(exc),), path=path)
        found = re.search(r"NTTTCP for Linux (\S+)", text)
        if not found:
            first = text.strip().splitlines()[0] if text.strip() else "nothing"
            why = f"{path} -h (exit code {code}) does not look like NTTTCP for Linux: {first}"
            return Availability(False, reasons=(why,), path=path)
        self._help = text
        return Availability(True, version=found.group(1), path=path)

    # -- refusals -----------------------------------------------------------------------

    def refusals(self, spec: TestSpec) -> list[str]:
        """Capability refusals plus ntttcp's own: whole seconds, no UDP over IPv6, exact
        rates, UDP datagram size, and options this build's help does not list."""
        found = super().refusals(spec)

        def refuse(option: str, why: str) -> None:
            found.append(f"ntttcp cannot honour {option}: {why}")

        if spec.duration_s is not None and not float(spec.duration_s).is_integer():
            refuse(f"--time {spec.duration_s:g}", "ntttcp -t takes whole seconds")
        if spec.omit_s and not float(spec.omit_s).is_integer():
            refuse(f"--omit {spec.omit_s:g}", "ntttcp -W takes whole seconds")
        if spec.protocol == "udp" and family_for(spec) == socket.AF_INET6:
            refuse("--udp with IPv6", "UDP over IPv6 is not implemented in ntttcp (it hangs)")
        rate = spec.rate_bits_per_second
        if rate is not None and not float(rate * spec.streams).is_integer():
            refuse(f"--bitrate {rate:g}", "ntttcp -B takes whole bits per second")
        if self.options.get("receive"):
            self._receive_refusals(spec, refuse)
        found += self._feature_refusals(spec, refuse)
        return found

    @staticmethod
    def _receive_refusals(spec: TestSpec, refuse: Any) -> None:
        """Receive-only: what only the (outside) sender decides cannot be asked here."""
        # (a UDP spec always has a rate, netprobe's default: not the user's wish)
        rate = spec.rate_bits_per_second is not None and spec.protocol == "tcp"
        sender_side = [(rate, "--bitrate"),
                       (spec.nodelay, "--nodelay"), (spec.bind_address is not None, "--bind")]
        for asked, option in sender_side:
            if asked:
                refuse(option, "with --receive the sender started elsewhere decides it")

    def _feature_refusals(self, spec: TestSpec, refuse: Any) -> list[str]:
        """Options this build does not list in its help (known only after a probe)."""
        if not self._help:
            return []
        wanted = [
            (spec.nodelay, "--no-delay", "--nodelay"),
            (spec.rate_bits_per_second is not None, "-B ", "--bitrate"),
            (spec.omit_s > 0, "-W ", "--omit"),
            (spec.bind_address is not None, "-a ", "--bind"),
        ]
        for asked, flag, option in wanted:
            if asked and flag not in self._help:
                refuse(option, f"this ntttcp build has no {flag.strip()} option")
        return []

    # -- run ----------------------------------------------------------------------------

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        """Run the test (starting a receiver first when the host is this machine)."""
        self.check(spec)  # what the capabilities refuse, before the probe runs ntttcp -h
        available = self.probe()
        self.check(spec)  # and what this build lacks, known from its help
        if not available.available or available.path is None:
            raise ToolUnavailable("; ".join(available.reasons) or "ntttcp is not available")
        workdir = tempfile.mkdtemp(prefix="netprobe-ntttcp-")
        try:
            plan = make_plan(spec, available.path, self.options, workdir, self._help)
            return _Session(spec, plan, reporter, available.version).run()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def far_end_argv(self, spec: TestSpec, address: str, port: int) -> list[str] | None:
        """The receiver (``-r``) with the sender's thread mapping, duration and ports; its
        console report is what the agent sends back."""
        available = self.probe()
        if not available.available or available.path is None:
            raise ToolUnavailable("; ".join(available.reasons) or "ntttcp is not available")
        prefix = line_buffer_prefix(self.options)
        return [*prefix, available.path, "-r", *common_args(spec, address, port)]

    def merge_far_end(self, result: Result, far_end: RawOutput) -> Result:
        """The receiver's console report fills the receiver figures the sender lacks."""
        try:
            theirs = parse_sources([("receiver", far_end.text)])
        except NetprobeError:
            return super().merge_far_end(result, far_end)
        merged = fill_missing(result, theirs, far_end)
        receiver = merged.summaries[0].receiver if merged.summaries else None
        if receiver is None or not any(w == COUNTER_NOTE for w in merged.warnings):
            return merged
        # the sender's acknowledged bytes and the far receiver's total count the same bytes
        return attrs.evolve(merged, intervals=reconcile(merged.intervals, receiver.bytes,
                                                        "sender"))

    # -- parse --------------------------------------------------------------------------

    def parse(self, sources: Sequence[tuple[str, str]]) -> Result:
        """Read saved ntttcp outputs: console logs, -x XML and -j JSON files, either role."""
        return parse_sources(sources)


# --- one run ---------------------------------------------------------------------------


@dataclass
class _Proc:
    """One ntttcp process and its live parser."""

    role: str
    process: DrivenProcess
    parser: p.ConsoleParser
    complete_at: float | None = None
    stopped_after_report: bool = False


class _Session:
    """One run: the processes, their parsers, and the result built from them."""

    def __init__(self, spec: TestSpec, plan: Plan, reporter: Reporter, version: str | None) -> None:
        self.spec = spec
        self.plan = plan
        self.version = version
        self.lock = threading.Lock()  # the parsers' state, read by the result builder
        self.driven = DrivenRun(reporter, tool="ntttcp")
        live_role = "receiver" if plan.receiver_argv is not None else "sender"
        self.live_role = live_role
        self.builder = IntervalBuilder(live_role, spec.interval_s)
        self.sampler = self._sampler()
        self.start_time = utc_now_iso()
        self.procs: dict[str, _Proc] = {}
        self.problems: list[str] = []
        self.warnings: list[str] = []

    def _sampler(self) -> CounterSampler | None:
        """TCP intervals from the connections' byte counters (None: UDP, no interval
        asked, or no sock_diag here: the real-time lines then)."""
        spec = self.spec
        if spec.protocol != "tcp" or spec.interval_s is None or not tcpbytes.available(
                self.plan.family):
            return None
        ports = range(self.plan.base_port, self.plan.base_port + spec.streams)
        counter = tcpbytes.TcpBytes(self.plan.family, ports, self.live_role)
        ends = schedule(spec.interval_s, float(spec.omit_s), float(spec.duration_s or 0))
        return CounterSampler(self.live_role, ends, float(spec.omit_s), counter.total,
                              self.driven.emit)

    def run(self) -> Result:
        """Run the processes; the Result, or TestFailed/TestInterrupted with the partial."""
        try:
            return self._run()
        finally:
            if self.sampler is not None:
                self.sampler.stop()

    def _run(self) -> Result:
        receiver_ready = True
        with self.driven as run:
            if self.plan.receiver_argv is not None:
                receiver = self._start("receiver", self.plan.receiver_argv)
                receiver_ready = run.wait_ready(receiver, self._receiver_ports(),
                                                _START_TIMEOUT_S)
            if receiver_ready and self.plan.receive_only:
                run.note(self._waiting_note())
            if receiver_ready and self.plan.sender_argv is not None:
                self._start("sender", self.plan.sender_argv)
            if receiver_ready:
                self._wait()
        if run.interrupted:
            partial = self._result("interrupted", ["interrupted by the user"])
            raise TestInterrupted("interrupted: ntttcp stopped", partial)
        if not receiver_ready:
            raise self._receiver_failed()
        return self._finish()

    # -- processes ----------------------------------------------------------------------

    def _start(self, role: str, argv: tuple[str, ...]) -> DrivenProcess:
        parser = p.ConsoleParser(warmup=self.spec.omit_s > 0)
        process = self.driven.start(role, argv, on_line=self._line_handler(role, parser))
        self.procs[role] = _Proc(role, process, parser)
        return process

    def _receiver_ports(self) -> Ready:
        udp = self.spec.protocol == "udp"
        ports = [] if self.plan.no_sync else [(self.plan.base_port - 1, False)]  # sync: TCP
        ports += [(self.plan.base_port + i, udp) for i in range(self.spec.streams)]
        return listening(ports, self.plan.family)

    def _waiting_note(self) -> str:
        last = self.plan.base_port + self.spec.streams - 1
        ports = f"port {last}" if last == self.plan.base_port else (
            f"ports {self.plan.base_port}-{last}")
        sync = ("no sync (a sender with -N, or ntttcp.exe -ns)" if self.plan.no_sync
                else f"sync port {self.plan.base_port - 1}")
        return (f"ntttcp receiver listening on {self.plan.address} {ports}, {sync}: waiting "
                "for a sender (Ctrl-C to stop)")

    def _receiver_failed(self) -> TestFailed:
        receiver = self.procs["receiver"].process
        why = p.failure_message(self.procs["receiver"].parser.out) or "no message"
        why = f"{why} (exit code {receiver.returncode})"
        return TestFailed(
            f"ntttcp receiver did not start listening on port {self.plan.base_port}: "
            f"{why} (command: {' '.join(receiver.argv)})",
            self._result("failed", [f"ntttcp receiver did not start: {why}"]),
        )

    def _wait(self) -> None:
        def tick() -> None:
            self._stop_finished(time.monotonic())
            self._stop_orphan_receiver()

        def exited() -> bool:
            return all(proc.process.returncode is not None for proc in self.procs.values())

        if self.plan.receive_only:
            self._wait_for_outside_sender(exited, tick)
        elif not self.driven.wait(exited, self.plan.timeout_s, tick):
            self.problems.append(
                f"ntttcp did not finish within {self.plan.timeout_s:g} s and was stopped"
            )

    def _wait_for_outside_sender(self, exited: Any, tick: Any) -> None:
        """Receive-only: no deadline until a sender connects (Ctrl-C ends the wait), then
        the test's own length and the grace."""
        receiver = self.procs["receiver"]
        self.driven.wait(lambda: exited() or receiver.parser.out.connected, None, tick)
        if exited():
            return
        if not self.driven.wait(exited, self.plan.timeout_s, tick):
            self.problems.append(f"ntttcp receiver did not finish within "
                                 f"{self.plan.timeout_s:g} s of its sender connecting")

    def _stop_finished(self, now: float) -> None:
        """Stop a process that printed its whole report but does not exit (ntttcp's
        receiver often hangs, and its sender waits for it)."""
        sender = self.procs.get("sender")
        sender_done = self.plan.receive_only or (sender is not None and (
            sender.parser.out.report_complete or sender.process.returncode is not None
        ))
        for proc in self.procs.values():
            if proc.process.returncode is not None or not proc.parser.out.report_complete:
                continue
            if proc.role == "receiver" and not sender_done:
                continue
            if proc.complete_at is None:
                proc.complete_at = now
            waited = now - proc.complete_at
            ready = self._files_ready(proc.role) or waited > _EXIT_GRACE_S + _FILE_GRACE_S
            if waited > _EXIT_GRACE_S and ready:
                proc.stopped_after_report = True
                proc.process.stop()
                self.warnings.append(
                    f"ntttcp {proc.role} did not exit after its report; it was stopped"
                )

    def _stop_orphan_receiver(self) -> None:
        """The sender gave up before its report: the receiver would wait forever."""
        sender, receiver = self.procs.get("sender"), self.procs.get("receiver")
        if sender is None or receiver is None or sender.process.returncode is None:
            return
        if not sender.parser.out.report_complete and receiver.process.returncode is None:
            receiver.process.stop(grace_s=0.5)

    def _files_ready(self, role: str) -> bool:
        for kind in ("xml", "json"):
            path = self.plan.files.get(f"{role}.{kind}")
            asked = any(arg.startswith(f"-{kind[0]}") for arg in self.procs[role].process.argv)
            if path is None or not asked:
                continue
            text = _read(path)
            if text is None or not _complete(kind, text):
                return False
        return True

    # -- live output --------------------------------------------------------------------

    def _line_handler(self, role: str, parser: p.ConsoleParser) -> Any:
        def on_line(line: str) -> None:
            now = time.monotonic()
            with self.lock:
                started = self._test_started(parser.out)
                samples = parser.feed(line)
                if role != self.live_role:
                    return
                if self._test_started(parser.out) and not started:
                    self._clock_starts(now)
                if self.sampler is not None:
                    return
                found = [self.builder.add(sample, now) for sample in samples]
                if parser.out.in_totals or parser.out.report_complete:
                    found.append(self.builder.flush())  # the report: no more samples
                for item in found:
                    if item is not None:
                        self.driven.emit(item)

        return on_line

    def _test_started(self, out: p.ConsoleOutput) -> bool:
        # With sync both ends print "Network activity progressing..."; without, a
        # receiver's test starts at its first connection (and the sender's at its own).
        return out.started or (self.plan.no_sync and out.connected)

    def _clock_starts(self, now: float) -> None:
        if self.sampler is not None:
            self.sampler.start(now)
        else:
            self.builder.start(now)

    # -- result -------------------------------------------------------------------------

    def _finish(self) -> Result:
        reasons = list(self.problems)
        for proc in self.procs.values():
            reasons += self._proc_problems(proc)
        if not reasons:
            return self._result("ok", [])
        why = "; ".join(reasons)
        command = " ".join(self.plan.sender_argv or self.plan.receiver_argv or ())
        raise TestFailed(
            f"ntttcp failed: {why}; command: {command}", self._result("failed", reasons)
        )

    def _proc_problems(self, proc: _Proc) -> list[str]:
        out = proc.parser.out
        code = proc.process.returncode
        message = p.failure_message(out)
        if proc.process.callback_error is not None:
            return [f"ntttcp {proc.role} output could not be read: {proc.process.callback_error}"]
        if out.report_complete:
            if message:
                self.warnings.append(f"ntttcp {proc.role} reported: {message}")
            if code not in (0, None) and not proc.stopped_after_report:
                return [f"ntttcp {proc.role} exited with code {code} after its report"]
            return []
        why = message or f"ntttcp {proc.role} printed no report"
        return [f"{why} (ntttcp {proc.role}, exit code {code})"]

    def _result(self, status: str, errors: list[str]) -> Result:
        with self.lock:
            totals = {role: self._totals(role) for role in ("sender", "receiver")}
        if self.sampler is not None:
            self.sampler.stop()  # its last interval, if any, before they are read
            if self.sampler.failed:
                self.warnings.append(f"ntttcp intervals: {self.sampler.failed}")
        intervals = tuple(self.driven.collected())
        received = totals["receiver"]
        if self.live_role == "receiver" and received is not None:
            intervals = reconcile(intervals, received.bytes, "receiver")
        elif self.sampler is not None and totals["sender"] is not None:
            self._acked_gap(intervals, totals["sender"].bytes)
        omit = float(self.spec.omit_s)
        sender, receiver = (p.side_summary(role, found, self.spec.protocol, omit)
                            if (found := totals[role]) is not None else None
                            for role in ("sender", "receiver"))
        summaries: tuple[FlowSummary, ...] = ()
        if sender is not None or receiver is not None:
            summaries = (FlowSummary("client_to_server", sender=sender, receiver=receiver),)
        measured = receiver or sender
        duration = None if measured is None else measured.end_s - measured.start_s
        warnings = [*self.warnings, *self.driven.warnings]
        if intervals:
            warnings.append(COUNTER_NOTE if self.sampler is not None else _INTERVAL_NOTE)
        if self.plan.receive_only:
            warnings.append(_RECEIVE_ONLY_NOTE)
        version = next(
            (pr.parser.out.version for pr in self.procs.values() if pr.parser.out.version), None
        )
        local, remote = self._endpoints()
        return with_cpu_warnings(Result(
            tool=ToolInfo(name="ntttcp", version=version or self.version),
            spec=self.spec,
            start_time=self.start_time,
            local=local,
            remote=remote,
            status=status,
            duration_s=duration,
            summaries=summaries,
            streams=p.streams(totals["sender"], totals["receiver"], self.spec.protocol, omit),
            intervals=intervals,
            warnings=tuple(warnings),
            errors=tuple(errors),
            raw=self._raw(),
        ))

    def _acked_gap(self, intervals: tuple[Interval, ...], written: int | None) -> None:
        """A sender's intervals count acknowledged bytes; its total, bytes written into the
        socket (some still unacknowledged at its end): say by how much they differ."""
        acked = sum(i.bytes for i in intervals if i.role == "sender" and not i.omitted)
        if written and acked != written:
            self.warnings.append(
                f"ntttcp sender intervals sum to {acked:,} acknowledged bytes, "
                f"{(written - acked) / written:.1%} below its total of {written:,} bytes "
                "written (the rest was still in the socket buffer when it ended)")

    def _endpoints(self) -> tuple[Endpoint, Endpoint]:
        """This machine and the far end (in receive-only mode: the receiver here, and the
        outside sender as its first connection shows it)."""
        if self.plan.receive_only:
            peer = self.procs["receiver"].parser.out.peer_address
            return (Endpoint(role="server", address=self.plan.address,
                             port=self.plan.base_port, system=system_name()),
                    Endpoint(role="client", address=peer))
        return (Endpoint(role="client", address=self.spec.bind_address, system=system_name()),
                Endpoint(role="server", host=self.spec.host, address=self.plan.address,
                         port=self.plan.base_port,
                         system=system_name() if self.plan.local else None))

    def _totals(self, role: str) -> p.Totals | None:
        """The role's report: its console's and its result files' figures together."""
        proc = self.procs.get(role)
        if proc is None:
            return None
        files = _result_files(self.plan.files, role)
        warning = p.disagreement(proc.parser.out.totals, files, role)
        if warning and warning not in self.warnings:
            self.warnings.append(warning)
        return p.merge(proc.parser.out.totals, files)

    def _raw(self) -> tuple[RawOutput, ...]:
        found = [proc.process.raw() for proc in self.procs.values()]
        for name, path in sorted(self.plan.files.items()):
            text = _read(path)
            if text is not None:
                found.append(RawOutput(name=name, text=text))
        return tuple(found)


_RECEIVE_ONLY_NOTE = (
    "receive-only: netprobe ran the ntttcp receiver and an outside sender sent; the "
    "sender's own figures are in its output"
)
_INTERVAL_NOTE = (
    "ntttcp intervals are its ~0.5 s real-time throughput lines, timed by their arrival "
    "and summed to the interval; their bytes are derived from the printed rate; the last "
    "takes what the others leave of the total"
)
COUNTER_NOTE = (
    "ntttcp intervals are the kernel's byte counters of the test's connections (a "
    "sender's acknowledged, a receiver's received bytes), sampled by netprobe; the last "
    "takes what the others leave of the receiver's total"
)


def _read(path: str) -> str | None:
    with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()
    return None


def _complete(kind: str, text: str) -> bool:
    if kind == "xml":
        return text.rstrip().endswith(("</ntttcps>", "</ntttcpr>"))
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _result_files(files: dict[str, str], role: str) -> p.Totals | None:
    """The role's result file totals: XML (it has the host CPU breakdown), else JSON."""
    for kind, reader in (("xml", p.parse_xml), ("json", p.parse_json)):
        path = files.get(f"{role}.{kind}")
        text = _read(path) if path else None
        if text and _complete(kind, text):
            with contextlib.suppress(ParseError):
                return reader(text, path or kind).totals
    return None


# --- parse saved output ---------------------------------------------------------------


@dataclass
class _RoleOutputs:
    """What the sources say about one role."""

    console: p.ConsoleOutput | None = None
    file: p.ResultFile | None = None


def parse_sources(sources: Sequence[tuple[str, str]]) -> Result:
    """A Result from saved ntttcp outputs (console, XML, JSON; sender and/or receiver)."""
    roles: dict[str, _RoleOutputs] = {"sender": _RoleOutputs(), "receiver": _RoleOutputs()}
    warnings: list[str] = []
    raw: list[RawOutput] = []
    readable = [(name, text) for name, text in sources if text.strip()]
    if not readable:
        raise ParseError("no ntttcp output: the input is empty", sources[0][0] if sources else None)
    for name, text in readable:
        raw.append(RawOutput(name=name, text=text))
        _read_source(name, text, roles, warnings)
    return _parsed_result(roles, warnings, tuple(raw), readable)


def _read_source(name: str, text: str, roles: dict[str, _RoleOutputs], warnings: list[str]) -> None:
    head = text.lstrip()[:1]
    if head in "<{":
        found = p.parse_xml(text, name) if head == "<" else p.parse_json(text, name)
        slot = roles[found.role]
        if slot.file is None or name.endswith(".xml"):  # XML has more than JSON
            slot.file = found
        return
    if is_windows_console(text):
        _read_windows_console(name, text, roles, warnings)
        return
    out = p.parse_console(text)
    if out.recognized == 0 or (out.version is None and out.unknown and not out.in_totals
                               and not out.report_complete and not out.errors):  # fmt: skip
        line = out.unknown[0] if out.unknown else 1
        raise ParseError("not ntttcp output", name, line)
    role = p.guess_role(text, name) or "sender"
    if roles[role].console is not None:
        warnings.append(f"{name}: a second {role} console output; ignored")
        return
    roles[role].console = out
    if out.unknown:
        warnings.append(
            f"{name}: {len(out.unknown)} line(s) not understood, first at line {out.unknown[0]}"
        )


def _read_windows_console(name: str, text: str, roles: dict[str, _RoleOutputs],
                          warnings: list[str]) -> None:
    """Windows NTttcp's console: it does not say its role, the file name may."""
    totals = parse_windows_console(text)
    if totals.bytes is None:
        raise ParseError("Windows NTttcp output without its totals table", name,
                         text.count("\n") + 1)
    role = next((r for r in ("receiver", "sender") if r in name.lower()), None)
    if role is None:
        role = "sender"  # the Windows end of an interop test is usually the sender
        warnings.append(f"{name}: Windows NTttcp does not print its role: taken as the sender")
    version = windows_version(text)
    roles[role].console = p.ConsoleOutput(role=role, totals=totals, report_complete=True,
                                          recognized=1, version=version)
    warnings.append(f"{name}: Windows NTttcp {version or ''}".rstrip() + ": its MB are 2**20 "
                    "bytes; Avg. CPU %, retransmits, DPC and interrupt counts are the host's")


def _parsed_result(
    roles: dict[str, _RoleOutputs],
    warnings: list[str],
    raw: tuple[RawOutput, ...],
    readable: list[tuple[str, str]],
) -> Result:
    spec = _parsed_spec(roles)
    totals, errors = _parsed_totals(roles, warnings)
    omit = float(spec.omit_s)
    sender, receiver = (p.side_summary(role, totals[role], spec.protocol, omit)
                        for role in ("sender", "receiver"))
    for role in ("sender", "receiver"):
        console = roles[role].console
        if console and console.started and not console.report_complete and (
                sender if role == "sender" else receiver) is None:
            warnings.append(f"ntttcp {role}: no report: the output is incomplete")
    if sender is None and receiver is None and not errors:
        name, text = readable[-1]
        raise ParseError("no ntttcp results in the output (truncated?)", name, text.count("\n") + 1)
    summaries: tuple[FlowSummary, ...] = ()
    if sender is not None or receiver is not None:
        summaries = (FlowSummary("client_to_server", sender=sender, receiver=receiver),)
    if any(slot.console and slot.console.realtime_count for slot in roles.values()):
        warnings.append("ntttcp's real-time throughput lines carry no timestamps: no intervals")
    first = receiver or sender
    consoles = [slot.console for slot in roles.values() if slot.console]
    return with_cpu_warnings(Result(
        tool=ToolInfo(
            name="ntttcp", version=next((c.version for c in consoles if c.version), None)
        ),
        spec=spec,
        start_time=None,
        local=Endpoint(role="client"),
        remote=Endpoint(role="server", host=spec.host, address=spec.host, port=spec.port),
        status="failed" if errors and not summaries else "ok",
        duration_s=None if first is None else first.end_s - first.start_s,
        summaries=summaries,
        streams=p.streams(totals["sender"], totals["receiver"], spec.protocol, omit),
        warnings=(_RECONSTRUCTED, *warnings),
        errors=tuple(errors),
        raw=raw,
    ))


_RECONSTRUCTED = (
    "test options reconstructed from the output; options it does not show are left at "
    "their defaults"
)


def _parsed_totals(
    roles: dict[str, _RoleOutputs], warnings: list[str]
) -> tuple[dict[str, p.Totals], list[str]]:
    """Each role's totals (console and result file together) and the errors its console
    shows."""
    found: dict[str, p.Totals] = {}
    errors: list[str] = []
    for role, slot in roles.items():
        console = slot.console.totals if slot.console else None
        result_file = slot.file.totals if slot.file else None
        warning = p.disagreement(console, result_file, role)
        if warning:
            warnings.append(warning)
        found[role] = p.merge(console, result_file)
        message = p.failure_message(slot.console) if slot.console else None
        if message:
            errors.append(f"{role}: {message}")
    return found, errors


def _parsed_spec(roles: dict[str, _RoleOutputs]) -> TestSpec:
    """The test options as far as the outputs show them (result files first)."""
    params = [slot.file.params for slot in roles.values() if slot.file]
    params += [slot.console.params for slot in roles.values() if slot.console]

    def first(name: str) -> Any:
        return next((getattr(x, name) for x in params if getattr(x, name) is not None), None)

    totals = [slot.file.totals for slot in roles.values() if slot.file]
    totals += [slot.console.totals for slot in roles.values() if slot.console]
    connections = next((t.connections for t in totals if t.connections), None)
    measured = next((round(t.duration_s) for t in totals if t.duration_s), None)
    return TestSpec(
        tool="ntttcp",
        host=first("server_address"),
        protocol=first("protocol") or "tcp",
        streams=connections or first("streams") or 1,
        duration_s=float(first("duration_s") or measured or 10),
        interval_s=None,
        omit_s=float(first("warmup_s") or 0),
        port=first("port"),
        ip_version=6 if first("ipv6") else None,
    )
