"""The client's half of the latency probes: :class:`Prober` sends probes at a steady rate
beside a test, matches the echoes and returns a :class:`~netprobe.latency.figures.ProbeLog`
(wire format: :mod:`netprobe.engine.probes`).
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter

import attrs

from netprobe import core
from netprobe.engine import protocol
from netprobe.engine.probes import (
    DEFAULT_RATE_HZ,
    HELLO_TRIES,
    HELLO_WAIT_S,
    KIND_ECHO,
    KIND_PROBE,
    REQUEST,
    Probe,
    Transport,
    address_family,
    decode_received,
    pack,
    unpack,
)
from netprobe.engine.protocol import Channel, DataHello, close_quietly, readable
from netprobe.errors import NetprobeError, ProtocolError, TestFailed
from netprobe.latency.figures import Phase, ProbeLog, ProbeSample


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
        self._channel: Channel | None = None
        self._key = b""
        self._max_probes = 0
        self._transport: Transport | None = None
        self._stop_sending = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

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
    def transport(self) -> Transport | None:
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
            if readable(transport.sock, wait) and not self._receive(transport):
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

    def _server_report(self) -> frozenset[int] | None:
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

    def _log(self, received: frozenset[int] | None) -> ProbeLog:
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
