"""iperf 2's receiver figures (issue 34 item 7).

A UDP receiver's ``packets`` are the datagrams it received. iperf 2 reports ``lost/total``
where ``total`` is the sender's numbering (sent), so netprobe gave the datagrams sent as
received (127,381 where 81,665 arrived). The witness here is the receiving namespace's own
kernel: its Udp InDatagrams counter, over a link that drops 30 % at random.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from netprobe.tools.iperf2 import Iperf2Tool
from tests.netlab import Lab, wait_listening
from tests.peers import default_peer

A, B = "10.77.35.1", "10.77.35.2"
PORT = 5735
FIN_SLACK = 20
"""Datagrams the receiver's kernel takes in besides the test's numbered ones: iperf 2's
client repeats its closing datagram until the server's report comes back (10 tries)."""


@pytest.mark.root
@pytest.mark.peers
def test_udp_receiver_packets_are_what_arrived_over_a_lossy_link() -> None:
    why_not = Lab.available()
    if why_not:
        pytest.skip(why_not)
    peer = default_peer("iperf2")
    if peer is None:
        pytest.skip("no iperf 2 binary")
    with Lab(prefix="nd") as lab:
        a, b = lab.host("a"), lab.host("b")
        lab.link(a, f"{A}/24", b, f"{B}/24")
        server = lab.start(b, [peer.path, "-s", "-u", "-B", B, "-p", str(PORT), "-e", "-f", "b"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_listening(lab, b, PORT, udp=True)
        lab.drop_percent(b, 30)
        before = lab.snmp(b, "Udp")["InDatagrams"]
        client = lab.run(a, [sys.executable, "-m", "netprobe", "run", B, "--tool", "iperf2",
                             "-u", "-b", "20M", "-t", "2", "--port", str(PORT), "--json",
                             "--no-agent"], timeout=60)
        arrived = lab.snmp(b, "Udp")["InDatagrams"] - before
        lab.stop(server)
        server_text = server.stdout.read() if server.stdout else ""
    assert client.returncode == 0, client.stdout[-2000:] + client.stderr[-2000:]
    result = json.loads(client.stdout)
    flow = result["summaries"][0]
    sent, got = flow["sender"]["packets"], flow["receiver"]["packets"]
    lost = flow["receiver"]["lost_packets"]
    print(f"sent {sent}, receiver packets {got}, lost {lost}, kernel InDatagrams {arrived}")
    assert got < sent, "30 % dropped: fewer arrived than were sent"
    assert 0 <= arrived - got <= FIN_SLACK, (got, arrived)
    assert lost > 0 and got + lost >= sent - FIN_SLACK
    # the server's own log, read as a saved output, says the same
    saved = Iperf2Tool().parse([("server", server_text)])
    assert saved.summaries[0].receiver is not None
    assert saved.summaries[0].receiver.packets == got
