"""The native test on the server: the handler of a ``test`` request
(:func:`native_test`), one :class:`NativeTest` per test: its streams gathered by cookie,
run through a :class:`~netprobe.engine.side.Side` and a
:class:`~netprobe.engine.conduct.Conductor`, its end logged.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time

from netprobe.engine import protocol
from netprobe.engine.admission import test_memory
from netprobe.engine.conduct import REPORT_WAIT_S, Conductor, Reader
from netprobe.engine.handlers import ControlConnection
from netprobe.engine.log import client, escape
from netprobe.engine.protocol import DataHello, close_quietly, readable
from netprobe.engine.side import LocalStream, Side
from netprobe.engine.sockets import apply_options, udp_answer
from netprobe.errors import ProtocolError, SpecError
from netprobe.schema import Interval, TestSpec

WATCHDOG_GRACE_S = 5.0  # past the planned end and the report wait: the session is closed


def native_test(control: ControlConnection, request: dict) -> None:
    """The ``test`` request's handler: check the spec, hold a slot, run the test."""
    spec = control.checked_spec(request)
    features = request.get("features")
    if spec.protocol == "udp":
        control.require_udp_proof(request)
    keyed = isinstance(features, list) and "sequence_base" in features
    shared = isinstance(features, list) and protocol.WARM_UP_FEATURE in features
    with control.slot(spec, memory=test_memory(spec)):
        NativeTest(control, spec, secrets.randbits(64) if keyed else 0, shared).serve()


class NativeTest:
    """One native test on the server (an Attachable: its data arrives by cookie)."""

    def __init__(self, control: ControlConnection, spec: TestSpec, sequence_base: int,
                 shared_boundary: bool) -> None:
        self.control = control
        self.spec = spec
        self.control_peer = control.control_peer
        self.local_address = control.local_address
        self.udp_key = control.udp_key
        self._sequence_base = sequence_base
        self._shared_boundary = shared_boundary  # the client sends and takes the warm-up
        self._streams: dict[tuple[int, str], socket.socket] = {}
        self._lock = threading.Lock()
        self._complete = threading.Event()
        self._expected = len(spec.flow_directions()) * spec.streams

    def serve(self) -> None:
        """Accept the test, gather its streams, run it, report; the streams closed after."""
        spec, server, channel = self.spec, self.control.server, self.control.channel
        who = client(self.control.peer)
        server.log(f"{who}: native test {spec_words(spec)}", event="test", client=who,
                   tool="native", spec=spec_words(spec))
        cookie = secrets.token_bytes(16)
        server.register(cookie, self)
        try:
            # The UDP sequence base keys the test's datagrams (see np_udp.c); an old client
            # that does not ask for one numbers from 0.
            channel.send({"type": "accept", "cookie": cookie.hex(),
                          "sequence_base": self._sequence_base,
                          "features": [protocol.WARM_UP_FEATURE]
                          if self._shared_boundary else []})
            self._run_test(spec)
        finally:
            server.unregister(cookie)
            with self._lock:
                close_quietly(*self._streams.values())

    def attach(self, hello: DataHello, sock: socket.socket) -> bool:
        """Take a TCP data connection for this test; False if it does not belong."""
        if self.spec.protocol != "tcp":
            return False
        return self._add(hello, sock)

    def attach_udp(self, hello: DataHello, peer: tuple, datagram: bytes) -> None:
        """Open this test's UDP socket for a stream (connected to the client) and ack."""
        if self.spec.protocol != "udp":
            return
        with self._lock:
            known = (hello.stream_id, hello.direction) in self._streams
        if known:
            return  # a retried hello: the client will see our ack on the stream socket
        try:
            sock = udp_answer(self.control.channel.sock.family, self.local_address,
                              self.control.server.port, peer, datagram)
        except OSError:
            return
        if not self._add(hello, sock):
            close_quietly(sock)

    def _add(self, hello: DataHello, sock: socket.socket) -> bool:
        valid = 1 <= hello.stream_id <= self.spec.streams
        if not valid or hello.direction not in self.spec.flow_directions():
            return False
        with self._lock:
            if (hello.stream_id, hello.direction) in self._streams:
                return False
            self._streams[(hello.stream_id, hello.direction)] = sock
            if len(self._streams) == self._expected:
                self._complete.set()
        return True

    def _wait_streams(self) -> None:
        # The client may give up while opening streams; notice at once and free the slot.
        channel = self.control.channel
        end = time.monotonic() + self.control.server.config.handshake_timeout_s
        while not self._complete.wait(0.1):
            if _peer_closed(channel.sock):
                raise ProtocolError("client left before opening its streams")
            if time.monotonic() > end:
                channel.send({"type": "error", "code": "streams",
                              "message": "not every data stream arrived in time"})
                raise ProtocolError("data streams missing")

    def _run_test(self, spec: TestSpec) -> None:
        self._wait_streams()
        streams = self._local_streams(spec)
        channel = self.control.channel
        reader = Reader(channel)
        forward = _Forwarder()
        side = Side(spec, streams, on_interval=forward)
        side.shared_boundary = self._shared_boundary
        # A byte-count test has no planned end; the duration limit still bounds it.
        planned = spec.planned_s() or self.control.server.config.max_duration_s
        conductor = Conductor(channel, reader, side, lambda _s: None, planned)
        forward.conductor = conductor
        # Whatever the client does, the session ends by the planned end plus the report
        # wait and a grace: the watchdog closes the connection, which wakes every thread
        # of the session that is blocked on it.
        limit = planned + REPORT_WAIT_S + WATCHDOG_GRACE_S
        watchdog = threading.Timer(limit, self._expire, (side,))
        watchdog.daemon = True
        watchdog.start()
        try:
            conductor.send({"type": "start"})
            side.start()
            outcome = conductor.run()
            side.stop()
            side.wait(2.0)
            if outcome.error is None:
                reader.get(5.0)  # the client's bye (or its close)
        finally:
            watchdog.cancel()
        self._log_end(side, outcome.error)

    def _log_end(self, side: Side, error: str | None) -> None:
        who, status = client(self.control.peer), "failed" if error else "ok"
        figures = _side_words(side)
        words = f"{status}, {figures}" + (f": {escape(error)}" if error else "")
        self.control.server.log(f"{who}: test ended {words}", event="test-end", client=who,
                                status=status, measured=figures, error=error)

    def _expire(self, side: Side) -> None:
        who = client(self.control.peer)
        self.control.server.log(f"{who}: test past its planned end: session closed",
                                event="watchdog", client=who)
        side.stop()
        self.control.channel.close()

    def _local_streams(self, spec: TestSpec) -> list[LocalStream]:
        streams = []
        for (stream_id, direction), sock in sorted(self._streams.items()):
            role = "receiver" if direction == "client_to_server" else "sender"
            sock.settimeout(None)
            try:
                apply_options(sock, spec)
            except SpecError as exc:
                self.control.channel.send({"type": "error", "code": "option",
                                           "message": str(exc)})
                raise
            stream = LocalStream(stream_id, direction, role, sock)
            stream.counters.sequence_base = self._sequence_base
            streams.append(stream)
        return streams


class _Forwarder:
    """Sends the server's interval samples to the client as they are taken."""

    def __init__(self) -> None:
        self.conductor: Conductor | None = None

    def __call__(self, sample: Interval) -> None:
        if self.conductor is not None:
            self.conductor.send_interval(sample)


def spec_words(spec: TestSpec) -> str:
    """A spec in short, for a log line: ``tcp normal x4 10 s`` (escaped: from a client)."""
    span = f"{spec.bytes_total} bytes" if spec.bytes_total else f"{spec.duration_s:g} s"
    return escape(f"{spec.protocol} {spec.direction} x{spec.streams} {span}")


def _side_words(side: Side) -> str:
    # What this end measured: received (a receiver's figure) and sent, per direction.
    words = []
    for role, verb in (("receiver", "received"), ("sender", "sent")):
        parts = [summary for stream, summary in side.stream_summaries() if stream.role == role]
        if parts:
            nbytes = sum(p.bytes for p in parts)
            span = max(p.end_s for p in parts) - min(p.start_s for p in parts)
            rate = nbytes * 8 / span / 1e6 if span > 0 else 0.0
            words.append(f"{verb} {nbytes} bytes at {rate:.1f} Mbit/s")
    return "; ".join(words) or "nothing measured"


def _peer_closed(sock: socket.socket) -> bool:
    """True if the peer has closed the connection (readable with nothing to read)."""
    if not readable(sock, 0):
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
