"""iperf3 3.9's --bidir documents: sums of one direction only, rebuilt from the streams.

3.9 writes no ``*_bidir_reverse`` keys; its ``sum_sent``/``sum_received`` (and each
interval's ``sum``) hold whichever direction it summed last. netprobe read the client's
c->s flow as the s->c stream's bytes and reported no s->c flow. Real documents, written by
the 3.9 that peers/build.sh builds, on loopback.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from netprobe.tools.iperf3.parse_output import parse_document, with_bidir_sums

from .peers import stock_iperf3
from .servers import free_port

C2S, S2C = "client_to_server", "server_to_client"


def _bidir_doc(version: str, *extra: str) -> dict:
    binary = stock_iperf3(version)
    port = free_port()
    server = subprocess.Popen([binary, "-s", "-1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):  # until it listens (it serves one test, -1)
            client = subprocess.run([binary, "-c", "127.0.0.1", "-p", str(port), "-t", "2",
                                     "-P", "2", "--bidir", "--json", *extra],
                                    capture_output=True, text=True, timeout=30)
            doc = json.loads(client.stdout)
            if "unable to connect" not in str(doc.get("error", "")):
                break
        assert not doc.get("error"), doc["error"]
        return doc
    finally:
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            # 3.9's -s -1 once stayed after a UDP --bidir test whose client had its whole
            # document (CI): the client's document is what this file tests
            server.kill()
            server.wait(10)


def _streams_by_flag(doc: dict, part: str) -> dict[bool, list[dict]]:
    by_flag: dict[bool, list[dict]] = {True: [], False: []}
    for item in doc["end"]["streams"]:
        block = item[part]
        by_flag[block["sender"]].append(block)
    return by_flag


@pytest.mark.slow
def test_tcp_flows_are_each_directions_own_streams() -> None:
    doc = _bidir_doc("3.9")
    assert not any(k.endswith("_bidir_reverse") for k in doc["end"])  # the trap is there
    senders, receivers = _streams_by_flag(doc, "sender"), _streams_by_flag(doc, "receiver")
    figures = parse_document(doc)
    flows = {f.direction: f for f in figures.summaries}
    assert set(flows) == {C2S, S2C}
    # The client sent the streams flagged True (c->s) and received the others.
    assert flows[C2S].sender.bytes == sum(b["bytes"] for b in senders[True])
    assert flows[C2S].receiver.bytes == sum(b["bytes"] for b in receivers[True])
    assert flows[S2C].sender.bytes == sum(b["bytes"] for b in senders[False])
    assert flows[S2C].receiver.bytes == sum(b["bytes"] for b in receivers[False])
    assert flows[C2S].sender.retransmits == sum(b["retransmits"] for b in senders[True])
    # Each interval's sums are its own direction's streams, not one direction twice.
    for block in doc["intervals"]:
        for flag, direction in ((True, C2S), (False, S2C)):
            mine = [s["bytes"] for s in block["streams"] if s["sender"] is flag]
            began = block["sum"]["start"]
            sums = [i for i in figures.intervals if i.stream_id is None
                    and i.direction == direction and abs(i.start_s - began) < 1e-3]
            assert [i.bytes for i in sums] == [sum(mine)], (direction, began)


@pytest.mark.slow
def test_udp_flows_keep_each_direction_and_no_figure_is_made_up() -> None:
    doc = _bidir_doc("3.9", "-u", "-b", "20M")
    blocks = {True: [], False: []}
    for item in doc["end"]["streams"]:
        blocks[item["udp"]["sender"]].append(item["udp"])
    flows = {f.direction: f for f in parse_document(doc).summaries}
    assert flows[C2S].sender.packets == sum(b["packets"] for b in blocks[True])
    assert flows[S2C].receiver.lost_packets == sum(b["lost_packets"] for b in blocks[False])
    # Neither the far receiver's count of c->s nor the far sender's of s->c is in the
    # client's document: unknown, not the other direction's figure.
    assert flows[C2S].receiver is None and flows[S2C].sender is None
    # Two streams each way: a mean of their jitters would be made up.
    assert flows[S2C].receiver.jitter_ms is None


def test_documents_with_both_directions_sums_are_left_as_they_are() -> None:
    doc = {"start": {"connecting_to": {"host": "h", "port": 5201}},
           "end": {"streams": [{"sender": {"sender": True, "bytes": 1},
                                "receiver": {"sender": True, "bytes": 1}},
                               {"sender": {"sender": False, "bytes": 2},
                                "receiver": {"sender": False, "bytes": 2}}],
                   "sum_sent": {"bytes": 1}, "sum_sent_bidir_reverse": {"bytes": 2}}}
    assert with_bidir_sums(doc) is doc
    one_way = {"end": {"streams": [{"sender": {"sender": True, "bytes": 1}}],
                       "sum_sent": {"bytes": 1}}}
    assert with_bidir_sums(one_way) is one_way
