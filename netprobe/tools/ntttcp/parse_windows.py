"""Pure parsers for Windows NTttcp (``ntttcp.exe``, 5.x) console output, the other end of a
Windows interop test (``ntttcp.exe -s ... -ns`` to Linux ``ntttcp -r ... -N``).

The console: ``Copyright Version 5.xx``, a per-thread table (``Thread  Time(s)
Throughput(KB/s)  Avg B / Compl``), then after ``#####  Totals:  #####`` one or more
tables of three lines each: column names (which contain spaces: ``Avg Frame Size``,
``Avg. CPU %``), a rule of ``=`` runs, one row of values. The rule's runs give the columns.

Units: Windows NTttcp's KB is 1024 bytes and its MB (``Bytes(MEG)``, ``Throughput(MB/s)``)
2**20 bytes. ``Avg. CPU %`` is the whole machine's; ``Retransmits``, the packet, DPC and
interrupt counts are the host's counters too. Its ``-xml`` file has the element names that
NTTTCP for Linux copied (parse_output reads both; the root's ``version`` has no ``-linux``).
"""

from __future__ import annotations

import re

from netprobe.tools.ntttcp.parse_output import ThreadTotal, Totals, number
from netprobe.units import KIB, MIB

# Windows NTttcp's MB is MIB, its KB KIB (netprobe.units: the one table of prefixes).

_BANNER = re.compile(r"^Copyright Version (\S+)")
_RULE = re.compile(r"^[= ]*=[= ]*$")


def is_windows_console(text: str) -> bool:
    """True for Windows NTttcp console output (its banner or its totals table)."""
    head = text.lstrip()[:200]
    return bool(_BANNER.match(head)) or "Bytes(MEG)" in text


def windows_version(text: str) -> str | None:
    """``5.33`` from ``Copyright Version 5.33``."""
    for line in text.splitlines()[:5]:
        found = _BANNER.match(line.strip())
        if found:
            return found.group(1)
    return None


def tables(lines: list[str]) -> list[dict[str, str]]:
    """Every header / ``=`` rule / values triple, as ``{column: value}`` (columns cut where
    the rule's runs are)."""
    found = []
    for i in range(1, len(lines) - 1):
        if not _RULE.match(lines[i]) or not lines[i].strip():
            continue
        spans = [m.span() for m in re.finditer(r"=+", lines[i])]
        header, values = lines[i - 1], lines[i + 1]

        def cut(text: str, span: tuple[int, int]) -> str:
            return text[span[0]:span[1]].strip()

        # Columns are right-aligned under their rule; a header may start left of it.
        starts = [0, *(end + 1 for _, end in spans[:-1])]
        names = [header[s:e].strip() for s, (_, e) in zip(starts, spans)]
        found.append({name: cut(values, (s, e)) for name, s, (_, e) in zip(names, starts, spans)})
    return found


def parse_windows_console(text: str) -> Totals:
    """The totals (and per-thread figures) of one Windows NTttcp console output."""
    lines = [line.rstrip("\r") for line in text.split("\n")]
    totals = Totals()
    for table in tables(lines):
        if "Thread" in table:
            continue  # the first row only; the thread rows are read below
        _apply(totals, table)
    totals.threads = _threads(lines)
    if totals.threads and totals.connections is None:
        totals.connections = len(totals.threads)
    return totals


def _apply(totals: Totals, table: dict[str, str]) -> None:
    megabytes = number(table.get("Bytes(MEG)", ""))
    if megabytes is not None:
        totals.bytes = round(megabytes * MIB)
    rate = number(table.get("Throughput(MB/s)", ""))
    if rate is not None:
        totals.bits_per_second = rate * MIB * 8
    setters = {"realtime(s)": "duration_s", "Cycles/Byte": "cycles_per_byte",
               "Avg. CPU %": "host_busy_percent"}
    for column, name in setters.items():
        value = number(table.get(column, ""))
        if value is not None:
            setattr(totals, name, value)
    retransmits = number(table.get("Retransmits", ""))
    if retransmits is not None:
        totals.retransmits = int(retransmits)


def _threads(lines: list[str]) -> list[ThreadTotal]:
    """The rows under ``Thread  Time(s)  Throughput(KB/s)`` up to the totals."""
    found: list[ThreadTotal] = []
    inside = False
    for line in lines:
        if line.strip().startswith("Thread") and "Throughput(KB/s)" in line:
            inside = True
            continue
        if inside and line.strip().startswith("#####"):
            break
        row = re.match(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)", line) if inside else None
        if row:
            seconds, rate = float(row.group(2)), float(row.group(3)) * KIB * 8
            found.append(ThreadTotal(int(row.group(1)), seconds, rate,
                                     round(rate / 8 * seconds)))
    return found
