"""Latency probes: small timestamped datagrams the client sends at a steady rate and the
server echoes, beside any test (native or driven), on the server's one port.

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
import secrets
import select
import socket
import struct
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Optional

import attrs

from netprobe import core
from netprobe.engine import protocol
from netprobe.engine.latency import Phase, ProbeLog, ProbeSample
from netprobe.engine.protocol import Channel, DataHello, close_quietly
from netprobe.engine.sockets import udp_answer
from netprobe.errors import NetprobeError, ProtocolError, TestFailed

if TYPE_CHECKING:
    from netprobe.engine.server import Session

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


def unpack(key: bytes, data: bytes, kind: int) -> tuple[Optional[Probe], str]:
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


def _kernel_stamp(ancillary: list) -> Optional[int]:
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


class _Bitmap:
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


def decode_received(text: object, limit: int) -> Optional[frozenset[int]]:
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


class Echo:
    """The server's end of one probe session: registered under its cookie, it takes the
    session's UDP hello (or TCP connection) and echoes valid probes until closed."""

    def __init__(self, cookie: bytes, session: Session, max_probes: int, rate_hz: float) -> None:
        self.key = cookie
        self.family = session.channel.sock.family
        self.local_address = session.local_address
        self.control_peer = session.peer
        self.udp_key = secrets.token_bytes(16)
        self.port = session.server.port
        self.received = _Bitmap(max_probes)
        self.bad: Counter[str] = Counter()
        self.max_probes = max_probes
        # Echo at most twice the asked rate (plus a burst): never a reflector for a flood.
        self._budget = _TokenBucket(2 * rate_hz, burst=20)
        self._transport: Optional[Transport] = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def attach(self, hello: DataHello, sock: socket.socket) -> bool:
        """Take the TCP connection that carries this session's probes."""
        if hello.stream_id != 0 or not self._claim(sock):
            return False
        sock.settimeout(None)
        return True

    def attach_udp(self, hello: DataHello, peer: tuple, datagram: bytes) -> None:
        """Open the session's UDP socket, connected to the client that proved it receives
        at ``peer`` (the only address it then hears and answers), and echo the hello."""
        if hello.stream_id != 0:
            return
        with self._lock:
            if self._transport is not None:
                return  # a retried hello: the client sees our answer on the session socket
        try:
            sock = udp_answer(self.family, self.local_address, self.port, peer, datagram)
        except OSError:
            return
        if not self._claim(sock):
            close_quietly(sock)

    def _claim(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._transport is not None or self._closed.is_set():
                return False
            self._transport = Transport(sock)
            self._thread = threading.Thread(target=self._loop, name="np-probe-echo", daemon=True)
            self._thread.start()
            return True

    def _loop(self) -> None:
        transport = self._transport
        assert transport is not None
        while not self._closed.is_set():
            readable, _, _ = select.select([transport.sock], [], [], 0.25)
            if not readable:
                continue
            try:
                frames = transport.receive()
            except (OSError, EOFError):
                return
            for data, rx_ns in frames:
                reply = self.answer(data, rx_ns)
                if reply is not None:
                    with contextlib.suppress(OSError):
                        transport.send(reply)

    def answer(self, data: bytes, rx_ns: int) -> Optional[bytes]:
        """The echo of one probe, or None (and counted) if the probe is bad."""
        probe, why = unpack(self.key, data, KIND_PROBE)
        if probe is None:
            self.bad[why] += 1
            return None
        if probe.seq >= self.max_probes:
            self.bad["out_of_range"] += 1
            return None
        if not self.received.add(probe.seq):
            self.bad["replayed"] += 1
            return None
        if not self._budget.take():
            self.bad["over_rate"] += 1
            return None
        echo = attrs.evolve(probe, kind=KIND_ECHO, server_rx_ns=rx_ns, server_tx_ns=time.time_ns())
        return pack(self.key, echo)

    def report(self) -> dict[str, Any]:
        """The ``latency_report`` message."""
        return {"type": "latency_report", "received": self.received.encode(),
                "bad": dict(self.bad)}

    def close(self) -> None:
        """Stop echoing and close the session's socket."""
        self._closed.set()
        with self._lock:
            transport = self._transport
        if transport is not None:
            close_quietly(transport.sock)
        if self._thread is not None:
            self._thread.join(1.0)


class _TokenBucket:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class ProbeService:
    """The server's ``latency`` request handler (one per server: it bounds the sessions)."""

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self._slots = threading.BoundedSemaphore(max_sessions)

    def __call__(self, session: Session, request: dict) -> None:
        """Serve one probe session until the client is done, gone or late."""
        rate, duration = _checked_request(session, request)
        if not self._slots.acquire(blocking=False):
            session.refuse(f"server busy: {MAX_SESSIONS} latency probe sessions running", "busy")
        try:
            _serve(session, rate, duration)
        finally:
            self._slots.release()


def _checked_request(session: Session, request: dict) -> tuple[float, float]:
    rate, duration = request.get("rate_hz"), request.get("duration_s")
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0 < rate <= MAX_RATE_HZ:
        session.refuse(f"latency probe rate must be above 0 and at most {MAX_RATE_HZ:g} per s")
    limit = session.server.config.max_duration_s
    if not isinstance(duration, (int, float)) or isinstance(duration, bool) or duration <= 0:
        session.refuse("latency probe duration must be a positive number of seconds")
    if duration > limit:
        session.refuse(f"duration {duration:g} s exceeds this server's limit of {limit:g} s")
    session.require_udp_proof(request)
    return float(rate), float(duration)


def _serve(session: Session, rate: float, duration: float) -> None:
    cookie = secrets.token_bytes(16)
    max_probes = min(MAX_PROBES, int(rate * (duration + GRACE_S)) + 64)
    echo = Echo(cookie, session, max_probes, rate)
    session.server.register(cookie, echo)
    try:
        session.channel.send({"type": "latency_accept", "cookie": cookie.hex(),
                              "max_probes": max_probes})
        end = time.monotonic() + duration + GRACE_S
        while time.monotonic() < end:
            try:
                message = session.channel.recv(timeout=max(0.1, end - time.monotonic()))
            except socket.timeout:
                break
            if message.get("type") == "latency_done":
                session.channel.send(echo.report())
                return
    finally:
        session.server.unregister(cookie)
        echo.close()


# --- the client's end --------------------------------------------------------------------


@attrs.define
class _Pending:
    seq: int
    phase: int
    sent_s: float
    tx_ns: int


class Prober:
    """The client's end of a probe session: sends probes at a steady rate on a thread of
    its own, matches the echoes, and returns everything as a :class:`ProbeLog`.

    ``mark()`` starts a new phase (idle, loaded, ...): each probe belongs to the phase it
    was sent in."""

    def __init__(self, rate_hz: float = DEFAULT_RATE_HZ, transport: str = "auto") -> None:
        if transport not in ("auto", "udp", "tcp"):
            raise ValueError(f"unknown probe transport {transport!r}")
        self.rate_hz = rate_hz
        self.want = transport
        self.t0 = 0.0
        self.samples: list[ProbeSample] = []
        self.phases: list[Phase] = []
        self.bad: Counter[str] = Counter()
        self._pending: dict[int, _Pending] = {}
        self._channel: Optional[Channel] = None
        self._key = b""
        self._max_probes = 0
        self._transport: Optional[Transport] = None
        self._stop_sending = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    # -- set-up

    def start(self, channel: Channel, duration_s: float, phase: str = "idle",
              loaded: bool = False) -> None:
        """Open the session on ``channel`` (a control connection to the server, welcomed
        and authenticated; the prober owns it from now) for at most ``duration_s``, and
        start probing in ``phase``."""
        self._channel = channel
        try:
            channel.send({"type": REQUEST, "rate_hz": self.rate_hz, "duration_s": duration_s,
                          "features": [protocol.UDP_PROOF_FEATURE]})
            reply = channel.expect("latency_accept", timeout=10.0)
            self._key = bytes.fromhex(protocol.field(reply, "cookie", str))
            self._max_probes = int(protocol.field(reply, "max_probes", int))
            self._transport = self._open(channel.sock.getpeername())
        except (OSError, ValueError, NetprobeError) as exc:
            self.close()
            raise TestFailed(f"latency probes: {protocol.reason(exc)}") from None
        self.t0 = core.monotonic()
        self.phases.append(Phase(phase, loaded, 0.0))
        self._thread = threading.Thread(target=self._loop, name="np-prober", daemon=True)
        self._thread.start()

    def _open(self, address: tuple) -> Transport:
        hello = DataHello(self._key, 0, "client_to_server")
        if self.want in ("auto", "udp"):
            sock = socket.socket(address_family(address), socket.SOCK_DGRAM)
            sock.connect(address)
            if protocol.udp_handshake(sock, hello, HELLO_TRIES, HELLO_WAIT_S):
                sock.setblocking(False)
                return Transport(sock)
            close_quietly(sock)
            if self.want == "udp":
                raise ProtocolError("no answer to the UDP probe hello (is UDP blocked?)")
        sock = socket.create_connection(address[:2], timeout=5.0)
        tcp_hello = protocol.pack_data_hello(
            protocol.KIND_DATA, DataHello(self._key, 0, "client_to_server"))
        sock.sendall(tcp_hello)
        sock.settimeout(None)
        return Transport(sock)

    # -- running

    @property
    def transport(self) -> Optional[Transport]:
        """The probes' socket, once the session is open."""
        return self._transport

    def now_s(self) -> float:
        """Seconds since the probes started."""
        return core.monotonic() - self.t0

    def mark(self, name: str, loaded: bool) -> None:
        """End the current phase and start ``name`` now."""
        with self._lock:
            at = self.now_s()
            if self.phases:
                self.phases[-1] = attrs.evolve(self.phases[-1], end_s=at)
            self.phases.append(Phase(name, loaded, at))

    def answered(self) -> list[ProbeSample]:
        """A copy of the samples recorded so far (answered probes, in order of arrival)."""
        with self._lock:
            return list(self.samples)

    def _loop(self) -> None:
        transport = self._transport
        assert transport is not None
        step = 1.0 / self.rate_hz
        seq = 0
        while not self._stop.is_set():
            due = self.t0 + seq * step
            sending = not self._stop_sending.is_set() and seq < self._max_probes
            wait = max(0.0, due - core.monotonic()) if sending else 0.05
            readable, _, _ = select.select([transport.sock], [], [], wait)
            if readable and not self._receive(transport):
                return
            # Checked again: stop() may have come while this thread waited for the due time.
            if sending and not self._stop_sending.is_set() and core.monotonic() >= due:
                self._send(transport, seq)
                seq += 1

    def _send(self, transport: Transport, seq: int) -> None:
        tx_ns = time.time_ns()
        with self._lock:
            self._pending[seq] = _Pending(seq, len(self.phases) - 1, self.now_s(), tx_ns)
        try:
            transport.send(pack(self._key, Probe(KIND_PROBE, seq, tx_ns)))
        except OSError:
            self._stop.set()  # the TCP connection is gone: no more probes

    def _receive(self, transport: Transport) -> bool:
        try:
            frames = transport.receive()
        except (OSError, EOFError):
            return False
        for data, rx_ns in frames:
            self._match(data, rx_ns)
        return True

    def _match(self, data: bytes, rx_ns: int) -> None:
        echo, why = unpack(self._key, data, KIND_ECHO)
        if echo is None:
            self.bad[why] += 1
            return
        with self._lock:
            sent = self._pending.pop(echo.seq, None)
            if sent is None or sent.tx_ns != echo.client_tx_ns:
                self.bad["replayed"] += 1  # never sent, already answered, or not ours
                return
            turnaround = max(0, echo.server_tx_ns - echo.server_rx_ns)
            rtt_ns = rx_ns - sent.tx_ns - turnaround
            self.samples.append(ProbeSample(
                seq=sent.seq, phase=sent.phase, sent_s=sent.sent_s, rtt_us=rtt_ns / 1000.0,
                up_ns=echo.server_rx_ns - sent.tx_ns, down_ns=rx_ns - echo.server_tx_ns))

    # -- the end

    def stop(self) -> ProbeLog:
        """Stop sending, wait for the echoes still on their way, get the server's report."""
        self._stop_sending.set()
        with self._lock:
            if self.phases:
                self.phases[-1] = attrs.evolve(self.phases[-1], end_s=self.now_s())
        self._drain()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        received = self._server_report()
        self.close()
        return self._log(received)

    def _drain(self) -> None:
        # Echoes still queued somewhere get three times the slowest round trip seen, at
        # least half a second, at most three: later than that they count as lost.
        with self._lock:
            slowest = max((s.rtt_us or 0.0 for s in self.samples), default=0.0) / 1e6
        end = core.monotonic() + min(3.0, max(0.5, 3 * slowest))
        while core.monotonic() < end:
            with self._lock:
                if not self._pending:
                    return
            time.sleep(0.02)

    def _server_report(self) -> Optional[frozenset[int]]:
        if self._channel is None:
            return None
        try:
            self._channel.send({"type": "latency_done"})
            report = self._channel.expect("latency_report", timeout=5.0)
        except (OSError, NetprobeError):
            return None
        bad = report.get("bad")
        if isinstance(bad, dict):
            for why, count in bad.items():
                if isinstance(why, str) and isinstance(count, int) and count > 0:
                    self.bad[f"server {why}"] += count
        return decode_received(report.get("received"), self._max_probes)

    def _log(self, received: Optional[frozenset[int]]) -> ProbeLog:
        with self._lock:
            answered = {s.seq: s for s in self.samples}
            lost = [ProbeSample(seq=p.seq, phase=p.phase, sent_s=p.sent_s)
                    for p in self._pending.values()]
        samples = sorted([*answered.values(), *lost], key=lambda s: s.seq)
        return ProbeLog(
            samples=tuple(samples), phases=tuple(self.phases),
            transport=self._transport.name if self._transport else "udp",
            server_received=received, bad=tuple(sorted(self.bad.items())),
        )

    def close(self) -> None:
        """Close the session's sockets (idempotent)."""
        self._stop.set()
        if self._transport is not None:
            close_quietly(self._transport.sock)
        if self._channel is not None:
            self._channel.close()


def address_family(address: tuple) -> int:
    """AF_INET6 for a 4-tuple socket address, AF_INET for a pair."""
    return socket.AF_INET6 if len(address) == 4 else socket.AF_INET
