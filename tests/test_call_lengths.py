"""What each end's data loop asked of a call (SideSummary.call_length_bytes) for the driven
tools: read from what each tool prints, on saved outputs and on live runs of every peer
version here, where each end's real read()/write() lengths were first seen with strace."""

from __future__ import annotations

import pytest

from netprobe.plugin import NullReporter, Tool, fill_missing, with_call_lengths
from netprobe.schema import (
    Endpoint,
    FlowSummary,
    Result,
    SideSummary,
    StreamResult,
    TestSpec,
    ToolInfo,
)
from netprobe.tools.iperf2 import parse_output as p2
from netprobe.tools.iperf2.tool import Iperf2Tool
from netprobe.tools.iperf3.tool import Iperf3Tool
from netprobe.tools.ntttcp.tool import NtttcpTool
from netprobe.tools.nuttcp.tool import NuttcpTool

from .peers import PeerBinary, fixture_files, needs_fixtures, read_fixture, tool_version_params

C2S, S2C = "client_to_server", "server_to_client"


def _side(role: str, length: int | None = None) -> SideSummary:
    return SideSummary(role=role, start_s=0.0, end_s=1.0, bytes=1, bits_per_second=8.0,
                       call_length_bytes=length)


def _result(protocol: str = "tcp", length: int | None = None) -> Result:
    return Result(
        tool=ToolInfo(name="test"), spec=TestSpec(protocol=protocol), start_time=None,
        local=Endpoint(role="client"), remote=Endpoint(role="server"),
        summaries=(FlowSummary(C2S, sender=_side("sender", length), receiver=_side("receiver")),),
        streams=(StreamResult(1, C2S, sender=_side("sender"), receiver=_side("receiver")),))


def _lengths(result: Result) -> set[tuple[str, str, int | None]]:
    """Every side's (direction, role, call length), flows and streams alike."""
    found = set()
    items: list[FlowSummary | StreamResult] = [*result.summaries, *result.streams]
    for item in items:
        for side in (item.sender, item.receiver):
            if side is not None:
                found.add((item.direction, side.role, side.call_length_bytes))
    return found


# --- the helper ----------------------------------------------------------------------------


def test_lengths_fill_flows_and_streams_by_direction_and_role() -> None:
    filled = with_call_lengths(_result(), {(C2S, "receiver"): 65536, (S2C, "sender"): 9})
    assert _lengths(filled) == {(C2S, "sender", None), (C2S, "receiver", 65536)}


def test_a_length_already_there_is_kept_and_udp_is_left_alone() -> None:
    kept = with_call_lengths(_result(length=1000), {(C2S, "sender"): 2000})
    assert (C2S, "sender", 1000) in _lengths(kept)
    udp = _result(protocol="udp")
    assert with_call_lengths(udp, {(C2S, "sender"): 1472}) is udp


def test_fill_missing_takes_the_other_outputs_length_for_a_side_both_have() -> None:
    mine = _result()
    theirs = with_call_lengths(_result(), {(C2S, "receiver"): 131072})
    assert (C2S, "receiver", 131072) in _lengths(fill_missing(mine, theirs))


# --- saved outputs -------------------------------------------------------------------------


def _parsed(tool: Tool, pattern: str) -> Result:
    files = fixture_files(pattern)
    if not files:
        pytest.skip(f"no fixture {pattern}")
    return tool.parse([(f.name, f.read_text()) for f in files])


@needs_fixtures
@pytest.mark.parametrize(("tool", "pattern", "sender", "receiver"), [
    (Iperf3Tool(), "iperf3-3.12-tcp-J-client.txt", 131072, 131072),  # test_start.blksize
    (Iperf3Tool(), "iperf3-3.12-R-J-*.txt", 131072, 131072),
    (Iperf3Tool(), "iperf3-3.12-tcp-V-i1-client.txt", 131072, 131072),  # "131072 byte blocks"
    (NuttcpTool(), "nuttcp8-8.2.2-v-*.txt", 65536, 65536),  # each end's own buflen=
    (NuttcpTool(), "nuttcp6-6.1.2-r-v-*.txt", 65536, 65536),
    (NtttcpTool(), "ntttcp-1.4.3-tcp-verbose-*.txt", 131072, 65536),  # -V's -b lines
    (NtttcpTool(), "ntttcp-1.4.3-tcp-json-*", 131072, 65536),  # a file's own role's -b
    (NtttcpTool(), "ntttcp-1.4.3-tcp-xml-*", 131072, 65536),
    # the client says "Write buffer size: 131072 Byte"; its server rounds ("128 KByte")
    (Iperf2Tool(), "iperf2-2.1.8-tcp-e-*.txt", 131072, None),
])
def test_saved_tcp_outputs_give_each_ends_length(
        tool: Tool, pattern: str, sender: int, receiver: int | None) -> None:
    result = _parsed(tool, pattern)
    flow = result.summaries[0]
    assert flow.sender is not None and flow.sender.call_length_bytes == sender
    assert flow.receiver is not None and flow.receiver.call_length_bytes == receiver
    for stream in result.streams:
        assert stream.sender is None or stream.sender.call_length_bytes == sender


@needs_fixtures
@pytest.mark.parametrize(("tool", "pattern"), [
    (Iperf3Tool(), "iperf3-3.12-udp-b100M-J-*.txt"),
    (NuttcpTool(), "nuttcp8-8.2.2-vv-udp-*.txt"),
    (NtttcpTool(), "ntttcp-1.4.3-udp-json-xml-*"),
    (Iperf2Tool(), "iperf2-2.1.8-udp-b100M-e-i1-*.txt"),
])
def test_udp_outputs_give_none(tool: Tool, pattern: str) -> None:
    assert {length for *_, length in _lengths(_parsed(tool, pattern))} == {None}


@needs_fixtures
def test_iperf3_human_output_without_v_says_no_length() -> None:
    # Only -V prints "Starting Test: ... byte blocks": the plain client output knows none.
    result = _parsed(Iperf3Tool(), "iperf3-3.12-tcp-i1-client.txt")
    assert {length for *_, length in _lengths(result)} == {None}


def test_iperf2_headers_map_onto_both_ends() -> None:
    # -f b prints whole bytes (netprobe's own runs); the server reads with its own -l and
    # writes with the client's, so only the client's output knows the server's writes.
    client = p2.read_text(read_fixture("iperf2-2.1.8-R-reverse-e-i1-client.txt"), True)
    assert client.call_lengths() == {(C2S, "sender"): 131072, (S2C, "sender"): 131072,
                                     (S2C, "receiver"): 131072}
    server = p2.TextReader(False)
    for line in ("Server listening on TCP port 5001 with pid 1",
                 "Read buffer size: 65536 Byte (Dist bin width=8.00 KByte)",
                 "Read buffer size:  128 KByte (Dist bin width=16.0 KByte)"):
        server.feed(line)
    assert server.call_lengths() == {(C2S, "receiver"): 65536}
    rounded = p2.TextReader(False)
    rounded.feed("Read buffer size:  128 KByte (Dist bin width=16.0 KByte)")
    assert rounded.call_lengths() == {}


# --- live runs -----------------------------------------------------------------------------


TOOLS: dict[str, type[Tool]] = {
    "iperf3": Iperf3Tool, "iperf2": Iperf2Tool, "nuttcp": NuttcpTool, "ntttcp": NtttcpTool}


@pytest.mark.peers
@pytest.mark.parametrize(("name", "peer"), tool_version_params(tuple(TOOLS)))
@pytest.mark.parametrize("direction", ["normal", "reverse"])
def test_live_runs_keep_the_asked_length_on_both_ends(
        name: str, peer: PeerBinary, direction: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if name == "ntttcp" and direction == "reverse":
        pytest.skip("ntttcp has no reverse mode (netprobe refuses it)")
    for variable, value in peer.env.items():
        monkeypatch.setenv(variable, value)
    # 16 KiB is no tool's default, so a side left at its default shows: iperf 2's local
    # server read with its 128K before netprobe gave it -l.
    spec = TestSpec(tool=name, duration_s=1.0, interval_s=None, direction=direction,
                    length_bytes=16384)
    result = TOOLS[name]().run(spec, NullReporter())
    assert result.status == "ok", result.errors
    found = _lengths(result)
    assert {role for _, role, _ in found} == {"sender", "receiver"}
    assert {length for *_, length in found} == {16384}
