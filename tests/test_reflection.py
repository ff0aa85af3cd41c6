"""Issue 33 item 1: the native server and its latency echo send only to an address that
proved it asked. Three hosts on one segment: the server, an attacker with a genuine control
connection, and a victim that never speaks to the server. The attacker sends the UDP hello
(and probes) with the victim's source address through a raw socket; the victim's own
nftables counter of what came from the server is the witness.

Measured before the fix (3 s reverse UDP test at -b 100M): 27,000+ datagrams, 38 MB at the
victim; the probe echo answered the spoofed hello and every spoofed probe. After: nothing.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from netprobe import __version__, convert
from netprobe.engine import protocol
from netprobe.engine.protocol import Channel, DataHello
from netprobe.engine.server import Server, ServerConfig
from netprobe.schema import TestSpec

from .netlab import Lab, switched_hosts, wait_listening

why_not = Lab.available() or (None if shutil.which("nft") else "nftables (nft) is not installed")


def _lab(test):  # type: ignore[no-untyped-def]
    """The marks of a test that builds namespaces (skipped, with the reason, where it cannot)."""
    for mark in (pytest.mark.root, pytest.mark.slow,
                 pytest.mark.skipif(why_not is not None, reason=str(why_not))):
        test = mark(test)
    return test

NETPROBE = [sys.executable, "-m", "netprobe"]
ATTACKER = [sys.executable, str(Path(__file__).with_name("reflect_attacker.py"))]
SUBNET = "10.133.33"


def _count_from(lab: Lab, ns: str, source: str) -> None:
    """An nftables counter in ``ns`` of the UDP that arrives from ``source``."""
    nft = ["ip", "netns", "exec", ns, "nft"]
    for words in (["add", "table", "inet", "nu"],
                  ["add", "chain", "inet", "nu", "in",
                   "{ type filter hook input priority 0; policy accept; }"],
                  ["add", "rule", "inet", "nu", "in", "ip", "saddr", source, "meta",
                   "l4proto", "udp", "counter"]):
        subprocess.run([*nft, *words], check=True, capture_output=True, timeout=10)


def _counted(lab: Lab, ns: str) -> tuple[int, int]:
    """(packets, bytes) the counter of :func:`_count_from` has seen."""
    out = lab.run(ns, ["nft", "list", "chain", "inet", "nu", "in"]).stdout
    found = re.search(r"counter packets (\d+) bytes (\d+)", out)
    assert found, out
    return int(found.group(1)), int(found.group(2))


@contextlib.contextmanager
def _three_hosts(*server_args: str) -> Iterator[tuple[Lab, dict, subprocess.Popen]]:
    """(lab, hosts, server process) with the victim's counter installed."""
    with switched_hosts(["srv", "att", "vic"], subnet=SUBNET, prefix="nu") as (lab, hosts):
        srv_ns, srv_addr = hosts["srv"]
        server = lab.start(srv_ns, [*NETPROBE, "server", "-B", srv_addr, *server_args],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_listening(lab, srv_ns, 5301)
        wait_listening(lab, srv_ns, 5301, udp=True)
        _count_from(lab, hosts["vic"][0], srv_addr)
        yield lab, hosts, server


@pytest.fixture
def trio():  # type: ignore[no-untyped-def]
    """The three hosts, the server with its defaults."""
    with _three_hosts() as made:
        yield made


@pytest.fixture
def trio_open():  # type: ignore[no-untyped-def]
    """The three hosts, the server with --allow-other-data-addresses."""
    with _three_hosts("--allow-other-data-addresses") as made:
        yield made


def _attack(lab: Lab, hosts: dict, mode: str) -> dict:
    att_ns = hosts["att"][0]
    proc = lab.run(att_ns, [*ATTACKER, hosts["srv"][1], hosts["vic"][1], mode], timeout=30)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@_lab
@pytest.mark.parametrize("mode", ["reverse", "bidir"])
def test_spoofed_udp_hello_sends_nothing_at_the_victim(trio, mode: str) -> None:  # type: ignore[no-untyped-def]
    lab, hosts, _server = trio
    said = _attack(lab, hosts, mode)
    packets, nbytes = _counted(lab, hosts["vic"][0])
    assert (packets, nbytes) == (0, 0), f"the victim got {packets} datagrams, {nbytes} bytes"
    assert "start" not in said["said"]  # no test ran on the spoofed stream


@_lab
def test_other_addresses_allowed_still_need_the_proof(trio_open) -> None:  # type: ignore[no-untyped-def]
    # The owner lifted the address rule: the spoofed hellos reach the server's check, and
    # the victim gets only their challenges (one each, no larger), never the test's data.
    lab, hosts, _server = trio_open
    said = _attack(lab, hosts, "reverse")
    packets, nbytes = _counted(lab, hosts["vic"][0])
    assert packets <= 10 and nbytes <= 10 * (20 + 8 + protocol.DATA_HELLO_BYTES), (packets, nbytes)
    assert "start" not in said["said"]


@_lab
def test_probe_echo_ignores_a_spoofed_hello_and_probes(trio) -> None:  # type: ignore[no-untyped-def]
    lab, hosts, _server = trio
    _attack(lab, hosts, "probe")
    packets, nbytes = _counted(lab, hosts["vic"][0])
    assert (packets, nbytes) == (0, 0), f"the victim got {packets} datagrams, {nbytes} bytes"


@_lab
@pytest.mark.parametrize("args", [["-u", "-R"], ["-u", "--bidir"], ["-u"]])
def test_genuine_udp_tests_still_work(trio, args: list[str]) -> None:  # type: ignore[no-untyped-def]
    lab, hosts, _server = trio
    proc = lab.run(hosts["att"][0], [*NETPROBE, "run", hosts["srv"][1], "--json", *args,
                                     "-b", "20M", "-t", "1"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    flows = result["summary"]["directions"] if "directions" in result.get("summary", {}) else None
    received = [s["receiver"]["bytes"] for s in result["streams"]]
    assert received and all(b > 1_000_000 for b in received), received
    assert flows is None or flows
    assert _counted(lab, hosts["vic"][0]) == (0, 0)


@_lab
def test_genuine_latency_probes_still_work(trio) -> None:  # type: ignore[no-untyped-def]
    lab, hosts, _server = trio
    proc = lab.run(hosts["att"][0], [*NETPROBE, "run", hosts["srv"][1], "--json", "-u",
                                     "-b", "5M", "-t", "1", "--latency"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "netprobe-udp" in proc.stdout, proc.stdout[-2000:]  # the probes went by UDP


# --- on loopback: the same rules, no namespaces needed -----------------------------------


@pytest.fixture
def loopback_server():  # type: ignore[no-untyped-def]
    """An in-process server on 127.0.0.1 (addresses 127.0.0.2-3 play other hosts)."""
    server = Server(ServerConfig(bind_address="127.0.0.1", port=0, handshake_timeout_s=2.0))
    port = server.start()
    yield server, port
    server.close()


def _control(port: int, request: dict) -> tuple[Channel, dict]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(protocol.pack_hello(protocol.KIND_CONTROL))
    channel = Channel(sock)
    channel.expect("welcome", timeout=5)
    channel.send(request)
    return channel, channel.recv(timeout=5)


def _udp_test(direction: str, features: list) -> dict:
    spec = TestSpec(protocol="udp", direction=direction, duration_s=1.0,
                    rate_bits_per_second=1e6)
    return {"type": "test", "spec": convert.unstructure(spec), "features": features}


def test_old_client_udp_test_is_refused_naming_the_version(loopback_server) -> None:  # type: ignore[no-untyped-def]
    _server, port = loopback_server
    channel, reply = _control(port, _udp_test("reverse", ["sequence_base"]))
    channel.close()
    assert reply["type"] == "error" and reply["code"] == "version", reply
    assert f"netprobe {__version__}" in reply["message"] and "udp_proof" in reply["message"]


def test_old_client_probe_session_is_refused_naming_the_version(loopback_server) -> None:  # type: ignore[no-untyped-def]
    _server, port = loopback_server
    channel, reply = _control(port, {"type": "latency", "rate_hz": 10, "duration_s": 1})
    channel.close()
    assert reply["type"] == "error" and reply["code"] == "version", reply


def test_udp_hello_from_another_address_gets_no_answer(loopback_server) -> None:  # type: ignore[no-untyped-def]
    _server, port = loopback_server
    channel, reply = _control(port, _udp_test("reverse", ["udp_proof"]))
    cookie = bytes.fromhex(reply["cookie"])
    hello = DataHello(cookie, 1, "server_to_client")
    stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stranger.bind(("127.0.0.2", 0))
    stranger.connect(("127.0.0.1", port))
    try:
        assert not protocol.udp_handshake(stranger, hello, tries=3, wait_s=0.1)
        # From the control connection's own address, the same hello is answered.
        genuine = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        genuine.connect(("127.0.0.1", port))
        assert protocol.udp_handshake(genuine, hello, tries=5, wait_s=0.2)
        genuine.close()
    finally:
        stranger.close()
        channel.close()


def test_udp_proof_with_a_wrong_nonce_opens_nothing(loopback_server) -> None:  # type: ignore[no-untyped-def]
    _server, port = loopback_server
    channel, reply = _control(port, _udp_test("reverse", ["udp_proof"]))
    hello = DataHello(bytes.fromhex(reply["cookie"]), 1, "server_to_client")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect(("127.0.0.1", port))
    sock.settimeout(0.3)
    try:
        for _ in range(3):  # a guessed proof, never preceded by the hello's challenge
            sock.send(protocol.pack_proof(hello, b"\0" * protocol.NONCE_BYTES))
        with pytest.raises(socket.timeout):
            sock.recv(100)
    finally:
        sock.close()
        channel.close()


def test_tcp_data_connection_from_another_address_is_refused(loopback_server) -> None:  # type: ignore[no-untyped-def]
    _server, port = loopback_server
    spec = TestSpec(protocol="tcp", direction="reverse", duration_s=1.0)
    channel, reply = _control(port, {"type": "test", "spec": convert.unstructure(spec),
                                     "features": ["sequence_base", "udp_proof"]})
    hello = DataHello(bytes.fromhex(reply["cookie"]), 1, "server_to_client")
    data = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    data.bind(("127.0.0.3", 0))
    data.settimeout(5)
    try:
        data.connect(("127.0.0.1", port))
        data.sendall(protocol.pack_data_hello(protocol.KIND_DATA, hello))
        assert data.recv(65536) == b""  # closed unused: no test byte came
        told = channel.recv(timeout=5)
        assert told["type"] == "error" and told["code"] == "streams", told
    finally:
        data.close()
        channel.close()


def test_other_address_opens_a_stream_with_the_option_and_the_proof() -> None:
    server = Server(ServerConfig(bind_address="127.0.0.1", port=0,
                                 allow_other_data_addresses=True, handshake_timeout_s=2.0))
    port = server.start()
    channel, reply = _control(port, _udp_test("reverse", ["udp_proof"]))
    hello = DataHello(bytes.fromhex(reply["cookie"]), 1, "server_to_client")
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind(("127.0.0.2", 0))
    other.connect(("127.0.0.1", port))
    try:
        assert protocol.udp_handshake(other, hello, tries=5, wait_s=0.2)
    finally:
        other.close()
        channel.close()
        server.close()
