"""netprobe's engine as a client of a stock ``iperf3 -s`` (``netprobe run HOST --iperf3``).

iperf3's control sequence from the client's end: the cookie, the params, one data
connection per stream (TCP: each carries the cookie; UDP: a 4-byte hello and the server's
reply), the test on this side's clock, TEST_END, both results objects, IPERF_DONE. TCP
streams run on the native engine's :class:`~netprobe.engine.side.Side` (the C core's loops,
TCP_INFO, intervals); UDP streams need iperf3's datagram header, which the C core does not
write, so they run the Python loops of :mod:`netprobe.engine.iperf3.udp`. The far end's
figures come from the results object it sends; everything it sends is data: bounded,
checked, and never shown but as numbers.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import time
from typing import Any, Callable

from netprobe import convert, core
from netprobe.engine.assemble import build_result, cpu_by_role_of, streams_and_flows
from netprobe.engine.conduct import Outcome
from netprobe.engine.iperf3 import wire
from netprobe.engine.iperf3.handshake import HandshakeProbes, with_probes
from netprobe.engine.iperf3.udp import UdpStream
from netprobe.engine.protocol import readable
from netprobe.engine.side import SENDER_DRAIN_S, LocalStream, Side, default_length
from netprobe.engine.sockets import (
    apply_options,
    family_for,
    resolve,
    untransmitted_bytes,
)
from netprobe.engine.summary import process_cpu, sum_intervals
from netprobe.errors import NetprobeError, TestFailed
from netprobe.host import utc_now_iso
from netprobe.plugin import Reporter
from netprobe.reporting import KeptIntervals
from netprobe.schema import (
    Cpu,
    CpuUsage,
    Endpoint,
    Interval,
    RawOutput,
    Result,
    SideSummary,
    TestSpec,
    ToolInfo,
)
from netprobe.version import __version__

DEFAULT_PORT = 5201
CONNECT_TIMEOUT_S = 5.0
CONTROL_READ_S = 30.0  # a stock end's own bound on one control read
UDP_REPLY_S = 10.0  # the hello is not sent again: a stock server takes a second as a stream
UDP_EARLY_DATAGRAMS = 1000  # -R: the server's data may come before its reply; skipped
END_GRACE_S = 10.0  # past the planned end, how long the server may take to answer
STALL_S = 30.0  # -n: no byte moved for this long ends the test as failed
BUSY_WORDS = "is busy running a test"
"""How a stock server's ACCESS_DENIED is worded; the fleet reads it in the error its source
agent relays as text, to record the pair as busy, not failed."""
UDP_SETTLE_S = 0.01  # last datagram to TEST_END (the server counts this in its time)
DRAIN_S = 1.0  # how long a receiver reads on once the server said the test is over
DRAIN_QUIET_S = 0.1
POLL_S = 0.05
TRANSMIT_POLL_S = 0.001  # how often the senders' untransmitted bytes are asked, at the end
RAW_RESULTS_CHARS = 65536  # the server's results kept in the Result, at most
MIN_PEER_SECONDS = 0.001  # a stream time the server gives below this is not taken
Key = tuple[int, str, str]  # stream id, direction, role (the native engine's keys)


def client_params(spec: TestSpec, length: int, udp64: bool = False) -> dict:
    """The params object, as a stock client sends it: only true flags (a stock server
    reads a flag's presence), ``len`` and ``bandwidth`` always (omitted ones reset to the
    server's defaults, and a UDP length of its default is refused), ``time`` 0 with a
    byte count, no ``window`` for none. iperf3's ``-n`` counts all streams together;
    netprobe's counts each, so ``num`` is the count times the streams."""
    p: dict[str, Any] = {"udp" if spec.protocol == "udp" else "tcp": True,
                         "omit": math.ceil(spec.omit_s),
                         "time": 0 if spec.bytes_total else math.ceil(spec.duration_s or 0),
                         "parallel": spec.streams}
    if spec.bytes_total:
        p["num"] = spec.bytes_total * spec.streams
    if spec.direction == "reverse":
        p["reverse"] = True
    elif spec.direction == "bidir":
        p["bidirectional"] = True
    if spec.window_bytes:
        p["window"] = spec.window_bytes
    if spec.mss_bytes:
        p["MSS"] = spec.mss_bytes
    if spec.nodelay:
        p["nodelay"] = True
    p["len"] = length
    p["bandwidth"] = int(spec.rate_bits_per_second or 0)
    p["pacing_timer"] = 1000
    if udp64 and spec.protocol == "udp":
        p["udp_counters_64bit"] = 1  # a number: its presence turns it on
    if spec.dscp is not None:
        p["TOS"] = spec.dscp << 2
    if spec.congestion:
        p["congestion"] = spec.congestion
    p["client_version"] = f"netprobe {__version__}"
    return p


def _untransmitted(stream: LocalStream) -> int | None:
    """A TCP sender's bytes not yet handed to the network: -1 while its loop still writes,
    0 for a loop that ended without finishing (nothing more will go), None if unknown."""
    if stream.error is not None or (stream.ended_at is not None and stream.wrote_until is None):
        return 0
    if stream.wrote_until is None:
        return -1
    return untransmitted_bytes(stream.sock)


def iperf3_id(index: int) -> int:
    """The id iperf3 gives the ``index``-th stream opened: 1, 3, 4, 5, ... (2 skipped)."""
    return 1 if index == 0 else index + 2


class Iperf3Client:
    """One test against a stock iperf3 server, from the client's end."""

    def __init__(self, spec: TestSpec, reporter: Reporter, host: str,
                 auth: Any = None, udp64: bool = False,
                 probe_hz: float | None = None) -> None:
        self.spec = spec
        self.auth = auth  # an auth.ClientAuth: a token in the params (iperf3's RSA auth)
        self.udp64 = udp64  # --udp-counters-64bit: 64-bit sequence numbers, both ways
        self.reporter = reporter
        self.host = host
        self.port = spec.port or DEFAULT_PORT
        self.family, self.address = resolve(host, self.port, family_for(spec),
                                            socket.SOCK_STREAM)
        self.length = default_length(spec)
        self.cookie = wire.make_cookie()
        self.start_time = utc_now_iso()
        self.conn: socket.socket | None = None
        self.keys: list[Key] = []  # in connect order: index -> iperf3 id
        self.tcp: list[LocalStream] = []
        self.udp: list[UdpStream] = []
        self.kept = KeptIntervals()
        self.t0: float | None = None  # when the test's own clock began (monotonic)
        # --latency: TCP handshakes to the server's port while the test runs
        self.probes = HandshakeProbes(self.family, self.address, spec.bind_address,
                                      probe_hz, time.monotonic()) if probe_hz else None

    @property
    def where(self) -> str:
        """The server, for messages."""
        return f"the iperf3 server at {self.host}:{self.port}"

    def run(self) -> Result:
        """Run the test; TestFailed (one line) for every way it can fail."""
        try:
            return self._probed(self._run())
        except TestFailed as exc:
            if isinstance(exc.partial, Result):
                exc.partial = self._probed(exc.partial)
            raise
        except KeyboardInterrupt:
            if self.conn is not None:  # as a stock client says it was stopped
                with contextlib.suppress(OSError):
                    wire.send_state(self.conn, wire.CLIENT_TERMINATE)
            raise
        except (OSError, NetprobeError) as exc:
            raise TestFailed(f"{self.where}: {_one_line(exc)}") from None
        finally:
            if self.probes is not None:
                self.probes.close()
            for sock in [*(s.sock for s in self.tcp), *(s.sock for s in self.udp)]:
                with contextlib.suppress(OSError):
                    sock.close()
            if self.conn is not None:
                wire.sync_close(self.conn)

    def _run(self) -> Result:
        self._connect()
        self._expect(wire.PARAM_EXCHANGE)
        assert self.conn is not None
        params = client_params(self.spec, self.length, self.udp64)
        if self.auth is not None:
            params["authtoken"] = self.auth.token()
        wire.send_json(self.conn, params)
        try:
            self._expect(wire.CREATE_STREAMS)
        except TestFailed as exc:  # iperf3 3.21 closes without a word on a bad token
            raise TestFailed(f"{exc} (authentication failed?)" if self.auth and "closed"
                             in str(exc) else str(exc)) from None
        self._open_streams()
        self._expect(wire.TEST_START)
        self._expect(wire.TEST_RUNNING)
        self.reporter.note(f"iperf3 test started with {self.host}:{self.port}")
        if self.probes is not None:  # only now: see netprobe.engine.iperf3.handshake
            self.probes.start()
        return self._run_udp() if self.udp else self._run_tcp()

    def _probed(self, result: Result) -> Result:
        if self.probes is None:
            return result
        self.probes.close()
        return with_probes(result, self.probes, self.t0)

    def _timed_connect(self, sock: socket.socket) -> None:
        at = time.monotonic()
        sock.connect(self.address)
        if self.probes is not None:  # a handshake before the load: the idle baseline
            self.probes.connected(at, time.monotonic() - at)

    # -- control ------------------------------------------------------------------------

    def _connect(self) -> None:
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            if self.spec.bind_address:
                sock.bind((self.spec.bind_address, 0))
            self._timed_connect(sock)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(self.cookie)
        except OSError as exc:
            sock.close()
            raise TestFailed(f"cannot connect to {self.where}: {_one_line(exc)}") from None
        self.conn = sock

    def _state(self, timeout: float | None = None) -> int:
        """The next state byte; TestFailed for busy, a relayed error or a stop."""
        assert self.conn is not None
        timeout = CONTROL_READ_S if timeout is None else timeout
        self.conn.settimeout(timeout)
        try:
            state = wire.read_state(self.conn)
        except socket.timeout:
            raise TestFailed(f"{self.where} said nothing for {timeout:g} s") from None
        except wire.WireError:
            raise TestFailed(f"{self.where} closed the control connection") from None
        if state == wire.ACCESS_DENIED:
            raise TestFailed(f"{self.where} {BUSY_WORDS} (or refused this client): "
                             "try again later")
        if state == wire.SERVER_ERROR:
            try:
                code, os_errno = wire.read_error(self.conn)
            except (OSError, wire.WireError):
                raise TestFailed(f"{self.where} reported an error (and closed before "
                                 "saying which)") from None
            detail = f": errno {os_errno}" if os_errno > 0 else ""
            raise TestFailed(f"{self.where} refused or ended the test: "
                             f"{wire.error_words(code)} (iperf3 error {code}{detail})")
        if state == wire.SERVER_TERMINATE:
            raise TestFailed(f"{self.where} ended the test (the server was stopped)")
        return state

    def _expect(self, wanted: int, timeout: float | None = None) -> None:
        state = self._state(timeout)
        if state != wanted:
            raise TestFailed(f"{self.where} broke iperf3's protocol: state {state} where "
                             f"{wanted} was due")

    def _watch(self, seconds: float) -> None:
        """Wait up to ``seconds`` for the control connection; anything the server says
        during the test ends it (an error, a stop, a close)."""
        assert self.conn is not None
        if readable(self.conn, seconds):
            state = self._state(1.0)
            raise TestFailed(f"{self.where} broke iperf3's protocol: state {state} "
                             "during the test")

    # -- streams ------------------------------------------------------------------------

    def _open_streams(self) -> None:
        # The client's sending streams first (the server gives roles in accept order).
        udp = self.spec.protocol == "udp"
        for direction in self.spec.flow_directions():
            role = "sender" if direction == "client_to_server" else "receiver"
            for stream_id in range(1, self.spec.streams + 1):
                index = len(self.keys)
                try:
                    sock = self._open_udp() if udp else self._open_tcp()
                except OSError as exc:
                    raise TestFailed(f"cannot open data stream {stream_id} to {self.where}: "
                                     f"{_one_line(exc)}") from None
                self.keys.append((stream_id, direction, role))
                if udp:
                    stream = UdpStream(sock, iperf3_id(index), role == "sender",
                                       self.length, int(self.spec.rate_bits_per_second or 0),
                                       self.udp64)
                    stream.limit_bytes = self.spec.bytes_total
                    self.udp.append(stream)
                else:
                    self.tcp.append(LocalStream(stream_id, direction, role, sock))

    def _data_socket(self, kind: int) -> socket.socket:
        sock = socket.socket(self.family, kind)
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            if self.spec.bind_address:
                sock.bind((self.spec.bind_address, 0))
            apply_options(sock, self.spec)  # before connect: MSS and window go in the SYN
        except (OSError, NetprobeError):
            sock.close()
            raise
        return sock

    def _open_tcp(self) -> socket.socket:
        sock = self._data_socket(socket.SOCK_STREAM)
        try:
            self._timed_connect(sock)
            sock.sendall(self.cookie)
        except OSError:
            sock.close()
            raise
        sock.settimeout(None)
        return sock

    def _open_udp(self) -> socket.socket:
        sock = self._data_socket(socket.SOCK_DGRAM)
        try:
            sock.connect(self.address)
            sock.send(wire.UDP_HELLO)
            self._await_reply(sock)
        except OSError:
            sock.close()
            raise
        return sock

    @staticmethod
    def _await_reply(sock: socket.socket) -> None:
        # Any 4-byte datagram is the reply ("6789", or an older server's 987654321 in its
        # own byte order); in -R the server's data may come first and is skipped.
        deadline = time.monotonic() + UDP_REPLY_S
        for _ in range(UDP_EARLY_DATAGRAMS):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            try:
                data = sock.recv(65536)
            except socket.timeout:
                break
            if len(data) == 4:
                return
        raise OSError(0, f"no answer to the UDP hello within {UDP_REPLY_S:g} s (is UDP "
                         "blocked?)")

    # -- the test -----------------------------------------------------------------------

    def _wait_end(self, moved: Callable[[], tuple[int, int]], loops_done: Callable[[], bool],
                  t0: float, tick: Callable[[float], None] | None = None) -> None:
        """Until the planned end, or (-n) until the senders are done and the receivers
        have the count; the control connection watched throughout (``tick``: called at
        every poll with the time)."""
        planned = self.spec.planned_s()
        count = (self.spec.bytes_total or 0) * self.spec.streams
        last, last_change = moved(), time.monotonic()
        while True:
            now = time.monotonic()
            if tick is not None:
                tick(now)
            if planned is not None:
                if now >= t0 + planned:
                    return
                self._watch(min(POLL_S, t0 + planned - now))
                continue
            sent, received = moved()
            wants_send = "client_to_server" in self.spec.flow_directions()
            wants_receive = "server_to_client" in self.spec.flow_directions()
            if (not wants_send or sent >= count) and (not wants_receive or received >= count):
                return
            if loops_done():
                return
            if (sent, received) != last:
                last, last_change = (sent, received), now
            elif now - last_change > STALL_S:
                raise TestFailed(f"no data moved for {STALL_S:g} s with {self.where}")
            self._watch(POLL_S)

    @staticmethod
    def _drain(received: Callable[[], int]) -> float | None:
        """Let what the server sent before the end arrive, until nothing came for a while;
        when the last of it came (None: nothing came)."""
        until = time.monotonic() + DRAIN_S
        seen, quiet_from, last = received(), time.monotonic(), None
        while time.monotonic() < until:
            time.sleep(DRAIN_QUIET_S / 4)
            now = received()
            if now != seen:
                seen, quiet_from = now, time.monotonic()
                last = quiet_from
            elif time.monotonic() - quiet_from >= DRAIN_QUIET_S:
                break
        return last

    def _swap_results(self, ours: dict) -> dict:
        """Send our results, read the server's (checked), and say done."""
        assert self.conn is not None
        self.conn.settimeout(CONTROL_READ_S)
        wire.send_json(self.conn, ours)
        theirs = wire.read_json(self.conn, wire.MAX_RESULTS_BYTES)
        if not wire.results_ok(theirs):
            raise TestFailed(f"{self.where} sent results without the fields iperf3 requires")
        self._expect(wire.DISPLAY_RESULTS)
        if self.probes is not None:  # none left in the accept queue of the next test
            self.probes.settle()
        wire.send_state(self.conn, wire.IPERF_DONE)
        return theirs

    def _end(self, received: Callable[[], int]) -> float:
        """Send TEST_END, wait for the server's EXCHANGE_RESULTS and let the data it sent
        before arrive; the monotonic time the last of it came (or TEST_END's)."""
        assert self.conn is not None
        senders = [s for s in self.udp if s.sending]
        if self.probes is not None:
            self.probes.stop()
        for stream in senders:
            stream.stop_loop()
        if senders:
            # The last datagrams are still on their way when the loops return, and the
            # server stops counting at TEST_END: sent then, they read as sent and not
            # received (1784 sent, 1783 received, 0 lost against 3.17.1 on loopback).
            time.sleep(UDP_SETTLE_S)
        wire.send_state(self.conn, wire.TEST_END)
        ended = time.monotonic()
        self._expect(wire.EXCHANGE_RESULTS, END_GRACE_S + CONTROL_READ_S)
        return max(ended, self._drain(received) or ended)

    def _run_tcp(self) -> Result:
        side = Side(self.spec, self.tcp, self._interval)
        side.start()
        t0 = self.t0 = time.monotonic()
        try:
            self._wait_end(lambda: _moved(self.tcp), lambda: side.done, t0)
            # TEST_END once every byte written is on its way, behind the data in the
            # path's queues: the server stops reading at TEST_END, so sent earlier its
            # figure missed the data still queued here. Not once every byte was
            # acknowledged, as at first: the link then idled for the last
            # acknowledgement's trip (~30 ms over a 100 Mbit/s tbf), which the server
            # counted in its time (its last interval 74 Mbit/s, the test 91.5-92.9 where
            # the wire carries 94.1). Where the kernel cannot say what it has not sent,
            # the acknowledgement it is.
            if not self._transmitted(SENDER_DRAIN_S + 1.0):
                side.wait_senders(SENDER_DRAIN_S + 1.0)
            ended = self._end(lambda: _moved(self.tcp)[1])
            # This end's own figure: each sender's loop returns when its peer
            # acknowledged the last byte (or after SENDER_DRAIN_S).
            side.wait_senders(SENDER_DRAIN_S + 1.0)
        finally:
            side.stop()
            side.wait(2.0)
        for stream in self.tcp:
            # The server keeps its data connections open until the test is over, so a
            # receiver's loop sees no end of its data: its data ended when the last of
            # it came, not when the loop was stopped.
            if stream.role == "receiver" and stream.ended_at is not None:
                stream.ended_at = min(stream.ended_at, ended)
        theirs = self._swap_results(self._tcp_results(side))
        report = peer_report(theirs, self.keys, self.spec, udp=False)
        errors = side.errors()
        result = _marked(build_result(
            spec=self.spec, start_time=self.start_time, local=self._local(),
            remote=self._remote(), side=side, outcome=Outcome(peer_report=report),
            local_kept=self.kept, status="failed" if errors else "ok", errors=errors,
            data_path=core.DATA_PATH), theirs)
        if errors:  # as the native client: a stream's error fails the test, figures kept
            raise TestFailed(errors[0], result)
        return result

    def _transmitted(self, timeout: float) -> bool:
        """Wait until every TCP sender's loop has written its last byte and its socket has
        handed all of it to the network; False if that could not be seen (the kernel
        cannot say, or not within ``timeout``)."""
        until = time.monotonic() + timeout
        while True:
            left = [_untransmitted(s) for s in self.tcp if s.role == "sender"]
            if None in left:
                return False
            if all(n is not None and 0 <= n <= 1 for n in left):  # 1: the FIN alone
                return True
            if time.monotonic() >= until:
                return False
            time.sleep(TRANSMIT_POLL_S)

    def _tcp_results(self, side: Side) -> dict:
        summaries = {(s.stream_id, s.direction, s.role): summary
                     for s, summary in side.stream_summaries()}
        sending = any(role == "sender" for _, _, role in self.keys)
        rows = []
        for index, key in enumerate(self.keys):
            mine = summaries.get(key)
            retransmits = mine.retransmits if mine is not None and key[2] == "sender" \
                else None
            rows.append(_row(iperf3_id(index), mine.bytes if mine else 0,
                             (retransmits or 0) if sending else -1,
                             (mine.end_s - mine.start_s) if mine else 0.0))
        return _results(side.cpu(), 1 if sending else -1, rows)

    def _run_udp(self) -> Result:
        before = core.rusage("process")
        t0 = self.t0 = time.monotonic()
        for stream in self.udp:
            stream.start()
        sampler = UdpIntervals(self.keys, self.udp, self.spec.interval_s, t0, self._interval)
        try:
            self._wait_end(lambda: _udp_moved(self.udp), lambda: False, t0, sampler.tick)
            ended = self._end(lambda: _udp_moved(self.udp)[1])
        finally:
            for stream in self.udp:
                stream.finish()
        sampler.tick(ended, final=True)
        after = core.rusage("process")
        wall = max(1e-6, ended - t0)
        cpu = Cpu(process=process_cpu(after.user_s - before.user_s,
                                      after.system_s - before.system_s, wall))
        sending = any(s.sending for s in self.udp)
        rows = [_row(s.stream_id, s.counted, -1, wall, s) for s in self.udp]
        theirs = self._swap_results(_results(cpu, 0 if sending else -1, rows))
        return _marked(self._udp_result(theirs, cpu, wall), theirs)

    def _udp_result(self, theirs: dict, cpu: Cpu, duration: float) -> Result:
        start = self.spec.omit_s
        summaries: dict[Key, SideSummary] = {}
        for key, stream in zip(self.keys, self.udp):
            summaries[key] = _udp_summary(key[2], stream, start, start + duration)
        report = peer_report(theirs, self.keys, self.spec, udp=True)
        for item in report["streams"]:
            summaries[(item["stream_id"], item["direction"], item["role"])] = \
                convert.structure(item["summary"], SideSummary)
        peer_cpu = convert.structure(report["cpu"], Cpu) if report.get("cpu") else None
        streams, flows = streams_and_flows(self.spec, summaries, {},
                                           cpu_by_role_of(self.spec, cpu, peer_cpu))
        ends = [s.end_s for s in summaries.values()]
        return Result(tool=ToolInfo(name="native", version=__version__, data_path="python",
                                    mode="copy"),
                      spec=self.spec, start_time=self.start_time, local=self._local(),
                      remote=self._remote(), status="ok",
                      duration_s=max(ends) if ends else None, summaries=tuple(flows),
                      streams=tuple(streams), intervals=tuple(self.kept.samples))

    # -- the Result ---------------------------------------------------------------------

    def _interval(self, sample: Interval) -> None:
        self.kept.add(sample)
        if self.probes is not None and self.t0 is not None:  # the live view's latency
            sample = self.probes.interval(sample, self.t0)
        self.reporter.interval(sample)

    def _local(self) -> Endpoint:
        address = None
        if self.conn is not None:
            with contextlib.suppress(OSError):
                address = str(self.conn.getsockname()[0])
        return Endpoint(role="client", address=address)

    def _remote(self) -> Endpoint:
        return Endpoint(role="server", host=self.host, address=str(self.address[0]),
                        port=self.port)


class UdpIntervals:
    """Interval samples of the UDP streams (their Python loops have no sampler of their
    own), taken at the control loop's polls: each stream's bytes, datagrams and (a
    receiver's) loss since the last, and its jitter; sums where there are several."""

    def __init__(self, keys: list[Key], streams: list[UdpStream], step: float | None,
                 t0: float, emit: Callable[[Interval], None]) -> None:
        self.keys = keys
        self.streams = streams
        self.step = step
        self.t0 = t0
        self.emit = emit
        self.start_s = 0.0
        self.last = [(0, 0, 0, 0)] * len(streams)

    def tick(self, now: float, final: bool = False) -> None:
        """Emit the interval ending ``now`` if one is due (``final``: the tail however
        short, so that no byte goes missing, unless nothing moved in it)."""
        end_s = now - self.t0
        if self.step is None or end_s <= self.start_s:
            return
        if final and not any(
                (s.bytes, s.packets) != self.last[n][:2] for n, s in enumerate(self.streams)):
            return
        if not final and end_s - self.start_s < self.step:
            return
        samples = []
        for n, (key, stream) in enumerate(zip(self.keys, self.streams)):
            counts = (stream.bytes, stream.packets, stream.errors, stream.out_of_order)
            moved, packets, lost, disorder = (max(0, a - b)
                                              for a, b in zip(counts, self.last[n]))
            self.last[n] = counts
            receiver = not stream.sending
            samples.append(Interval(
                direction=key[1], role=key[2], stream_id=key[0], start_s=self.start_s,
                end_s=end_s, bytes=moved, bits_per_second=moved * 8 / (end_s - self.start_s),
                packets=packets, lost_packets=lost if receiver else None,
                out_of_order_packets=disorder if receiver else None,
                jitter_ms=stream.jitter_s * 1e3 if receiver else None))
        self.start_s = end_s
        for sample in [*samples, *sum_intervals(samples)]:
            self.emit(sample)


# -- results objects ---------------------------------------------------------------------


def _row(stream_id: int, count: int, retransmits: int, seconds: float,
         udp: UdpStream | None = None) -> dict:
    receiving = udp is not None and not udp.sending
    return wire.stream_row(stream_id, count, retransmits, seconds,
                           jitter_s=udp.jitter_s if receiving and udp else 0,
                           errors=udp.errors if receiving and udp else 0,
                           packets=udp.packets if udp else 0)


def _results(cpu: Cpu | None, has_retransmits: int, rows: list[dict]) -> dict:
    process = cpu.process if cpu is not None else None
    return wire.results_message((process.total_percent if process else None) or 0.0,
                                (process.user_percent if process else None) or 0.0,
                                (process.system_percent if process else None) or 0.0,
                                has_retransmits, rows)


def _number(value: Any, most: float = 2.0**63) -> float | None:
    """A foreign number if it is one: finite, not negative, below ``most``; else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):  # a JSON integer may be beyond what a float holds
        return float(value) if 0 <= value < most else None
    if not math.isfinite(value) or not 0 <= value < most:
        return None
    return float(value)


def peer_report(theirs: dict, keys: list[Key], spec: TestSpec, *, udp: bool) -> dict:
    """The server's results as the native engine's peer report (per stream summaries by
    stream id, direction and role, and its CPU), for :func:`build_result`. A row with an
    unknown id or figures that cannot be is left out."""
    by_id = {iperf3_id(index): key for index, key in enumerate(keys)}
    retransmits_known = theirs.get("sender_has_retransmits") == 1
    streams = []
    for row in theirs.get("streams", []):
        ident = row.get("id") if isinstance(row, dict) else None
        if not isinstance(ident, int) or isinstance(ident, bool):
            continue
        key = by_id.get(ident)
        count = _number(row.get("bytes"))
        if key is None or count is None:
            continue
        stream_id, direction, mine = key
        role = "receiver" if mine == "sender" else "sender"
        seconds = _number(row.get("end_time"), 1e7) or 0.0
        if seconds < MIN_PEER_SECONDS:  # absent, or too short to divide by
            seconds = spec.duration_s or 1.0
        side = SideSummary(role=role, start_s=spec.omit_s, end_s=spec.omit_s + seconds,
                           bytes=int(count), bits_per_second=count * 8 / seconds)
        side = _peer_figures(side, row, role, udp, retransmits_known)
        streams.append({"stream_id": stream_id, "direction": direction, "role": role,
                        "summary": convert.unstructure(side)})
    return {"streams": streams, "cpu": _peer_cpu(theirs)}


def _peer_figures(side: SideSummary, row: dict, role: str, udp: bool,
                  retransmits_known: bool) -> SideSummary:
    import attrs

    if role == "sender" and not udp and retransmits_known:
        found = _number(row.get("retransmits"), 2.0**53)
        if found is not None:
            side = attrs.evolve(side, retransmits=int(found), retransmits_scope="connection")
    if udp:
        packets = _number(row.get("packets"), 2.0**53)
        side = attrs.evolve(side, packets=None if packets is None else int(packets))
        if role == "receiver":
            lost = _number(row.get("errors"), 2.0**53)
            jitter = _number(row.get("jitter"), 1e6)
            side = attrs.evolve(
                side, lost_packets=None if lost is None else int(lost),
                lost_percent=(100.0 * lost / packets if lost is not None and packets else None),
                jitter_ms=None if jitter is None else jitter * 1e3)
    return side


def _peer_cpu(theirs: dict) -> dict | None:
    total = _number(theirs.get("cpu_util_total"), 1e5)
    if total is None:
        return None
    usage = CpuUsage(total_percent=total, user_percent=_number(theirs.get("cpu_util_user"), 1e5),
                     system_percent=_number(theirs.get("cpu_util_system"), 1e5))
    return dict(convert.unstructure(Cpu(process=usage)))


def _udp_summary(role: str, stream: UdpStream, start: float, end: float) -> SideSummary:
    seconds = max(1e-6, end - start)
    side = SideSummary(role=role, start_s=start, end_s=end, bytes=stream.counted,
                       bits_per_second=stream.counted * 8 / seconds, packets=stream.packets)
    if role == "sender":
        return side
    import attrs

    return attrs.evolve(side, lost_packets=stream.errors,
                        lost_percent=100.0 * stream.errors / stream.packets
                        if stream.packets else None,
                        out_of_order_packets=stream.out_of_order,
                        jitter_ms=stream.jitter_s * 1e3)


def _marked(result: Result, theirs: dict) -> Result:
    """The Result, with the server's results object kept raw (bounded) for diagnosis."""
    import attrs

    text = json.dumps(theirs, sort_keys=True)[:RAW_RESULTS_CHARS]
    return attrs.evolve(result, raw=(RawOutput(name="iperf3 server results", text=text),))


def _moved(streams: list[LocalStream]) -> tuple[int, int]:
    sent = sum(s.counters.bytes for s in streams if s.role == "sender")
    return sent, sum(s.counters.bytes for s in streams if s.role == "receiver")


def _udp_moved(streams: list[UdpStream]) -> tuple[int, int]:
    sent = sum(s.bytes for s in streams if s.sending)
    return sent, sum(s.bytes for s in streams if not s.sending)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def run_iperf3_test(spec: TestSpec, reporter: Reporter, host: str,
                    auth: Any = None, udp64: bool = False,
                    probe_hz: float | None = None) -> Result:
    """Run one test against the stock iperf3 server at ``host`` (port ``spec.port`` or
    5201), with ``auth`` (:class:`~netprobe.engine.iperf3.auth.ClientAuth`) if it asks
    for iperf3's RSA authentication; ``udp64``: UDP with 64-bit sequence numbers
    (iperf3's --udp-counters-64bit); ``probe_hz``: latency under load, TCP handshakes to
    the server's port at this rate (:mod:`netprobe.engine.iperf3.handshake`)."""
    return Iperf3Client(spec, reporter, host, auth, udp64, probe_hz).run()
