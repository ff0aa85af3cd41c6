"""The lifecycle of one run of a driven tool, written once for every adapter.

A :class:`DrivenRun` starts the tool's processes (a local server first when the test stays
on this machine, then the client), waits until the server is ready, waits for the client
within a deadline, turns Ctrl-C (and SIGTERM, which the CLI turns into Ctrl-C) into a flag
the adapter builds a partial Result from, and stops every process it started, by PID,
whatever happens. Each adapter adds only its command lines, its line parsers and its
result builder (Flent's ProcessRunner is the model)::

    with DrivenRun(reporter, tool="nuttcp") as run:
        server = run.start("server", server_argv, on_line=parse_server)
        if run.wait_ready(server, listening([(port, False)], family), 5.0):
            client = run.start("client", client_argv, on_line=parse_client)
            run.wait_exit(client, deadline_s)
    return build_result(run)          # run.interrupted, run.timed_out, run.warnings

The thread rule (the Reporter contract in :mod:`netprobe.plugin`): line parsers run on the
processes' reader threads and hand their samples to :meth:`DrivenRun.emit`; the reporter is
called only from the thread that entered the run (the one that called ``Tool.run``), while
it waits. An exception from the reporter never ends the test: it becomes one warning
(:attr:`DrivenRun.warnings`, for the Result) and the reporter is not called again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Callable

from netprobe.driven.net import is_listening
from netprobe.driven.process import DrivenProcess
from netprobe.plugin import Reporter
from netprobe.reporting import KeptIntervals, intervals_not_kept
from netprobe.schema import Interval, RawOutput
from netprobe.starvation import WATCH_EVERY_S, ProcessWatch

POLL_S = 0.05
"""How often a waiting run delivers intervals and looks at its processes again."""
MAX_PENDING = 10_000
"""Samples waiting for the reporter at most. The run's thread hands them over every
:data:`POLL_S` while it waits; a tool that prints samples faster than the reporter takes
them (or a run thread held elsewhere) would otherwise queue them without limit. Past it, a
sample is kept for the Result as usual but not shown live, and the warnings count them."""

Ready = Callable[[DrivenProcess], bool]
"""Says whether a started server is ready for the client."""


def printed(predicate: Callable[[str], bool]) -> Ready:
    """Ready once the process has printed a line satisfying ``predicate``."""
    return lambda process: any(predicate(line) for line in process.lines)


def listening(ports: Sequence[tuple[int, bool]], family: int) -> Ready:
    """Ready once every ``(port, udp)`` is bound on this machine (read from /proc/net, no
    connection made: one-shot servers would take a probe connection for their test)."""
    return lambda _process: all(is_listening(port, family, udp) for port, udp in ports)


class DrivenRun:
    """One run of a driven tool: its processes, the intervals they produced, how it ended.

    Use it as a context manager: leaving the block stops every process it started (by PID,
    with its process group) and delivers what is still queued; a KeyboardInterrupt inside
    the block is caught there and sets :attr:`interrupted`, so that the adapter goes on to
    build the partial Result.
    """

    def __init__(self, reporter: Reporter, *, tool: str) -> None:
        self.tool = tool
        """The tool's name, for notes and warnings."""
        self.processes: dict[str, DrivenProcess] = {}
        """Every process started, by role name, in the order started."""
        self.kept = KeptIntervals()
        """The samples kept for the Result, in arrival order: the first
        :data:`~netprobe.reporting.MAX_INTERVALS_KEPT`, and a count of the rest (every one
        still reaches the reporter)."""
        self._notes: list[str] = []  # a failing reporter (see warnings)
        self.interrupted = False
        """True when Ctrl-C (or SIGTERM) ended the run."""
        self.timed_out = False
        """True when :meth:`wait_exit` passed its deadline and stopped the process."""
        self._reporter: Reporter | None = reporter
        self._pending = KeptIntervals(MAX_PENDING)  # the same bound, emptied at each delivery
        self._not_shown = 0  # samples past the pending bound: never reached the reporter
        self._lock = threading.Lock()
        self._watches: dict[str, ProcessWatch] = {}  # CPU starvation, by role

    # -- processes ---------------------------------------------------------------------

    def start(self, role: str, argv: Sequence[str], on_line: Callable[[str], None] | None = None,
              env: Mapping[str, str] | None = None, cwd: str | None = None,
              watch: bool = True) -> DrivenProcess:
        """Start ``argv`` as the process ``role`` (ToolUnavailable if it cannot be run);
        with ``watch``, whether it was starved of CPU is looked at while it runs (for a
        process that moves the test's data; not for a latency probe, say).

        The tool dies with the thread that started it (PR_SET_PDEATHSIG): a run is entered
        and left on one thread, which stops its processes on every way out but SIGKILL;
        this covers that one too (a killed client left iperf sending for ever)."""
        process = DrivenProcess(argv, on_line=on_line, name=role, env=env, cwd=cwd,
                                die_with_parent=True)
        self.processes[role] = process
        process.start()
        if watch:
            self._watches[role] = ProcessWatch.begin(process.pid)
        self.note(f"{self.tool} {role} started (pid {process.pid})")
        return process

    def wait_ready(self, process: DrivenProcess, ready: Ready, timeout_s: float) -> bool:
        """Wait until ``ready(process)``: False if it exits or ``timeout_s`` passes first
        (the process is then stopped)."""
        deadline = time.monotonic() + timeout_s
        while not ready(process):
            if process.returncode is not None or time.monotonic() > deadline:
                process.stop(grace_s=0.5)
                return False
            self._pause()
        return True

    def wait(self, done: Callable[[], bool], deadline_s: float | None,
             tick: Callable[[], None] | None = None, poll_s: float = POLL_S) -> bool:
        """Deliver intervals until ``done()`` (True) or ``deadline_s`` seconds pass (False).
        ``tick`` runs at every look (every ``poll_s``), on this thread."""
        end = None if deadline_s is None else time.monotonic() + deadline_s
        while not done():
            if end is not None and time.monotonic() > end:
                return False
            if tick is not None:
                tick()
            self._pause(poll_s)
        self.deliver()
        return True

    def wait_exit(self, process: DrivenProcess, deadline_s: float | None) -> int | None:
        """Wait for ``process`` to exit, delivering intervals; past ``deadline_s`` it is
        stopped (and :attr:`timed_out` set). Its exit code."""
        if not self.wait(lambda: process.returncode is not None, deadline_s):
            self.timed_out = True
            process.stop()
        process.wait(None if process.returncode is None else 0)
        return process.returncode

    def stop_all(self) -> None:
        """Stop every process started, the last started first (clients before servers)."""
        for process in reversed(list(self.processes.values())):
            process.stop()

    def raw(self) -> tuple[RawOutput, ...]:
        """Every started process's output, in the order started."""
        return tuple(process.raw() for process in self.processes.values())

    def _pause(self, seconds: float = POLL_S) -> None:
        self.deliver()
        for watch in self._watches.values():
            watch.sample(WATCH_EVERY_S)
        time.sleep(seconds)

    # -- the reporter ------------------------------------------------------------------

    @property
    def intervals(self) -> list[Interval]:
        """The samples kept (see :attr:`kept`), in arrival order."""
        return self.kept.samples

    def emit(self, sample: Interval) -> None:
        """Keep ``sample`` (up to the limit) and queue it for the reporter (any thread may
        call this). Past the limit, the run's :attr:`warnings` say how many were not kept."""
        with self._lock:
            self.kept.add(sample)
            self._pending.add(sample)

    def interval(self, sample: Interval) -> None:
        """The Reporter's method, so that code written for a reporter (a sampler) can be
        handed the run: the same as :meth:`emit`."""
        self.emit(sample)

    def deliver(self) -> None:
        """Hand the queued samples to the reporter, on the calling thread."""
        while True:
            with self._lock:
                batch, dropped = self._pending.take()
                self._not_shown += dropped
            if not batch:
                return
            for sample in batch:
                self._call("interval", sample)

    def note(self, message: str) -> None:
        """A progress note for the reporter (on the calling thread)."""
        self._call("note", message)

    def collected(self) -> list[Interval]:
        """The samples kept so far (a copy)."""
        with self._lock:
            return list(self.kept.samples)

    @property
    def warnings(self) -> list[str]:
        """What the Result should say about the run itself: a failing reporter, samples
        past the limits not kept or not shown live, output not kept (a new list each
        time)."""
        with self._lock:
            not_kept = intervals_not_kept(len(self.kept), self.kept.dropped)
            not_shown = self._not_shown + self._pending.dropped
        found = [*self._notes, *([not_kept] if not_kept else [])]
        if not_shown:
            found.append(f"{not_shown} interval reports were not shown live: the tool printed "
                         f"them faster than the live output took them (more than "
                         f"{self._pending.limit} waiting); the summaries cover the whole "
                         "test")
        notes = [process.output_note() for process in self.processes.values()]
        notes += [watch.warning(f"{self.tool} {role}") for role, watch in self._watches.items()]
        return [*found, *(note for note in notes if note)]

    def _call(self, event: str, value: object) -> None:
        if self._reporter is None:
            return
        try:
            getattr(self._reporter, event)(value)
        except Exception as exc:  # the reporter is outside code: it must not cost the test
            self._reporter = None
            self._notes.append(f"the live reporter failed and was not called again: "
                                 f"{type(exc).__name__}: {exc}")

    # -- context manager ---------------------------------------------------------------

    def __enter__(self) -> DrivenRun:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        try:
            self.stop_all()
            self.deliver()
        except KeyboardInterrupt:  # a second Ctrl-C while stopping: stop without delivering
            self.stop_all()
            self.interrupted = True
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self.interrupted = True
            return True
        return False


__all__ = ["MAX_PENDING", "POLL_S", "DrivenRun", "Ready", "listening", "printed"]
