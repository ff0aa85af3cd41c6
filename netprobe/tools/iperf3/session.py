"""One run of iperf3: the processes through the one driven lifecycle
(:class:`~netprobe.tools._iperf_common.IperfSession`, a
:class:`~netprobe.driven.DrivenSession`), the live readers, and the Result from the
client's JSON.

Live intervals come from ``--json-stream`` where the binary has it (iperf3 3.17+). Older
iperf3 (Debian's 3.12) prints its JSON only at the end, so live samples come from the
local server's human output when this adapter starts the server itself; against a remote
3.12 server the intervals are reported when the test ends.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from netprobe.driven import DrivenProcess, DrivenRun
from netprobe.driven.figures import Figures
from netprobe.errors import ParseError
from netprobe.plugin import Reporter
from netprobe.schema import Endpoint, Interval, TestSpec
from netprobe.tools._iperf_common import IperfSession, Launch, StreamNumbers
from netprobe.tools.iperf3 import parse_output as p3
from netprobe.tools.iperf3.command import Iperf3Binary, client_argv, mode, server_argv
from netprobe.tools.iperf3.parse_saved import shift_after_warmup


class Iperf3Session(IperfSession):
    """One iperf3 test: ``-J`` from the client (the authoritative record), live samples from
    ``--json-stream`` or the local server's human output."""

    def __init__(self, spec: TestSpec, reporter: Reporter, *, name: str, binary: Iperf3Binary,
                 launch: Launch) -> None:
        super().__init__(spec, reporter, tool=name, version=binary.version, mode=mode(spec),
                         launch=launch)
        self.binary = binary
        host, port = launch.host, launch.port
        self.client_argv = client_argv(binary, spec, host, port)
        if launch.local:
            self.server_argv = server_argv(binary, spec, host, port)
        if binary.json_stream:
            self.on_client_line = _stream_reader({"intervals": []}, spec, self.driven)
        else:
            self.on_server_line = _server_reader(spec, self.driven)
            if not launch.local:
                self.driven.note(f"iperf3 {binary.version} prints JSON only at the end: "
                                 "intervals will be shown when the test ends")
        self._read: tuple[Figures, str | None] | None = None

    def problem(self) -> str | None:
        """What the client's JSON (or its last line) says went wrong."""
        return self._client_reading()[1]

    def parts(self) -> Figures:
        """The figures of the client's JSON, on the test's own time line; a run that left
        none keeps what was seen live."""
        parts = attrs.evolve(self._client_reading()[0])
        parts.warnings = list(parts.warnings)
        live = self.driven
        if not parts.intervals:
            parts.intervals = live.collected()
        elif not live.collected():
            for sample in parts.intervals:  # nothing could be shown live: report them now
                live.emit(sample)
            live.deliver()
        parts.local = parts.local or Endpoint(role="client")
        go = self.launch
        if parts.remote is None or parts.remote.port is None:
            parts.remote = Endpoint(role="server", host=self.spec.host or go.host, port=go.port)
        parts.remote = attrs.evolve(parts.remote, host=self.spec.host or parts.remote.host)
        shift_after_warmup(parts, self.spec.omit_s)
        return parts

    def _client_reading(self) -> tuple[Figures, str | None]:
        # Read once, when the client has ended (a partial Result may ask earlier).
        if self._read is None or self._read[1] == "the client did not start":
            reading = read_client(self.client)
            if self.client is None or self.client.returncode is None:
                return reading
            self._read = reading
        return self._read


# --- live readers ---------------------------------------------------------------------------


def _stream_reader(doc: dict[str, Any], spec: TestSpec, live: DrivenRun) -> Any:
    """on_line for ``--json-stream``: each interval event becomes live samples."""
    numbers = StreamNumbers()
    ctx = p3.DocContext(
        is_client=True,
        reverse=spec.direction == "reverse",
        bidir=spec.direction == "bidir",
        udp=spec.protocol == "udp",
    )

    def on_line(line: str) -> None:
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            return  # not an event line (e.g. a warning printed by the binary)
        if isinstance(event, dict):
            data = p3.apply_event(doc, event)
            if data is not None:
                for sample in p3.intervals_from_block(data, ctx, numbers):
                    live.emit(sample)

    return on_line


def _server_reader(spec: TestSpec, live: DrivenRun) -> Any:
    """on_line for the local server's human output (iperf3 before 3.17)."""
    role = "sender" if spec.direction == "reverse" else "receiver"
    reader = p3.HumanIntervals(process_is_client=False, default_role=role)

    def on_line(line: str) -> None:
        sample: Interval | None = reader.feed(line)
        if sample is not None:
            live.emit(sample)

    return on_line


# --- reading the client's output --------------------------------------------------------------


def read_client(client: DrivenProcess | None) -> tuple[Figures, str | None]:
    """Result parts from the client's JSON, and what went wrong (None if nothing)."""
    if client is None:
        return Figures(), "the client did not start"
    text = client.text
    json_at = text.find("{")
    if json_at < 0:
        said = text.strip().splitlines()[-1] if text.strip() else "no output"
        return Figures(), said.replace("iperf3: error - ", "")
    try:
        doc, warnings = p3.parse_json_text(text[json_at:], "client")
    except ParseError as exc:
        return Figures(), f"unreadable JSON output: {exc}"
    parts = p3.parse_document(doc, "client")
    parts.warnings.extend(warnings)
    if client.callback_error is not None:
        parts.warnings.append(f"live interval display failed: {client.callback_error}")
    error = p3.json_error(doc)
    if error is None and client.returncode not in (0, None):
        error = f"exited with code {client.returncode}"
    if error is None and "end" not in doc:
        error = "the output ended before the test did"
    return parts, error
