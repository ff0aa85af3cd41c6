"""Run inside an attacker namespace by tests/test_reflection.py: ask the server at argv[1]
for a test (or a probe session) over a genuine control connection, then send its UDP
hello (and, for probes, valid probes) with the victim's address argv[2] as the source,
through a raw socket. Prints one JSON line: what the control connection said. Bounded:
it ends within about 6 s whatever the server does."""

from __future__ import annotations

import json
import socket
import struct
import sys
import time

from netprobe import convert
from netprobe.engine import probes, protocol
from netprobe.engine.protocol import Channel, DataHello
from netprobe.schema import TestSpec

PORT = 5301
SPOOFED_PORT = 40000


def _checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF


def spoof(raw: socket.socket, source: str, dest: str, payload: bytes) -> None:
    """One UDP datagram from ``source``:SPOOFED_PORT to ``dest``:PORT (no UDP checksum)."""
    udp = struct.pack("!HHHH", SPOOFED_PORT, PORT, 8 + len(payload), 0) + payload
    head = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0,
                       socket.inet_aton(source), socket.inet_aton(dest))
    head = head[:10] + struct.pack("!H", _checksum(head)) + head[12:]
    raw.sendto(head + udp, (dest, 0))


def main() -> None:
    server, victim, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    sock = socket.create_connection((server, PORT), timeout=5)
    sock.sendall(protocol.pack_hello(protocol.KIND_CONTROL))
    channel = Channel(sock)
    channel.expect("welcome", timeout=5)
    features = ["sequence_base", "udp_proof"]
    if mode == "probe":
        channel.send({"type": "latency", "rate_hz": 50, "duration_s": 3, "features": features})
        reply = channel.expect("latency_accept", timeout=5)
        stream, direction = 0, "client_to_server"
    else:
        spec = TestSpec(protocol="udp", direction=mode, duration_s=3.0,
                        rate_bits_per_second=100e6)
        channel.send({"type": "test", "spec": convert.unstructure(spec), "features": features})
        reply = channel.expect("accept", timeout=5)
        stream, direction = 1, ("server_to_client" if mode == "reverse" else "client_to_server")
    cookie = bytes.fromhex(reply["cookie"])
    hello = protocol.pack_data_hello(protocol.KIND_UDP, DataHello(cookie, stream, direction))
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    for _ in range(10):
        spoof(raw, victim, server, hello)
        time.sleep(0.05)
    if mode == "bidir":  # the other direction's stream too
        back = protocol.pack_data_hello(protocol.KIND_UDP, DataHello(cookie, 1, "server_to_client"))
        for _ in range(10):
            spoof(raw, victim, server, back)
            time.sleep(0.05)
    if mode == "probe":
        for seq in range(40):
            probe = probes.Probe(probes.KIND_PROBE, seq, time.time_ns())
            spoof(raw, victim, server, probes.pack(cookie, probe))
            time.sleep(0.02)
    said = []
    end = time.monotonic() + 4
    while time.monotonic() < end:
        try:
            said.append(channel.recv(timeout=max(0.05, end - time.monotonic()))["type"])
        except (OSError, protocol.ProtocolError):
            break
    print(json.dumps({"said": said[:5]}))


if __name__ == "__main__":
    main()
