"""One run of iperf 2: the processes through the one driven lifecycle
(:class:`~netprobe.tools._iperf_common.IperfSession`, a
:class:`~netprobe.driven.DrivenSession`), the live readers of both ends, and the Result.

Both ends print enhanced reports (``-e``) in plain bytes and bits (``-f b``), and iperf 2
flushes each report line, so intervals are read live from the client and from the local
server (which never exits by itself: the session stops it by its PID). iperf 2 exits 0 on
most failures, so the output is checked for those messages (:func:`_problem`).
"""

from __future__ import annotations

from typing import Any

import attrs

from netprobe.driven import DrivenProcess, DrivenRun
from netprobe.driven.figures import Figures
from netprobe.plugin import Reporter
from netprobe.schema import TestSpec
from netprobe.tools._iperf_common import IperfSession, Launch, Probed
from netprobe.tools.iperf2 import parse_output as p2
from netprobe.tools.iperf2.command import client_argv, server_argv


class Iperf2Session(IperfSession):
    """One iperf 2 test: a reader per end, each end's final reports merged."""

    def __init__(self, spec: TestSpec, reporter: Reporter, *, name: str, binary: Probed,
                 launch: Launch) -> None:
        super().__init__(spec, reporter, tool=name, version=binary.version, mode="copy",
                         launch=launch)
        keys = p2.StreamKeys()
        on = spec.interval_s is not None
        self.client_reader = p2.TextReader(True, keys, intervals=on)
        self.server_reader = p2.TextReader(False, keys, intervals=on)
        host, port = launch.host, launch.port
        self.client_argv = client_argv(binary, spec, host, port)
        if launch.local:
            self.server_argv = server_argv(binary, spec, host, port)
        self.on_client_line = _live(self.client_reader, self.driven)
        self.on_server_line = _live(self.server_reader, self.driven)

    def server_done(self) -> bool:
        """Every stream's final report printed (the server never exits by itself)."""
        expected = self.spec.streams * len(self.spec.flow_directions())
        return (self.server is None or self.server.returncode is not None
                or _finished(self.server_reader) >= expected)

    def problem(self) -> str | None:
        """What the output says went wrong (iperf 2 exits 0 from most failures)."""
        return _problem(self.client, self.client_reader, self._merged())

    def parts(self) -> Figures:
        """Both ends' figures merged, with the endpoints, latency and the server's
        warnings."""
        parts = self._merged()
        parts.latency = p2.latency(parts)
        problem = _problem(self.client, self.client_reader, parts)
        parts.warnings.extend(_server_warnings(self.server, self.server_reader, problem))
        if self.client is not None and self.client.callback_error is not None:
            parts.warnings.append(f"live interval display failed: {self.client.callback_error}")
        return parts

    def _merged(self) -> Figures:
        parts = p2.merge(self.client_reader.parts(), self.server_reader.parts())
        parts.local, parts.remote = p2.endpoints(self.client_reader)
        parts.remote = attrs.evolve(parts.remote, host=self.spec.host or self.launch.host,
                                    port=parts.remote.port or self.launch.port)
        parts.start_time = self.client_reader.start_time
        return parts


def _live(reader: p2.TextReader, live: DrivenRun) -> Any:
    def on_line(line: str) -> None:
        sample = reader.feed(line)
        if sample is not None:
            live.emit(sample)

    return on_line


def _finished(reader: p2.TextReader) -> int:
    """How many per-stream final reports a reader has seen."""
    parts = reader.parts()
    return sum((s.sender is not None) + (s.receiver is not None) for s in parts.streams)


def _problem(process: DrivenProcess | None, client: p2.TextReader, parts: Figures) -> str | None:
    if client.failures:
        return "; ".join(dict.fromkeys(client.failures))  # in order, without repeats
    code = process.returncode if process is not None else None
    if code not in (0, None):
        return _last_line(process) or f"exited with code {code}"
    if not any(f.sender or f.receiver for f in parts.summaries):
        return f"no report in the output: {_last_line(process) or 'nothing printed'}"
    return None


def _last_line(proc: DrivenProcess | None) -> str:
    lines = [line.strip() for line in proc.lines if line.strip()] if proc else []
    return lines[-1] if lines else ""


def _server_warnings(
    proc: DrivenProcess | None, reader: p2.TextReader, problem: str | None
) -> list[str]:
    if proc is None or problem:
        return []
    found = [f"local iperf server: {f}" for f in dict.fromkeys(reader.failures)]
    if proc.callback_error is not None:
        found.append(f"live interval display failed: {proc.callback_error}")
    code = proc.returncode
    if code is not None and code > 0:
        # Debian's iperf 2.1.8 server has been seen to abort after a -P 2 test.
        found.append(
            f"the local iperf server exited with code {code}; the receiver's figures may be missing"
        )
    return found
