"""ntttcp's two generations of result files (issue 14 item 4) and its per-thread figures
(item 9), on real outputs: NTTTCP for Linux 1.4.0 built from its tag (tests/data/ntttcp,
see its README) and 1.4.3 (shared/fixtures/peers and tests/data).

1.4.0 and 1.4.3 both write ``version="5.33-linux"``, but 1.4.0's ``total_bytes
metric="MB"`` is bytes / 2**20 (floored) and its rates 2**20-based: read as 10**6 they are
4.6 % low and disagree with the console of the same run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from netprobe.errors import TestFailed
from netprobe.plugin import NullReporter
from netprobe.schema import Result, TestSpec
from netprobe.tools.ntttcp import NtttcpTool
from netprobe.tools.ntttcp import parse_output as p
from tests.peers import PEER_FIXTURES, PeerBinary, peer_params

DATA = Path(__file__).parent / "data"
OLD = DATA / "ntttcp"
MIB = 1 << 20


def _parse(*paths: Path) -> Result:
    return NtttcpTool().parse([(path.name, path.read_text()) for path in paths])


def _console_bytes(path: Path) -> int:
    found = re.search(r"total bytes\s*:(\d+)", path.read_text())
    assert found
    return int(found.group(1))


@pytest.mark.parametrize("case", ["tcp-1thread-sender", "tcp-1thread-receiver",
                                  "tcp-4threads-sender", "tcp-4threads-receiver"])
def test_a_1_4_0_xml_is_read_in_mebibytes(case: str) -> None:
    xml, console = OLD / f"ntttcp-1.4.0-{case}.xml", OLD / f"ntttcp-1.4.0-{case}.txt"
    exact = _console_bytes(console)
    assert p.parse_xml(xml.read_text(), xml.name).flavour == "linux-mib"
    alone = _parse(xml).summaries[0]
    side = alone.sender or alone.receiver
    assert side is not None
    assert 0 <= exact - side.bytes < MIB  # floored to whole MiB, not 4.6 % low
    seconds = side.end_s - side.start_s
    assert side.bits_per_second == pytest.approx(exact * 8 / seconds, rel=MIB / exact + 1e-3)
    both = _parse(xml, console)
    merged = both.summaries[0].sender or both.summaries[0].receiver
    assert merged is not None and merged.bytes == exact  # the console's exact count
    assert merged.bits_per_second == pytest.approx(exact * 8 / seconds, rel=1e-9)
    assert not any("console says" in w for w in both.warnings)


def test_a_1_4_3_xml_stays_in_10_6_bytes() -> None:
    xml = PEER_FIXTURES / "ntttcp-1.4.3-tcp-xml-sender.xml"
    if not xml.exists():
        pytest.skip("peer fixtures not found")
    assert p.parse_xml(xml.read_text(), xml.name).flavour == "linux"
    console = PEER_FIXTURES / "ntttcp-1.4.3-tcp-xml-sender.txt"
    sender = _parse(xml).summaries[0].sender
    assert sender is not None and abs(sender.bytes - _console_bytes(console)) <= 1


def test_a_console_and_a_file_that_disagree_keep_the_exact_bytes_and_warn() -> None:
    console = OLD / "ntttcp-1.4.0-tcp-4threads-sender.txt"
    other_run = OLD / "ntttcp-1.4.0-tcp-1thread-sender.xml"
    result = _parse(console, other_run)
    sender = result.summaries[0].sender
    assert sender is not None and sender.bytes == _console_bytes(console)
    warning = [w for w in result.warnings if "console says" in w]
    assert len(warning) == 1 and f"{_console_bytes(console):,}" in warning[0]


# --- per-thread figures (item 9) -----------------------------------------------------------


def _thread_rates(path: Path) -> list[float]:
    """The console's own -V thread table, in bit/s (SI)."""
    rows = re.findall(r"INFO: \t(\d+)\t\s*[\d.]+\t\s*([\d.]+)(Gbps|Mbps)", path.read_text())
    return [float(rate) * (1e9 if unit == "Gbps" else 1e6) for _, rate, unit in rows]


def test_per_thread_throughput_from_the_console_becomes_streams() -> None:
    console = OLD / "ntttcp-1.4.0-tcp-4threads-sender.txt"
    result = _parse(console)
    want = _thread_rates(console)
    assert len(want) == 4
    assert [s.stream_id for s in result.streams] == [0, 1, 2, 3]
    assert [s.sender.bits_per_second for s in result.streams if s.sender] == want


def test_per_thread_throughput_from_xml_and_json_becomes_streams() -> None:
    xml = OLD / "ntttcp-1.4.0-tcp-4threads-receiver.xml"
    kib = [float(x) for x in re.findall(r'metric="KB/s">([\d.]+)<', xml.read_text())]
    streams = _parse(xml).streams
    assert [s.receiver.bits_per_second for s in streams if s.receiver] == pytest.approx(
        [k * 1024 * 8 for k in kib])  # 1.4.0: KB = 2**10
    name = DATA / "ntttcp-1.4.3-tcp-4threads-V-json-sender.json"
    kb = [float(x) for x in re.findall(r'"KB/s",\s*"value"\s*:\s*"([\d.]+)"',
                                              name.read_text())]
    streams = _parse(name).streams
    assert len(kb) == 4
    assert [s.sender.bits_per_second for s in streams if s.sender] == pytest.approx(
        [k * 1000 * 8 for k in kb])  # 1.4.3: KB = 10**3


needs_ntttcp = pytest.mark.parametrize("peer", peer_params("ntttcp"), indirect=True)


@needs_ntttcp
@pytest.mark.peers
def test_a_four_thread_run_has_four_streams_and_its_cycles_per_byte(peer: PeerBinary) -> None:
    spec = TestSpec(tool="ntttcp", duration_s=2.0, streams=4)
    result = _run_past_one_hung_sender(spec)
    flow = result.summaries[0]
    assert flow.sender is not None and flow.receiver is not None
    assert [s.stream_id for s in result.streams] == [0, 1, 2, 3]
    rates = [s.receiver.bits_per_second for s in result.streams if s.receiver]
    assert sum(rates) == pytest.approx(flow.receiver.bits_per_second, rel=0.05)
    console = next(r.text for r in result.raw if r.name == "receiver")
    printed = re.search(r"cycles/byte\s*:([\d.]+)", console)
    assert printed and flow.receiver.cpu is not None and flow.receiver.cpu.host is not None
    assert flow.receiver.cpu.host.cycles_per_byte == float(printed.group(1))


def _run_past_one_hung_sender(spec: TestSpec) -> Result:
    # ntttcp 1.4.3's sender with -m 4 once hung after its receiver had reported and exited
    # (a CI-like run here: "did not finish within 17.4 s", the sender printed nothing).
    # netprobe said so, as it should; that hang is ntttcp's, so one more run is allowed
    # for it and for nothing else, and the figures are asked of the run that finished.
    try:
        return NtttcpTool().run(spec, NullReporter())
    except TestFailed as exc:
        if "did not finish within" not in str(exc) or "sender printed no report" not in str(exc):
            raise
    return NtttcpTool().run(spec, NullReporter())
