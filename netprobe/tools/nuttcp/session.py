"""One run of nuttcp: the one-shot server (for a local test) and the client through the
one driven lifecycle (:class:`~netprobe.driven.DrivenSession`), the live parser, and the
Result from what the client printed (nuttcp's client prints both sides' figures).
"""

from __future__ import annotations

from collections.abc import Sequence

from netprobe.driven import (
    SERVER_READY_S,
    SERVER_REPORT_S,
    DrivenProcess,
    DrivenSession,
    is_numeric,
    listening,
    system_name,
)
from netprobe.errors import TestFailed
from netprobe.plugin import Reporter
from netprobe.schema import Endpoint, Interval, RawOutput, Result, TestSpec
from netprobe.tools.nuttcp import parse_output as p
from netprobe.tools.nuttcp.command import DEFAULT_CONTROL_PORT, NuttcpPlan


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
        return self.serve("server", self.plan.server_argv, ready, SERVER_READY_S)

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
            run.wait(lambda: server.returncode is not None, SERVER_REPORT_S)
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
        # The exit code is said by the failure's message (DrivenSession.how_it_ended).
        return ["; ".join(reasons) or "nuttcp printed no result"]

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
