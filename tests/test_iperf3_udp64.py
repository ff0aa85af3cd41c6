"""``netprobe run HOST --iperf3 -u --udp-counters-64bit``: 64-bit UDP sequence numbers
against stock ``iperf3 -s`` servers (3.12 and 3.21, the real binaries on loopback), both
ways; and a forged sequence number far ahead (near 2^32 in 32-bit mode, near 2^63 in
64-bit mode) never books billions of datagrams lost in the client's receive path."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from netprobe.engine.iperf3 import client as iperf3_client
from netprobe.engine.iperf3.udp import UdpStream
from netprobe.reporting import NullReporter
from netprobe.schema import TestSpec
from netprobe.tools.native import NativeTool
from tests.test_iperf3_client import (
    check_udp,
    cli,
    one_line_error,
    rcvbuf_errors,
    stock,
    stock_server,
)

UDP = {"protocol": "udp", "rate_bits_per_second": 20e6, "length_bytes": 1400,
       "duration_s": 1.0}


def test_the_params_say_64_bit_only_when_asked_and_only_for_udp() -> None:
    udp = TestSpec(host="h", protocol="udp", rate_bits_per_second=1e6, length_bytes=1400)
    assert iperf3_client.client_params(udp, 1400, True)["udp_counters_64bit"] == 1
    assert "udp_counters_64bit" not in iperf3_client.client_params(udp, 1400)
    tcp = TestSpec(host="h")
    assert "udp_counters_64bit" not in iperf3_client.client_params(tcp, 131072, True)


class Capture:
    """The first datagrams of 1400 bytes to or from ``port`` on loopback, as the wire
    carries them (an AF_PACKET socket on ``lo``: the witness of which header was sent)."""

    def __init__(self, port: int, most: int = 64) -> None:
        try:
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
        except (PermissionError, AttributeError, OSError) as exc:
            pytest.skip(f"no packet capture here ({exc}): it witnesses the header")
        self.sock.bind(("lo", 0))
        self.sock.settimeout(0.1)
        self.port = port
        self.most = most
        self.heads: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 30.0
        while not self.stop.is_set() and len(self.heads) < self.most \
                and time.monotonic() < deadline:
            try:
                frame = self.sock.recv(65536)
            except socket.timeout:
                continue
            ip = frame[14:]  # lo's frames carry a 14-byte Ethernet header
            if len(ip) < 20 or ip[9] != socket.IPPROTO_UDP:
                continue
            udp = ip[(ip[0] & 0x0F) * 4:]
            src, dst, length = struct.unpack_from(">HHH", udp)
            if self.port in (src, dst) and length == 1400 + 8:
                self.heads.append(bytes(udp[8:24]))

    def close(self) -> list[bytes]:
        """Stop; the heads (the first 16 bytes of each datagram's payload) seen."""
        self.stop.set()
        self.thread.join(5.0)
        self.sock.close()
        return self.heads


def _sequences(heads: list[bytes], wide: bool) -> list[int]:
    """Each datagram's sequence number read as ``wide`` (64-bit) or 32-bit."""
    return [struct.unpack_from(">Q" if wide else ">I", head, 8)[0] for head in heads]


@pytest.mark.parametrize("version", ["3.12", "3.21"])
@pytest.mark.parametrize("direction", ["client_to_server", "server_to_client"])
def test_64_bit_counters_against_stock_server(version: str, direction: str) -> None:
    fields = dict(UDP, direction="normal" if direction == "client_to_server" else "reverse")
    with stock_server(stock(version)) as server:
        before = rcvbuf_errors()
        spec = TestSpec(host="127.0.0.1", port=server.port, **fields)
        capture = Capture(server.port)
        try:
            result = NativeTool({"iperf3": True, "udp_counters_64bit": True}).run(
                spec, NullReporter())
        finally:
            heads = capture.close()
        end = server.report()
        after = rcvbuf_errors()
    # The wire's witness: 64-bit sequence numbers from 1, whoever sent them (in 32-bit
    # mode the first four bytes after the times are the sequence itself, never 0).
    assert len(heads) >= 10, len(heads)
    wide = _sequences(heads, True)
    assert all(1 <= seq <= 10**6 for seq in wide), wide[:8]
    dropped = after - before if after is not None and before is not None else 0
    # Had either end read the other's 64-bit field as 32 bits, every datagram's sequence
    # would read as 0 (its high half): no packets counted, or all lost.
    check_udp(result, end, direction, dropped)
    f = next(f for f in result.summaries if f.direction == direction)
    assert f.receiver is not None and f.receiver.packets and f.receiver.packets > 100, f


def _receiver(wide: bool) -> tuple[UdpStream, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.settimeout(0.05)
    return UdpStream(a, 1, False, 1400, 0, wide), b


@pytest.mark.parametrize(("wide", "forged"), [(False, 2**32 - 5), (False, 2**31),
                                               (True, 2**63 - 5), (True, 2**64 - 1)])
def test_a_forged_sequence_far_ahead_books_no_billions_lost(wide: bool, forged: int) -> None:
    stream, peer = _receiver(wide)
    header = struct.Struct(">IIQ" if wide else ">III")
    now = time.time()
    pad = bytes(64)
    try:
        stream.start()
        for seq in [1, 2, 3, forged, 4, 5]:
            peer.send(header.pack(int(now), 0, seq) + pad)
        for _ in range(200):  # 2 s at most for the loop to read all six
            if stream.packets >= 5 and stream.strays:
                break
            time.sleep(0.01)
    finally:
        stream.finish()
        peer.close()
    assert stream.packets == 5, stream.packets
    assert stream.errors == 0, stream.errors
    assert stream.strays == 1


def test_the_option_needs_iperf3_and_udp() -> None:
    line = one_line_error(cli("127.0.0.1", "--udp-counters-64bit", "-t", "1"))
    assert "--udp-counters-64bit" in line and "--iperf3" in line, line
    line = one_line_error(cli("127.0.0.1", "--iperf3", "--udp-counters-64bit", "-t", "1"))
    assert "--udp-counters-64bit" in line and "-u" in line, line
