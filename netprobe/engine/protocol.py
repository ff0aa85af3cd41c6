"""The netprobe control protocol: framing, hellos and message checks.

Wire format (all integers big-endian):

* Every TCP connection to the server starts with an 8-byte hello: ``b"NPRB"``, the
  protocol version (1 byte), the connection kind (1 byte: control or data), 2 reserved
  bytes. A data hello goes on with the test's 16-byte cookie, the stream id (2 bytes) and
  the flow direction (1 byte), 1 reserved byte.
* UDP streams open with a return-routability check, so that the server never sends a
  stream (or its answers) to an address that did not ask: the client sends the 28-byte
  data hello (kind ``udp``); the server answers a 28-byte challenge (kind ``udp
  challenge``: a 16-byte nonce in the cookie's place, keyed to the session and to the
  hello's source address and port) to that address only, and only when the address is the
  control connection's (unless the owner allows others); the client sends the 44-byte
  proof (kind ``udp proof``: its data hello plus the nonce); then the server answers the
  data hello from a socket connected to the client, on the same port number, and only
  then may data flow. No answer is larger than what it answers. A client offers this as
  the feature ``udp_proof``; a server refuses a UDP test or probe session without it.
* On a control connection, after the hello, messages are JSON objects framed by a 4-byte
  length. A frame longer than the limit is refused before it is read, so a peer can never
  make the other side allocate more than ``max_size`` bytes.

One port carries control, TCP data and UDP data: 5301 by default, clear of iperf3 (5201),
iperf2 (5001), nuttcp (5000, 5001, 5101) and NTttcp (5000 and 5001 upward).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import select
import socket
import struct
import threading
import time
from typing import Any

import attrs

from netprobe.errors import ProtocolError
from netprobe.record import Record

DEFAULT_PORT = 5301
"""The server's TCP and UDP port."""
VERSION = 1
"""Protocol version spoken by this netprobe."""
MAGIC = b"NPRB"
MAX_MESSAGE_BYTES = 64 * 1024
"""Largest control message accepted (results of many streams fit easily)."""

KIND_CONTROL = 1
KIND_DATA = 2
KIND_UDP = 3
KIND_UDP_CHALLENGE = 4
KIND_UDP_PROOF = 5
UDP_PROOF_FEATURE = "udp_proof"
"""What a client offers in its request when it makes the UDP return-routability check."""
WARM_UP_FEATURE = "warm_up_boundary"
"""What a client offers, and a server's ``accept`` echoes, when both ends send their TCP
senders' byte counts at the warm-up's end (the ``warm-up`` message): a receiver then starts
its summary at that byte (see netprobe.engine.side.Side.peer_boundary). An end that
does not speak it is neither sent the message nor expected to send it."""
NONCE_BYTES = 16

DIRECTION_CODES = {"client_to_server": 0, "server_to_client": 1}
DIRECTION_NAMES = {code: name for name, code in DIRECTION_CODES.items()}

_HELLO = struct.Struct("!4sBBH")
_DATA = struct.Struct("!16sHBx")
HELLO_BYTES = _HELLO.size
DATA_HELLO_BYTES = _HELLO.size + _DATA.size
PROOF_BYTES = DATA_HELLO_BYTES + NONCE_BYTES
_KINDS = (KIND_CONTROL, KIND_DATA, KIND_UDP, KIND_UDP_CHALLENGE, KIND_UDP_PROOF)
_LENGTH = struct.Struct("!I")


@attrs.frozen(repr=False, eq=False)
class DataHello(Record):
    """What a data connection or UDP stream says about itself."""

    cookie: bytes
    stream_id: int
    direction: str


def pack_hello(kind: int, version: int = VERSION) -> bytes:
    """The 8-byte hello that opens every connection."""
    return _HELLO.pack(MAGIC, version, kind, 0)


def unpack_hello(data: bytes) -> int:
    """Check an 8-byte hello and return its connection kind."""
    if len(data) != HELLO_BYTES:
        raise ProtocolError("truncated hello")
    magic, version, kind, _ = _HELLO.unpack(data)
    if magic != MAGIC:
        raise ProtocolError("not a netprobe client (bad magic)")
    if version != VERSION:
        raise ProtocolError(
            f"protocol version {version} not supported (this side speaks {VERSION})"
        )
    if kind not in _KINDS:
        raise ProtocolError(f"unknown connection kind {kind}")
    return int(kind)


def pack_data_hello(kind: int, hello: DataHello) -> bytes:
    """A data (TCP or UDP) hello: the common hello plus cookie, stream and direction."""
    code = DIRECTION_CODES[hello.direction]
    return pack_hello(kind) + _DATA.pack(hello.cookie, hello.stream_id, code)


def unpack_data_hello(data: bytes) -> DataHello:
    """Decode the part of a data hello that follows the common 8 bytes."""
    if len(data) != _DATA.size:
        raise ProtocolError("truncated data hello")
    cookie, stream_id, code = _DATA.unpack(data)
    if code not in DIRECTION_NAMES:
        raise ProtocolError(f"unknown direction code {code}")
    return DataHello(cookie, stream_id, DIRECTION_NAMES[code])


def udp_nonce(key: bytes, hello: DataHello, peer: tuple) -> bytes:
    """The challenge a server sends for ``hello`` from ``peer``: a MAC under the session's
    secret ``key`` of the stream and the address and port, so the server keeps no state
    for hellos (a flood of them costs it nothing) and only who receives at ``peer`` learns
    it."""
    # Imported here: hmac loads hashlib and OpenSSL, which a TCP test's start-up need not.
    import hashlib
    import hmac

    what = f"{hello.stream_id}|{hello.direction}|{peer[0]}|{peer[1]}".encode()
    return hmac.new(key, hello.cookie + what, hashlib.sha256).digest()[:NONCE_BYTES]


def pack_challenge(hello: DataHello, nonce: bytes) -> bytes:
    """The server's 28-byte answer to a UDP hello: the nonce in the cookie's place."""
    return pack_data_hello(KIND_UDP_CHALLENGE, attrs.evolve(hello, cookie=nonce))


def pack_proof(hello: DataHello, nonce: bytes) -> bytes:
    """The client's 44-byte proof that it received the challenge: its hello, the nonce."""
    return pack_data_hello(KIND_UDP_PROOF, hello) + nonce


def unpack_udp(data: bytes) -> tuple[int, DataHello, bytes]:
    """A datagram at the server's port: (kind, hello, nonce: empty but in a proof);
    ProtocolError if it is neither a UDP hello nor a proof."""
    kind = unpack_hello(data[:HELLO_BYTES])
    size = {KIND_UDP: DATA_HELLO_BYTES, KIND_UDP_PROOF: PROOF_BYTES}.get(kind)
    if size is None or len(data) != size:
        raise ProtocolError("not a UDP hello or proof")
    return kind, unpack_data_hello(data[HELLO_BYTES:DATA_HELLO_BYTES]), data[DATA_HELLO_BYTES:]


def udp_handshake(sock: socket.socket, hello: DataHello, tries: int, wait_s: float) -> bool:
    """The client's side of a UDP stream's opening, on ``sock`` (connected to the server):
    send the hello, answer the challenge with the proof, until the server echoes the hello
    (True) or ``tries`` waits of ``wait_s`` pass (False). Datagrams can be lost: what is
    unanswered is sent again."""
    opening = pack_data_hello(KIND_UDP, hello)
    sending = opening
    sock.settimeout(wait_s)
    for _ in range(tries):
        with contextlib.suppress(OSError):
            sock.send(sending)
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                answer = sock.recv(PROOF_BYTES + 1)
            except socket.timeout:
                break
            except OSError:  # e.g. ICMP port unreachable: wait out the step, send again
                time.sleep(max(0.0, left))
                break
            if answer == opening:
                return True
            nonce = _challenge_nonce(answer, hello)
            if nonce is not None:
                sending = pack_proof(hello, nonce)
                with contextlib.suppress(OSError):
                    sock.send(sending)
    return False


def _challenge_nonce(answer: bytes, hello: DataHello) -> bytes | None:
    # The nonce of a challenge to this very hello, or None for anything else.
    if len(answer) != DATA_HELLO_BYTES or answer[:HELLO_BYTES] != pack_hello(KIND_UDP_CHALLENGE):
        return None
    try:
        said = unpack_data_hello(answer[HELLO_BYTES:])
    except ProtocolError:
        return None
    if (said.stream_id, said.direction) != (hello.stream_id, hello.direction):
        return None
    return said.cookie


def encode(message: dict[str, Any], max_size: int = MAX_MESSAGE_BYTES) -> bytes:
    """Frame one message: 4-byte length then compact JSON."""
    body = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    if len(body) > max_size:
        raise ProtocolError(f"message of {len(body)} bytes exceeds the {max_size}-byte limit")
    return _LENGTH.pack(len(body)) + body


def decode_length(header: bytes, max_size: int = MAX_MESSAGE_BYTES) -> int:
    """Read a frame's 4-byte length; refuse it if it is over the limit."""
    if len(header) != _LENGTH.size:
        raise ProtocolError("truncated frame header")
    (length,) = _LENGTH.unpack(header)
    if length > max_size:
        raise ProtocolError(f"frame of {length} bytes exceeds the {max_size}-byte limit")
    return int(length)


class _NotFinite(ValueError):
    """A number JSON cannot carry (NaN, Infinity, or one too large for a float)."""


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def _no_constant(text: str) -> float:
    raise _NotFinite(text)


def decode_body(body: bytes) -> dict[str, Any]:
    """Parse a frame's JSON body, which must be an object with a string ``type``.

    Non-finite numbers are refused: Python's decoder takes NaN, Infinity and 1e999, which
    no figure or limit may be."""
    try:
        message = json.loads(body.decode("utf-8"), parse_float=_finite,
                             parse_constant=_no_constant)
    except _NotFinite as exc:
        raise ProtocolError(f"bad message: the number {exc} is not finite") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"bad message: {type(exc).__name__}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("bad message: not an object with a 'type'")
    return message


def recv_exact(sock: socket.socket, count: int, deadline: float | None = None) -> bytes:
    """Read exactly ``count`` bytes; ProtocolError if the peer closes first.

    With ``deadline`` (time.monotonic()), the whole read must finish by then: a client
    that sends one byte at a time cannot stretch a timeout that restarts at every byte.
    """
    chunks = []
    remaining = count
    while remaining:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProtocolError("timed out")
            sock.settimeout(left)
        chunk = sock.recv(min(remaining, 65536))
        if not chunk:
            raise ProtocolError("connection closed by peer")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


class FrameReader:
    """Incremental decoder of framed messages: feed it bytes as they arrive.

    It never holds more than one frame header, one frame body of at most ``max_size``
    bytes and the unread rest of the last chunk fed, whatever a peer sends, and raises
    nothing but ProtocolError on bad input.
    """

    def __init__(self, max_size: int = MAX_MESSAGE_BYTES) -> None:
        self.max_size = max_size
        self._buffer = bytearray()
        self._length: int | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Add received bytes; return the messages they complete, in order."""
        self._buffer += data
        messages: list[dict[str, Any]] = []
        while True:
            if self._length is None:
                if len(self._buffer) < _LENGTH.size:
                    return messages
                self._length = decode_length(bytes(self._buffer[: _LENGTH.size]), self.max_size)
                del self._buffer[: _LENGTH.size]
            if len(self._buffer) < self._length:
                return messages
            body = bytes(self._buffer[: self._length])
            del self._buffer[: self._length]
            self._length = None
            messages.append(decode_body(body))


SEND_TIMEOUT_S = 10.0
"""Longest a control message may take to leave: a peer that reads takes one within a round
trip; one that has stopped reading (suspended, hostile) must not hold the sender for ever."""


QUEUE_BYTES = 2 * 1024 * 1024
"""Most a control connection queues for a peer that is behind in reading (interval samples):
at -P 128 and -i 0.1, the CLI's floor, 4 s of samples (129 of about 370 bytes a step), on
top of what the kernel's socket buffers hold. Past it samples are dropped, never waited for."""


class Channel:
    """A control connection: send and receive framed messages on a socket.

    The socket is non-blocking and every wait is a poll with its own deadline, so the
    reader thread and a sender never share (or reset) one socket timeout, and neither a
    slow sender nor a peer that stops reading can stretch one.
    """

    def __init__(self, sock: socket.socket, max_size: int = MAX_MESSAGE_BYTES) -> None:
        self.sock = sock
        self.max_size = max_size
        # Each message goes out in one write. With Nagle's algorithm a small message
        # waits for the ACK of the one before, and the peer delays that ACK by up to
        # 40 ms: "start" reached the client that late, and the receiver's clock ran
        # 40 ms before any data came (its rate 4 % low on a 1 s test).
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(0.0)
        self._reader = FrameReader(max_size)
        self._ready: list[dict[str, Any]] = []
        self._send_lock = threading.Lock()  # one writer at a time: frames never interleave
        self._queue_lock = threading.Lock()  # held only while no I/O waits
        self._queued = bytearray()  # frames (or the rest of one) not yet written
        self._broken = False

    def send(self, message: dict[str, Any], timeout: float = SEND_TIMEOUT_S) -> None:
        """Send one message within ``timeout``, after whatever :meth:`try_send` queued
        (OSError if the connection is gone, socket.timeout if the peer does not take it in
        time: the channel is then broken, as a frame may be half sent)."""
        data = encode(message, self.max_size)
        deadline = time.monotonic() + timeout
        with self._send_lock:
            with self._queue_lock:
                if not self._broken:
                    self._queued += data
            self._push_queued(deadline)

    def _push_queued(self, deadline: float | None) -> bool:
        # Under the send lock: write the queued frames, waiting until ``deadline`` for the
        # peer to take them (None: only what the socket takes now). True once all are out.
        while True:
            with self._queue_lock:
                if self._broken:
                    raise OSError(errno.EPIPE, "control connection broken by a send that timed out")
                if not self._queued:
                    return True
                with contextlib.suppress(BlockingIOError):
                    del self._queued[: self.sock.send(self._queued)]
                if not self._queued:
                    return True
            if deadline is None:
                return False
            if not _wait(self.sock, select.POLLOUT, deadline):
                self._broken = True
                raise socket.timeout("timed out sending a control message")

    def allow_frames_of(self, max_size: int) -> None:
        """Raise the frame limit both ways to ``max_size`` (never lower it): a test's
        final report grows with its stream count, past what a request may take."""
        self.max_size = max(self.max_size, max_size)
        self._reader.max_size = max(self._reader.max_size, max_size)

    def try_send(self, message: dict[str, Any]) -> bool:
        """Send a message that may be dropped, never waiting: what the socket does not take
        now is queued, and goes out with the next send. False (dropped) when the peer has
        left more than :data:`QUEUE_BYTES` unread, or the connection is broken.

        Dropping only when the socket cannot take it at once lost the samples of a client
        that reads, merely a step late (a burst of 129 at -P 128 is 48 KB, past the window
        a slowly read connection has open)."""
        data = encode(message, self.max_size)
        with self._queue_lock:
            if self._broken or len(self._queued) + len(data) > QUEUE_BYTES:
                return False
            self._queued += data
        # A send under way (it may wait up to its deadline) writes this after its own frame.
        if self._send_lock.acquire(blocking=False):
            try:
                self._push_queued(None)
            finally:
                self._send_lock.release()
        return True

    def recv(self, timeout: float | None = None) -> dict[str, Any]:
        """Receive one message; socket.timeout if it has not wholly arrived within
        ``timeout`` (a deadline: a peer trickling bytes cannot extend it).

        A timeout mid-frame loses nothing: the bytes already read stay in the reader.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ready:
            try:
                chunk = self.sock.recv(65536)
            except BlockingIOError:
                if not _wait(self.sock, select.POLLIN, deadline):
                    raise socket.timeout("timed out") from None
                continue
            if not chunk:
                raise ProtocolError("connection closed by peer")
            self._ready.extend(self._reader.feed(chunk))
        return self._ready.pop(0)

    def expect(self, kind: str, timeout: float | None = None) -> dict[str, Any]:
        """Receive one message that must be of type ``kind`` (an ``error`` is raised)."""
        message = self.recv(timeout)
        if message["type"] == "error":
            raise ProtocolError(str(message.get("message", "peer reported an error")))
        if message["type"] != kind:
            raise ProtocolError(f"expected '{kind}', got '{message['type']}'")
        return message

    def close(self) -> None:
        """Close the connection (idempotent).

        shutdown() first: a thread blocked reading this socket holds the kernel's file, so a
        bare close() would leave the connection open for as long as nothing arrives (for
        ever, on a cut link) and that thread stuck with it.
        """
        close_quietly(self.sock)


def readable(sock: socket.socket, timeout_s: float) -> bool:
    """Whether ``sock`` has something to read (data, its end, an error) within
    ``timeout_s``. poll, not select: select refuses a descriptor of 1024 or more, which a
    busy server reaches (its limit is 20,000 under the shipped unit); ValueError for a
    socket already closed, as select gave."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout_s) * 1000))


def _wait(sock: socket.socket, events: int, deadline: float | None) -> bool:
    """Poll ``sock`` for ``events`` until ``deadline`` (None: no limit); False on timeout.

    An error or hang-up counts as ready: the next call on the socket reports it."""
    poller = select.poll()
    try:
        poller.register(sock, events)
    except ValueError:  # closed by another thread (close_quietly on the way out)
        raise OSError(errno.EBADF, "control connection closed") from None
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if poller.poll(None if left is None else left * 1000):
            return True
        if left is not None and deadline is not None and time.monotonic() >= deadline:
            return False


def field(message: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """Fetch a required field of a given type from a message, or raise ProtocolError."""
    value = message.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(
            f"message '{message.get('type')}': field '{name}' missing or wrong type"
        )
    return value


def reason(exc: BaseException) -> str:
    """A short human reason for a network error: "timed out", the OS's words, or the message."""
    if isinstance(exc, socket.timeout):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def close_quietly(*socks: socket.socket | None) -> None:
    """Close sockets, ignoring errors (used on every exit path).

    shutdown() first: it wakes any thread still blocked reading the socket, which would
    otherwise hold the connection open after close().
    """
    for sock in socks:
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
