"""The server's half of the latency probes: the ``latency`` request's handler
(:class:`ProbeService`, one per server, bounding the sessions) and each session's
:class:`Echo`, which answers the probes of its cookie (wire format:
:mod:`netprobe.engine.probes`).
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
from collections import Counter
from typing import Any

import attrs

from netprobe.engine.handlers import ControlConnection
from netprobe.engine.probes import (
    GRACE_S,
    KIND_ECHO,
    KIND_PROBE,
    MAX_PROBES,
    MAX_RATE_HZ,
    MAX_SESSIONS,
    Bitmap,
    Transport,
    pack,
    unpack,
)
from netprobe.engine.protocol import DataHello, close_quietly, readable
from netprobe.engine.sockets import udp_answer


class Echo:
    """The server's end of one probe session: registered under its cookie, it takes the
    session's UDP hello (or TCP connection) and echoes valid probes until closed."""

    def __init__(self, cookie: bytes, control: ControlConnection, max_probes: int,
                 rate_hz: float) -> None:
        self.key = cookie
        self.family = control.channel.sock.family
        self.local_address = control.local_address
        self.control_peer = control.peer
        self.udp_key = secrets.token_bytes(16)
        self.port = control.server.port
        self.received = Bitmap(max_probes)
        self.bad: Counter[str] = Counter()
        self.max_probes = max_probes
        # Echo at most twice the asked rate (plus a burst): never a reflector for a flood.
        self._budget = _TokenBucket(2 * rate_hz, burst=20)
        self._transport: Transport | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

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
            if not readable(transport.sock, 0.25):
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

    def answer(self, data: bytes, rx_ns: int) -> bytes | None:
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

    def __call__(self, control: ControlConnection, request: dict) -> None:
        """Serve one probe session until the client is done, gone or late."""
        rate, duration = _checked_request(control, request)
        if not self._slots.acquire(blocking=False):
            control.refuse(f"server busy: {MAX_SESSIONS} latency probe sessions running", "busy")
        try:
            _serve(control, rate, duration)
        finally:
            self._slots.release()


def _checked_request(control: ControlConnection, request: dict) -> tuple[float, float]:
    rate, duration = request.get("rate_hz"), request.get("duration_s")
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0 < rate <= MAX_RATE_HZ:
        control.refuse(f"latency probe rate must be above 0 and at most {MAX_RATE_HZ:g} per s")
    limit = control.server.config.max_duration_s
    if not isinstance(duration, (int, float)) or isinstance(duration, bool) or duration <= 0:
        control.refuse("latency probe duration must be a positive number of seconds")
    if duration > limit:
        control.refuse(f"duration {duration:g} s exceeds this server's limit of {limit:g} s")
    control.require_udp_proof(request)
    return float(rate), float(duration)


def _serve(control: ControlConnection, rate: float, duration: float) -> None:
    cookie = secrets.token_bytes(16)
    max_probes = min(MAX_PROBES, int(rate * (duration + GRACE_S)) + 64)
    echo = Echo(cookie, control, max_probes, rate)
    control.server.register(cookie, echo)
    try:
        control.channel.send({"type": "latency_accept", "cookie": cookie.hex(),
                              "max_probes": max_probes})
        end = time.monotonic() + duration + GRACE_S
        while time.monotonic() < end:
            try:
                message = control.channel.recv(timeout=max(0.1, end - time.monotonic()))
            except socket.timeout:
                break
            if message.get("type") == "latency_done":
                control.channel.send(echo.report())
                return
    finally:
        control.server.unregister(cookie)
        echo.close()
