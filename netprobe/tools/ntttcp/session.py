"""One run of ntttcp: the receiver (for a test on this machine, or alone in receive-only
mode) and the sender (unless the sender is someone else's), through
:class:`netprobe.driven.DrivenSession`.

ntttcp's receiver (and then the sender, which waits for it) often prints its whole report
and does not exit: once a report is complete and its result files are written, the
process is stopped. A receive-only receiver waits for its outside sender without a
deadline (Ctrl-C ends the wait), then for the test's length and the grace.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any

import attrs

from netprobe.driven import (
    SERVER_READY_S,
    DrivenProcess,
    DrivenSession,
    Ready,
    listening,
    system_name,
    tcpbytes,
)
from netprobe.errors import ParseError, TestFailed
from netprobe.plugin import Reporter
from netprobe.resultops import short_sender_totals
from netprobe.schema import Endpoint, FlowSummary, Interval, RawOutput, Result, TestSpec
from netprobe.tools.ntttcp import parse_output as p
from netprobe.tools.ntttcp.command import Plan
from netprobe.tools.ntttcp.intervals import CounterSampler, IntervalBuilder, reconcile, schedule

_EXIT_GRACE_S = 2.0
_FILE_GRACE_S = 2.0


@dataclass
class _Proc:
    """One ntttcp process's live parser and how it ended."""

    role: str
    parser: p.ConsoleParser
    complete_at: float | None = None
    stopped_after_report: bool = False


class NtttcpSession(DrivenSession):
    """One run: the processes, their parsers, the interval sampler, the Result."""

    def __init__(self, spec: TestSpec, plan: Plan, reporter: Reporter, version: str | None) -> None:
        super().__init__(spec, reporter, tool="ntttcp", version=version)
        self.plan = plan
        live_role = "receiver" if plan.server_argv is not None else "sender"
        self.live_role = live_role
        self.builder = IntervalBuilder(live_role, spec.interval_s)
        self.sampler = self._sampler()
        self.procs: dict[str, _Proc] = {}

    def _sampler(self) -> CounterSampler | None:
        """TCP intervals from the connections' byte counters (None: UDP, no interval
        asked, or no sock_diag here: the real-time lines then)."""
        spec = self.spec
        if spec.protocol != "tcp" or spec.interval_s is None or not tcpbytes.available(
                self.plan.family):
            return None
        ports = range(self.plan.base_port, self.plan.base_port + spec.streams)
        counter = tcpbytes.TcpBytes(self.plan.family, ports, self.live_role,
                                    self.plan.address if self.live_role == "sender" else None)
        ends = schedule(spec.interval_s, float(spec.omit_s), float(spec.duration_s or 0))
        return CounterSampler(self.live_role, ends, float(spec.omit_s), counter.total,
                              self.driven.emit)

    def run(self) -> Result:
        """Run the processes; the Result, or TestFailed/TestInterrupted with the partial."""
        try:
            return super().run()
        finally:
            if self.sampler is not None:
                self.sampler.stop()

    # -- processes ----------------------------------------------------------------------

    def start_server(self) -> bool:
        """Start the local receiver, if the plan has one; False if it did not listen."""
        if self.plan.server_argv is None:
            return True
        ready = self.serve("receiver", self.plan.server_argv, self._receiver_ports(),
                           SERVER_READY_S, on_line=self._parser_for("receiver"))
        if ready and self.plan.receive_only:
            self.driven.note(self._waiting_note())
        return ready

    def run_client(self) -> None:
        """Start the sender (unless it is someone else's) and wait for the end."""
        if self.plan.client_argv:
            self.driven.start("sender", self.plan.client_argv,
                              on_line=self._parser_for("sender"))
        self._wait()

    def _parser_for(self, role: str) -> Any:
        parser = p.ConsoleParser(warmup=self.spec.omit_s > 0)
        self.procs[role] = _Proc(role, parser)
        return self._line_handler(role, parser)

    def _process(self, role: str) -> DrivenProcess:
        return self.driven.processes[role]

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

    def server_failed(self) -> TestFailed:
        """The receiver did not start listening: its own words, exit code and command."""
        receiver = self._process("receiver")
        why = p.failure_message(self.procs["receiver"].parser.out) or "no message"
        why = f"{why} (exit code {receiver.returncode})"
        return TestFailed(
            f"ntttcp receiver did not start listening on port {self.plan.base_port}: "
            f"{why} (command: {' '.join(receiver.argv)})",
            self.result("failed", [f"ntttcp receiver did not start: {why}"]),
        )

    def _wait(self) -> None:
        def tick() -> None:
            self._stop_finished(time.monotonic())
            self._stop_orphan_receiver()

        def exited() -> bool:
            return all(process.returncode is not None
                       for process in self.driven.processes.values())

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
            sender.parser.out.report_complete or self._process("sender").returncode is not None
        ))
        for proc in self.procs.values():
            process = self._process(proc.role)
            if process.returncode is not None or not proc.parser.out.report_complete:
                continue
            if proc.role == "receiver" and not sender_done:
                continue
            if proc.complete_at is None:
                proc.complete_at = now
            waited = now - proc.complete_at
            ready = self._files_ready(proc.role) or waited > _EXIT_GRACE_S + _FILE_GRACE_S
            if waited > _EXIT_GRACE_S and ready:
                proc.stopped_after_report = True
                self._process(proc.role).stop()
                self.warnings.append(
                    f"ntttcp {proc.role} did not exit after its report; it was stopped"
                )

    def _stop_orphan_receiver(self) -> None:
        """The sender gave up before its report: the receiver would wait forever."""
        sender, receiver = self.procs.get("sender"), self.procs.get("receiver")
        if sender is None or receiver is None or self._process("sender").returncode is None:
            return
        if not sender.parser.out.report_complete and self._process("receiver").returncode is None:
            self._process("receiver").stop(grace_s=0.5)

    def _files_ready(self, role: str) -> bool:
        for kind in ("xml", "json"):
            path = self.plan.files.get(f"{role}.{kind}")
            asked = any(arg.startswith(f"-{kind[0]}") for arg in self._process(role).argv)
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

    # -- how it ended -------------------------------------------------------------------

    def failures(self) -> list[str]:
        """The run's problems and each process's (its message, no report, its exit)."""
        reasons = list(self.problems)
        for proc in self.procs.values():
            reasons += self._proc_problems(proc)
        return reasons

    def failed(self, reasons: Any, command: Any = ()) -> TestFailed:
        """TestFailed naming the sender's command line (the receiver's if none)."""
        return super().failed(reasons, command or self.plan.client_argv or
                              self.plan.server_argv or ())

    def _proc_problems(self, proc: _Proc) -> list[str]:
        out = proc.parser.out
        code = self._process(proc.role).returncode
        message = p.failure_message(out)
        process = self._process(proc.role)
        if process.callback_error is not None:
            return [f"ntttcp {proc.role} output could not be read: {process.callback_error}"]
        if out.report_complete:
            if message:
                self.warnings.append(f"ntttcp {proc.role} reported: {message}")
            if code not in (0, None) and not proc.stopped_after_report:
                return [f"ntttcp {proc.role} exited with code {code} after its report"]
            return []
        why = message or f"ntttcp {proc.role} printed no report"
        return [f"{why} (ntttcp {proc.role}, exit code {code})"]

    # -- result -------------------------------------------------------------------------

    def result(self, status: str, errors: list[str]) -> Result:
        """The Result from what the processes printed and wrote so far."""
        with self.lock:
            totals = {role: self._totals(role) for role in ("sender", "receiver")}
        intervals = self._final_intervals(totals)
        omit = float(self.spec.omit_s)
        sender, receiver = (p.side_summary(role, found, self.spec.protocol, omit)
                            if (found := totals[role]) is not None else None
                            for role in ("sender", "receiver"))
        summaries = []
        if sender is not None or receiver is not None:
            summaries = [FlowSummary("client_to_server", sender=sender, receiver=receiver)]
        measured = receiver or sender
        notes = [COUNTER_NOTE if self.sampler is not None else _INTERVAL_NOTE] if intervals else []
        notes += short_sender_totals("ntttcp", self.spec.protocol, summaries)
        if intervals and self.live_role == "receiver" and totals["receiver"] is not None:
            notes.append(RECONCILED_NOTE)
        if self.plan.receive_only:
            notes.append(_RECEIVE_ONLY_NOTE)
        version = next((pr.parser.out.version for pr in self.procs.values()
                        if pr.parser.out.version), None)
        local, remote = self._endpoints()
        result = self.build_result(
            status, errors, remote=remote, summaries=summaries, intervals=intervals,
            streams=p.streams(totals["sender"], totals["receiver"], self.spec.protocol, omit),
            duration_s=None if measured is None else measured.end_s - measured.start_s,
            warnings=notes, version=version, raw=self._raw())
        return attrs.evolve(result, local=local)

    def _final_intervals(self, totals: dict[str, p.Totals | None]) -> tuple[Interval, ...]:
        """The intervals, the sampler stopped first; a receiver's summed to its total, a
        sender's gap to its own total said."""
        if self.sampler is not None:
            self.sampler.stop()  # its last interval, if any, before they are read
            if self.sampler.failed:
                self.warnings.append(f"ntttcp intervals: {self.sampler.failed}")
        intervals = self.intervals()
        received = totals["receiver"]
        if self.live_role == "receiver" and received is not None:
            return reconcile(intervals, received.bytes, "receiver")
        if self.sampler is not None and totals["sender"] is not None:
            self._acked_gap(intervals, totals["sender"].bytes)
        return intervals

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
        found = list(self.driven.raw())
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
    "and summed to the interval; their bytes are derived from the printed rate"
)
COUNTER_NOTE = (
    "ntttcp intervals are the kernel's byte counters of the test's connections (a "
    "sender's acknowledged, a receiver's received bytes), sampled by netprobe"
)
RECONCILED_NOTE = (
    "the last ntttcp interval takes what the counters missed of the receiver's total "
    "(bytes moved after the last sample), so that the intervals sum to it"
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
