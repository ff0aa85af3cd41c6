"""Old kernels: every optional kernel feature the data path uses, refused by a seccomp filter
the way a kernel without it refuses it, falls back cleanly and says so in the result.

Each case runs a real self-test (both ends in one child process, on loopback) under a filter
(tests/sockfilter.py) that makes setsockopt/getsockopt of one option fail with the errno
an old kernel gives; on both data paths, each direction (-R puts the server on the sending
end). A kernel before 4.18 ignores a UDP_SEGMENT control message without an error, so GSO
must be confirmed by getsockopt(SOL_UDP, UDP_SEGMENT), never by a send that did not fail.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import sockfilter

pytestmark = pytest.mark.skipif(
    not sockfilter.available(),
    reason="no seccomp filter can be loaded here (libseccomp absent, or an emulated CPU)")

ROOT = Path(__file__).resolve().parent.parent
SOL_UDP, UDP_SEGMENT, UDP_GRO = 17, 103, 104
SO_MAX_PACING_RATE = 47


def _both(level: int, optname: int, name: str) -> list[list[Any]]:
    return [["setsockopt", level, optname, name], ["getsockopt", level, optname, name]]


FEATURES: dict[str, tuple[str, list[list[Any]], str]] = {
    # feature: (protocol, rules, words the result's note must hold)
    "gso": ("udp", _both(SOL_UDP, UDP_SEGMENT, "ENOPROTOOPT"), "UDP_SEGMENT"),
    "gro": ("udp", _both(SOL_UDP, UDP_GRO, "ENOPROTOOPT"), "UDP_GRO"),
    "rcvlowat": ("tcp", [["setsockopt", socket.SOL_SOCKET, socket.SO_RCVLOWAT, "EINVAL"],
                         ["getsockopt", socket.SOL_SOCKET, socket.SO_RCVLOWAT, "ENOPROTOOPT"]],
                 "SO_RCVLOWAT"),
    "tcp_info": ("tcp", _both(socket.IPPROTO_TCP, socket.TCP_INFO, "EOPNOTSUPP"), "TCP_INFO"),
}


def _run(rules: list[list[Any]], path: str, **spec: Any) -> dict[str, Any]:
    env = dict(os.environ, NETPROBE_PURE="1" if path == "python" else "0")
    done = subprocess.run([sys.executable, "-m", "tests.sockfilter", json.dumps(rules),
                           json.dumps({"duration_s": 1.0, **spec})],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    assert result["errors"] == [], result["errors"]
    return result


def _flow(result: dict[str, Any], reverse: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    direction = "server_to_client" if reverse else "client_to_server"
    summary = next(s for s in result["summaries"] if s["direction"] == direction)
    return summary["sender"], summary["receiver"]


@pytest.fixture(params=["c", "python"])
def path(request: pytest.FixtureRequest) -> str:
    if request.param == "c":
        from netprobe import core
        if core.DATA_PATH != "c":
            pytest.skip("the compiled core is not built here")
    return str(request.param)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_a_refused_feature_falls_back_and_says_so(feature: str, path: str,
                                                  reverse: bool) -> None:
    protocol, rules, words = FEATURES[feature]
    spec: dict[str, Any] = {"protocol": protocol,
                            "direction": "reverse" if reverse else "normal"}
    if protocol == "udp":
        spec["rate_bits_per_second"] = 100_000_000
        spec["udp_gso"] = True
    result = _run(rules, path, **spec)
    sender, receiver = _flow(result, reverse)
    notes = [w for w in result["warnings"] if words in w]
    used = feature != "gso" or path == "c"  # the pure path never sends GSO messages
    assert len(notes) == (1 if used else 0), result["warnings"]
    assert sender["bytes"] > 0
    if protocol == "udp":
        # exact counts: every datagram the sender counted is received or lost, never more
        assert receiver["packets"] + receiver["lost_packets"] == sender["packets"]
        assert receiver["bytes"] <= sender["bytes"]
    else:
        assert receiver["bytes"] == sender["bytes"]
    if feature == "gso":
        # a kernel that refuses UDP_SEGMENT would send a GSO message as one 64 KiB datagram
        assert sender["datagrams_per_message"] == 1.0
    if feature == "gro":
        assert receiver["datagrams_per_message"] == 1.0
    if feature == "tcp_info":
        # unknown, not zero: a refused TCP_INFO must not read as "no retransmits"
        assert sender["retransmits"] is None and sender["rtt_us"] is None


@pytest.mark.parametrize("protocol", ["tcp", "udp"])
def test_a_refused_pacing_cap_changes_nothing(protocol: str, path: str) -> None:
    # netprobe paces in user space and never sets SO_MAX_PACING_RATE: refusing it must
    # leave a paced test whole, with no note.
    rules = _both(socket.SOL_SOCKET, SO_MAX_PACING_RATE, "ENOPROTOOPT")
    result = _run(rules, path, protocol=protocol, rate_bits_per_second=50_000_000)
    sender, receiver = _flow(result, False)
    assert sender["bytes"] > 0 and not any("PACING" in w for w in result["warnings"])
    if protocol == "tcp":
        assert receiver["bytes"] == sender["bytes"]


def test_the_core_confirms_gso_itself(path: str) -> None:
    # Called directly (the API, not the engine): with UDP_SEGMENT refused the C core must
    # send one datagram a message, not trust a sendmmsg that carried the cmsg without error.
    env = dict(os.environ, NETPROBE_PURE="1" if path == "python" else "0")
    rules = json.dumps(_both(SOL_UDP, UDP_SEGMENT, "ENOPROTOOPT"))
    done = subprocess.run([sys.executable, "-m", "tests.sockfilter", rules, "core-udp"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    sent = json.loads(done.stdout)
    assert sent == {"packets": 300, "messages": 300}


@pytest.mark.parametrize(("length", "gone"), [
    (192, "retransmitted bytes"),  # Linux 4.10-4.17, a 4.14 router's
    (104, "minimum RTT, acknowledged bytes, delivery rate, retransmitted bytes"),  # 3.x
])
def test_a_short_tcp_info_leaves_the_rest_unknown(length: int, gone: str) -> None:
    # A filter cannot shorten what the kernel returns: a real connection's TCP_INFO is cut
    # to an old kernel's length and read as the pure path reads the kernel's answer (the C
    # path's reading of the same lengths is checked in csrc/test_core.c).
    from netprobe.core import pure
    from netprobe.engine import features

    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname()) as client:
        peer, _ = server.accept()
        with peer:
            client.sendall(b"hello")
            assert peer.recv(5) == b"hello"
            raw = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    if len(raw) <= 4:
        pytest.skip("TCP_INFO is truncated to 4 bytes here (qemu-user emulation)")
    full, short = pure.tcp_info_from(raw), pure.tcp_info_from(raw[:length])
    assert full.bytes_retrans is not None and features.tcp_info_gaps(full) is None
    assert short.retransmits == full.retransmits and short.rtt_us == full.rtt_us
    assert short.bytes_retrans is None
    note = features.tcp_info_gaps(short)
    assert note is not None and f": {gone} not reported" in note
