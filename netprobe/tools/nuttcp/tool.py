"""nuttcp driven as a netprobe tool: the Tool (probe, refusals, run, parse) and one run's
session (the processes through DrivenSession, the live parser, the Result).

How the command lines are built is in :mod:`~netprobe.tools.nuttcp.command`; how nuttcp's
output is read, in :mod:`~netprobe.tools.nuttcp.parse_output` (live and saved alike) and
:mod:`~netprobe.tools.nuttcp.parse_saved` (a saved output as a Result).
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Iterator, Sequence
from typing import ClassVar, cast

from netprobe.driven import (
    DrivenProcess,
    DrivenSession,
    DrivenTool,
    is_numeric,
    listening,
    read_version,
    system_name,
)
from netprobe.errors import TestFailed
from netprobe.plugin import Availability, Capabilities, Reporter
from netprobe.schema import Endpoint, Interval, RawOutput, Result, TestSpec
from netprobe.tools._bounded import SpooledLog, held
from netprobe.tools.nuttcp import command
from netprobe.tools.nuttcp import parse_output as p
from netprobe.tools.nuttcp.command import DEFAULT_CONTROL_PORT, NuttcpPlan, make_plan
from netprobe.tools.nuttcp.parse_saved import parse_sources

MAX_STREAMS = 128
"""nuttcp's MAXSTREAM: it silently lowers larger -N values to this."""
_START_TIMEOUT_S = 5.0
_SERVER_EXIT_S = 2.0


class NuttcpTool(DrivenTool):
    """nuttcp (6.x, 8.x): drives the nuttcp client, and a one-shot server for local tests.

    Options: ``path`` (the binary), ``timeout_s`` (limit for byte-count tests),
    ``data_port`` (data port against a remote server; default control port + 1, or the
    server's default when no port is given), ``start_server`` (False: never start a server,
    even for this machine; a nuttcp server must already listen).
    """

    name: ClassVar[str] = "nuttcp"
    description: ClassVar[str] = "nuttcp 6.x/8.x (client driven; one-shot server for local tests)"
    overhead_s: ClassVar[float] = 0.15  # the one-shot server's start: 0.1-0.2 s here
    capabilities: ClassVar[Capabilities] = Capabilities.all_but(
        "omit", "congestion", "bind", "zerocopy", "skip_rx_copy",
        directions=frozenset({"normal", "reverse"}),
        max_streams=MAX_STREAMS, min_interval_s=0.1,
    )
    program: ClassVar[str] = "nuttcp"
    env_var: ClassVar[str] = "NETPROBE_NUTTCP"
    install_hint: ClassVar[str] = "install the nuttcp package"

    def identify(self, path: str) -> Availability:
        """Ask the version (``nuttcp -V``); 6.x is the oldest with ``-fparse -v`` output."""
        found, _text = read_version(path, ["-V"], r"nuttcp-(\d+(?:\.\d+)+)", "nuttcp")
        major = p.version_major(found.version) or 0
        if found.available and major < 6:
            why = f"nuttcp {found.version} is too old: netprobe needs 6.x or later"
            return Availability(False, version=found.version, reasons=(why,), path=path)
        return found

    def refusals(self, spec: TestSpec) -> list[str]:
        """Capability refusals plus the ones nuttcp's option units impose."""
        return [*super().refusals(spec), *command.refusals(spec, lambda: self.probe().version)]

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        """Run the test (starting a one-shot server first when the host is this machine)."""
        self.check(spec)
        plan = make_plan(spec, self.binary(), self.options)
        return NuttcpSession(spec, plan, reporter, self.probe().version).run()

    def far_end_argv(self, spec: TestSpec, address: str, port: int) -> list[str] | None:
        """A one-shot ``nuttcp -1 --nofork`` with its control port on ``port``; the client
        names the data port (``port + 1``). nuttcp's client prints both sides already."""
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        return command.server_argv(self.binary(), port, family)

    def split_tests(self, lines: Iterable[str]) -> Iterator[str]:
        """The one test of a saved output, spooled past _bounded.SPOOL_CHARS (a big log
        comes as a SpooledLog, which parse reads as it reads a str)."""
        chunk = SpooledLog()
        for line in lines:
            chunk.add(line)
        yield cast(str, held(chunk))

    def parse(self, sources: Sequence[tuple[str, str]]) -> Result:
        """Read saved nuttcp client output (-fparse or plain, brief or -v; 6.x or 8.x)."""
        return parse_sources(sources)


class NuttcpSession(DrivenSession):
    """One run: the one-shot server (for a local test), the client, the live parser."""

    def __init__(self, spec: TestSpec, plan: NuttcpPlan, reporter: Reporter,
                 version: str | None) -> None:
        super().__init__(spec, reporter, tool="nuttcp", version=version)
        self.plan = plan
        self.direction = "server_to_client" if spec.direction == "reverse" else "client_to_server"
        self.parser = p.NuttcpParser()
        self.next_start = 0.0
        self.client: DrivenProcess | None = None

    # -- processes ----------------------------------------------------------------------

    def start_server(self) -> bool:
        """Start the local one-shot server, if the plan has one; False if it did not listen."""
        if self.plan.server_argv is None:
            return True
        assert self.plan.control_port is not None
        ready = listening([(self.plan.control_port, False)], self.plan.family)
        return self.serve("server", self.plan.server_argv, ready, _START_TIMEOUT_S)

    def run_client(self) -> None:
        """Run the client to its end; then let the one-shot server finish its output."""
        run = self.driven
        self.client = run.start("client", self.plan.client_argv, on_line=self._on_line)
        run.wait_exit(self.client, self.plan.timeout_s)
        if run.timed_out:
            self.problems.append(
                f"nuttcp did not finish within {self.plan.timeout_s:g} s and was stopped"
            )
        server = run.processes.get("server")
        if server is not None:
            run.wait(lambda: server.returncode is not None, _SERVER_EXIT_S)
        for item in self._tail():
            run.emit(item)

    def _tail(self) -> list[Interval]:
        """The interval nuttcp prints no line for (from its last line to the receiver's
        end, read from the summary), when it is long enough to be one of its own."""
        with self.lock:
            summaries, _, _ = p.flows(self.parser.out, self.direction, self.spec.protocol,
                                      self.spec.streams)
            lines = self.intervals()
        return p.with_tail(lines, summaries[0] if summaries else None)[len(lines):]

    # -- live output --------------------------------------------------------------------

    def _on_line(self, line: str) -> None:
        """Called by the reader thread for each line: parse, queue interval samples."""
        with self.lock:
            sample = self.parser.feed(line)
            if sample is None:
                return
            item = p.to_interval(sample, self.next_start, self.direction, self._retrans_ok())
            self.next_start = item.end_s
            if self._after_end(item):
                return
        self.driven.emit(item)

    def _retrans_ok(self) -> bool:
        major = p.version_major(self.parser.out.version or self.version)
        return major is not None and major >= 7

    def _after_end(self, item: Interval) -> bool:
        end = self.spec.duration_s if self.spec.bytes_total is None else None
        return end is not None and item.bytes == 0 and item.start_s >= end - 1e-6

    # -- how it ended -------------------------------------------------------------------

    def failures(self) -> list[str]:
        """nuttcp's own message, the run's problems, a missing summary, the exit code
        (nuttcp can exit 0 and still have failed: -xt does, so what it printed counts)."""
        out = self.parser.out
        code = self.client.returncode if self.client is not None else None
        if self.client is not None and self.client.callback_error is not None:
            self.problems.append(f"nuttcp output could not be read: {self.client.callback_error}")
        message = p.failure_message(out)
        if code == 0 and not message and not self.problems and out.has_summary:
            return []
        reasons = [reason for reason in (message, *self.problems) if reason]
        why = "; ".join(reasons) or "nuttcp printed no result"
        if code not in (0, None):
            why = f"{why} (exit code {code})"
        return [why]

    def failed(self, reasons: Sequence[str], command: Sequence[str] = ()) -> TestFailed:
        """TestFailed naming the client's command line."""
        return super().failed(reasons, command or self.plan.client_argv)

    def result(self, status: str, errors: list[str]) -> Result:
        """The Result from what the client printed so far."""
        with self.lock:
            out = self.parser.out
            summaries, streams, warnings = p.flows(
                out, self.direction, self.spec.protocol, self.spec.streams
            )
            intervals = p.with_tail(self.intervals(), summaries[0] if summaries else None)
        receiver = summaries[0].receiver if summaries else None
        if intervals:
            warnings.append(p.INTERVAL_NOTE)
        return self.build_result(
            status, errors, remote=self._remote(), summaries=summaries, streams=streams,
            intervals=intervals, duration_s=receiver.end_s if receiver else None,
            warnings=warnings, version=out.version, raw=self._raw(),
        )

    def _raw(self) -> list[RawOutput]:
        """The client's output first: it holds both sides' figures (servers print none)."""
        processes = self.driven.processes
        return [processes[role].raw() for role in ("client", "server") if role in processes]

    def _remote(self) -> Endpoint:
        port = self.plan.control_port or DEFAULT_CONTROL_PORT
        address = self.plan.address if is_numeric(self.plan.address) else None
        system = system_name() if self.plan.local else None
        return Endpoint(
            role="server", host=self.spec.host, address=address, port=port, system=system
        )
