"""Latency under load against a stock ``iperf3 -s``: TCP handshake times to its port.

A stock iperf3 server has no echo for netprobe's probes, but while it runs a test it
answers every further connection to its port the same way: the kernel completes the
handshake, the server accepts, writes one byte (0xFF, "busy") without reading anything
and closes (``iperf_server_api.c iperf_accept``, 3.9 to 3.21). The handshake's time is
a round trip through the loaded path: the responsiveness draft's "foreign" probe.

What keeps the probes from disturbing the test (each checked live, 3.9 to 3.21):

* they are sent only while the test runs (after TEST_RUNNING, none after TEST_END): an
  extra connection during stream set-up would be taken for a data stream, and one the
  server accepts after the test would be taken for the next client;
* each is closed only once the server answered (its byte or its close), and then with a
  FIN: iperf3 3.9 ends the running test when writing the busy byte fails, which it does
  on a connection already reset (3.10 on ignore that failure);
* before the client says IPERF_DONE every probe is settled, so no probe waits in the
  server's accept queue when it goes back to listening;
* the first probe goes alone, and the rest only if it was answered busy: a far end that
  answers otherwise (a server serving several tests, as ``netprobe server --iperf3``,
  takes a connection for a new client) gets no more.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import threading
import time

import attrs

from netprobe.latency import figures
from netprobe.latency.figures import Phase, ProbeLog, ProbeSample
from netprobe.schema import Interval, Result

BUSY = b"\xff"
CONNECT_S = 3.0  # a handshake unanswered this long is lost (one SYN resend is 1 s)
ANSWER_S = 5.0  # how long a handshake waits for the server's busy byte
MAX_IN_FLIGHT = 16  # probes open at once, at most
POLL_S = 0.02


class HandshakeProbes:
    """TCP handshakes to a stock iperf3 server's port at ``rate_hz``, on a thread of their
    own, between :meth:`start` and :meth:`stop`; :meth:`settle` waits until the server
    answered every one. Times are monotonic seconds since ``zero``."""

    def __init__(self, family: int, address: tuple, bind_address: str | None,
                 rate_hz: float, zero: float) -> None:
        self.family = family
        self.address = address
        self.bind_address = bind_address
        self.step_s = 1.0 / rate_hz
        self.zero = zero
        self.samples: list[ProbeSample] = []
        self.idle: list[tuple[float, float]] = []  # (sent, rtt) of the test's own handshakes
        self.refused: str | None = None  # why probing stopped early (the far end's answer)
        self.unsettled = 0  # probes the server had not answered by the end
        self.loaded_from: float | None = None
        self.loaded_until: float | None = None
        self._launching = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._selector = selectors.DefaultSelector()
        # socket -> [seq, sent_at, connected_at or None]
        self._open: dict[socket.socket, list] = {}
        self._gate_open = False

    def connected(self, sent_at: float, rtt_s: float) -> None:
        """One of the test's own handshakes (control or data, before any load): the idle
        baseline, since probing an idle stock server would take its one test's place."""
        self.idle.append((sent_at - self.zero, rtt_s))

    def start(self) -> None:
        """Start probing (the test runs)."""
        self.loaded_from = time.monotonic() - self.zero
        self._launching.set()
        self._thread = threading.Thread(target=self._run, name="np-i3-probes", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Send no more probes (the test ends)."""
        if self.loaded_until is None and self.loaded_from is not None:
            self.loaded_until = time.monotonic() - self.zero
        self._launching.clear()

    def settle(self, timeout: float = ANSWER_S) -> None:
        """Wait (at most ``timeout``) until the server answered every probe; then close
        what is left (``unsettled`` counts it)."""
        self.stop()
        if self._thread is not None:
            self._thread.join(timeout)  # it ends once every probe was answered
        self.close()

    def close(self) -> None:
        """Stop the thread, then close every probe socket left (FIN, never a reset)."""
        self.stop()
        self._done.set()
        if self._thread is not None:
            self._thread.join(5 * POLL_S + 1.0)  # it looks at the flag every POLL_S
        for sock in list(self._open):
            self.unsettled += 1
            self._finish(sock, None)
        with contextlib.suppress(OSError, RuntimeError):
            self._selector.close()

    def log(self) -> ProbeLog:
        """The samples as a probe log: the idle phase (the test's own handshakes), the
        loaded one (the probes)."""
        loaded_from = self.loaded_from if self.loaded_from is not None else 0.0
        # The first contact (the control connection) may wait for the neighbour's address
        # to be resolved (9.3 and 3.2 ms across a fresh veth, the data connection after it
        # 0.05): it is the baseline only where it is the only handshake (UDP).
        baseline = self.idle[1:] if len(self.idle) > 1 else self.idle
        idle = [ProbeSample(seq=n, phase=0, sent_s=sent, rtt_us=rtt * 1e6)
                for n, (sent, rtt) in enumerate(baseline)]
        loaded = [ProbeSample(seq=len(idle) + s.seq, phase=1, sent_s=s.sent_s,
                              rtt_us=s.rtt_us) for s in self.samples]
        phases = (Phase("idle", False, 0.0, loaded_from),
                  Phase("loaded", True, loaded_from, self.loaded_until))
        loaded.sort(key=lambda sample: sample.seq)
        return ProbeLog(samples=tuple(idle + loaded), phases=phases, transport="tcp-connect")

    def interval(self, sample: Interval, t0: float) -> Interval:
        """A live interval (its clock starting at the monotonic ``t0``) with the round
        trips of the probes answered within it so far."""
        start_s = t0 - self.zero
        rtts = figures.answered_between(list(self.samples), start_s + sample.start_s,
                                        start_s + sample.end_s)
        return figures.with_interval_latency(sample, rtts)

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        next_at = time.monotonic()
        sent = 0
        while not self._done.is_set():
            now = time.monotonic()
            may = self._launching.is_set() and self.refused is None and \
                (self._gate_open or sent == 0)
            if may and now >= next_at and len(self._open) < MAX_IN_FLIGHT:
                self._launch(sent, now)
                sent += 1
                next_at = max(next_at + self.step_s, now)
            if not self._launching.is_set() and not self._open:
                return  # stopped, and every probe answered
            wait = max(0.0, min(POLL_S, next_at - time.monotonic())) if may else POLL_S
            for key, _ in self._selector.select(wait):
                self._ready(key.fileobj)  # type: ignore[arg-type]
            self._expire(time.monotonic())

    def _launch(self, seq: int, now: float) -> None:
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            if self.bind_address:
                sock.bind((self.bind_address, 0))
            code = sock.connect_ex(self.address)
        except OSError:
            sock.close()
            self.samples.append(ProbeSample(seq=seq, phase=1, sent_s=now - self.zero))
            return
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            self.samples.append(ProbeSample(seq=seq, phase=1, sent_s=now - self.zero))
            return
        self._open[sock] = [seq, now, None]
        self._selector.register(sock, selectors.EVENT_WRITE)

    def _ready(self, sock: socket.socket) -> None:
        state = self._open.get(sock)
        if state is None:
            return
        now = time.monotonic()
        if state[2] is None:  # the handshake ended
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self._finish(sock, None)
                return
            state[2] = now
            self._selector.modify(sock, selectors.EVENT_READ)
            return
        try:
            answer = sock.recv(1)
        except BlockingIOError:
            return
        except OSError:
            answer = b""
        if not self._gate_open and answer != BUSY:
            self.refused = ("the server did not answer a second connection busy, as a stock "
                            "iperf3 server does while it runs a test: no more probes")
        elif answer == BUSY:
            self._gate_open = True
        self._finish(sock, state[2] - state[1])

    def _expire(self, now: float) -> None:
        for sock, (_, sent_at, connected_at) in list(self._open.items()):
            if connected_at is None and now - sent_at > CONNECT_S:
                self._finish(sock, None)  # closed before the server could accept it
            elif connected_at is not None and now - connected_at > ANSWER_S \
                    and not self._gate_open:
                self.refused = ("the server did not answer a second connection within "
                                f"{ANSWER_S:g} s, as a stock iperf3 server does: no more "
                                "probes")
                self._finish(sock, connected_at - sent_at)

    def _finish(self, sock: socket.socket, rtt_s: float | None) -> None:
        state = self._open.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError, OSError, RuntimeError):
            self._selector.unregister(sock)
        sock.close()  # no SO_LINGER 0: a FIN, after the server's write where it wrote
        if state is not None:
            self.samples.append(ProbeSample(
                seq=state[0], phase=1, sent_s=state[1] - self.zero,
                rtt_us=None if rtt_s is None else rtt_s * 1e6))


def with_probes(result: Result, probes: HandshakeProbes, t0: float | None) -> Result:
    """The result with the handshakes' latency (``Result.latency``: idle and loaded
    phases, increase, RPM, grade) and each interval's, its test clock starting at the
    monotonic ``t0``; a warning where probing stopped early or probes went unanswered."""
    warnings = list(result.warnings)
    if probes.refused:
        warnings.append(f"latency probes: {probes.refused}")
    if probes.unsettled:
        warnings.append(f"latency probes: {probes.unsettled} not answered by the server "
                        "before the test ended")
    log = probes.log()
    if not any(s.phase == 1 for s in log.samples):
        return attrs.evolve(result, warnings=tuple(warnings))
    start_s = (t0 - probes.zero) if t0 is not None else (probes.loaded_from or 0.0)
    summary = attrs.evolve(figures.summarize(log), test_start_s=round(start_s, 4))
    intervals = tuple(
        figures.with_interval_latency(i, figures.answered_between(
            log.samples, start_s + i.start_s, start_s + i.end_s))
        for i in result.intervals)
    return attrs.evolve(result, latency=summary, intervals=intervals,
                        warnings=tuple(warnings))
