"""Reading qperf 0.4.11's real outputs (saved in tests/fixtures from the Debian binary)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from netprobe.errors import ParseError
from netprobe.schema import Result

from netprobe_qperf import QperfTool
from netprobe_qperf.parse import convert, parse

FIXTURES = Path(__file__).parent / "fixtures"


def _parsed(name: str) -> Result:
    return QperfTool().parse([(name, (FIXTURES / name).read_text())])


def _printed(name: str) -> dict[str, float]:
    """The file's ``name = value`` figures, read with a plain regex (-uu: plain numbers)."""
    text = (FIXTURES / name).read_text()
    return {k: float(v) for k, v in re.findall(r"^\s+(\w+)\s+=\s+([\d.]+)", text, re.M)}


def test_tcp_bw_sender_and_receiver_are_qperf_s_byte_counts() -> None:
    result = _parsed("tcp_bw-vv-uu.txt")
    printed = _printed("tcp_bw-vv-uu.txt")
    flow = result.summary()
    assert flow is not None and flow.sender is not None and flow.receiver is not None
    assert flow.sender.bytes == printed["send_bytes"]
    assert flow.sender.end_s == printed["send_real_time"] / 1e9
    assert flow.receiver.bytes == printed["recv_bytes"]
    # qperf's own "bw" is the receiver's bytes over its time, as netprobe computes it
    assert flow.receiver.bits_per_second == pytest.approx(printed["bw"] * 8)
    assert flow.receiver.packets is None and flow.receiver.lost_packets is None  # TCP
    assert result.spec.protocol == "tcp" and result.spec.length_bytes == 65536
    assert result.latency is None
    assert result.streams[0].stream_id == 1 and result.streams[0].receiver == flow.receiver


def test_udp_bw_loss_is_datagrams_sent_minus_received() -> None:
    result = _parsed("udp_bw-vv-uu.txt")
    printed = _printed("udp_bw-vv-uu.txt")
    flow = result.summary()
    assert flow is not None and flow.sender is not None and flow.receiver is not None
    assert flow.sender.packets == printed["send_msgs"]
    assert flow.receiver.packets == printed["recv_msgs"]
    lost = printed["send_msgs"] - printed["recv_msgs"]
    assert flow.receiver.lost_packets == lost
    assert flow.receiver.lost_percent == pytest.approx(lost * 100 / printed["send_msgs"])
    assert flow.sender.bits_per_second == pytest.approx(printed["send_bw"] * 8)
    assert flow.receiver.bits_per_second == pytest.approx(printed["recv_bw"] * 8)


def test_latency_is_round_trips_twice_qperf_s_one_way_figure() -> None:
    result = _parsed("tcp_lat-vv-uu.txt")
    printed = _printed("tcp_lat-vv-uu.txt")
    latency = result.latency
    assert latency is not None
    assert latency.count == printed["loc_recv_msgs"]
    assert latency.mean_us == pytest.approx(2 * printed["latency"] / 1000)
    assert latency.measured_by == "qperf"  # the tool that measured it is named
    # one figure: no distribution is made up
    assert (latency.min_us, latency.p50_us, latency.p90_us, latency.p99_us, latency.max_us) == (
        None, None, None, None, None)
    assert any("no distribution" in w for w in result.warnings)


def test_rounded_output_gives_derived_figures_and_says_so() -> None:
    result = _parsed("udp_bw-v.txt")
    flow = result.summary()
    assert flow is not None and flow.receiver is not None
    assert flow.receiver.bits_per_second == pytest.approx(1.34e9 * 8)
    assert any("derived from qperf's rounded" in w for w in result.warnings)


def test_plain_output_without_counts_keeps_no_made_up_records() -> None:
    result = _parsed("tcp_bw-tcp_lat-plain.txt")
    assert result.summaries == () and result.latency is None
    assert any("tcp_lat: qperf printed no message count" in w for w in result.warnings)


def test_connection_failure_is_a_failed_result() -> None:
    result = _parsed("err-no-server.txt")
    assert result.status == "failed"
    assert result.errors == ("127.0.0.1: failed to connect",)


def test_not_qperf_output_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        QperfTool().parse([("x.txt", "")])
    with pytest.raises(ParseError, match="no qperf test results"):
        QperfTool().parse([("x.txt", "hello\nworld\n")])


@pytest.mark.parametrize(
    ("value", "unit", "expected"),
    [
        (3.39, "GB", 3.39e9),
        (1.69, "GB/sec", 1.69e9),
        (64, "KiB", 65536),
        (9.6, "us", 9.6e-6),
        (2, "sec", 2.0),
        (1000000000, "ns", 1.0),
        (199, "% cpus", 199),
    ],
)
def test_units(value: float, unit: str, expected: float) -> None:
    assert convert(value, unit) == pytest.approx(expected)


def test_exact_figure_in_brackets_wins() -> None:
    out = parse("tcp_bw:\n    msg_size  =  64 KiB (65,536)\n    send_msgs = 51,683 \n")
    report = out.report("tcp_bw")
    assert report is not None
    assert report.figures == {"msg_size": 65536.0, "send_msgs": 51683.0}
