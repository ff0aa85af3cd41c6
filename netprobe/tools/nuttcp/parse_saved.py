"""Saved nuttcp client output (-fparse or plain, brief or -v; 6.x or 8.x) as a Result.

The test options are read back from what the output shows (``-v`` prints most of them);
the rest are left at their defaults, and the Result says so.
"""

from __future__ import annotations

from collections.abc import Sequence

from netprobe.driven import readable_sources
from netprobe.driven.figures import Figures, to_result
from netprobe.errors import ParseError
from netprobe.schema import RawOutput, Result, TestSpec, ToolInfo
from netprobe.tools import _bounded
from netprobe.tools.nuttcp import parse_output as p


def parse_sources(sources: Sequence[tuple[str, str]]) -> Result:
    """A Result from saved nuttcp outputs; empty files (servers print nothing) are skipped."""
    readable = readable_sources(sources, "nuttcp", "the input is empty (servers print nothing)")
    name, text = readable[0]
    out = p.parse_lines(text)
    _check_parsed(name, text, out)
    warnings = [f"{other}: ignored (only one nuttcp output is read)" for other, _ in readable[1:]]
    return _parsed_result(name, text, out, warnings)


def _first_text_line(text: str) -> int:
    for number, line in enumerate(_bounded.lines(text), 1):
        if line.strip():
            return number
    return 1


def _check_parsed(name: str, text: str, out: p.NuttcpOutput) -> None:
    if out.recognized == 0:
        line = out.unknown[0] if out.unknown else _first_text_line(text)
        raise ParseError("not nuttcp output", source=name, line=line)
    if not out.has_summary and not out.intervals and not p.failure_message(out):
        raise ParseError("no nuttcp results in the output (truncated?)", name, out.last_line)


def _parsed_spec(out: p.NuttcpOutput) -> tuple[TestSpec, list[str]]:
    tx, rx = out.sides.get("t"), out.sides.get("r")
    known = [side for side in (tx, rx) if side is not None]
    mode = next((s.mode for s in known if s.mode), None)
    udp = mode == "udp" or any(s.pkt is not None for s in known)
    udp = udp or any(s.pkt is not None for s in out.intervals)
    if out.brief is not None and out.brief.pkt is not None:
        udp = True
    warnings = [
        "test options reconstructed from the output; options it does not show "
        "are left at their defaults"
    ]
    if out.first_side is None and out.has_summary:
        warnings.append("the output does not say the direction: assumed normal (client sends)")
    duration = next((s.time_limit for s in known if s.time_limit), None)
    if duration is None and out.brief is not None and out.brief.seconds > 0:
        duration = out.brief.seconds
    interval = next((s.interval_s for s in known if s.interval_s), None)
    if interval is None and out.intervals:
        interval = out.intervals[0].seconds or None
    spec = TestSpec(
        tool="nuttcp",
        host=next((s.host for s in known if s.host), None),
        protocol="udp" if udp else "tcp",
        direction="reverse" if out.first_side == "r" else "normal",
        streams=next((s.nstream for s in known if s.nstream), 1),
        duration_s=duration or 10.0,
        interval_s=interval,
        length_bytes=next((s.buflen for s in known if s.buflen), None),
    )
    return spec, warnings


def _parsed_result(name: str, text: str, out: p.NuttcpOutput, extra: list[str]) -> Result:
    spec, warnings = _parsed_spec(out)
    direction = "server_to_client" if spec.direction == "reverse" else "client_to_server"
    summaries, streams, flow_warnings = p.flows(out, direction, spec.protocol, spec.streams)
    end = summaries[0].receiver.end_s if summaries and summaries[0].receiver else None
    warnings += flow_warnings + extra
    # Past the limit the kept lines are not the whole test: no tail is made from them.
    totals = summaries[0] if summaries and not out.intervals_not_kept else None
    intervals = p.intervals(out, direction, end, totals)
    if intervals:
        warnings.append(p.INTERVAL_NOTE)
    not_kept = _bounded.not_kept_warning(len(out.intervals), out.intervals_not_kept)
    if not_kept:
        warnings.append(not_kept)
    if out.unknown:
        warnings.append(
            f"{name}: {len(out.unknown)} line(s) not understood, first at line {out.unknown[0]}"
        )
    if not out.has_summary:
        warnings.append(f"{name}: no final summary: the output is incomplete")
    message = p.failure_message(out)
    figures = Figures(summaries=list(summaries), streams=list(streams),
                      intervals=list(intervals), warnings=warnings, duration_s=end)
    return to_result(figures, tool=ToolInfo(name="nuttcp", version=out.version), spec=spec,
                     start_time=None, status="failed" if message else "ok",
                     errors=[message] if message else [],
                     raw=(RawOutput(name=name, text=_bounded.kept_raw(text)),))
