"""How UDP datagrams travelled, as the result reports it (issue 34 item 1): the sender's
default (one datagram a call for small datagrams), datagrams per message summed over
streams, the warning when the receiver read them as they were sent, and the table's cell.
The namespace run that measures it is tests/test_udp_gso_path.py."""
from __future__ import annotations

import io

import attrs
import pytest
from rich.console import Console

from netprobe.cli.render import print_result
from netprobe.engine import assemble, side, summary
from netprobe.schema import FlowSummary, SideSummary, TestSpec
from tests.test_formats import sample_result


@pytest.mark.parametrize(("length", "option", "gso"), [
    (64, None, False), (511, None, False), (512, None, True), (1448, None, True),
    (64, True, True), (1448, False, False)])
def test_small_datagrams_go_one_a_call_unless_told(length: int, option: bool | None,
                                                   gso: bool) -> None:
    spec = TestSpec(protocol="udp", length_bytes=length, udp_gso=option)
    assert side.udp_gso(spec, length) is gso


def _side(role: str, packets: int, per: float | None) -> SideSummary:
    return SideSummary(role=role, start_s=0.0, end_s=1.0, bytes=packets * 64,
                       bits_per_second=packets * 512.0, packets=packets,
                       datagrams_per_message=per)


def test_streams_sum_to_their_datagrams_over_their_messages() -> None:
    # 1280 datagrams in 10 messages and 100 in 100: 1380 in 110, not the mean 64.5.
    total = summary.sum_summaries([_side("sender", 1280, 128.0), _side("sender", 100, 1.0)],
                                  None)
    assert total.datagrams_per_message == pytest.approx(1380 / 110, abs=0.01)
    assert summary.sum_summaries([_side("sender", 5, None)], None).datagrams_per_message is None


@pytest.mark.parametrize(("sent", "got", "warned"), [
    (128.0, 128.0, True), (128.0, 121.26, True), (128.0, 41.0, False), (128.0, 1.0, False),
    (1.0, 1.0, False), (None, None, False)])
def test_warns_when_the_path_never_split_the_messages(sent: float | None, got: float | None,
                                                       warned: bool) -> None:
    flow = FlowSummary(direction="client_to_server", sender=_side("sender", 1280, sent),
                       receiver=_side("receiver", 1280, got))
    found = assemble._super_packet_warnings([flow])
    assert bool(found) is warned
    assert all("the packet rate is not the path's" in w and "--no-gso" in w for w in found)


def test_the_table_says_datagrams_per_message() -> None:
    result = sample_result(protocol="udp")
    (flow,) = result.summaries
    flow = attrs.evolve(flow,
                        sender=attrs.evolve(flow.sender, datagrams_per_message=128.0),
                        receiver=attrs.evolve(flow.receiver, datagrams_per_message=1.0))
    buffer = io.StringIO()
    console = Console(file=buffer, width=120, color_system=None, force_terminal=False)
    print_result(console, attrs.evolve(result, summaries=(flow,), warnings=()))
    lines = [line for line in buffer.getvalue().splitlines() if line.startswith("c->s")]
    assert "128 dgrams" in lines[0] and "1 dgram " in lines[1] + " ", lines
