"""Latency probes: small timestamped datagrams the client sends at a steady rate and the
server echoes, beside any test (native or driven), on the server's one port. This module is
the wire format and the transport both ends share; the server's half is
:mod:`netprobe.engine.echo`, the client's :mod:`netprobe.engine.prober`.

A probe session has a control connection of its own (request ``latency``), so it runs
beside a test without touching the test's protocol, and ``netprobe server`` answers it
without holding one of its test slots (a session moves ~100 bytes 20 times a second).

Session (all on the server's port):

1. control: ``latency`` {rate_hz, duration_s} -> ``latency_accept`` {cookie, max_probes};
2. UDP: the client sends the 28-byte data hello with the cookie and stream 0 until the
   server's session socket (connected to the client) echoes it; where UDP is dropped, a
   TCP connection with the same data hello carries the probes instead;
3. probes (client -> server, kind 1) and echoes (server -> client, kind 2), each::

       magic "NPLT" | version 1 | kind 1 | reserved 2 | seq 4 | client_tx_ns 8 |
       server_rx_ns 8 | server_tx_ns 8 | MAC 16   (52 bytes, big-endian)

   The MAC is HMAC-SHA256 of the first 36 bytes keyed by the session's cookie, cut to 16
   bytes: a probe of another session (foreign), a truncated one or one sent twice
   (replayed) is ignored and counted, never echoed, never in the figures.
4. control: ``latency_done`` -> ``latency_report`` {received (bitmap of the sequence
   numbers the server got, base64), bad {reason: count}}: this splits the loss between
   the two directions.

Timestamps are CLOCK_REALTIME nanoseconds; receive stamps come from the kernel
(SO_TIMESTAMPNS) where it gives them, so a busy interpreter does not add its own delay.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import socket
import struct
import time

import attrs

REQUEST = "latency"
DEFAULT_RATE_HZ = 20.0
"""Probes per second: one every 50 ms sees a queue build and drain; 52-byte probes at this
rate are ~20 kbit/s each way (0.02 % of a 100 Mbit/s link)."""
MAX_RATE_HZ = 100.0
MAX_PROBES = 1 << 18
"""Most probes one session numbers (the server's received-bitmap stays under 33 KiB)."""
MAX_SESSIONS = 16
"""Probe sessions a server runs at once."""
GRACE_S = 30.0
"""How long past its planned end the server keeps a probe session."""
HELLO_TRIES = 15
HELLO_WAIT_S = 0.2
KIND_PROBE = 1
KIND_ECHO = 2
MAGIC = b"NPLT"
_HEAD = struct.Struct("!4sBBHIQQQ")
MAC_BYTES = 16
PROBE_BYTES = _HEAD.size + MAC_BYTES
_TIMESPEC = struct.Struct("@ll")
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", None)


@attrs.frozen
class Probe:
    """The fields of one probe or echo."""

    kind: int
    seq: int
    client_tx_ns: int
    server_rx_ns: int = 0
    server_tx_ns: int = 0


def pack(key: bytes, probe: Probe) -> bytes:
    """The 52 bytes of a probe or echo, MAC included."""
    head = _HEAD.pack(MAGIC, 1, probe.kind, 0, probe.seq, probe.client_tx_ns,
                      probe.server_rx_ns, probe.server_tx_ns)
    return head + hmac.new(key, head, hashlib.sha256).digest()[:MAC_BYTES]


def unpack(key: bytes, data: bytes, kind: int) -> tuple[Probe | None, str]:
    """Check one datagram: the probe (and ``""``), or None and why it is bad."""
    if len(data) != PROBE_BYTES:
        return None, "truncated" if len(data) < PROBE_BYTES else "oversized"
    head, mac = data[: _HEAD.size], data[_HEAD.size :]
    magic, version, got_kind, _, seq, ctx, srx, stx = _HEAD.unpack(head)
    if magic != MAGIC or version != 1 or got_kind != kind:
        return None, "foreign"
    if not hmac.compare_digest(mac, hmac.new(key, head, hashlib.sha256).digest()[:MAC_BYTES]):
        return None, "foreign"
    return Probe(got_kind, seq, ctx, srx, stx), ""


# --- transports: one datagram socket or one TCP connection ------------------------------


def _enable_timestamps(sock: socket.socket) -> None:
    if _SO_TIMESTAMPNS is not None and sock.type == socket.SOCK_DGRAM:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)


def _kernel_stamp(ancillary: list) -> int | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack(data[: _TIMESPEC.size])
            return int(sec) * 1_000_000_000 + int(nsec)
    return None


class Transport:
    """Sends and receives whole probes on a UDP socket or a TCP connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.udp = sock.type == socket.SOCK_DGRAM
        self._buffer = b""
        _enable_timestamps(sock)
        if not self.udp:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @property
    def name(self) -> str:
        """``udp`` or ``tcp``."""
        return "udp" if self.udp else "tcp"

    def send(self, data: bytes) -> None:
        """Send one probe (a lost UDP datagram is the network's business, not an error)."""
        if self.udp:
            with contextlib.suppress(BlockingIOError, ConnectionRefusedError):
                self.sock.send(data)
        else:
            self.sock.sendall(data)

    def receive(self) -> list[tuple[bytes, int]]:
        """What has arrived (call when readable): (bytes, receive time ns) per probe.

        EOFError when a TCP peer has closed."""
        if self.udp:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(PROBE_BYTES + 64, 64)
            except (BlockingIOError, ConnectionRefusedError):
                return []
            return [(data, _kernel_stamp(ancillary) or time.time_ns())]
        chunk = self.sock.recv(65536)
        now = time.time_ns()
        if not chunk:
            raise EOFError
        self._buffer += chunk
        whole = len(self._buffer) // PROBE_BYTES * PROBE_BYTES
        frames = [(self._buffer[i : i + PROBE_BYTES], now) for i in range(0, whole, PROBE_BYTES)]
        self._buffer = self._buffer[whole:]
        return frames


# --- the server's end --------------------------------------------------------------------


class Bitmap:
    """Which sequence numbers arrived (bounded: one bit per probe the session may send)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.bits = bytearray((size + 7) // 8)

    def add(self, seq: int) -> bool:
        """Mark ``seq``; False if it was already marked."""
        byte, bit = divmod(seq, 8)
        if self.bits[byte] & (1 << bit):
            return False
        self.bits[byte] |= 1 << bit
        return True

    def encode(self) -> str:
        """Base64 of the bits (for the report)."""
        return base64.b64encode(bytes(self.bits)).decode("ascii")


def decode_received(text: object, limit: int) -> frozenset[int] | None:
    """The sequence numbers of a server's received-bitmap (None if it is unusable)."""
    if not isinstance(text, str) or len(text) > 4 * ((MAX_PROBES // 8 + 2) // 3 + 1):
        return None
    try:
        bits = base64.b64decode(text, validate=True)
    except ValueError:
        return None
    return frozenset(
        i * 8 + b for i, byte in enumerate(bits) if byte for b in range(8)
        if byte & (1 << b) and i * 8 + b < limit
    )


def address_family(address: tuple) -> int:
    """AF_INET6 for a 4-tuple socket address, AF_INET for a pair."""
    return socket.AF_INET6 if len(address) == 4 else socket.AF_INET
