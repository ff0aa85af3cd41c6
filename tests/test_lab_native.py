"""The native engine across a real bottleneck: two namespaces, a veth pair, tc tbf at
100 Mbit/s, and (second case) 1% random loss made by nftables in the receiver.

The TCP goodput of a 100 Mbit/s link at MTU 1500 with timestamps is
100 x 1448 / 1538 = 94.1 Mbit/s; iperf3 and nuttcp report 93.5 to 94.7 there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from .netlab import (
    B_ADDR,
    HOP_B_ADDR,
    Lab,
    measured_within,
    shaped_hop,
    shaped_pair,
    wait_listening,
)

pytestmark = [pytest.mark.root, pytest.mark.slow]

why_not = Lab.available()
if why_not:
    pytestmark.append(pytest.mark.skip(reason=why_not))

NETPROBE = [sys.executable, "-m", "netprobe"]


@pytest.fixture
def link():  # type: ignore[no-untyped-def]
    """Namespaces a (client) and b (server), 100 Mbit/s each way."""
    with shaped_pair(100) as lab_a_b:
        yield lab_a_b


def start_server(lab: Lab, ns: str, address: str = B_ADDR) -> subprocess.Popen:
    server = lab.start(
        ns, [*NETPROBE, "server", "-B", address], stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE
    )
    wait_listening(lab, ns, 5301)
    return server


def run_client(lab: Lab, ns: str, *args: str, host: str = B_ADDR) -> dict:
    proc = lab.run(ns, [*NETPROBE, "run", host, "--json", *args], timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _off_the_wire(lab: Lab, flow: dict, roles: tuple[str, ...]) -> list[str]:
    """Each of ``roles``' figures off 94.1 +/- 1 Mbit/s, with the link's qdisc counters."""
    off = [f"{role} {flow[role]['bits_per_second'] / 1e6:.2f} Mbit/s" for role in roles
           if flow[role]["bits_per_second"] / 1e6 != pytest.approx(94.1, abs=1.0)]
    return [*off, lab.qdisc_report()] if off else []


@pytest.mark.host_timing
def test_tcp_goodput_on_a_100_mbit_link(link) -> None:  # type: ignore[no-untyped-def]
    lab, a, b = link
    start_server(lab, b)
    # Both ends' figures, measured again on a miss (netlab.measured_within). The sender's
    # counts what it wrote, so socket-buffer growth inside the window lifts it (one full
    # run here: 95.19 beside a receiver in range).
    measured_within(lambda: run_client(lab, a, "-t", "6", "-O", "1")["summaries"][0],
                    lambda flow: _off_the_wire(lab, flow, ("receiver", "sender")),
                    "native TCP off 94.1 +/- 1 Mbit/s")


@pytest.mark.host_timing
def test_reverse_goodput_on_a_100_mbit_link(link) -> None:  # type: ignore[no-untyped-def]
    lab, a, b = link
    start_server(lab, b)
    flow = measured_within(
        lambda: run_client(lab, a, "-t", "5", "-O", "1", "-R")["summaries"][0],
        lambda flow: _off_the_wire(lab, flow, ("receiver",)),
        "native TCP -R off 94.1 +/- 1 Mbit/s")
    assert flow["direction"] == "server_to_client"


def test_short_runs_after_a_warm_up_never_read_above_the_wire(link) -> None:  # type: ignore[no-untyped-def]
    lab, a, b = link
    start_server(lab, b)
    # No run is measured again here: a figure above the wire is wrong however rarely it
    # comes. The bound leaves out the 24 bytes a frame spends on the wire (tbf adds them
    # once per GSO packet, not per segment): 100 x 1448/1500 = 96.5 Mbit/s. With the wake
    # threshold set at each loop's start from the read length alone, a receive holding up
    # to 1 MiB uncounted at the warm-up's end made the receiver read 98.1-99.1 in half of
    # such runs (the length probe starts a loop per window); 94.8-95.2 since.
    wire = 100e6 * 1448 / 1500
    figures = []
    for _ in range(4):
        flow = run_client(lab, a, "-t", "2", "-O", "0.5")["summaries"][0]
        figures.append(round(flow["receiver"]["bits_per_second"] / 1e6, 2))
    assert max(figures) <= wire / 1e6, (figures, lab.qdisc_report())


@pytest.mark.skipif(not shutil.which("nft"), reason="nftables (nft) is not installed")
def test_retransmits_match_the_kernel_under_loss(link) -> None:  # type: ignore[no-untyped-def]
    lab, a, b = link
    lab.drop_percent(b, 1)
    start_server(lab, b)
    before = lab.snmp(a)["RetransSegs"]
    result = run_client(lab, a, "-t", "5")
    after = lab.snmp(a)["RetransSegs"]
    sender = result["summaries"][0]["sender"]
    assert sender["retransmits"] > 0
    # The control connection may retransmit a segment or two of its own.
    assert abs(sender["retransmits"] - (after - before)) <= 3
    # what the interval reports add up to is the summary: none left out at the end
    sent = [i for i in result["intervals"] if i["role"] == "sender" and i["stream_id"] == 1]
    assert sum(i["retransmits"] for i in sent) == sender["retransmits"]


# UDP through a 100 Mbit/s hop with a 200 ms queue: offered 150 Mbit/s, the queue fills and
# drains for up to 200 ms after the sender stops. On the wire a 1400-byte payload is a
# 1466-byte frame (UDP 8, IP 20, Ethernet 14, tbf's overhead 24), so the hop carries at most
# 100 x 1400 / 1466 = 95.5 Mbit/s of payload: iperf3 there says 95.46 over 0-2.203 s.
UDP_CEILING_MBIT = 100 * 1400 / 1466


@pytest.mark.host_timing
def test_udp_receiver_figures_stay_under_the_link_with_a_deep_queue() -> None:
    with shaped_hop(100, latency_ms=200) as (lab, a, _, b, _):
        start_server(lab, b, HOP_B_ADDR)
        # Never above the link, on any try; at it only while the hosts keep it busy (a
        # loaded CI machine read 91.6 of 95.5 Mbit/s once): measured again then.
        measured_within(
            lambda: run_client(lab, a, "-u", "-b", "150M", "-l", "1400", "-t", "2", "-i",
                               "0.5", host=HOP_B_ADDR),
            _deep_queue_misses, "UDP 150M into a 100 Mbit/s link with a 200 ms queue")


def _deep_queue_misses(result: dict) -> list[str]:
    """What a deep-queue UDP run's receiver missed of the link's rate; an error in its
    figures (above the link, a span that is not the sender's plus the drain, a rate that
    is not its bytes over its span) fails at once."""
    receiver = result["summaries"][0]["receiver"]
    span = receiver["end_s"] - receiver["start_s"]
    mbit = receiver["bits_per_second"] / 1e6
    assert mbit <= UDP_CEILING_MBIT * 1.005, receiver
    # its own span: the sender's 2 s plus the queue's drain (at most 200 ms and a little)
    assert 2.05 < span < 2.3, receiver
    assert receiver["bytes"] * 8 / span == pytest.approx(receiver["bits_per_second"])
    for sample in result["intervals"]:
        if sample["role"] == "receiver" and sample["stream_id"] is None:
            assert sample["bits_per_second"] / 1e6 <= UDP_CEILING_MBIT * 1.02, sample
    if mbit < UDP_CEILING_MBIT * 0.97:
        return [f"receiver {mbit:.2f} Mbit/s of the link's {UDP_CEILING_MBIT:.2f}"]
    return []


def _buffer_loss_run(streams: int, gro: bool) -> tuple[dict, int]:
    """A UDP run into a receiver with a small socket buffer (-w 4k at 1 Gbit/s) in one
    namespace, its loopback only: no path to lose anything on, so every datagram lost
    overflowed a receiver's socket buffer. The result and the namespace's RcvbufErrors
    over the run."""
    with Lab() as lab:
        ns = lab.host("a")
        env = {**os.environ, "NETPROBE_UDP_GRO": "1" if gro else "0"}
        lab.start(ns, [*NETPROBE, "server", "-B", "127.0.0.1"], stdout=subprocess.DEVNULL,
                  stderr=subprocess.DEVNULL, env=env)
        wait_listening(lab, ns, 5301)
        before = lab.snmp(ns, "Udp")["RcvbufErrors"]
        proc = lab.run(ns, [*NETPROBE, "run", "127.0.0.1", "--json", "-u", "-b", "1G",
                            "-w", "4k", "-t", "1", "-P", str(streams)], timeout=60)
        after = lab.snmp(ns, "Udp")["RcvbufErrors"]
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), after - before


def test_udp_loss_in_the_receivers_own_buffer_is_counted_apart() -> None:
    result, host = _buffer_loss_run(1, gro=True)
    receiver = result["summaries"][0]["receiver"]
    drops = receiver["receive_buffer_dropped_packets"]
    assert host > 0, "the small buffer should have overflowed"
    # The socket's own count: the namespace's may hold a few more (the peer's last words
    # after the receiver stopped reading, other sockets). With UDP_GRO a coalesced group
    # dropped whole counts once, so drops may be fewer than the datagrams lost.
    assert 0 < drops <= host
    assert drops <= receiver["lost_packets"]
    assert any("full socket buffer" in w for w in result["warnings"])


def test_udp_buffer_drops_are_each_streams_own_and_add_up_to_the_loss() -> None:
    # Without UDP_GRO the kernel counts one drop a datagram, so on a lone loopback each
    # stream's drops are exactly its loss. Before, every stream showed the namespace's
    # whole count (twice the loss over two streams) read a moment late.
    result, host = _buffer_loss_run(2, gro=False)
    receivers = [s["receiver"] for s in result["streams"]]
    assert len(receivers) == 2
    for receiver in receivers:
        assert receiver["lost_packets"] > 0, "the small buffers should have overflowed"
        assert receiver["receive_buffer_dropped_packets"] == receiver["lost_packets"]
    assert sum(r["receive_buffer_dropped_packets"] for r in receivers) <= host
    total = result["summaries"][0]["receiver"]
    assert total["receive_buffer_dropped_packets"] == total["lost_packets"]


@pytest.mark.skipif(not shutil.which("nft"), reason="nftables (nft) is not installed")
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_udp_datagrams_lost_at_the_very_end_are_counted_lost(reverse: bool) -> None:
    # A gap in the sequence numbers shows a loss only below the highest number that came:
    # the last datagrams of a test, dropped, left no gap, and the receiver said nothing
    # was lost (CI saw a stream's socket drop 7,655 datagrams where its loss said 7,636).
    # Here a byte count of 10 x 1000 + 600 ends in one 600-byte datagram, which nftables
    # drops by its length: every other datagram of the test arrives.
    with Lab() as lab:
        ns = lab.host("a")
        lab.drop_arriving(ns, "udp", "length", "608")
        lab.start(ns, [*NETPROBE, "server", "-B", "127.0.0.1"], stdout=subprocess.DEVNULL,
                  stderr=subprocess.DEVNULL)
        wait_listening(lab, ns, 5301)
        proc = lab.run(ns, [*NETPROBE, "run", "127.0.0.1", "--json", "-u", "-n", "10600",
                            "-l", "1000", *(["-R"] if reverse else [])], timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    flow = result["summaries"][0]
    assert flow["sender"]["packets"] == 11
    assert flow["receiver"]["packets"] == 10
    assert flow["receiver"]["bytes"] == 10_000
    assert flow["receiver"]["lost_packets"] == 1
    assert flow["receiver"]["lost_percent"] == pytest.approx(100 / 11, abs=0.01)
    # the intervals add up to the summary: the loss is in the last one
    received = [i for i in result["intervals"]
                if i["role"] == "receiver" and i["stream_id"] is not None]
    assert sum(i["lost_packets"] for i in received) == 1


@pytest.mark.skipif(not shutil.which("nft"), reason="nftables (nft) is not installed")
def test_udp_loss_percent_is_of_the_datagrams_sent_not_of_the_duplicates_too() -> None:
    # nftables duplicates every datagram of the test once (dup, which never re-duplicates
    # its own copy) and drops the last: 11 sent, 10 came twice, 1 lost. The loss is 1 of
    # 11, 9.09%; before it was taken of the 21 arrivals and losses, 4.76%.
    with Lab() as lab:
        ns = lab.host("a")
        for rule in (["add", "table", "ip", "npdup"],
                     ["add", "chain", "ip", "npdup", "out",
                      "{ type filter hook output priority 0; policy accept; }"],
                     ["add", "rule", "ip", "npdup", "out", "udp", "length", "1008",
                      "dup", "to", "127.0.0.1"]):
            done = lab.run(ns, ["nft", *rule])
            assert done.returncode == 0, done.stderr
        lab.drop_arriving(ns, "udp", "length", "608")
        lab.start(ns, [*NETPROBE, "server", "-B", "127.0.0.1"], stdout=subprocess.DEVNULL,
                  stderr=subprocess.DEVNULL)
        wait_listening(lab, ns, 5301)
        proc = lab.run(ns, [*NETPROBE, "run", "127.0.0.1", "--json", "-u", "-n", "10600",
                            "-l", "1000"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    receiver = json.loads(proc.stdout)["summaries"][0]["receiver"]
    assert (receiver["packets"], receiver["duplicate_packets"]) == (20, 10)
    assert receiver["lost_packets"] == 1
    assert receiver["lost_percent"] == pytest.approx(100 / 11, abs=0.01)


def _tbf_dropped(lab: Lab, ns: str, dev: str) -> int:
    shown = lab.run(ns, ["tc", "-s", "qdisc", "show", "dev", dev]).stdout
    found = re.search(r"dropped (\d+)", shown)
    assert found, shown
    return int(found.group(1))


@pytest.mark.skipif(not shutil.which("ethtool"), reason="ethtool is not installed")
def test_udp_loss_is_what_the_bottleneck_and_the_receivers_buffer_dropped() -> None:
    """Every datagram lost is one the hop's queue or the receiver's socket buffer dropped.

    tbf counts a drop per packet the kernel hands it, and the native sender's UDP GSO hands
    it messages of up to 43 datagrams: one dropped whole counts once. So this run turns the
    sender's device's UDP segmentation off (the kernel cuts each message into datagrams
    before the device) and the two counters then add up to the loss exactly. With GSO on,
    the same 10 s run lost 46,941 datagrams where tbf counted 45,974 drops and the receiver
    70: the 897 apart were whole GSO messages, not loss in the tester."""
    with shaped_hop(100, latency_ms=200) as (lab, a, r, b, dev_r):
        for dev in json.loads(lab.run(a, ["ip", "-j", "link"]).stdout):
            if dev["ifname"] != "lo":
                off = lab.run(a, ["ethtool", "-K", dev["ifname"], "tx-udp-segmentation", "off"])
                assert off.returncode == 0, off.stderr
        start_server(lab, b, HOP_B_ADDR)
        tbf_before, buffer_before = _tbf_dropped(lab, r, dev_r), lab.snmp(b, "Udp")
        result = run_client(lab, a, "-u", "-b", "150M", "-l", "1400", "-t", "3",
                            host=HOP_B_ADDR)
        tbf = _tbf_dropped(lab, r, dev_r) - tbf_before
        buffer = lab.snmp(b, "Udp")["RcvbufErrors"] - buffer_before["RcvbufErrors"]
    receiver = result["summaries"][0]["receiver"]
    assert tbf > 10_000  # 150 offered into 100: about a third dropped at the hop
    # Within 2: the queue also drops the odd packet that is not a data datagram (the UDP
    # stream's own hello or end marker, an ARP), and the run's last datagram may be still
    # in flight when the receiver counts (seen: 1 either way in 6 runs).
    assert abs(receiver["lost_packets"] - (tbf + buffer)) <= 2, (receiver, tbf, buffer)
    assert (receiver.get("receive_buffer_dropped_packets") or 0) == buffer
    # every datagram sent either came or is counted lost, the last ones too
    sender = result["summaries"][0]["sender"]
    assert receiver["packets"] + receiver["lost_packets"] == sender["packets"]
