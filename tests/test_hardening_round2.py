"""Hardening, round two (issue 16): attacks on a running ``netprobe server`` that once
corrupted figures, exhausted its resources or held its slots, each against a real server
process on loopback."""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any, Optional

import pytest

from netprobe.engine.client import run_test
from netprobe.plugin import NullReporter
from netprobe.schema import Result, TestSpec

from .servers import ServerProcess, netprobe_server

pytestmark = pytest.mark.slow

HEADER = struct.Struct("!QQ")


def run_spec(server: ServerProcess, secret: Optional[bytes] = None, **kw: Any) -> Result:
    spec = TestSpec(**{"duration_s": 0.3, "interval_s": None, "port": server.port, **kw})
    return run_test(spec, NullReporter(), "127.0.0.1", secret)


# --- item 7: forged UDP datagrams ----------------------------------------------------------


def _connected_udp_peers(port: int) -> list[tuple[str, int]]:
    """Remote ends of the UDP sockets bound to ``port`` and connected (the server's streams)."""
    peers = []
    with open("/proc/net/udp") as table:
        for line in list(table)[1:]:
            local, remote = line.split()[1:3]
            local_port = int(local.split(":")[1], 16)
            raddr, rport = remote.split(":")
            if local_port == port and int(rport, 16):
                ip = socket.inet_ntoa(struct.pack("<I", int(raddr, 16)))
                peers.append((ip, int(rport, 16)))
    return peers


def _forge(server_port: int, count: int) -> int:
    """Send ``count`` datagrams into a running reverse UDP test's client socket, from the
    server's own address and port (what an on-host or spoofing attacker can do)."""
    end = time.monotonic() + 5
    while not (peers := _connected_udp_peers(server_port)) and time.monotonic() < end:
        time.sleep(0.02)
    assert peers, "the test's UDP stream never opened"
    time.sleep(0.3)  # into the test proper, past the stream's hello
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", server_port))
        sock.connect(peers[0])  # connected: it takes none of the server's own datagrams
        for n in range(count):
            # Huge numbers (which made lost = 2**63) and small ones (in an unkeyed window).
            seq = (1 << 63) + n if n % 2 else n
            sock.send(HEADER.pack(seq, 0) + bytes(100))
    return count


def test_forged_udp_datagrams_touch_no_figure() -> None:
    with netprobe_server() as server:
        forged: list[int] = []
        attacker = threading.Thread(target=lambda: forged.append(_forge(server.port, 346)))
        attacker.start()
        result = run_spec(server, protocol="udp", direction="reverse", duration_s=1.5,
                          rate_bits_per_second=20e6)
        attacker.join(10)
    assert forged == [346]
    receiver = result.summaries[0].receiver
    assert receiver is not None and receiver.lost_packets is not None
    assert receiver.lost_packets < 50, receiver  # the real loss on loopback: none or nearly
    assert receiver.lost_percent is not None and 0 <= receiver.lost_percent < 5
    # Forged datagrams that came in during the stream's hello are read and dropped there;
    # every one that reached the loop is counted as foreign, none as the test's.
    counts = [int(w.split(": ")[1].split()[0]) for w in result.warnings if "not of this test" in w]
    assert len(counts) == 1 and 0 < counts[0] <= 346, result.warnings
