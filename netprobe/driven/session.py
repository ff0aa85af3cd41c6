"""One run of a client/server tool, from the plan to the Result: the glue every adapter of
a driven tool would otherwise write again.

:class:`Plan` holds what is decided before anything runs (an adapter subclasses it for its
own ports and files); :func:`local_server_wanted` and :func:`client_deadline` are the two
decisions every plan makes. :class:`DrivenSession` runs a plan through a
:class:`~netprobe.driven.run.DrivenRun`: an optional server on this machine first (and
only once it is ready) the client, then one policy for how a run ends:

- Ctrl-C or SIGTERM: :class:`~netprobe.errors.TestInterrupted` with the partial Result;
- a server that never got ready: :meth:`DrivenSession.server_failed` (TestFailed);
- what :meth:`DrivenSession.failures` lists: TestFailed with the Result, which keeps
  everything measured and every process's raw output;
- a run the tool did not call failed but that broke or ran short
  (:func:`~netprobe.driven.verdict.run_faults`): TestFailed the same way;
- else the Result with status ``ok``.

A subclass supplies the parts that are the tool's own: which processes it starts
(:meth:`~DrivenSession.start_server`, :meth:`~DrivenSession.run_client`), what went
wrong (:meth:`~DrivenSession.failures`) and the figures (:meth:`~DrivenSession.result`,
which usually ends in :meth:`~DrivenSession.build_result`). Line parsers run on reader
threads: they take :attr:`DrivenSession.lock` and hand intervals to ``self.driven.emit``.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from netprobe.driven.figures import Figures, to_result
from netprobe.driven.net import is_local_host, system_name
from netprobe.driven.run import DrivenRun, Ready
from netprobe.driven.verdict import run_faults
from netprobe.errors import TestFailed, TestInterrupted
from netprobe.host import utc_now_iso
from netprobe.plugin import Reporter
from netprobe.schema import (
    Endpoint,
    FlowSummary,
    Interval,
    RawOutput,
    Result,
    StreamResult,
    TestSpec,
    ToolInfo,
)

# --- the one timing table of every driven tool ----------------------------------------------

HANG_GRACE_S = 15.0
"""How long past its test a client may run before it counts as hung (start-up, the
exchange of results, a slow far end, a connect timeout of the tool's own)."""
HANG_SLACK = 0.2
"""And a share of the test's length on top (a long test's end drifts more)."""
SERVER_READY_S = 10.0
"""How long a local server may take to show it is ready (a slow router starts Python
tools and their servers in seconds)."""
SERVER_REPORT_S = 3.0
"""How long a local server may take to print its last report once the client is done."""


@dataclass(frozen=True)
class Plan:
    """Everything decided before anything runs. Adapters subclass it (frozen too) to add
    their ports and files."""

    local: bool
    """True when the adapter starts the server side itself, on this machine."""
    family: int
    """AF_INET or AF_INET6."""
    address: str
    """What the client connects to (a name or an address)."""
    client_argv: tuple[str, ...]
    """The client's command line (the binary first)."""
    server_argv: tuple[str, ...] | None
    """The local server's command line; None when a server elsewhere is used."""
    timeout_s: float | None
    """How long the client may run before it is taken as hung (None: no limit)."""


def local_server_wanted(spec: TestSpec, options: dict[str, Any]) -> bool:
    """True when the adapter should start the server itself: the host is this machine
    and the tool's option ``start_server`` is not False."""
    return bool(options.get("start_server", True)) and is_local_host(spec.host)


def client_deadline(spec: TestSpec, grace_s: float = HANG_GRACE_S) -> float | None:
    """Seconds the client may run: the test (with its warm-up) plus ``grace_s`` plus a
    fifth of the test; None in byte-count mode, whose length is not known in advance."""
    if spec.bytes_total is not None or spec.duration_s is None:
        return None
    return spec.duration_s + spec.omit_s + grace_s + HANG_SLACK * spec.duration_s


class DrivenSession(abc.ABC):
    """One run of a driven tool: its processes, and the Result built from their output."""

    def __init__(self, spec: TestSpec, reporter: Reporter, *, tool: str,
                 version: str | None) -> None:
        self.spec = spec
        """The test as asked."""
        self.tool = tool
        """The tool's name (for messages and ``Result.tool``)."""
        self.version = version
        """The version the probe found (the output may name a more exact one)."""
        self.driven = DrivenRun(reporter, tool=tool)
        """The processes and the intervals they produced."""
        self.lock = threading.Lock()
        """Held by the line parsers (reader threads) and by the result builder."""
        self.start_time = utc_now_iso()
        self.problems: list[str] = []
        """What went wrong in the run itself (a deadline passed, unreadable output)."""
        self.warnings: list[str] = []
        """What the Result should say about the run."""

    # -- the run -----------------------------------------------------------------------

    def run(self) -> Result:
        """Run the processes; the Result, or TestFailed/TestInterrupted with the partial."""
        with self.driven:
            ready = self.start_server()
            if ready:
                self.run_client()
        if self.driven.interrupted:
            partial = self.result("interrupted", ["interrupted by the user"])
            raise TestInterrupted(f"interrupted: {self.tool} stopped", partial)
        if not ready:
            raise self.server_failed()
        reasons = self.failures()
        if reasons:
            raise self.failed(reasons)
        result = self.result("ok", [])
        faults = run_faults(result)  # the tool exited content from a broken or short run
        if faults:
            raise self.failed(faults)
        return result

    def start_server(self) -> bool:
        """Start the local server side, if there is one: False if it did not get ready.
        The default starts none."""
        return True

    def serve(self, role: str, argv: Sequence[str], ready: Ready, timeout_s: float,
              on_line: Any = None) -> bool:
        """Start ``argv`` as ``role`` and wait until ``ready`` (False if it exits or
        ``timeout_s`` passes first: it is then stopped)."""
        process = self.driven.start(role, argv, on_line=on_line)
        return self.driven.wait_ready(process, ready, timeout_s)

    @abc.abstractmethod
    def run_client(self) -> None:
        """Start the client side and wait for the end of the test (the server is ready)."""

    def server_failed(self) -> TestFailed:
        """The error of a server that never got ready (its last words and command)."""
        process = next(iter(self.driven.processes.values()), None)
        why, command = "no server", ""
        if process is not None:
            why = process.text.strip() or f"exit code {process.returncode}"
            command = f" (command: {' '.join(process.argv)})"
        message = f"{self.tool} {process.name if process else 'server'} did not get ready"
        return TestFailed(f"{message}: {why}{command}", self.result("failed", [message]))

    @abc.abstractmethod
    def failures(self) -> list[str]:
        """Why the run failed, in the tool's words where it gave any (empty: it did not)."""

    def failed(self, reasons: Sequence[str], command: Sequence[str] = ()) -> TestFailed:
        """TestFailed for ``reasons``, carrying the Result (status ``failed``). The message,
        one shape for every driven tool: ``TOOL failed: WHY (exit code N; command: ...)``,
        of ``command`` or else of the process started as ``client``."""
        why = "; ".join(reasons)
        return TestFailed(f"{self.tool} failed: {why}{self.how_it_ended(command)}",
                          self.result("failed", list(reasons)))

    def how_it_ended(self, command: Sequence[str] = ()) -> str:
        """`` (exit code N; command: ...)`` for a failure message: the client's exit code
        and ``command`` (default: the client's command line); empty with neither."""
        client = self.driven.processes.get("client")
        argv = list(command) or (list(client.argv) if client is not None else [])
        said = []
        if client is not None:
            said.append(f"exit code {client.returncode}")
        if argv:
            said.append(f"command: {' '.join(argv)}")
        return f" ({'; '.join(said)})" if said else ""

    # -- the result --------------------------------------------------------------------

    @abc.abstractmethod
    def result(self, status: str, errors: list[str]) -> Result:
        """The Result of the run so far with ``status`` and ``errors`` (also partial)."""

    def intervals(self) -> tuple[Interval, ...]:
        """The intervals emitted so far, in arrival order."""
        return tuple(self.driven.collected())

    def build_result(
        self,
        status: str,
        errors: Sequence[str],
        *,
        remote: Endpoint,
        summaries: Sequence[FlowSummary] = (),
        streams: Sequence[StreamResult] = (),
        intervals: Sequence[Interval] = (),
        duration_s: float | None = None,
        warnings: Sequence[str] = (),
        version: str | None = None,
        local_address: str | None = None,
        raw: Sequence[RawOutput] | None = None,
    ) -> Result:
        """A Result of this run through :func:`~netprobe.driven.figures.to_result` (the
        one assembler): the tool, the spec, the start time, this machine as the client,
        ``warnings`` then the session's and the run's own, ``raw`` (default: every
        process's output in the order started). The CPU rule is the road's
        (:func:`netprobe.session.checked`), applied to every tool's Result alike."""
        figures = Figures(
            intervals=list(intervals), streams=list(streams), summaries=list(summaries),
            warnings=[*warnings, *self.warnings, *self.driven.warnings],
            duration_s=duration_s, remote=remote,
            local=Endpoint(role="client", address=local_address, system=system_name()))
        return to_result(figures, tool=ToolInfo(name=self.tool, version=version or self.version),
                         spec=self.spec, start_time=self.start_time, status=status,
                         errors=errors, raw=self.driven.raw() if raw is None else raw)


__all__ = [
    "HANG_GRACE_S",
    "HANG_SLACK",
    "SERVER_READY_S",
    "SERVER_REPORT_S",
    "DrivenSession",
    "Plan",
    "client_deadline",
    "local_server_wanted",
]
