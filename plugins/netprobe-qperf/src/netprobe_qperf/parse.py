"""Reading qperf's output: the ``name = value unit`` lines it prints after each test.

netprobe runs qperf with ``-vv -uu -e 12`` (every figure, units unified to bytes, ns and
bytes/sec, twelve significant digits); saved output printed without those flags is read too,
with its units (``GB/sec``, ``us``, ``KiB``, ...) converted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from netprobe.errors import ParseError
from netprobe.units import binary_factor, si_factor

TESTS = ("tcp_bw", "udp_bw", "tcp_lat", "udp_lat")
"""The qperf tests this plugin runs and reads."""

_HEADER = re.compile(r"^(\w+):\s*$")
_FIGURE = re.compile(r"^\s+(\w+)\s*=\s*(\S+)\s*(.*?)\s*$")

# Multipliers to seconds; qperf's byte prefixes K/M/G are powers of 1000, its KiB/MiB/GiB
# powers of 1024 (netprobe.units' one table of prefixes).
_PREFIXES = ("", "K", "M", "G", "T")
_TIMES = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "sec": 1.0, "s": 1.0, "min": 60.0}


@dataclass
class Report:
    """One test's figures as qperf printed them, in bytes, seconds and bytes per second."""

    test: str
    """qperf's test name (``tcp_bw``, ``udp_lat``, ...)."""
    figures: dict[str, float] = field(default_factory=dict)
    """Every ``name = value`` figure, converted to bytes, seconds, bytes/s or percent."""
    first_line: int = 0
    """Line number (from 1) of the test's header."""

    def get(self, name: str) -> Optional[float]:
        """A figure, or None when qperf did not print it."""
        return self.figures.get(name)


@dataclass
class Output:
    """Everything read from one qperf client output."""

    reports: list[Report] = field(default_factory=list)
    """One per test, in the order printed."""
    warnings: list[str] = field(default_factory=list)
    """qperf's own ``warning:`` lines."""
    errors: list[str] = field(default_factory=list)
    """Lines that are neither figures nor headers nor warnings: qperf's error messages."""

    def report(self, test: str) -> Optional[Report]:
        """The report of ``test``, if qperf printed one."""
        return next((r for r in self.reports if r.test == test), None)


def number(text: str) -> float:
    """A qperf number: digits with optional thousands commas (``51,683``)."""
    return float(text.replace(",", ""))


def convert(value: float, unit: str) -> float:
    """``value`` in ``unit`` as bytes, seconds or bytes per second (unknown units as is)."""
    unit = unit.split("(")[0].strip()  # "64 KiB (65,536)": the exact figure is in brackets
    if unit in _TIMES:
        return value * _TIMES[unit]
    if unit.endswith("iB") and unit[:-2] in _PREFIXES[1:]:
        return value * binary_factor(unit[:-2])
    per_second = unit.endswith("/sec")
    base = unit[: -len("/sec")] if per_second else unit
    for suffix in ("bytes", "B"):
        if base.endswith(suffix) and base[: -len(suffix)] in _PREFIXES:
            return value * si_factor(base[: -len(suffix)])
    return value


def _figure(raw: str, unit: str) -> float:
    exact = re.search(r"\(([\d,]+)\)", unit)  # "64 KiB (65,536)"
    if exact:
        return number(exact.group(1))
    return convert(number(raw), unit)


def parse(text: str, source: Optional[str] = None) -> Output:
    """Read a qperf client output; ParseError when it holds nothing qperf would print."""
    out = Output()
    current: Optional[Report] = None
    for lineno, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        figure = _FIGURE.match(line)
        if header and header.group(1) in (*TESTS, "conf", "quit"):
            current = Report(header.group(1), first_line=lineno)
            out.reports.append(current)
        elif figure and current is not None:
            name, raw, unit = figure.groups()
            try:
                current.figures[name] = _figure(raw, unit)
            except ValueError:
                continue  # a text figure (conf: node names, CPU model)
        elif line.strip().startswith("warning:"):
            out.warnings.append(line.strip())
        elif line.strip():
            out.errors.append(line.strip())
    if not out.reports and not out.errors:
        raise ParseError("no qperf output: the input is empty", source)
    return out
