"""The iperf3 adapter: parsers on the real 3.12 outputs in shared/fixtures/peers (figures
checked against what each file itself prints), hand-written 3.17-style --json-stream, and
real runs of Debian's iperf3 on loopback."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import attrs
import pytest

from netprobe.driven import Figures, free_port
from netprobe.errors import ParseError, SpecError, TestFailed, TestInterrupted
from netprobe.plugin import NullReporter, fill_missing
from netprobe.schema import Result, TestSpec
from netprobe.testing import RecordingReporter
from netprobe.tools._iperf_common import IperfSession, Launch
from netprobe.tools.iperf3 import Iperf3Tool
from tests.interrupts import Measuring, ctrl_c_after
from tests.peers import PEER_FIXTURES, PeerBinary, peer_params, read_fixture, run_recorded

PEERS = PEER_FIXTURES
C2S, S2C = "client_to_server", "server_to_client"


fixture = read_fixture


def parse(*names: str) -> Result:
    return Iperf3Tool().parse([(name, fixture(name)) for name in names])


def doc(name: str) -> dict:
    return json.loads(fixture(name))


def flow(result: Result, direction: str):
    found = result.summary(direction)
    assert found is not None, f"no {direction} flow"
    return found


# --- -J documents ---------------------------------------------------------------------------


def test_tcp_json_figures_match_the_document() -> None:
    data = doc("iperf3-3.12-tcp-J-client.txt")
    result = parse("iperf3-3.12-tcp-J-client.txt")
    end = data["end"]
    one = flow(result, C2S)
    assert result.status == "ok"
    assert result.tool.version == "3.12"
    assert one.receiver.bits_per_second == end["sum_received"]["bits_per_second"]
    assert one.receiver.bytes == end["sum_received"]["bytes"] == 15300034560
    assert one.sender.bytes == end["sum_sent"]["bytes"]
    assert one.sender.retransmits == 0 and one.sender.retransmits_scope == "connection"
    stream = end["streams"][0]["sender"]
    assert one.sender.rtt_us == stream["mean_rtt"] == 142
    assert (one.sender.min_rtt_us, one.sender.max_rtt_us) == (51, 243)
    assert one.sender.cwnd_bytes == stream["max_snd_cwnd"]
    cpu = end["cpu_utilization_percent"]
    assert one.sender.cpu.process.total_percent == cpu["host_total"]  # client = sender
    assert one.receiver.cpu.process.total_percent == cpu["remote_total"]
    assert result.streams[0].socket.congestion == "bbr"
    first = next(i for i in result.intervals if i.stream_id == 1)
    raw = data["intervals"][0]["streams"][0]
    assert (first.bytes, first.rtt_us, first.rttvar_us, first.cwnd_bytes) == (
        raw["bytes"],
        raw["rtt"],
        raw["rttvar"],
        raw["snd_cwnd"],
    )
    assert first.role == "sender" and first.direction == C2S
    assert len(result.intervals) == 2 * len(data["intervals"])  # stream + sum per interval
    assert result.local.address == "127.0.0.1" and result.remote.port == 35201
    assert result.start_time.startswith("2026-11-30T21:27:56")
    assert result.spec.duration_s == 5 and result.spec.protocol == "tcp"


def test_reverse_json_client_is_the_receiver_and_unknown_sender_figures_are_none() -> None:
    data = doc("iperf3-3.12-R-J-client.txt")
    result = parse("iperf3-3.12-R-J-client.txt")
    assert result.spec.direction == "reverse"
    assert [f.direction for f in result.summaries] == [S2C]
    one = flow(result, S2C)
    assert one.receiver.bits_per_second == data["end"]["sum_received"]["bits_per_second"]
    assert one.sender.retransmits == 18
    # iperf3 3.12 writes 0 for the server's RTT/cwnd on a -R client: unknown, not 0.
    assert one.sender.rtt_us is None and one.sender.cwnd_bytes is None
    assert one.sender.min_rtt_us is None and one.sender.max_rtt_us is None
    cpu = data["end"]["cpu_utilization_percent"]
    assert one.receiver.cpu.process.total_percent == cpu["host_total"]  # client = receiver
    assert one.sender.cpu.process.total_percent == cpu["remote_total"]
    assert {(i.direction, i.role) for i in result.intervals} == {(S2C, "receiver")}


def test_bidir_json_has_both_flows() -> None:
    end = doc("iperf3-3.12-bidir-J-client.txt")["end"]
    result = parse("iperf3-3.12-bidir-J-client.txt")
    assert result.spec.direction == "bidir"
    forward, back = flow(result, C2S), flow(result, S2C)
    assert forward.sender.bytes == end["sum_sent"]["bytes"]
    assert forward.receiver.bits_per_second == end["sum_received"]["bits_per_second"]
    assert back.sender.bytes == end["sum_sent_bidir_reverse"]["bytes"]
    assert back.receiver.bits_per_second == end["sum_received_bidir_reverse"]["bits_per_second"]
    assert back.sender.retransmits == 12
    # The client's numbers for the stream it receives come from its own socket: dropped.
    assert back.sender.rtt_us is None and back.sender.cwnd_bytes is None
    assert forward.sender.rtt_us == end["streams"][0]["sender"]["mean_rtt"]
    roles = {(i.direction, i.role) for i in result.intervals}
    assert roles == {(C2S, "sender"), (S2C, "receiver")}
    assert {s.direction for s in result.streams} == {C2S, S2C}


def test_udp_json_loss_and_jitter() -> None:
    end = doc("iperf3-3.12-udp-b0-J-client.txt")["end"]
    result = parse("iperf3-3.12-udp-b0-J-client.txt")
    one = flow(result, C2S)
    received = end["sum_received"]
    assert one.receiver.bytes == received["bytes"] == 16961142784
    assert one.receiver.bits_per_second == received["bits_per_second"]
    assert one.receiver.lost_packets == received["lost_packets"] == 591832
    # iperf3's receiver "packets" is the datagrams expected; the schema's, those received
    assert one.receiver.packets == received["packets"] - 591832
    assert one.receiver.lost_percent == received["lost_percent"]
    assert one.receiver.jitter_ms == received["jitter_ms"]
    assert one.receiver.out_of_order_packets == 0
    assert one.sender.packets == end["sum_sent"]["packets"] == 1109700
    assert one.sender.jitter_ms is None and one.sender.lost_packets is None
    stream = result.streams[0]
    assert stream.sender.bytes == end["streams"][0]["udp"]["bytes"]
    assert stream.receiver.lost_packets == 591832
    assert stream.receiver.bytes == received["bytes"]  # one stream: the flow's receiver count


def test_udp_reverse_json() -> None:
    end = doc("iperf3-3.12-udp-R-b100M-J-client.txt")["end"]
    result = parse("iperf3-3.12-udp-R-b100M-J-client.txt")
    one = flow(result, S2C)
    assert one.receiver.bits_per_second == end["sum_received"]["bits_per_second"]
    assert one.receiver.jitter_ms == end["sum"]["jitter_ms"]
    assert result.spec.rate_bits_per_second == 100_000_000
    receiver_intervals = [i for i in result.intervals if i.role == "receiver"]
    assert receiver_intervals and all(i.jitter_ms is not None for i in receiver_intervals)


def test_four_streams() -> None:
    data = doc("iperf3-3.12-P4-J-client.txt")
    result = parse("iperf3-3.12-P4-J-client.txt")
    assert sorted(s.stream_id for s in result.streams) == [1, 2, 3, 4]
    assert result.spec.streams == 4
    assert sum(s.sender.bytes for s in result.streams) == data["end"]["sum_sent"]["bytes"]
    one = flow(result, C2S)
    assert one.sender.retransmits == 22
    assert one.sender.min_rtt_us == 231 and one.sender.max_rtt_us == 678
    assert one.sender.rtt_us is None  # a mean over four sockets would be made up
    sums = [i for i in result.intervals if i.stream_id is None]
    assert [s.bytes for s in sums] == [b["sum"]["bytes"] for b in data["intervals"]]


def test_server_document_leaves_the_clients_side_unknown() -> None:
    result = parse("iperf3-3.12-tcp-J-server-J-server.txt")
    one = flow(result, C2S)
    assert one.sender is None  # written before the client's figures arrived (zeros)
    assert one.receiver.bytes == 15352463360
    assert {i.role for i in result.intervals} == {"receiver"}


def test_client_and_server_documents_together() -> None:
    result = parse("iperf3-3.12-tcp-J-server-J-client.txt", "iperf3-3.12-tcp-J-server-J-server.txt")
    assert {(i.direction, i.role) for i in result.intervals} == {(C2S, "sender"), (C2S, "receiver")}
    assert [r.name for r in result.raw] == [
        "iperf3-3.12-tcp-J-server-J-client.txt",
        "iperf3-3.12-tcp-J-server-J-server.txt",
    ]


def test_fill_missing_adds_flows_and_streams_the_result_lacks() -> None:
    # What iperf3's parse needs of it: a client output cut before its summary, merged with
    # the server's document, takes the server's flows and streams whole.
    full = parse("iperf3-3.12-tcp-J-server-J-server.txt")
    bare = attrs.evolve(full, summaries=(), streams=(), intervals=(), latency=None)
    merged = fill_missing(bare, full)
    assert merged.summaries == full.summaries and merged.streams == full.streams
    assert merged.intervals == full.intervals and merged.raw == bare.raw
    mine = attrs.evolve(full.summaries[0], receiver=None)
    kept = fill_missing(attrs.evolve(full, summaries=(mine,)), full)
    assert kept.summaries[0].receiver == full.summaries[0].receiver  # sides still filled


def test_get_server_output_document() -> None:
    end = doc("iperf3-3.12-tcp-J-get-server-output-client.txt")["end"]
    result = parse("iperf3-3.12-tcp-J-get-server-output-client.txt")
    assert flow(result, C2S).receiver.bytes == end["sum_received"]["bytes"]


@pytest.mark.parametrize(
    "name", ["iperf3-3.12-err-noserver-J-client.txt", "iperf3-3.12-err-server-busy-client2-J.txt"]
)
def test_error_documents_are_failed_results(name: str) -> None:
    message = doc(name)["error"]
    result = parse(name)
    assert result.status == "failed"
    assert message in result.errors
    assert result.summaries == ()


def test_truncated_document_keeps_what_was_complete() -> None:
    text = fixture("iperf3-3.12-P4-J-client.txt")
    result = Iperf3Tool().parse([("cut.json", text[:7000])])
    assert len(result.intervals) == 3 * 5  # three whole intervals, 4 streams + sum
    assert any("cut short" in w for w in result.warnings)
    assert result.summaries == ()


OWN_DATA = Path(__file__).resolve().parent / "data"


def test_report_skipped_at_the_end_of_the_warmup_is_mended() -> None:
    """A real 3.12 run (-t 2 -O 1 -i 0.5 -P 2 -J on loopback) where the warm-up ended just
    before a report was due: iperf3 printed the first interval after it as 0.4998-0.5006
    with 1.0004 seconds and half a second's bytes."""
    name = "iperf3-3.12-omit-report-skipped.json"
    document = json.loads((OWN_DATA / name).read_text())
    raw_sum = document["intervals"][1]["sum"]
    assert not raw_sum["omitted"] and raw_sum["end"] - raw_sum["start"] < 0.01  # the trap
    result = Iperf3Tool().parse([(name, (OWN_DATA / name).read_text())])
    after = [i for i in result.intervals if not i.omitted]
    assert {i.stream_id for i in after} == {None, 1, 2}
    for series in (None, 1, 2):
        samples = sorted((i for i in after if i.stream_id == series), key=lambda i: i.start_s)
        assert samples[0].start_s == pytest.approx(1.0)  # the warm-up's end, on the test's clock
        for earlier, later in zip(samples, samples[1:]):
            assert later.start_s == pytest.approx(earlier.end_s)  # no gap, no overlap
        for sample in samples:
            seconds = sample.end_s - sample.start_s
            assert 0.45 < seconds < 0.55
            assert sample.bits_per_second == pytest.approx(sample.bytes * 8 / seconds, rel=0.01)
    first = min((i for i in after if i.stream_id is None), key=lambda i: i.start_s)
    assert first.bytes == raw_sum["bytes"]  # the bytes iperf3 counted are kept as they are


def test_garbage_is_a_parse_error_with_source_and_line() -> None:
    with pytest.raises(ParseError) as info:
        Iperf3Tool().parse([("bad.json", '{\n  "start": {\n  oops')])
    assert info.value.source == "bad.json" and info.value.line is not None
    with pytest.raises(ParseError, match="not an iperf3"):
        Iperf3Tool().parse([("x.json", '{"hello": 1}')])
    with pytest.raises(ParseError):
        Iperf3Tool().parse([])


# --- every 3.12 fixture: parses or is refused with ParseError, never a traceback -------------


def _all_fixtures() -> list[str]:
    if not PEERS.exists():
        return ["(fixtures absent)"]
    return sorted(p.name for p in PEERS.glob("iperf3-3.12-*"))


@pytest.mark.parametrize("name", _all_fixtures())
def test_every_fixture(name: str) -> None:
    text = fixture(name)
    readable = text.lstrip().startswith("{") or re.search(r"sec\s+[\d.]+ \w?Bytes", text)
    if not readable:  # help, version, plain-text errors
        with pytest.raises(ParseError):
            Iperf3Tool().parse([(name, text)])
        return
    result = Iperf3Tool().parse([(name, text)])
    assert result.tool.name == "iperf3"
    if "err" not in name:
        assert result.summaries and result.intervals


# --- human output ---------------------------------------------------------------------------


def test_human_client_output_matches_printed_figures() -> None:
    result = parse("iperf3-3.12-tcp-i1-client.txt")
    one = flow(result, C2S)
    assert one.sender.bits_per_second == 26.4e9 and one.sender.retransmits == 16
    assert one.receiver.bits_per_second == 26.4e9
    first = result.intervals[0]
    assert (first.start_s, first.end_s, first.retransmits) == (0.0, 1.0, 0)
    assert first.bytes == round(3.09 * 1024**3) and first.cwnd_bytes == round(3.00 * 1024**2)
    assert any("rounded" in w for w in result.warnings)


def test_udp_receiver_packets_are_those_received_in_every_format() -> None:
    for name in ("iperf3-3.12-udp-b100M-i1-server.txt", "iperf3-3.12-udp-b0-i1-server.txt",
                 "iperf3-3.12-udp-b0-J-client.txt"):
        receiver = flow(parse(name), C2S).receiver
        text = fixture(name)
        if name.endswith("J-client.txt"):
            total = json.loads(text)["end"]["sum_received"]["packets"]  # the receiver's
        else:  # the summary line's Lost/Total
            total = int(re.findall(r"\d+/(\d+) \([^)]*%\)\s+receiver", text)[-1])
        assert receiver.packets + receiver.lost_packets == total, name
        assert receiver.lost_packets > 0 or receiver.packets == total


def test_human_bidir_and_udp_server_output() -> None:
    bidir = parse("iperf3-3.12-bidir-i1-server.txt")
    assert flow(bidir, C2S).receiver.bits_per_second == 12.0e9
    assert flow(bidir, S2C).sender.retransmits == 9
    udp = parse("iperf3-3.12-udp-b100M-i1-server.txt")
    receiver = flow(udp, C2S).receiver
    assert (receiver.jitter_ms, receiver.lost_packets, receiver.packets) == (0.005, 0, 1907)


def test_human_server_output_of_a_reverse_test_is_the_servers_sending() -> None:
    # A -R test's server does not print "Reverse mode"; its lines (Retr, Cwnd, "sender")
    # are its own sending, server to client. They were put on a client_to_server flow,
    # which beside the client's -J made a phantom second flow.
    for name in ("iperf3-3.12-R-J-server.txt", "iperf3-3.12-R-i1-server.txt"):
        alone = parse(name)
        assert [f.direction for f in alone.summaries] == [S2C], name
        assert alone.spec.direction == "reverse"
        assert {i.direction for i in alone.intervals} == {S2C}
        assert flow(alone, S2C).sender.retransmits is not None
    both = parse("iperf3-3.12-R-J-client.txt", "iperf3-3.12-R-J-server.txt")
    assert [(f.direction, f.sender is not None, f.receiver is not None)
            for f in both.summaries] == [(S2C, True, True)]


# --- nearby versions: written from the documented formats -----------------------------------

JSON_STREAM_317 = "\n".join(
    json.dumps(event)
    for event in [
        {
            "event": "start",
            "data": {
                "connected": [
                    {
                        "socket": 5,
                        "local_host": "127.0.0.1",
                        "local_port": 40000,
                        "remote_host": "127.0.0.1",
                        "remote_port": 5201,
                    }
                ],
                "version": "iperf 3.17.1",
                "system_info": "Linux test",
                "timestamp": {
                    "time": "Mon, 01 Jan 2024 00:00:00 GMT",
                    "timesecs": 1704067200,
                    "timemillisecs": 1704067200000,
                },
                "connecting_to": {"host": "127.0.0.1", "port": 5201},
                "cookie": "x",
                "tcp_mss_default": 32768,
                "target_bitrate": 0,
                "fq_rate": 0,
                "sock_bufsize": 0,
                "sndbuf_actual": 16384,
                "rcvbuf_actual": 131072,
                "test_start": {
                    "protocol": "TCP",
                    "num_streams": 1,
                    "blksize": 131072,
                    "omit": 0,
                    "duration": 1,
                    "bytes": 0,
                    "blocks": 0,
                    "reverse": 0,
                    "tos": 0,
                    "target_bitrate": 0,
                    "bidir": 1,
                    "fqrate": 0,
                    "interval": 1,
                },
            },
        },
        {
            "event": "interval",
            "data": {
                "streams": [
                    {
                        "socket": 5,
                        "start": 0,
                        "end": 1.0,
                        "seconds": 1.0,
                        "bytes": 1000000,
                        "bits_per_second": 8000000.0,
                        "retransmits": 1,
                        "snd_cwnd": 65536,
                        "snd_wnd": 131072,
                        "rtt": 250,
                        "rttvar": 50,
                        "pmtu": 1500,
                        "reorder": 0,
                        "omitted": False,
                        "sender": True,
                    },
                    {
                        "socket": 7,
                        "start": 0,
                        "end": 1.0,
                        "seconds": 1.0,
                        "bytes": 500000,
                        "bits_per_second": 4000000.0,
                        "omitted": False,
                        "sender": False,
                    },
                ],
                "sum": {
                    "start": 0,
                    "end": 1.0,
                    "seconds": 1.0,
                    "bytes": 1000000,
                    "bits_per_second": 8000000.0,
                    "retransmits": 1,
                    "omitted": False,
                    "sender": True,
                },
                "sum_bidir_reverse": {
                    "start": 0,
                    "end": 1.0,
                    "seconds": 1.0,
                    "bytes": 500000,
                    "bits_per_second": 4000000.0,
                    "omitted": False,
                    "sender": False,
                },
            },
        },
        {
            "event": "end",
            "data": {
                "streams": [
                    {
                        "sender": {
                            "socket": 5,
                            "start": 0,
                            "end": 1.0,
                            "seconds": 1.0,
                            "bytes": 1000000,
                            "bits_per_second": 8000000.0,
                            "retransmits": 1,
                            "max_snd_cwnd": 65536,
                            "max_snd_wnd": 131072,
                            "max_rtt": 300,
                            "min_rtt": 200,
                            "mean_rtt": 250,
                            "sender": True,
                        },
                        "receiver": {
                            "socket": 5,
                            "start": 0,
                            "end": 1.0,
                            "seconds": 1.0,
                            "bytes": 990000,
                            "bits_per_second": 7920000.0,
                            "sender": True,
                        },
                    },
                    {
                        "sender": {
                            "socket": 7,
                            "start": 0,
                            "end": 1.0,
                            "seconds": 1.0,
                            "bytes": 500000,
                            "bits_per_second": 4000000.0,
                            "retransmits": 2,
                            "max_snd_cwnd": 0,
                            "max_snd_wnd": 0,
                            "max_rtt": 0,
                            "min_rtt": 0,
                            "mean_rtt": 0,
                            "sender": False,
                        },
                        "receiver": {
                            "socket": 7,
                            "start": 0,
                            "end": 1.0,
                            "seconds": 1.0,
                            "bytes": 495000,
                            "bits_per_second": 3960000.0,
                            "sender": False,
                        },
                    },
                ],
                "sum_sent": {
                    "start": 0,
                    "end": 1.0,
                    "seconds": 1.0,
                    "bytes": 1000000,
                    "bits_per_second": 8000000.0,
                    "retransmits": 1,
                    "sender": True,
                },
                "sum_received": {
                    "start": 0,
                    "end": 1.0,
                    "seconds": 1.0,
                    "bytes": 990000,
                    "bits_per_second": 7920000.0,
                    "sender": True,
                },
                "sum_sent_bidir_reverse": {
                    "start": 0,
                    "end": 1.0,
                    "seconds": 1.0,
                    "bytes": 500000,
                    "bits_per_second": 4000000.0,
                    "retransmits": 2,
                    "sender": False,
                },
                "sum_received_bidir_reverse": {
                    "start": 0,
                    "end": 1.0,
                    "seconds": 1.0,
                    "bytes": 495000,
                    "bits_per_second": 3960000.0,
                    "sender": False,
                },
                "cpu_utilization_percent": {
                    "host_total": 10.0,
                    "host_user": 1.0,
                    "host_system": 9.0,
                    "remote_total": 20.0,
                    "remote_user": 2.0,
                    "remote_system": 18.0,
                },
                "sender_tcp_congestion": "cubic",
                "receiver_tcp_congestion": "cubic",
            },
        },
    ]
)


def test_json_stream_317_bidir() -> None:
    result = Iperf3Tool().parse([("stream.jsonl", JSON_STREAM_317)])
    assert result.tool.version == "3.17.1"
    assert result.spec.direction == "bidir" and result.spec.interval_s == 1
    forward, back = flow(result, C2S), flow(result, S2C)
    assert (forward.sender.bytes, forward.receiver.bytes) == (1000000, 990000)
    assert (back.sender.bytes, back.receiver.bytes) == (500000, 495000)
    assert forward.sender.rtt_us == 250 and back.sender.rtt_us is None
    assert forward.sender.cpu.process.total_percent == 10.0  # the client sends c2s
    assert back.sender.cpu.process.total_percent == 20.0  # the server sends s2c
    by = {(i.direction, i.role, i.stream_id): i for i in result.intervals}
    assert by[(C2S, "sender", 1)].rtt_us == 250
    assert by[(S2C, "receiver", None)].bytes == 500000
    assert result.start_time.startswith("2024-01-01T00:00:00")


def test_json_stream_error_and_cut_short() -> None:
    failed = "\n".join(
        [
            json.dumps({"event": "error", "data": "unable to connect to server"}),
            json.dumps({"event": "end", "data": {}}),
        ]
    )
    result = Iperf3Tool().parse([("err.jsonl", failed)])
    assert result.status == "failed" and "unable to connect to server" in result.errors
    cut = "\n".join(JSON_STREAM_317.splitlines()[:2])
    partial = Iperf3Tool().parse([("cut.jsonl", cut)])
    assert len(partial.intervals) == 4 and any("no end event" in w for w in partial.warnings)


# --- capabilities and refusals (no binary needed for most) -----------------------------------


def test_refusals_name_option_and_tool() -> None:
    tool = Iperf3Tool()
    found = tool.refusals(
        TestSpec(
            tool="iperf3",
            duration_s=2.5,
            omit_s=0.5,
            streams=2,
            bytes_total=10**6,
            protocol="udp",
            nodelay=True,
        )
    )
    text = " | ".join(found)
    assert "--time 2.5" in text and "--omit 0.5" in text and "--bytes" in text
    assert "--nodelay" in text and all(f.startswith("iperf3 cannot honour") for f in found)
    with pytest.raises(SpecError):
        tool.check(TestSpec(tool="iperf3", interval_s=0.01))


def test_probe_with_a_bad_path_says_why() -> None:
    availability = Iperf3Tool({"path": "/nonexistent/iperf3"}).probe()
    assert not availability.available
    assert "/nonexistent/iperf3" in availability.reasons[0]


# --- real runs on loopback ------------------------------------------------------------------

needs_iperf3 = pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 not installed")


def run(spec: TestSpec, **options) -> tuple[Result, RecordingReporter]:
    return run_recorded(Iperf3Tool(options), spec)


@pytest.mark.peers
@needs_iperf3
def test_probe_finds_the_debian_binary() -> None:
    availability = Iperf3Tool().probe()
    assert availability.available and re.match(r"3\.\d+", availability.version)


@pytest.mark.peers
@pytest.mark.parametrize("peer", peer_params("iperf3"), indirect=True)
def test_run_tcp(peer: PeerBinary) -> None:
    result, recorder = run(TestSpec(tool="iperf3", duration_s=2))
    assert result.status == "ok"
    one = flow(result, C2S)
    assert one.sender.bytes > 0 and one.receiver.bytes > 0
    assert one.sender.rtt_us is not None and one.sender.retransmits is not None
    assert len([i for i in result.intervals if i.stream_id == 1]) >= 2
    assert recorder.intervals, "no live intervals"
    assert [r.name for r in result.raw] == ["client", "server"]
    assert all(r.exit_code == 0 for r in result.raw)
    assert result.tool.version == peer.version and result.tool.mode == "copy"
    live = Iperf3Tool().probe().details
    if peer.at_least(3, 17):
        assert live == ("live intervals from --json-stream",)  # the path 3.12 lacks


@pytest.mark.host_timing
@pytest.mark.peers
@pytest.mark.parametrize("peer", peer_params("iperf3"), indirect=True)
def test_run_udp_at_a_rate(peer: PeerBinary) -> None:
    rate = 50e6
    result, _ = run(
        TestSpec(tool="iperf3", protocol="udp", duration_s=2, rate_bits_per_second=rate)
    )
    sender, receiver = flow(result, C2S).sender, flow(result, C2S).receiver
    assert abs(sender.bits_per_second - rate) / rate < 0.05, sender
    # Loopback can drop a few datagrams when other work shares this 2-core machine.
    assert abs(receiver.bits_per_second - rate) / rate < 0.10, receiver
    assert receiver.jitter_ms is not None and receiver.lost_packets is not None
    # packets: those that arrived, as for every tool; with the lost ones, all that was sent
    assert receiver.packets + receiver.lost_packets == pytest.approx(sender.packets, abs=2)


@pytest.mark.peers
@pytest.mark.parametrize("peer", peer_params("iperf3"), indirect=True)
def test_run_two_streams_reverse(peer: PeerBinary) -> None:
    result, recorder = run(TestSpec(tool="iperf3", duration_s=2, streams=2, direction="reverse"))
    assert [s.stream_id for s in result.streams] == [1, 2]
    assert {s.direction for s in result.streams} == {S2C}
    back = flow(result, S2C)
    assert back.receiver.bytes > 0 and back.sender.rtt_us is None
    # 3.17+ streams the client's own (receiving) view; before, the local server's (sending)
    seen_by = "receiver" if peer.at_least(3, 17) else "sender"
    assert {i.role for i in recorder.intervals} == {seen_by}


@pytest.mark.peers
@pytest.mark.parametrize("peer", peer_params("iperf3"), indirect=True)
def test_run_bidir(peer: PeerBinary) -> None:
    result, _ = run(TestSpec(tool="iperf3", duration_s=2, direction="bidir"))
    assert flow(result, C2S).receiver.bytes > 0 and flow(result, S2C).receiver.bytes > 0


@pytest.mark.peers
@needs_iperf3
def test_run_without_a_server_fails_clearly() -> None:
    port = free_port()
    spec = TestSpec(tool="iperf3", host="127.0.0.1", port=port, duration_s=2)
    with pytest.raises(TestFailed) as info:
        run(spec, start_server=False)
    message = str(info.value)
    assert "Connection refused" in message and "exit code 0" in message
    assert f"-p {port}" in message
    assert info.value.partial.status == "failed"
    assert info.value.partial.raw[0].exit_code == 0


@pytest.mark.peers
@needs_iperf3
def test_ctrl_c_stops_the_tools_and_keeps_the_partial_result() -> None:
    reporter = Measuring()
    with ctrl_c_after(1.3, started=reporter.measuring), pytest.raises(TestInterrupted) as info:
        Iperf3Tool().run(TestSpec(tool="iperf3", duration_s=20), reporter)
    partial = info.value.partial
    assert partial.status == "interrupted"
    assert len([i for i in partial.intervals if i.stream_id == 1]) >= 1
    assert all(r.exit_code is not None for r in partial.raw)  # both processes are gone


# --- the shared driving machinery, on stand-in processes ---------------------------------------


class _ShellSession(IperfSession):
    """An IperfSession whose processes are shell commands (the lifecycle alone)."""

    def __init__(self, client: list[str], server: list[str] | None = None,
                 duration_s: float = 1.0) -> None:
        spec = TestSpec(tool="iperf3", duration_s=duration_s)
        launch = Launch("2026-12-05T00:00:00.000+00:00", "127.0.0.1", 1, server is not None)
        super().__init__(spec, NullReporter(), tool="shell", version="0", mode=None,
                         launch=launch)
        self.client_argv, self.server_argv = client, server

    def problem(self) -> str | None:
        return None

    def parts(self) -> Figures:
        return Figures()


def test_a_hung_client_is_stopped_with_its_children(monkeypatch: pytest.MonkeyPatch) -> None:
    from netprobe.tools import _iperf_common

    monkeypatch.setattr(_iperf_common, "client_deadline", lambda spec: 0.5)
    session = _ShellSession(["sh", "-c", "sleep 300 & echo child=$!; wait"])
    with pytest.raises(TestFailed, match=r"no result 0\.5 s after the start") as caught:
        session.run()
    assert session.driven.timed_out and caught.value.partial is not None
    child = int(session.client.lines[0].split("=")[1])
    stat = Path(f"/proc/{child}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    assert session.client.returncode is not None


def test_a_server_that_does_not_come_up_is_reported() -> None:
    session = _ShellSession(["true"], ["sh", "-c", "echo bind failed; exit 1"])
    with pytest.raises(TestFailed, match="server did not get ready: bind failed"):
        session.run()
    assert session.client is None  # the client never ran


def test_a_one_stream_bidir_log_draws_each_interval_once_per_direction() -> None:
    # iperf3 stamps the reverse sum with the forward sum's end (1.000475 s where the one
    # reverse stream ended at 1.000481): the stream and its identical sum were both drawn.
    from netprobe.cli.render import IntervalFilter

    result = parse("iperf3-3.12-bidir-J-client.txt")
    shown = IntervalFilter(streams=1)
    lines = [(round(i.start_s), i.direction, i.role) for i in result.intervals
             if shown.wants(i)]
    assert sorted(lines) == sorted(set(lines))
    assert {(d, r) for _, d, r in lines} == {(C2S, "sender"), (S2C, "receiver")}
    assert len(lines) == 2 * 5  # 5 one-second intervals each way
