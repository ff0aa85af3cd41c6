"""One stock iperf3 client's test on netprobe's server: parameter exchange, the limits and
the ACL as iperf3's numeric errors, the data streams (handed over by cookie), the client's
end of test, the results exchange, and the server's own Result logged."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

from netprobe.engine.iperf3 import udp, wire
from netprobe.engine.iperf3.record import server_result
from netprobe.engine.iperf3.streams import Stream
from netprobe.engine.log import client, escape
from netprobe.engine.sockets import IPV6_TCLASS, TCP_CONGESTION, congestion_of
from netprobe.errors import NetprobeError
from netprobe.host import utc_now_iso

SAFETY_S = 40.0  # past time + omit, as iperf3 3.21's own watchdog
CONTROL_READ_S = 30.0  # iperf3's overall bound on one control read
FIRST_STREAM_ID = 1


class Refused(Exception):
    """A test refused with iperf3's code ``code`` (logged with ``reason``)."""

    def __init__(self, code: int, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.kind = kind


class Iperf3Test:
    """One client's control connection, from its cookie to its close."""

    def __init__(self, service: Any, conn: socket.socket, peer: tuple, cookie: bytes) -> None:
        self.service = service
        self.server = service.server
        self.conn = conn
        self.peer = peer
        self.cookie = cookie
        self.who = client(peer)
        self.params: wire.Params | None = None
        self.streams: list[Any] = []  # Stream (TCP) or udp.UdpStream
        self.congestion: str | None = None  # what the TCP streams run (congestion_used)
        self._pending: list[tuple[int, socket.socket]] = []  # (accept order, connection)
        self._arrived = threading.Condition()
        self._expected = 0

    # -- data connections (called from the service's threads) ----------------------

    def attach(self, sock: socket.socket, peer: tuple, order: int) -> bool:
        """Take a data connection that carried this test's cookie, ``order`` being its
        place in the listener's accept order; False if it is not wanted (from another
        address, or more than the test opens)."""
        if not self.server.data_peer_ok(self.peer, peer):
            return False  # no reflection: data only from (and to) the control's peer
        with self._arrived:
            if len(self._pending) >= self._expected:
                return False
            self._pending.append((order, sock))
            self._arrived.notify_all()
        return True

    # -- the test ---------------------------------------------------------------------

    def run(self) -> None:
        """Serve the test; every way out closes the data connections and frees the slot."""
        key = id(self)
        took = False
        try:
            self.conn.settimeout(self.server.config.handshake_timeout_s)
            if self.server.admission.active_tests >= self.server.config.max_tests:
                self._busy(f"{self.server.config.max_tests} test(s) running")
                return  # told before its params, as a stock server tells a second client
            wire.send_state(self.conn, wire.PARAM_EXCHANGE)
            params = self._read_params()
            self._check_limits(params)
            reason = self.server.admission.take(key, self._doing(params), self._memory(params),
                                                self._rate(params), self._stream_count(params))
            if reason is not None:
                self._busy(reason)
                return
            took = True
            self._serve(params)
        except Refused as exc:
            self.service.count("refused")
            self.server.log_limited(f"{self.who}: iperf3 test refused: {exc.reason} (iperf3 "
                                    f"error {exc.code})", event="refused", client=self.who,
                                    reason=exc.kind, code=exc.code)
            with contextlib.suppress(OSError):
                self.conn.sendall(wire.error_frame(exc.code))
        except (OSError, NetprobeError) as exc:
            self.server.log(f"{self.who}: iperf3 session ended: {escape(exc)}",
                            event="session", client=self.who)
        finally:
            self.service.forget(self.cookie)
            for stream in self.streams:
                stream.stop.set()
            with self._arrived:
                extra, self._pending = self._pending, []
            for sock in [*(sock for _, sock in extra), *(s.sock for s in self.streams)]:
                with contextlib.suppress(OSError):
                    sock.close()
            wire.sync_close(self.conn)
            if took:
                self.server.admission.release(key)

    def _busy(self, reason: str) -> None:
        self.service.count("busy")
        self.server.log_limited(f"{self.who}: iperf3 client told busy: {reason}",
                                event="busy", client=self.who, reason=reason)
        with contextlib.suppress(OSError):
            wire.send_state(self.conn, wire.ACCESS_DENIED)

    def _read_params(self) -> wire.Params:
        try:
            raw = wire.read_json(self.conn, wire.MAX_PARAMS_BYTES)
        except (OSError, wire.WireError) as exc:
            raise Refused(wire.IERECVPARAMS, f"no usable params: {escape(exc)}",
                          "protocol") from None
        params = wire.parse_params(raw)
        self._check_auth(raw)
        broken = wire.check_params(params)
        if broken is not None:
            raise Refused(broken[0], broken[1], "params")
        self.params = params
        return params

    def _check_auth(self, raw: dict) -> None:
        """With authentication configured, only a valid ``authtoken`` passes; without it,
        a client that sends one is told so (as a stock server built without OpenSSL)."""
        # Keys are matched without case, as a stock server's JSON lookup does.
        tokens = [value for key, value in raw.items() if key.lower() == "authtoken"]
        auth = self.service.auth
        if auth is None:
            if tokens:
                raise Refused(wire.IEAUTHTEST, "the client sent an authtoken: this server "
                              "has no --rsa-private-key-path/--authorized-users-path",
                              "auth")
            return
        why = auth.check(tokens[0]) if tokens else "the client sent no authtoken"
        if why is not None:
            raise Refused(wire.IEAUTHTEST, f"authentication failed: {why}", "auth")

    def _check_limits(self, p: wire.Params) -> None:
        cfg = self.server.config
        bounded = p.time > 0 or p.num > 0 or p.blockcount > 0
        if not bounded or p.time + p.omit > cfg.max_duration_s:
            raise Refused(wire.IEMAXSERVERTESTDURATIONEXCEEDED,
                          f"test of {p.time + p.omit} s (time + omit; 0: unbounded) over "
                          f"--max-duration {cfg.max_duration_s:g} s", "duration")
        if self._stream_count(p) > cfg.max_streams:
            raise Refused(wire.IENUMSTREAMS, f"{self._stream_count(p)} streams over "
                          f"--max-streams {cfg.max_streams}", "streams")
        for limit, flag, asked in ((cfg.max_rate_bps, "--max-rate", self._rate(p)),
                                   (cfg.max_stream_rate_bps, "--max-stream-rate",
                                    float(p.bandwidth))):
            if limit and (not p.bandwidth or asked > limit):
                words = f"{asked / 1e6:.4g} Mbit/s" if p.bandwidth else "an unlimited rate"
                raise Refused(wire.IETOTALRATE, f"{words} over {flag} "
                              f"{limit / 1e6:.4g} Mbit/s", "rate")

    @staticmethod
    def _stream_count(p: wire.Params) -> int:
        return p.parallel * len(p.directions)

    def _rate(self, p: wire.Params) -> float:
        return float(p.bandwidth * self._stream_count(p))

    def _memory(self, p: wire.Params) -> int:
        return self._stream_count(p) * (p.length + 2 * p.window)

    def _doing(self, p: wire.Params) -> dict:
        return {"kind": "iperf3", "tool": "iperf3", "peer": self.peer[0],
                "protocol": "udp" if p.udp else "tcp", "streams": p.parallel,
                "duration_s": p.time}

    def _serve(self, p: wire.Params) -> None:
        started_wall = utc_now_iso()
        self._expected = self._stream_count(p)
        if p.udp:
            socks = self._udp_streams()
        else:
            self.service.remember(self.cookie, self)
            wire.send_state(self.conn, wire.CREATE_STREAMS)
            socks = self._wait_streams()
        self.streams = self._make_streams(p, socks)
        wire.send_state(self.conn, wire.TEST_START)
        wire.send_state(self.conn, wire.TEST_RUNNING)
        self.server.log(f"{self.who}: iperf3 test {_words(p)}", event="test",
                        client=self.who, tool="iperf3")
        cpu0, t0 = time.process_time(), time.monotonic()
        for stream in self.streams:
            stream.start()
        state, omit_end = self._wait_end(p, t0)
        duration = max(1e-6, time.monotonic() - max(t0, omit_end or t0))
        # Every stream's count ends now, at once: finish() joins one stream at a time (up
        # to DRAIN_S each), and the streams not yet told counted on meanwhile (-P 4 across
        # a 100 Mbit/s link read 101 Mbit/s).
        for stream in self.streams:
            stream.stop.set()
        for stream in self.streams:
            stream.finish()
        cpu = 100.0 * (time.process_time() - cpu0) / max(1e-6, time.monotonic() - t0)
        if state != wire.TEST_END:
            self._log_result(p, started_wall, duration, cpu, None,
                             f"the client ended the test early (state {state})")
            return
        self.conn.settimeout(CONTROL_READ_S)
        wire.send_state(self.conn, wire.EXCHANGE_RESULTS)
        theirs = wire.read_json(self.conn, wire.MAX_RESULTS_BYTES)
        wire.send_json(self.conn, self._results(p, duration, cpu))
        wire.send_state(self.conn, wire.DISPLAY_RESULTS)
        with contextlib.suppress(OSError, wire.WireError):
            wire.read_state(self.conn)  # IPERF_DONE (or a close): the test is over either way
        self.service.count("served")
        self._log_result(p, started_wall, duration, cpu, theirs, None)

    def _udp_streams(self) -> list[socket.socket]:
        # UDP carries no cookie: one client at a time sets its streams up on the port.
        timeout = self.server.config.handshake_timeout_s
        if not self.service.udp_setup.acquire(timeout=timeout):
            raise wire.WireError("another client's UDP setup did not end in time")
        try:
            return udp.open_streams(
                self.conn.getsockname()[0], self.service.port, self._expected,
                lambda source: self.server.data_peer_ok(self.peer, source), timeout,
                lambda: wire.send_state(self.conn, wire.CREATE_STREAMS))
        finally:
            self.service.udp_setup.release()

    def _wait_streams(self) -> list[socket.socket]:
        deadline = time.monotonic() + self.server.config.handshake_timeout_s
        with self._arrived:
            while len(self._pending) < self._expected:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise wire.WireError(f"{len(self._pending)} of {self._expected} data "
                                         "streams arrived in time (--handshake-timeout)")
                self._arrived.wait(left)
            arrived, self._pending = self._pending, []
        # in accept order: the cookies' threads may have finished in another
        return [sock for _, sock in sorted(arrived, key=lambda pair: pair[0])]

    def _make_streams(self, p: wire.Params, socks: list[socket.socket]) -> list[Any]:
        # Roles in accept order: the receivers first (the client opens its sending streams
        # first), then the senders; ids 1, 3, 4, ... as iperf3 numbers them (2 is skipped).
        receivers = p.parallel if "client_to_server" in p.directions else 0
        streams: list[Any] = []
        for index, sock in enumerate(socks):
            stream_id = FIRST_STREAM_ID if index == 0 else index + 2
            _mark(sock, p)
            if p.udp:
                streams.append(udp.UdpStream(sock, stream_id, index >= receivers, p.length,
                                             p.bandwidth, p.udp_counters_64bit))
                continue
            _apply_options(sock, p)
            self.congestion = self.congestion or congestion_of(sock)
            streams.append(Stream(sock, stream_id, index >= receivers, p.length,
                                  p.bandwidth))
        return streams

    def _wait_end(self, p: wire.Params, t0: float) -> tuple[int | None, float | None]:
        """The client's state that ends the test (None: it went away or ran over)."""
        limit = (p.time if p.time else self.server.config.max_duration_s) + p.omit + SAFETY_S
        omit_end = t0 + p.omit if p.omit else None
        omitted = omit_end is None
        while True:
            now = time.monotonic()
            if not omitted and omit_end is not None and now >= omit_end:
                for stream in self.streams:
                    stream.end_omit()
                omitted = True
            if now - t0 >= limit:
                with contextlib.suppress(OSError):
                    self.conn.sendall(wire.error_frame(wire.IESERVERTESTDURATIONEXPIRED))
                return None, omit_end
            wait = limit - (now - t0)
            if not omitted and omit_end is not None:
                wait = min(wait, omit_end - now)
            self.conn.settimeout(max(0.01, wait))
            try:
                return wire.read_state(self.conn), omit_end
            except socket.timeout:
                continue
            except (OSError, wire.WireError):
                return None, omit_end  # the client vanished: end now, free the slot

    def _results(self, p: wire.Params, duration: float, cpu: float) -> dict:
        sending = any(s.sending for s in self.streams) and not p.udp
        rows = [wire.stream_row(s.stream_id, s.counted,
                                (s.retransmits or 0) if sending else -1, duration,
                                jitter_s=getattr(s, "jitter_s", 0),
                                errors=getattr(s, "errors", 0),
                                packets=getattr(s, "packets", 0)) for s in self.streams]
        results = wire.results_message(cpu, cpu, 0.0, 1 if sending else -1, rows)
        if self.congestion:
            results["congestion_used"] = self.congestion
        if p.get_server_output:
            total = sum(s.counted for s in self.streams)
            results["server_output_text"] = (f"netprobe server: {total} bytes in "
                                             f"{duration:.3f} s\n")
        return results

    def _log_result(self, p: wire.Params, started: str, duration: float, cpu: float,
                    theirs: dict | None, error: str | None) -> None:
        result = server_result(p, self.peer, self.conn, self.streams, started, duration,
                               cpu, theirs, error)
        self.service.record(result)
        total = sum(s.counted for s in self.streams)
        self.server.log(f"{self.who}: iperf3 test ended: {total} bytes in {duration:.2f} s, "
                        f"{total * 8 / duration / 1e6:.1f} Mbit/s"
                        + (f" ({error})" if error else ""), event="test-end",
                        client=self.who, tool="iperf3", bytes=total,
                        bits_per_second=total * 8 / duration, error=error)


def _apply_options(sock: socket.socket, p: wire.Params) -> None:
    # One listener serves every client, so -w/-N/-M apply after accept (the window scale
    # came from the listener's defaults).
    with contextlib.suppress(OSError):
        if p.window:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, p.window)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, p.window)
        if p.nodelay:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if p.mss:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, p.mss)
    if p.congestion:
        # An algorithm the kernel lacks only warns in iperf3: the test runs on the default.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, p.congestion.encode())


def _mark(sock: socket.socket, p: wire.Params) -> None:
    # -S: what this end sends carries the client's TOS (its reverse and bidir streams);
    # the range was checked with the params (IEBADTOS).
    if not p.tos:
        return
    with contextlib.suppress(OSError):
        if sock.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_TCLASS, p.tos)
        else:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, p.tos)


def _words(p: wire.Params) -> str:
    direction = "bidir" if p.bidirectional else "reverse" if p.reverse else "normal"
    return (f"{'udp' if p.udp else 'tcp'} {direction}, {p.parallel} stream(s), {p.time} s, "
            f"omit {p.omit} s, "
            f"len {p.length}, window {p.window or 'default'}")
