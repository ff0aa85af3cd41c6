"""One table of unit prefixes (netprobe.units) that every reader of a tool's output uses.

A copy of the table in the iperf3 parser had ``"": 1`` where the others had ``"": 0``, so a
figure printed without a prefix (``512 Bytes``, ``800 bits/sec``: what a nearly idle
link shows) was read as if it were ``512 KBytes`` and ``800 Kbits/sec``. The tests read
such lines through ``netprobe parse`` for every tool whose output carries prefixes, and
look through the source for any other prefix table (a copy is how the bug came).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from netprobe import units
from netprobe.tools.iperf2 import parse_output as p2
from netprobe.tools.iperf3 import parse_output as p3
from netprobe.tools.ntttcp import parse_output as pn
from tests.test_cli import netprobe_cmd

REPO = Path(__file__).resolve().parents[1]

# iperf3 3.12 (human output, -i 1 -t 2) as a test over a link that carried almost nothing:
# the figures fall under 1 KByte and 1 Kbit/s, so iperf3 prints them without a prefix.
_IPERF3_IDLE = """\
Connecting to host 127.0.0.1, port 35201
[  5] local 127.0.0.1 port 46442 connected to 127.0.0.1 port 35201
[ ID] Interval           Transfer     Bitrate         Retr  Cwnd
[  5]   0.00-1.00   sec   512 Bytes   800 bits/sec    0   1.00 KBytes
[  5]   1.00-2.00   sec   0.00 Bytes  0.00 bits/sec    0   1.00 KBytes
- - - - - - - - - - - - - - - - - - - - - - - - -
[ ID] Interval           Transfer     Bitrate         Retr
[  5]   0.00-2.00   sec   512 Bytes   400 bits/sec    0             sender
[  5]   0.00-2.00   sec   512 Bytes   400 bits/sec                  receiver

iperf Done.
"""


def test_iperf3_text_without_a_prefix_is_read_as_printed(tmp_path: Path) -> None:
    saved = tmp_path / "iperf3-idle.txt"
    saved.write_text(_IPERF3_IDLE)
    proc = netprobe_cmd("parse", "--tool", "iperf3", "--format", "json", str(saved))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    first = result["intervals"][0]
    assert (first["bytes"], first["bits_per_second"]) == (512, 800.0)
    assert first["cwnd_bytes"] == 1024
    flow = result["summaries"][0]
    assert flow["sender"]["bytes"] == 512 and flow["receiver"]["bytes"] == 512
    assert flow["receiver"]["bits_per_second"] == 400.0


@pytest.mark.parametrize(("line", "want_bytes", "want_bps"), [
    ("[  5]   0.00-1.00   sec   512 Bytes   800 bits/sec", 512, 800.0),
    ("[  5]   0.00-1.00   sec  1.50 KBytes  12.3 Kbits/sec", 1536, 12_300.0),
    ("[  5]   0.00-1.00   sec  2.00 MBytes  16.8 Mbits/sec", 2 * 2**20, 16.8e6),
    ("[  5]   0.00-1.00   sec  3.09 GBytes  26.5 Gbits/sec", round(3.09 * 2**30), 26.5e9),
])
def test_iperf3_and_iperf2_read_each_prefix_alike(line: str, want_bytes: int,
                                                  want_bps: float) -> None:
    three = p3.parse_human_line(line, True, "sender")
    assert three is not None
    assert (three.sample.bytes, three.sample.bits_per_second) == (want_bytes,
                                                                  pytest.approx(want_bps))
    # iperf 2 prints the same columns with a four-decimal interval
    two = p2._LINE.match(re.sub(r"(\d+)\.(\d\d)-(\d+)\.(\d\d)", r"\1.\g<2>00-\3.\g<4>00",
                                line.replace("[  5]", "[  1]")))
    assert two is not None
    assert p2._size(two["xfer"], two["xunit"]) == want_bytes
    assert p2._rate(two["rate"], two["runit"]) == pytest.approx(want_bps)


@pytest.mark.parametrize(("text", "want"), [
    ("900bps", 900.0), ("12.5Kbps", 12_500.0), ("28.26Gbps", 28.26e9), ("3Mbps", 3e6),
])
def test_ntttcp_rates_use_si_prefixes(text: str, want: float) -> None:
    assert pn.parse_throughput(text) == pytest.approx(want)


def test_the_table_reads_no_prefix_as_one() -> None:
    assert units.binary_factor("") == 1 and units.si_factor("") == 1
    assert units.binary_factor("K") == units.binary_factor("k") == 1024
    assert units.si_factor("M") == 10**6 and units.binary_factor("G") == 2**30
    assert units.MIB == 2**20 and units.KIB == 1024


_PREFIXED_KEY = re.compile(r"^[kmgtKMGT](?:i?B|bps|bits?|bytes?)?$")


def _prefix_tables(path: Path) -> list[int]:
    """Lines of dict literals that map unit prefixes (``"K"``, ``"Mbps"``...) to numbers."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Dict) or len(node.keys) < 2:
            continue
        keys = [k.value for k in node.keys if isinstance(k, ast.Constant)
                and isinstance(k.value, str)]
        numeric = all(isinstance(v, ast.Constant) and isinstance(v.value, (int, float))
                      for v in node.values)
        if numeric and sum(bool(_PREFIXED_KEY.match(k)) for k in keys) >= 2:
            found.append(node.lineno)
    return found


def test_no_other_table_of_prefixes_in_the_source() -> None:
    # The package as imported (a wheel's suite has no checkout), and the plugins beside it
    # where there is one.
    package = Path(units.__file__).resolve().parent
    sources = [*package.rglob("*.py"), *(REPO / "plugins").rglob("*.py")]
    copies = {str(p): lines for p in sources
              if p != package / "units.py" and (lines := _prefix_tables(p))}
    assert len(sources) > 50
    assert _prefix_tables(package / "units.py")  # the one table, found as a copy would be
    assert copies == {}
