"""Saved iperf 2 output as a Result: ``-e`` or legacy text, or ``-y C`` CSV (with or
without the 2.2 header), of the client and/or the server, merged into one Result.
"""

from __future__ import annotations

from collections.abc import Sequence

from netprobe.driven.figures import Figures, to_result
from netprobe.errors import ParseError
from netprobe.schema import RawOutput, Result, TestSpec, ToolInfo
from netprobe.tools.iperf2 import parse_output as p2


def parse_sources(tool: str, sources: Sequence[tuple[str, str]]) -> Result:
    """Saved iperf 2 outputs ``[(file name, text), ...]`` of one test (``-e`` or legacy
    text, or ``-y C`` CSV, with or without the 2.2 header; client and/or server) as one
    Result of the tool called ``tool``. Raises ParseError when a source holds no iperf 2
    report."""
    if not sources:
        raise ParseError("nothing to parse")
    keys = p2.StreamKeys()
    readings = [_read_source(name, text, keys) for name, text in sources]
    clients = [r for r in readings if r[1]]
    servers = [r for r in readings if not r[1]]
    parts = clients[0][0] if clients else servers[0][0]
    for other, _, _ in readings:
        if other is not parts:
            parts = p2.merge(parts, other)
    parts.latency = p2.latency(parts)
    status = "failed" if parts.errors else "ok"
    spec = _spec_from(sources, parts)
    raw = tuple(RawOutput(name=name, text=p2.kept_raw(text)) for name, text in sources)
    return to_result(
        parts,
        tool=ToolInfo(name=tool),
        spec=spec,
        start_time=parts.start_time,
        status=status,
        raw=raw,
    )


def _read_source(name: str, text: str, keys: p2.StreamKeys) -> tuple[Figures, bool, str]:
    guessed = p2.guess_is_client(text, name)
    is_client = guessed is not False
    if p2.looks_like_csv(text):
        parts = p2.parse_csv(text, is_client, name)
    else:
        reader = p2.read_text(text, is_client, keys)
        if not reader.records and not reader.failures:
            raise ParseError("no iperf 2 report lines found", name)
        parts = reader.parts()
        parts.local, parts.remote = p2.endpoints(reader)
        parts.start_time = reader.start_time
        parts.errors.extend(dict.fromkeys(reader.failures))
    if guessed is None:
        parts.warnings.append(
            f"{name}: could not tell whether this is the client's or the "
            f"server's output; read it as the client's"
        )
    return parts, is_client, name


def _spec_from(sources: Sequence[tuple[str, str]], parts: Figures) -> TestSpec:
    directions = {f.direction for f in parts.summaries}
    direction = (
        "bidir"
        if len(directions) > 1
        else ("reverse" if directions == {"server_to_client"} else "normal")
    )
    forward = [
        s
        for s in parts.streams
        if s.direction == ("server_to_client" if direction == "reverse" else "client_to_server")
    ]
    intervals = [i for i in parts.intervals if i.stream_id is not None]
    udp = any("UDP port" in text for _, text in sources) or any(
        i.jitter_ms is not None for i in parts.intervals)
    return TestSpec(
        tool="iperf2",
        host=parts.remote.host if parts.remote else None,
        protocol="udp" if udp else "tcp",
        direction=direction,
        streams=max(1, len(forward)),
        duration_s=round(parts.duration_s, 1) if parts.duration_s else 10.0,
        interval_s=round(intervals[0].end_s - intervals[0].start_s, 4) if intervals else None,
        port=parts.remote.port if parts.remote else None,
    )
