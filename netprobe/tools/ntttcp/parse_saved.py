"""ntttcp's saved outputs read back into a Result (``netprobe parse``): console logs of
either role (Linux, or Windows NTttcp's), ``-x`` XML and ``-j`` JSON result files, in
any mix; the test's options are reconstructed from what they show."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from netprobe.driven import readable_sources
from netprobe.driven.figures import Figures, to_result
from netprobe.errors import ParseError
from netprobe.resultops import short_sender_totals
from netprobe.schema import Endpoint, FlowSummary, RawOutput, Result, TestSpec, ToolInfo
from netprobe.tools.ntttcp import parse_output as p
from netprobe.tools.ntttcp.parse_windows import (
    is_windows_console,
    parse_windows_console,
    windows_version,
)


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
    readable = readable_sources(sources, "ntttcp")
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
    warnings.extend(short_sender_totals("ntttcp", spec.protocol, summaries))
    if any(slot.console and slot.console.realtime_count for slot in roles.values()):
        warnings.append("ntttcp's real-time throughput lines carry no timestamps: no intervals")
    first = receiver or sender
    consoles = [slot.console for slot in roles.values() if slot.console]
    figures = Figures(
        summaries=list(summaries), streams=list(p.streams(totals["sender"], totals["receiver"],
                                                          spec.protocol, omit)),
        warnings=[_RECONSTRUCTED, *warnings],
        duration_s=None if first is None else first.end_s - first.start_s,
        remote=Endpoint(role="server", host=spec.host, address=spec.host, port=spec.port))
    version = next((c.version for c in consoles if c.version), None)
    return to_result(figures, tool=ToolInfo(name="ntttcp", version=version), spec=spec,
                     start_time=None, status="failed" if errors and not summaries else "ok",
                     errors=errors, raw=raw)


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
