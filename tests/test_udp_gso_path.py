"""Small-datagram UDP through a router namespace: the datagrams the result reports against
the ones the receiving namespace's kernel counted (``Udp InDatagrams`` in /proc/net/snmp,
which counts a packet handed to a socket once, however many datagrams it holds).

a - r - b, veth links, r forwarding. A GSO message crosses veth and the router whole and
the receiver's UDP_GRO reads it whole: the kernel counts one datagram where the run
counts 128 (issue 34 item 1: 58,486,784 reported, 456,929 counted). With one datagram a
call (the default at -l 64, or --no-gso) the two counts agree; with --gso the result says
how many datagrams a message carried, and warns.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from netprobe import core

from .netlab import HOP_A_ADDR, HOP_B_ADDR, Lab, wait_listening

pytestmark = [pytest.mark.root]
why_not = Lab.available()
if why_not:
    pytestmark.append(pytest.mark.skip(reason=why_not))

NETPROBE = [sys.executable, "-m", "netprobe"]


def _routed_run(*extra: str) -> tuple[dict, int]:
    """``run -u -b 0 -l 64 -t 1`` from a to b through r: (the result, the datagrams b's
    kernel handed to UDP sockets meanwhile)."""
    with Lab("ng") as lab:
        a, r, b = lab.host("a"), lab.host("r"), lab.host("b")
        lab.link(a, f"{HOP_A_ADDR}/24", r, "10.77.3.2/24")
        lab.link(r, "10.77.4.1/24", b, f"{HOP_B_ADDR}/24")
        lab.forward(r)
        lab.route(a, "10.77.4.0/24", "10.77.3.2")
        lab.route(b, "10.77.3.0/24", "10.77.4.1")
        lab.start(b, [*NETPROBE, "server", "-B", HOP_B_ADDR],
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_listening(lab, b, 5301)
        before = lab.snmp(b, "Udp")["InDatagrams"]
        run = lab.run(a, [*NETPROBE, "run", HOP_B_ADDR, "-u", "-b", "0", "-l", "64",
                          "-t", "1", "-i", "0", "--json", *extra], timeout=60)
        assert run.returncode == 0, run.stderr
        counted = lab.snmp(b, "Udp")["InDatagrams"] - before
        return json.loads(run.stdout), counted


def _flow(result: dict) -> dict:
    (flow,) = result["summaries"]
    return flow


@pytest.mark.parametrize("option", [(), ("--no-gso",)], ids=["default", "no-gso"])
def test_small_datagrams_are_the_packets_the_receiving_kernel_counted(option: tuple) -> None:
    result, counted = _routed_run(*option)
    flow = _flow(result)
    received = flow["receiver"]["packets"]
    assert received > 1000, flow
    # The kernel counts a few datagrams more (the test's own UDP set-up), never 1/128.
    assert counted == pytest.approx(received, rel=0.05), (counted, received)
    assert flow["sender"]["datagrams_per_message"] == 1.0
    assert flow["receiver"]["datagrams_per_message"] == 1.0
    assert not [w for w in result["warnings"] if "GSO" in w], result["warnings"]


@pytest.mark.skipif(core.DATA_PATH != "c", reason="the pure-Python data path sends one "
                    "datagram a call whatever it is asked (its sender reports 1 a message)")
def test_gso_says_the_datagrams_crossed_the_path_as_super_packets() -> None:
    result, counted = _routed_run("--gso")
    flow = _flow(result)
    sent_per = flow["sender"]["datagrams_per_message"]
    got_per = flow["receiver"]["datagrams_per_message"]
    # Not quite equal: datagrams that came before the receiver turned UDP_GRO on were
    # read one by one (121.26 of 128 once, under load).
    assert sent_per > 1 and got_per > sent_per / 2, flow
    # What the kernel counted is the messages, not the datagrams reported.
    received = flow["receiver"]["packets"]
    assert counted == pytest.approx(received / got_per, rel=0.1), (counted, received, got_per)
    assert [w for w in result["warnings"] if "the packet rate is not the path's" in w], \
        result["warnings"]
