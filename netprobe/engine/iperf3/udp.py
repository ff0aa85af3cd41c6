"""iperf3's UDP streams on the server: the hello/reply setup (serialised between clients,
since UDP carries no cookie) and the datagram loops with iperf3's header (sender's
seconds and microseconds, then a 32- or 64-bit sequence number, network order)."""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from typing import Callable

from netprobe.engine.iperf3 import wire
from netprobe.engine.iperf3.streams import POLL_S, BaseStream

MAX_GAP = 1 << 20
"""The largest jump in sequence numbers booked as loss: a stray or forged datagram with
a sequence near 2^32 (or 2^64) would otherwise book billions of losses."""


def open_streams(address: str, port: int, count: int, peer_ok: Callable[[tuple], bool],
                 timeout: float, announce: Callable[[], None]) -> list[socket.socket]:
    """Bind a UDP socket on ``port``, ``announce`` (CREATE_STREAMS), then per stream: take
    a 4-byte hello (any value, as a stock server), connect the socket to its source, bind
    the next and answer "6789". Hellos from sources ``peer_ok`` refuses are dropped."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    streams: list[socket.socket] = []
    listener = _bind(family, address, port)
    try:
        announce()
        deadline = time.monotonic() + timeout
        while len(streams) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise wire.WireError(f"{len(streams)} of {count} UDP streams said hello in time")
            listener.settimeout(left)
            _, source = listener.recvfrom(65536)
            if not peer_ok(source):
                continue  # no reflection: streams only from the control's peer
            listener.connect(source)
            streams.append(listener)
            # The next stream's socket is bound before the reply: the client sends its
            # next hello as soon as it has the reply, and an unbound port answers ICMP.
            listener = _bind(family, address, port)
            streams[-1].send(wire.UDP_HELLO_REPLY)
    except BaseException:
        for sock in streams:
            sock.close()
        raise
    finally:
        listener.close()
    return streams


def _bind(family: int, address: str, port: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((address, port))
    return sock


class UdpStream(BaseStream):
    """One UDP stream: a receiver keeps iperf3's loss, order and jitter; a sender paces."""

    thread_prefix = "np-i3u-"

    def __init__(self, sock: socket.socket, stream_id: int, sending: bool, length: int,
                 rate_bps: int, wide: bool) -> None:
        super().__init__(sock, stream_id, sending, length, rate_bps)
        self.wide = wide  # 64-bit sequence numbers (udp_counters_64bit)
        self.packets = 0  # highest sequence seen (receiver) or datagrams sent (sender)
        self.errors = 0  # lost
        self.out_of_order = 0
        self.strays = 0  # jumps over MAX_GAP, not booked as loss
        self.jitter_s = 0.0
        self.limit_bytes: int | None = None  # a sender stops at this many (-n)
        self._transit: float | None = None

    def finish(self) -> None:
        """Stop the loop."""
        self.stop_loop()

    def _loop(self) -> None:
        with contextlib.suppress(OSError):
            self._send() if self.sending else self._receive()

    def _receive(self) -> None:
        header = struct.Struct(">IIQ" if self.wide else ">III")
        while not self.stop.is_set():
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except ConnectionRefusedError:
                continue  # an ICMP error from an earlier send: not the stream's end
            if len(data) < header.size:
                continue
            sec, usec, seq = header.unpack_from(data)
            self.bytes += len(data)
            self._account(seq, sec + usec / 1e6, time.time())

    def _account(self, seq: int, sent: float, now: float) -> None:
        if seq > self.packets:
            gap = seq - 1 - self.packets
            if gap > MAX_GAP:
                self.strays += 1
                return
            self.errors += gap
            self.packets = seq
        else:
            self.out_of_order += 1
            self.errors = max(0, self.errors - 1)
        transit = now - sent
        if self._transit is not None:
            self.jitter_s += (abs(transit - self._transit) - self.jitter_s) / 16.0
        self._transit = transit

    def _send(self) -> None:
        header = struct.Struct(">IIQ" if self.wide else ">III")
        payload = bytearray(b"0123456789" * (self.length // 10 + 1))[: self.length]
        started = time.monotonic()
        while not self.stop.is_set():
            if self.limit_bytes is not None and self.bytes >= self.limit_bytes:
                return
            if self.rate_bps:
                ahead = self.bytes * 8 / self.rate_bps - (time.monotonic() - started)
                if ahead > 0:
                    self.stop.wait(min(ahead, POLL_S))
                    continue
            now = time.time()
            seq = self.packets + 1
            mask = (1 << 64) - 1 if self.wide else (1 << 32) - 1
            header.pack_into(payload, 0, int(now) & 0xFFFFFFFF, int((now % 1) * 1e6), seq & mask)
            try:
                self.bytes += self.sock.send(payload)
            except (ConnectionRefusedError, BlockingIOError, socket.timeout):
                continue
            self.packets = seq
