"""Which tool wrote a saved output, told from its first lines (``netprobe parse`` without
``--tool``). Pure: lines in, a tool name or None out.

Each built-in tool's output has lines no other tool prints: iperf3's ``Connecting to host``
and JSON ``"start"``, iperf 2's ``Client connecting to H, TCP port`` and its CSV rows'
14-digit stamp, nuttcp's ``nuttcp-t:`` and ``MB / sec = Mbps`` lines, ntttcp's banner,
``HH:MM:SS INFO:`` log lines and result files. The first line that is one of them names the
tool; a file with none of them (an empty server log, a one-line error) names none.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

DETECT_LINES = 200
"""How many leading lines are looked at: every known output says what it is well before."""

DETECTABLE = ("iperf2", "iperf3", "nuttcp", "ntttcp")
"""The tools whose saved output is recognised."""

_MARKS = (
    ("ntttcp", re.compile(
        r"^NTTTCP for Linux \d|^Copyright Version \d"           # console banners
        r"|^\d\d:\d\d:\d\d (?:INFO|ERR|DBG|WARN)\s*:"          # console or -O log lines
        r"|^\s*<ntttcp[sr][\s>]|^\s*\{?\s*\"ntttcp[sr]\"\s*:")),  # -x and -j result files
    ("nuttcp", re.compile(
        r"^nuttcp-[tr]:"
        r"|^\s*\d+(?:\.\d+)? MB /\s*\d+(?:\.\d+)? sec =\s*\d+(?:\.\d+)? Mbps"
        r"|^megabytes=\d+(?:\.\d+)? real_sec(?:onds)?=")),
    ("iperf3", re.compile(
        r"^iperf3: |^Connecting to host \S+, port \d+|^Server listening on \d+"
        r"|^\[ ID\] Interval\s+Transfer\s+Bitrate|^iperf Done\."
        r"|^\s*\"(?:start|intervals|end)\"\s*:|^\{\s*\"event\"\s*:")),
    ("iperf2", re.compile(
        r"^Client connecting to [^,]+, (?:TCP|UDP) port \d+"
        r"|^Server listening on (?:TCP|UDP)(?: \(v6\))? port \d+"
        r"|^\d{14}(?:\.\d+)?,[^,]*,\d+,[^,]*,\d+,"                # -y C rows
        r"|^\[\s*(?:\d+|SUM)\]\s+\d+\.\d{4}-\s*\d+\.\d{4} sec"
        r"|^(?:tcp |udp )?connect failed: ")),
)


_OWN = re.compile(r'^\s*"(?:spec|summaries|schema_version)"\s*:')
"""A key of netprobe's own Result JSON: such a file is no peer's output (its ``"intervals"``
key would otherwise read as iperf3's); ``netprobe report`` reads it."""


def detect_tool(lines: Iterable[str]) -> str | None:
    """The tool whose mark is on the first marked line of ``lines`` (at most
    :data:`DETECT_LINES` are read), or None when no line is marked or the text is a
    netprobe Result."""
    for number, line in enumerate(lines):
        if number >= DETECT_LINES:
            break
        text = line.replace("\x1b[2K", "").rstrip("\r\n")
        if _OWN.search(text):
            return None
        for tool, mark in _MARKS:
            if mark.search(text):
                return tool
    return None
