"""nuttcp adapter: parsers on the real outputs in shared/fixtures/peers, and real nuttcp runs
on loopback (the Debian nuttcp 6.1.2 binary)."""

from __future__ import annotations

import re
import shutil
import threading
from pathlib import Path

import attrs
import pytest

from netprobe.driven import free_port
from netprobe.errors import ParseError, SpecError, TestFailed, TestInterrupted
from netprobe.plugin import NullReporter
from netprobe.schema import Interval, Result, TestSpec
from netprobe.tools.nuttcp import parse_output as p
from netprobe.tools.nuttcp.command import client_args
from netprobe.tools.nuttcp.tool import NuttcpTool
from tests.interrupts import Measuring, ctrl_c_after
from tests.peers import (
    PEER_FIXTURES,
    PeerBinary,
    fixture_files,
    needs_fixtures,
    peer_params,
    read_fixture,
)

FIXTURES = PEER_FIXTURES
MIB = 1 << 20

def _parse(name: str) -> Result:
    return NuttcpTool().parse([(name, read_fixture(name))])


CLIENT_FILES = fixture_files("nuttcp[68]-*-client.txt")
RESULT_FILES = [f for f in CLIENT_FILES if not re.search(r"-(err-|help|version|xt)", f.name)]


# --- what the file itself prints, read independently of the parser -------------------------


def _printed_summary(text: str) -> dict[str, float]:
    """The brief summary line's figures, read with a plain regex."""
    last = [line for line in text.splitlines() if line.strip()][-1]
    if "megabytes=" in last:
        return {k: float(v.rstrip("%")) for k, v in re.findall(r"(\w+)=(\S+)", last)}
    found = re.match(r"\s*([\d.]+) MB /\s*([\d.]+) sec =\s*([\d.]+) Mbps", last)
    assert found, last
    figures = {
        "megabytes": float(found.group(1)),
        "real_seconds": float(found.group(2)),
        "rate_Mbps": float(found.group(3)),
    }
    for key, pattern in (
        ("tx_cpu", r"(\d+) %TX"),
        ("rx_cpu", r"(\d+) %RX"),
        ("retrans", r"(\d+) retrans"),
        ("cwnd", r"(\d+) KB-cwnd"),
        ("rtt_ms", r"([\d.]+) msRTT"),
        ("drop", r"(\d+) /"),
        ("pkt", r"/\s*(\d+) drop"),
        ("data_loss", r"([\d.]+) %loss"),
    ):
        hit = re.search(pattern, last)
        if hit:
            figures[key] = float(hit.group(1))
    return figures


@needs_fixtures
@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda f: f.name)
def test_every_result_fixture_matches_its_printed_figures(path: Path) -> None:
    text = path.read_text()
    result = NuttcpTool().parse([(path.name, text)])
    assert result.status == "ok"
    assert result.tool.name == "nuttcp"
    flow = result.summary(result.summaries[0].direction)
    assert flow is not None and flow.receiver is not None
    receiver = flow.receiver
    if "nuttcp-r:" in text:  # -v output: each side's own totals line
        return _check_verbose(text, result)
    printed = _printed_summary(text)
    assert receiver.bytes == round(printed["megabytes"] * MIB)
    assert receiver.bits_per_second == pytest.approx(printed["rate_Mbps"] * 1e6)
    assert receiver.end_s == printed["real_seconds"]
    assert receiver.cpu is not None and receiver.cpu.process is not None
    assert receiver.cpu.process.total_percent == printed["rx_cpu"]
    if "pkt" in printed:
        assert receiver.lost_packets == printed["drop"]
        assert receiver.packets == printed["pkt"] - printed["drop"]
        assert receiver.lost_percent == pytest.approx(printed["data_loss"])
        assert flow.sender is None  # brief UDP output has no sender total
        return
    sender = flow.sender
    assert sender is not None and sender.cpu is not None and sender.cpu.process is not None
    assert sender.cpu.process.total_percent == printed["tx_cpu"]
    if "rtt_ms" in printed:  # measured once, at connect, on the idle connection
        assert sender.min_rtt_us == round(printed["rtt_ms"] * 1000)
    assert sender.rtt_us is None  # nuttcp gives no RTT of the loaded connection
    if "cwnd" in printed:  # 8.x: real retransmits and cwnd
        assert sender.cwnd_bytes == printed["cwnd"] * 1024
        assert sender.retransmits == printed["retrans"]
        assert sender.retransmits_scope == "connection"
    else:  # 6.x prints "0 retrans" whatever happened: unknown
        assert sender.retransmits is None
        assert any("cannot count retransmits" in w for w in result.warnings)


def _check_verbose(text: str, result: Result) -> None:
    totals = {
        letter: (float(mb), float(sec), float(mbps))
        for letter, mb, sec, mbps in re.findall(
            r"nuttcp-([tr]): ([\d.]+) MB in ([\d.]+) real seconds = [\d.]+ KB/sec = ([\d.]+) Mbps",
            text,
        )
    }
    flow = result.summaries[0]
    for letter, side in (("t", flow.sender), ("r", flow.receiver)):
        assert side is not None
        mb, sec, mbps = totals[letter]
        assert side.bytes == round(mb * MIB)
        assert side.end_s == pytest.approx(sec, abs=0.005)  # printed to 2 decimals
        assert side.bits_per_second == pytest.approx(mbps * 1e6)
        # The time is nuttcp's own, to more than 2 decimals: bytes, time and rate agree.
        assert side.bytes * 8 / side.end_s == pytest.approx(side.bits_per_second, rel=2e-4)
        cpu = re.search(rf"nuttcp-{letter}: [\d.]+user [\d.]+sys \S+real (\d+)%", text)
        assert cpu and side.cpu and side.cpu.process
        assert side.cpu.process.total_percent == float(cpu.group(1))


def test_a_short_tests_time_is_taken_to_more_than_the_printed_two_decimals() -> None:
    """A conformance run interrupted nuttcp 8.2.2 after "0.39 real seconds" with 1352.4375 MB
    at 28757.9 Mbps: read as 0.39 s the result was 1.1% off its own bytes and rate (the
    validator's tolerance is 1%). The time nuttcp measured is MB / rate: 0.3945 s."""
    from netprobe.tools.nuttcp.parse_output import exact_seconds

    assert exact_seconds(1352.4375, 0.39, 28757.9) == pytest.approx(0.39450, abs=1e-5)
    # A time the rate does not round to is left as printed (a line that is not nuttcp's).
    assert exact_seconds(1352.4375, 0.50, 28757.9) == 0.50
    assert exact_seconds(0.0, 0.39, 0.0) == 0.39


@needs_fixtures
def test_interval_lines_become_receiver_intervals_timed_from_zero() -> None:
    result = _parse("nuttcp6-6.1.2-udp-R100m-i1-client.txt")
    assert [(i.start_s, i.end_s) for i in result.intervals] == [
        (0.0, 1.0),
        (1.0, 2.0),
        (2.0, 3.0),
        (3.0, 4.0),
        (4.0, 5.0),
    ]
    third = result.intervals[2]
    assert third.role == "receiver" and third.direction == "client_to_server"
    assert third.bytes == round(11.8672 * MIB)
    assert third.bits_per_second == pytest.approx(99.5578e6)
    assert (third.lost_packets, third.packets) == (7, 1526 - 7)
    receiver = result.summaries[0].receiver
    assert receiver is not None
    assert (receiver.lost_packets, receiver.packets, receiver.lost_percent) == (7, 7623, 0.09176)


@needs_fixtures
def test_fparse_intervals_and_summary_use_their_own_keys() -> None:
    result = _parse("nuttcp8-8.2.2-i1-fparse-client.txt")
    # 4 real_sec lines, then the tail nuttcp left out; the real_seconds line is the summary
    assert len(result.intervals) == 5
    first = result.intervals[0]
    assert first.bytes == round(3353.1875 * MIB)
    assert first.retransmits == 4 and first.cwnd_bytes == 1406 * 1024
    sender = result.summaries[0].sender
    assert sender is not None
    assert (sender.retransmits, sender.cwnd_bytes, sender.min_rtt_us) == (6, 639 * 1024, 70)
    assert sender.rtt_us is None


@needs_fixtures
def test_6x_interval_retransmits_are_unknown() -> None:
    result = _parse("nuttcp6-6.1.2-i1-client.txt")
    assert len(result.intervals) == 5
    assert all(i.retransmits is None for i in result.intervals)


@needs_fixtures
def test_running_total_and_xmitstats_suffixes_are_not_mixed_in() -> None:
    totals = _parse("nuttcp6-6.1.2-i1-frunningtotal-client.txt")
    assert totals.intervals[1].bytes == round(3724.8750 * MIB)  # not the "Tot:" figure
    xmit = _parse("nuttcp8-8.2.2-udp-R100m-i1-fxmitstats-client.txt")
    assert xmit.intervals[0].packets == 1525


@needs_fixtures
def test_verbose_output_gives_both_sides_socket_and_direction() -> None:
    result = _parse("nuttcp8-8.2.2-r-v-client.txt")
    assert result.tool.version == "8.2.2"
    assert result.spec.direction == "reverse"  # the client printed nuttcp-r first
    flow = result.summaries[0]
    assert flow.direction == "server_to_client"
    assert flow.sender is not None and flow.receiver is not None
    assert flow.sender.retransmits == 14 and flow.sender.cwnd_bytes == 447 * 1024
    assert flow.sender.min_rtt_us == 60 and flow.sender.rtt_us is None
    assert flow.receiver.bits_per_second == pytest.approx(32861.9456e6)
    assert flow.sender.cpu and flow.sender.cpu.process
    assert flow.sender.cpu.process.cpu_seconds == pytest.approx(3.6)
    stream = result.streams[0]
    assert stream.socket is not None
    assert (stream.socket.send_buffer_bytes, stream.socket.mss_bytes) == (4194304, 32741)


@needs_fixtures
def test_6x_verbose_udp_has_loss_and_no_retransmits() -> None:
    result = _parse("nuttcp6-6.1.2-vv-udp-client.txt")
    assert result.spec.protocol == "udp"
    flow = result.summaries[0]
    assert flow.receiver is not None and flow.sender is not None
    assert (flow.receiver.lost_packets, flow.receiver.packets) == (0, 7630)
    assert flow.sender.retransmits is None


@needs_fixtures
@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("nuttcp6-6.1.2-err-noserver-client.txt", "Error: connect: Connection refused"),
        ("nuttcp8-8.2.2-err-noserver-fparse-client.txt", "Error: connect: Connection refused"),
        ("nuttcp6-6.1.2-err-badhost-client.txt", "bad hostname or address"),
        ("nuttcp8-8.2.2-err-badopt-client.txt", "usage text"),
        ("nuttcp6-6.1.2-xt-client.txt", "failed to execute traceroute"),
    ],
)
def test_error_outputs_parse_as_failed_results(name: str, needle: str) -> None:
    result = _parse(name)
    assert result.status == "failed"
    assert needle in result.errors[0]
    assert result.summaries == ()


@needs_fixtures
def test_server_files_are_empty_and_skipped() -> None:
    client, server = "nuttcp6-6.1.2-fparse-client.txt", "nuttcp6-6.1.2-fparse-server.txt"
    both = NuttcpTool().parse([(server, read_fixture(server)), (client, read_fixture(client))])
    assert both.summaries[0].receiver is not None
    with pytest.raises(ParseError, match="empty"):
        NuttcpTool().parse([(server, read_fixture(server))])


@needs_fixtures
def test_version_output_has_no_results() -> None:
    with pytest.raises(ParseError, match="no nuttcp results") as info:
        _parse("nuttcp6-6.1.2-version-client.txt")
    assert info.value.source == "nuttcp6-6.1.2-version-client.txt"


@needs_fixtures
def test_truncated_file_keeps_what_was_read_and_warns() -> None:
    text = read_fixture("nuttcp8-8.2.2-i1-fparse-client.txt")
    cut = text[: text.index("\n\n")]  # intervals only, summary lost
    result = NuttcpTool().parse([("cut.txt", cut)])
    assert len(result.intervals) == 4 and result.summaries == ()
    assert any("incomplete" in w for w in result.warnings)


def test_unknown_input_is_a_parse_error_with_line() -> None:
    with pytest.raises(ParseError) as info:
        NuttcpTool().parse([("junk.txt", "\nhello world\nmore junk\n")])
    assert (info.value.source, info.value.line) == ("junk.txt", 2)
    with pytest.raises(ParseError):
        NuttcpTool().parse([("half.txt", "megabytes=3911.3750 real_s")])


def test_parser_reads_lines_of_a_live_run() -> None:
    parser = p.NuttcpParser()
    assert parser.feed("nuttcp-t: v6.1.2: socket") is None
    sample = parser.feed("megabytes=881.2500 real_sec=0.50 rate_Mbps=14784.1824 retrans=0")
    assert sample is not None and sample.seconds == 0.5
    parser.feed(
        "nuttcp-r: megabytes=3456.8750 real_seconds=2.00 rate_KBps=1.0 rate_Mbps=14489.2812"
    )
    parser.feed("nuttcp-r: stats=cpu user=0.0 system=0.6 elapsed=0:02 cpu=33% memory=0i")
    side = parser.out.sides["r"]
    assert (side.megabytes, side.seconds, side.cpu_percent, side.cpu_seconds) == (
        3456.875,
        2.0,
        33.0,
        0.6,
    )


# --- option mapping and refusals ---------------------------------------------------------


def test_options_map_to_nuttcp_flags_exactly() -> None:
    spec = TestSpec(
        tool="nuttcp",
        protocol="udp",
        direction="reverse",
        streams=2,
        duration_s=2.5,
        interval_s=0.5,
        length_bytes=1200,
        window_bytes=256 * 1024,
        rate_bits_per_second=1.5e6,
        dscp=46,
        ip_version=6,
    )
    args = client_args(spec, 5000, 5001)
    assert args[:4] == ["-v", "-fparse", "-P5000", "-p5001"]
    for flag in ("-T2.5", "-i0.5", "-u", "-r", "-6", "-N2", "-l1200", "-w256", "-c46"):
        assert flag in args
    assert "-R3000" in args  # 1.5 Mbit/s per stream, 2 streams: 3000 Kbps in all


def test_byte_count_is_whole_buffers_over_all_streams() -> None:
    spec = TestSpec(tool="nuttcp", streams=2, duration_s=None, bytes_total=10 * 65536)
    assert "-n20" in client_args(spec, None, None)
    refused = NuttcpTool().refusals(TestSpec(tool="nuttcp", duration_s=None, bytes_total=1000))
    assert any("--bytes 1000" in r for r in refused)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (TestSpec(tool="nuttcp", direction="bidir"), "--bidir"),
        (TestSpec(tool="nuttcp", congestion="bbr"), "--congestion"),
        (TestSpec(tool="nuttcp", window_bytes=1000), "--window 1000"),
        (TestSpec(tool="nuttcp", bind_address="127.0.0.1"), "--bind"),
        (TestSpec(tool="nuttcp", omit_s=1), "--omit"),
        (TestSpec(tool="nuttcp", protocol="udp", mss_bytes=1000), "--mss"),
        (TestSpec(tool="nuttcp", streams=200), "--parallel 200"),
    ],
)
def test_refuses_what_nuttcp_cannot_do(spec: TestSpec, needle: str) -> None:
    with pytest.raises(SpecError, match=re.escape(needle)) as info:
        NuttcpTool().check(spec)
    assert "nuttcp" in str(info.value)


@pytest.mark.parametrize(("version", "refused"), [("6.1.2", True), ("8.2.2", False)])
def test_sub_second_udp_reverse_reports_are_refused_on_6x(
    tmp_path: Path, version: str, refused: bool
) -> None:
    # 6.1.2 -u -r -i0.5 failed 3 runs in 16 on loopback ("not receiving data from
    # server"), -i0.8 and -i1 none: only that combination, and only on 6.x, is refused.
    binary = tmp_path / "nuttcp"
    binary.write_text(f"#!/bin/sh\necho 'nuttcp-{version}'\n")
    binary.chmod(0o755)
    tool = NuttcpTool({"path": str(binary)})
    udp_reverse = TestSpec(tool="nuttcp", protocol="udp", direction="reverse",
                           rate_bits_per_second=1e6)
    found = tool.refusals(attrs.evolve(udp_reverse, interval_s=0.5))
    assert any("--interval 0.5 with UDP and --reverse" in r for r in found) == refused
    assert tool.refusals(attrs.evolve(udp_reverse, interval_s=1.0)) == []
    assert tool.refusals(TestSpec(tool="nuttcp", protocol="udp", interval_s=0.5,
                                  rate_bits_per_second=1e6)) == []


def test_probe_explains_a_missing_binary(tmp_path: Path) -> None:
    available = NuttcpTool({"path": str(tmp_path / "nope")}).probe()
    assert not available.available
    assert "not an executable" in available.reasons[0]


# --- real runs on loopback ---------------------------------------------------------------

needs_nuttcp = pytest.mark.skipif(shutil.which("nuttcp") is None, reason="nuttcp not on PATH")


class Recorder(NullReporter):
    """Keeps the live interval samples."""

    def __init__(self) -> None:
        self.samples: list[Interval] = []
        self.thread_ids: set[int] = set()

    def interval(self, sample: Interval) -> None:
        self.samples.append(sample)
        self.thread_ids.add(threading.get_ident())


def _run(**options: object) -> tuple[Result, Recorder]:
    options.setdefault("duration_s", 2.0)
    options.setdefault("interval_s", 0.5)
    spec = TestSpec(tool="nuttcp", **options)  # type: ignore[arg-type]
    recorder = Recorder()
    result = NuttcpTool().run(spec, recorder)
    return result, recorder


def _no_process_left(result: Result) -> None:
    for raw in result.raw:
        assert raw.exit_code is not None, f"{raw.name} still running"


@pytest.mark.peers
@pytest.mark.parametrize("peer", peer_params("nuttcp"), indirect=True)
def test_tcp_run_reports_both_sides_and_live_intervals(peer: PeerBinary) -> None:
    result, recorder = _run()
    assert result.status == "ok" and result.tool.version
    flow = result.summary("client_to_server")
    assert flow is not None and flow.sender is not None and flow.receiver is not None
    assert flow.receiver.bytes > 0 and flow.receiver.bits_per_second > 0
    assert flow.sender.bytes == flow.receiver.bytes  # TCP: all that was sent arrived
    assert flow.sender.cpu and flow.sender.cpu.process
    assert flow.sender.cpu.process.total_percent is not None
    assert flow.sender.min_rtt_us is not None and flow.sender.min_rtt_us > 0
    assert flow.sender.rtt_us is None
    if peer.at_least(7):
        assert flow.sender.retransmits is not None  # 8.x reports them
    else:
        assert flow.sender.retransmits is None  # 6.1.2 cannot count them
    # every interval reached the reporter; the last may since have taken a tail too short
    # for an interval of its own (under nuttcp's 0.01 s rounding), so that they add up
    assert recorder.samples and recorder.samples[:-1] == list(result.intervals[:-1])
    assert recorder.samples[-1].start_s == result.intervals[-1].start_s
    assert recorder.thread_ids == {threading.get_ident()}  # delivered in the caller's thread
    assert all(i.role == "receiver" and i.bytes > 0 for i in result.intervals)
    assert {r.name for r in result.raw} == {"client", "server"}
    _no_process_left(result)


@pytest.mark.peers
@pytest.mark.parametrize("peer", peer_params("nuttcp"), indirect=True)
def test_udp_run_with_rate_is_near_the_rate(peer: PeerBinary) -> None:
    result, _ = _run(protocol="udp", rate_bits_per_second=20e6)
    receiver = result.summaries[0].receiver
    assert receiver is not None and receiver.packets is not None and receiver.packets > 0
    assert receiver.bits_per_second == pytest.approx(20e6, rel=0.1)
    assert receiver.lost_packets is not None and receiver.lost_percent is not None
    assert "-R20000" in result.raw[0].command  # type: ignore[operator]


@pytest.mark.peers
@pytest.mark.parametrize("peer", peer_params("nuttcp"), indirect=True)
def test_two_streams_are_summed(peer: PeerBinary) -> None:
    result, _ = _run(streams=2)
    client = result.raw[0]
    assert client.command is not None and "-N2" in client.command
    assert "nstream=2" in client.text
    flow = result.summaries[0]
    assert flow.receiver is not None and flow.receiver.bytes > 0
    assert [s.stream_id for s in result.streams] == [1, 2]  # from -v's by-stream totals
    assert all(i.stream_id is None for i in result.intervals)


@pytest.mark.peers
@pytest.mark.parametrize("peer", peer_params("nuttcp"), indirect=True)
def test_reverse_run_has_the_server_sending(peer: PeerBinary) -> None:
    result, _ = _run(direction="reverse")
    assert result.summary("client_to_server") is None
    flow = result.summary("server_to_client")
    assert flow is not None and flow.sender is not None and flow.receiver is not None
    assert flow.receiver.bytes > 0
    assert all(i.direction == "server_to_client" for i in result.intervals)


@needs_nuttcp
@pytest.mark.peers
def test_byte_count_run_moves_exactly_that_many_bytes() -> None:
    result, _ = _run(duration_s=None, bytes_total=200 * 65536)
    receiver = result.summaries[0].receiver
    assert receiver is not None
    assert abs(receiver.bytes - 200 * 65536) <= 60  # nuttcp prints MB to 4 decimals


@needs_nuttcp
@pytest.mark.peers
def test_no_server_is_a_clear_failure() -> None:
    port = free_port()
    spec = TestSpec(tool="nuttcp", host="127.0.0.1", port=port, duration_s=2.0)
    with pytest.raises(TestFailed) as info:
        NuttcpTool({"start_server": False}).run(spec, NullReporter())
    message = str(info.value)
    assert "Connection refused" in message and "exit code 1" in message
    assert f"-P{port}" in message  # the command is named
    partial = info.value.partial
    assert isinstance(partial, Result) and partial.status == "failed"
    assert partial.errors and partial.raw[0].exit_code == 1


@needs_nuttcp
@pytest.mark.peers
def test_ctrl_c_stops_both_processes() -> None:
    spec = TestSpec(tool="nuttcp", duration_s=5.0, interval_s=0.5)
    reporter = Measuring()
    with ctrl_c_after(0.5, started=reporter.measuring), pytest.raises(TestInterrupted) as info:
        NuttcpTool().run(spec, reporter)
    partial = info.value.partial
    assert isinstance(partial, Result) and partial.status == "interrupted"
    _no_process_left(partial)


INTERVAL_FILES = [f for f in CLIENT_FILES if "-i1-" in f.name and "udp" not in f.name
                  and "err" not in f.name]


@needs_fixtures
@pytest.mark.parametrize("path", INTERVAL_FILES, ids=lambda f: f.name)
def test_intervals_add_up_to_the_summary(path: Path) -> None:
    # nuttcp leaves out its last, partial interval: the tail is made up from the summary
    result = _parse(path.name)
    flow = result.summaries[0]
    assert flow.receiver is not None and flow.sender is not None
    mine = [i for i in result.intervals if i.role == "receiver"]
    assert sum(i.bytes for i in mine) == pytest.approx(flow.receiver.bytes, abs=60 * len(mine))
    assert mine[-1].end_s == pytest.approx(flow.receiver.end_s, abs=0.011)
    if flow.sender.retransmits is not None and mine[0].retransmits is not None:
        assert sum(i.retransmits or 0 for i in mine) == flow.sender.retransmits
    else:  # the lines carry none (-N, 6.x): the summary's are not all the tail's
        assert all(i.retransmits is None for i in mine)
