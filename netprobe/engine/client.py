"""The native engine's client: connect, ask for a test, open the streams, run, and merge
both ends' figures into one Result.
"""

from __future__ import annotations

import socket
from typing import Any

from netprobe import convert, core
from netprobe.engine import auth, greeting, protocol
from netprobe.engine.assemble import build_result
from netprobe.engine.conduct import PEER_TEXT_CHARS, Conductor, Outcome, Reader, system_name
from netprobe.engine.log import escape
from netprobe.engine.protocol import Channel, DataHello, close_quietly
from netprobe.engine.side import LocalStream, Side
from netprobe.engine.sockets import apply_options, family_for, resolve
from netprobe.errors import (
    NetprobeError,
    ProtocolError,
    SecretMissing,
    SecretRefused,
    TestFailed,
    TestInterrupted,
    refused_secret,
)
from netprobe.host import utc_now_iso
from netprobe.plugin import Reporter
from netprobe.reporting import KeptIntervals
from netprobe.schema import Endpoint, Interval, Result, TestSpec

CONNECT_TIMEOUT_S = 5.0
WELCOME_TIMEOUT_S = 10.0  # a netprobe server welcomes at once; a loaded router, later
UDP_HELLO_TRIES = 15
UDP_HELLO_WAIT_S = 0.2


class Client:
    """One native test from the client's end."""

    def __init__(
        self, spec: TestSpec, reporter: Reporter, host: str, secret: bytes | None = None
    ) -> None:
        self.spec = spec
        self.secret = secret
        self.reporter = reporter
        self.host = host
        self.port = spec.port or protocol.DEFAULT_PORT
        self.start_time = utc_now_iso()
        self.family, self.address = resolve(host, self.port, family_for(spec), socket.SOCK_STREAM)
        self.channel: Channel | None = None
        self.welcome: dict[str, Any] = {}
        self.streams: list[LocalStream] = []
        self.side: Side | None = None
        self.local_kept = KeptIntervals()  # bounded: reporting.MAX_INTERVALS_KEPT
        self.sequence_base = 0
        self.shared_boundary = False  # the server sends and takes the warm-up message

    def run(self) -> Result:
        """Run the test; TestFailed/TestInterrupted carry the partial result."""
        try:
            return self._run()
        finally:
            close_quietly(*(s.sock for s in self.streams))
            if self.channel is not None:
                self.channel.close()

    def _run(self) -> Result:
        self._connect()
        cookie = self._request_test()
        self._open_streams(cookie)
        assert self.channel is not None
        self.channel.expect("start", timeout=10.0)
        reader = Reader(self.channel)
        self.side = Side(self.spec, self.streams, self._local_interval)
        self.side.shared_boundary = self.shared_boundary
        planned = self.spec.planned_s()
        conductor = Conductor(self.channel, reader, self.side, self.reporter.interval, planned)
        self.side.start()
        self.reporter.note("test started")
        try:
            outcome = conductor.run()
        except KeyboardInterrupt:
            conductor.abort("interrupted by the user")
            self.side.wait(2.0)
            raise TestInterrupted(
                "interrupted",
                self._result(conductor.outcome, "interrupted", ["interrupted by the user"]),
            ) from None
        return self._finish(conductor, outcome)

    def _finish(self, conductor: Conductor, outcome: Outcome) -> Result:
        assert self.side is not None
        self.side.stop()
        self.side.wait(2.0)
        if outcome.error:
            errors = [outcome.error, *self.side.errors()]
            raise TestFailed(outcome.error, self._result(outcome, "failed", errors))
        conductor.send({"type": "bye"})
        errors = self.side.errors() + list((outcome.peer_report or {}).get("errors", []))
        errors += _warm_up_error(self.spec, self.side)
        result = self._result(outcome, "failed" if errors else "ok", errors)
        if errors:
            raise TestFailed(errors[0], result)
        return result

    # -- set-up ----------------------------------------------------------------------

    def _connect(self) -> None:
        self.channel = Channel(self._check_who_answers(self._say_hello()))
        try:
            self.welcome = self.channel.expect("welcome", timeout=WELCOME_TIMEOUT_S)
            if self.welcome.get("auth"):
                self._authenticate()
        except (OSError, ProtocolError) as exc:
            raise TestFailed(f"server at {self.host}: {protocol.reason(exc)}") from None
        server = _peer_text(self.welcome, "server") or "a netprobe server"
        self.reporter.note(f"connected to {server}")

    def _say_hello(self) -> socket.socket:
        sock = self._tcp_socket()
        try:
            sock.connect(self.address)
            sock.sendall(protocol.pack_hello(protocol.KIND_CONTROL))
        except OSError as exc:
            close_quietly(sock)
            raise TestFailed(
                greeting.connect_failure(self.host, self.port, exc, CONNECT_TIMEOUT_S)
            ) from None
        return sock

    def _check_who_answers(self, sock: socket.socket) -> socket.socket:
        # A netprobe server welcomes at once; text or silence is something else on the port.
        first = greeting.peek_first(sock, greeting.FIRST_ANSWER_S)
        if first is None:
            # Silence. iperf3 waits so for a cookie and serves one connection at a time:
            # close this one, ask as iperf3's client would, then (not iperf3, only a slow
            # server) say hello again.
            close_quietly(sock)
            state = greeting.iperf3_there(self.address, self.family)
            if state is not None:
                raise TestFailed(greeting.iperf3_message(self.host, self.port, state))
            sock = self._say_hello()
            first = greeting.peek_first(sock, WELCOME_TIMEOUT_S)
            if first is None:
                close_quietly(sock)
                raise TestFailed(greeting.silent(self.host, self.port, WELCOME_TIMEOUT_S))
        problem = greeting.not_netprobe(self.host, self.port, first)
        if problem:
            close_quietly(sock)
            raise TestFailed(problem)
        return sock

    def _authenticate(self) -> None:
        assert self.channel is not None
        method = self.welcome.get("auth")
        if method != auth.METHOD:
            raise ProtocolError(f"server asks for unknown authentication {method!r}")
        if not self.secret:
            raise SecretMissing(self.host)  # not a ProtocolError: the caller says whose
        ours = auth.new_challenge()
        response = auth.respond(self.secret, str(self.welcome.get("challenge")), "client")
        self.channel.send({"type": "auth", "response": response, "challenge": ours})
        reply = self.channel.recv(timeout=10.0)
        if refused_secret(reply):
            raise SecretRefused(self.host)
        if reply.get("type") != "auth_ok":
            raise ProtocolError(f"expected 'auth_ok', got '{reply.get('type')}'")
        if not auth.verify(self.secret, ours, "server", reply.get("response")):
            raise ProtocolError("the server could not prove it knows the shared secret")
        # A server with a secret says what it is only now, to a client that proved itself.
        self.welcome.update({k: reply[k] for k in ("server", "system") if k in reply})

    def _tcp_socket(self) -> socket.socket:
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT_S)
        if self.spec.bind_address:
            sock.bind((self.spec.bind_address, 0))
        return sock

    def _request_test(self) -> bytes:
        assert self.channel is not None
        self.channel.send({"type": "test", "spec": convert.unstructure(self.spec),
                           "features": ["sequence_base", protocol.UDP_PROOF_FEATURE,
                                        protocol.WARM_UP_FEATURE]})
        try:
            reply = self.channel.expect("accept", timeout=10.0)
            base = reply.get("sequence_base", 0)
            if not isinstance(base, int) or isinstance(base, bool) or not 0 <= base < 1 << 64:
                raise ProtocolError("bad sequence base in the server's accept")
            self.sequence_base = base
            features = reply.get("features")
            self.shared_boundary = isinstance(features, list) and \
                protocol.WARM_UP_FEATURE in features
            return bytes.fromhex(protocol.field(reply, "cookie", str))
        except (OSError, ValueError, ProtocolError) as exc:
            raise TestFailed(f"server refused the test: {protocol.reason(exc)}") from None

    def _open_streams(self, cookie: bytes) -> None:
        for direction in self.spec.flow_directions():
            role = "sender" if direction == "client_to_server" else "receiver"
            for stream_id in range(1, self.spec.streams + 1):
                hello = DataHello(cookie, stream_id, direction)
                try:
                    sock = (
                        self._open_tcp(hello)
                        if self.spec.protocol == "tcp"
                        else self._open_udp(hello)
                    )
                except OSError as exc:
                    raise TestFailed(
                        f"cannot open data stream {stream_id}: {protocol.reason(exc)}"
                    ) from None
                stream = LocalStream(stream_id, direction, role, sock)
                stream.counters.sequence_base = self.sequence_base
                self.streams.append(stream)

    def _open_tcp(self, hello: DataHello) -> socket.socket:
        sock = self._tcp_socket()
        try:
            apply_options(sock, self.spec)  # before connect, so MSS and window apply to the SYN
            sock.connect(self.address)
            sock.sendall(protocol.pack_data_hello(protocol.KIND_DATA, hello))
        except (OSError, NetprobeError):
            close_quietly(sock)
            raise
        sock.settimeout(None)
        return sock

    def _open_udp(self, hello: DataHello) -> socket.socket:
        sock = socket.socket(self.family, socket.SOCK_DGRAM)
        try:
            if self.spec.bind_address:
                sock.bind((self.spec.bind_address, 0))
            apply_options(sock, self.spec)
            sock.connect(self.address)
            if not protocol.udp_handshake(sock, hello, UDP_HELLO_TRIES, UDP_HELLO_WAIT_S):
                raise OSError(0, "no answer to the UDP stream hello (is UDP blocked?)")
        except (OSError, NetprobeError):
            close_quietly(sock)
            raise
        sock.settimeout(None)
        return sock

    # -- results ---------------------------------------------------------------------

    def _local_interval(self, sample: Interval) -> None:
        self.local_kept.add(sample)
        self.reporter.interval(sample)

    def _result(self, outcome: Outcome, status: str, errors: list[str]) -> Result:
        assert self.side is not None
        local = Endpoint(role="client", host=None, address=None, system=system_name())
        sock = self.channel.sock if self.channel else None
        if sock is not None:
            local = Endpoint(role="client", address=_addr(sock.getsockname), system=system_name())
        remote = Endpoint(
            role="server",
            host=self.host,
            address=str(self.address[0]),
            port=self.port,
            system=_peer_text(self.welcome, "system"),
        )
        return build_result(
            spec=self.spec,
            start_time=self.start_time,
            local=local,
            remote=remote,
            side=self.side,
            outcome=outcome,
            local_kept=self.local_kept,
            status=status,
            errors=errors,
            data_path=core.DATA_PATH,
        )


def _warm_up_error(spec: TestSpec, side: Side) -> list[str]:
    """An error when the data ended inside the warm-up: no figure is left to summarise."""
    ended = side.data_ended_s()
    if spec.omit_s <= 0 or ended > spec.omit_s:
        return []
    return [f"the test ended {ended:.2f} s after the start, inside the {spec.omit_s:g} s "
            "warm-up (-O): nothing is left to summarise; make -O shorter or the byte count "
            "larger"]


def _peer_text(message: dict[str, Any], key: str) -> str | None:
    """A text field of the server's, cut and escaped (None unless a string): what a server
    says about itself reaches the result and the screen as data, bounded."""
    value = message.get(key)
    return escape(value, PEER_TEXT_CHARS) if isinstance(value, str) else None


def _addr(getname: Any) -> str | None:
    try:
        return str(getname()[0])
    except OSError:
        return None


def run_test(
    spec: TestSpec, reporter: Reporter, host: str, secret: bytes | None = None
) -> Result:
    """Run one native test against the netprobe server at ``host``."""
    return Client(spec, reporter, host, secret).run()
