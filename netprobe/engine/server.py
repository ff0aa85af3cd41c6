"""``netprobe server``: the native engine's far end.

One port serves control connections, TCP data connections and UDP streams. Each control
connection is a session on a thread of its own; a session holds one of ``max_tests``
slots from the moment its test is accepted until its control connection ends, whatever
the reason, so the server is never stuck busy.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import ipaddress
import math
import os
import secrets
import select
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable, NoReturn, Optional, Protocol

import attrs

from netprobe import convert, core
from netprobe.engine import auth, probes, protocol
from netprobe.engine.capabilities import native_refusals
from netprobe.engine.conduct import REPORT_WAIT_S, Conductor, Reader, system_name
from netprobe.engine.log import Log, Throttle, client, escape, null_log
from netprobe.engine.protocol import Channel, DataHello, close_quietly
from netprobe.engine.side import LocalStream, Side, buffer_bytes
from netprobe.engine.sockets import apply_options, udp_answer
from netprobe.errors import NetprobeError, ProtocolError, SpecError, listen_error
from netprobe.host import utc_now_iso
from netprobe.schema import Interval, TestSpec
from netprobe.version import __version__

OUT_OF_FILES_PAUSE_S = 0.1  # accepting stops this long at the open-files limit
CLOSED_LINES_PER_S = 10  # connections closed in their hello that are logged, a second
REFUSAL_CHARS = 1000  # longest refusal told to a client (it may echo what the client sent)
WATCHDOG_GRACE_S = 5.0  # past the planned end and the report wait: the session is closed
Handler = Callable[["Session", dict], None]


@attrs.define
class ServerConfig:
    """How the server listens and what it allows."""

    bind_address: Optional[str] = None
    """Address to listen on; None for every IPv4 and IPv6 address."""
    port: int = protocol.DEFAULT_PORT
    """TCP and UDP port (0 picks a free one)."""
    max_tests: int = 2
    """Tests that may run at once; more get a clear 'busy'."""
    one_off: bool = False
    """Serve one test, then exit."""
    handshake_timeout_s: float = 10.0
    """Time a new connection has to say hello and a test has to open its streams."""
    idle_timeout_s: float = 30.0
    """Time a control connection may stay silent before its test is requested."""
    max_duration_s: float = 3600.0
    """Longest test accepted."""
    max_streams: int = 128
    """Most parallel streams (per direction) of one test, and of all running tests
    together: a test that does not fit beside the others is told the server is busy."""
    max_pending: int = 256
    """Connections allowed to be in their handshake at once."""
    max_rate_bps: Optional[float] = None
    """Highest total rate (bits/s) of one test, every stream and direction together, and
    of all running tests together (a test that alone asks more is refused; one that does
    not fit beside the others is told the server is busy). With it set, unlimited tests
    are refused: the limit binds before the bytes leave."""
    max_stream_rate_bps: Optional[float] = None
    """Highest rate of one stream (bits/s), only when asked for; with it set, unlimited
    tests are refused."""
    max_message_bytes: int = protocol.MAX_MESSAGE_BYTES
    """Largest control message read from a client."""
    max_connections_per_address: int = 32
    """Control connections and handshakes open at once from one client address."""
    allow: tuple = ()
    """Client networks (CIDR strings) allowed to connect; empty allows every address."""
    allow_third_party: bool = False
    """Run tests this agent is asked to send to another host (off: an agent that sends
    traffic wherever it is told would be a traffic amplifier)."""
    max_memory_bytes: Optional[int] = None
    """Buffer memory all running tests may take together (a test that alone needs more is
    refused, one that does not fit beside the others is told the server is busy); None:
    a quarter of this host's memory."""
    allow_other_data_addresses: bool = False
    """Take a test's data connections and UDP streams (and probe sessions) from addresses
    other than its control connection's (off: a client could otherwise point a reverse
    test at a third host). UDP still needs the return-routability proof."""
    secret: Optional[bytes] = attrs.field(default=None, repr=False)
    """Shared secret clients must prove they know (HMAC challenge); None: no authentication."""


class Attachable(Protocol):
    """What data connections and UDP hellos are handed to, by cookie: a test's session, or
    a latency probe session's echo."""

    control_peer: tuple
    """The control connection's peer: data may come only from its address."""
    local_address: str
    """The control connection's local address: UDP answers leave from it."""
    udp_key: bytes
    """The session's secret for the UDP return-routability nonces."""

    def attach(self, hello: DataHello, sock: socket.socket) -> bool:
        """Take a TCP data connection; False if it does not belong."""

    def attach_udp(self, hello: DataHello, peer: tuple, datagram: bytes) -> None:
        """Take a UDP stream whose ``peer`` has proved it receives there, and answer it
        ``datagram`` (the hello) from the stream's own socket."""


# Timeouts a server can keep (poll() takes milliseconds in a C int; a day is plenty).
CONFIG_SECONDS_MAX = 86_400.0


def check_config(config: ServerConfig) -> None:
    """Refuse (SpecError, naming the option) values a server cannot run with."""
    for name, flag in (("handshake_timeout_s", "--handshake-timeout"),
                       ("idle_timeout_s", "--idle-timeout")):
        value = getattr(config, name)
        if not (math.isfinite(value) and 0 < value <= CONFIG_SECONDS_MAX):
            raise SpecError(f"{flag} must be more than 0 and at most {CONFIG_SECONDS_MAX:g} "
                            f"seconds, got {value:g}")
    if not (math.isfinite(config.max_duration_s) and config.max_duration_s > 0):
        raise SpecError(f"--max-duration must be a finite number of seconds, "
                        f"got {config.max_duration_s:g}")
    for rate, flag in ((config.max_rate_bps, "--max-rate"),
                       (config.max_stream_rate_bps, "--max-stream-rate")):
        if rate is not None and not (math.isfinite(rate) and rate > 0):
            raise SpecError(f"{flag} must be a finite rate, got {rate:g}")


class Server:
    """A running netprobe server (start() it; close() it)."""

    def __init__(
        self, config: ServerConfig, log: Optional[Log] = None,
        handlers: Optional[dict[str, Handler]] = None,
    ) -> None:
        check_config(config)
        self.config = config
        self.handlers: dict[str, Handler] = {probes.REQUEST: probes.ProbeService(),
                                             **(handlers or {})}
        """Request types a session can start with besides a test (latency probes, the
        agent's), by message type."""
        self.log: Log = log or null_log
        self.port = config.port
        self._listeners: list[socket.socket] = []
        self._sessions: dict[bytes, Attachable] = {}
        self._lock = threading.Lock()
        self._active = 0
        self._pending = threading.BoundedSemaphore(config.max_pending)
        self._closed = threading.Event()
        self._served = 0
        self._thread: Optional[threading.Thread] = None
        self._networks = _networks(config.allow)
        self._wake_r, self._wake_w = socket.socketpair()
        self._hellos: dict[int, _Hello] = {}  # connections in their hello, by fd
        self._selector = selectors.DefaultSelector()  # the accept loop's (see _accept_loop)
        self._spare: Optional[int] = os.open(os.devnull, os.O_RDONLY)  # see _out_of_files
        self._per_address: dict[str, int] = {}
        self._running: dict[int, dict] = {}  # what each held slot is doing (status request)
        self.max_memory = config.max_memory_bytes or _quarter_of_memory()
        self._memory = 0
        self._rate = 0.0  # bits/s the running tests asked for together (--max-rate)
        self._streams = 0  # their streams together (--max-streams)
        self._closed_lines = Throttle(CLOSED_LINES_PER_S)
        self._charges: dict[int, tuple[int, float, int]] = {}  # per slot: memory, rate, streams

    # -- listening --------------------------------------------------------------------

    def start(self) -> int:
        """Bind the TCP and UDP sockets and start accepting; returns the port."""
        for family, address in _bind_addresses(self.config.bind_address):
            self._listen(family, address)
        if not self._listeners:
            raise OSError(f"cannot listen on port {self.config.port}")
        self._thread = threading.Thread(target=self._accept_loop, name="np-accept", daemon=True)
        self._thread.start()
        return self.port

    def _listen(self, family: int, address: str) -> None:
        tcp = socket.socket(family, socket.SOCK_STREAM)
        udp = socket.socket(family, socket.SOCK_DGRAM)
        try:
            for sock in (tcp, udp):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            # UDP streams get sockets bound to the same port and connected to the client.
            udp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            tcp.bind((address, self.port))
            self.port = tcp.getsockname()[1]
            udp.bind((address, self.port))
            tcp.listen(128)
        except OSError as exc:
            close_quietly(tcp, udp)
            if self.config.bind_address:
                raise listen_error("-B/--bind", address, self.port, exc) from None
            if self._listeners:
                raise listen_error(None, address, self.port, exc) from None
            return  # e.g. no IPv6 on this host: serve IPv4 only
        self._listeners += [tcp, udp]

    def _accept_loop(self) -> None:
        # One thread serves the listeners and every connection still in its hello: a
        # connection costs a thread only once it is a control session.
        with self._selector as selector:
            for sock in [*self._listeners, self._wake_r]:
                selector.register(sock, selectors.EVENT_READ)
            while not self._closed.is_set():
                for key, _ in selector.select(timeout=self._next_timeout()):
                    if isinstance(key.data, _Hello):
                        self._hello_bytes(key.data)
                        continue
                    listener = key.fileobj
                    assert isinstance(listener, socket.socket)
                    if listener is self._wake_r:
                        continue  # close() wants the loop to look at _closed now
                    if listener.type == socket.SOCK_STREAM:
                        self._accept(listener)
                    else:
                        self._udp_hello(listener)
                self._expire_hellos()
            for hello in list(self._hellos.values()):
                self._drop_hello(hello)

    def _next_timeout(self) -> float:
        soonest = min((h.deadline for h in self._hellos.values()), default=None)
        if soonest is None:
            return 1.0
        return min(1.0, max(0.0, soonest - time.monotonic()))

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, peer = listener.accept()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self._out_of_files(listener)
            return
        # The allow-list comes before anything else: a refused address is only told why.
        if not self._allowed(peer[0]):
            self._refuse_early(conn, peer, "acl", "this server does not accept tests from "
                               f"{peer[0]} (--allow)")
            return
        if not self._count_in(peer[0]):
            self._refuse_early(conn, peer, "per-address limit", "too many connections from "
                               f"{peer[0]} at once (--max-connections-per-address)")
            return
        if not self._pending.acquire(blocking=False):
            self._count_out(peer[0])
            close_quietly(conn)  # too many half-open handshakes: shed load, say nothing
            self.log(f"{client(peer)}: too many handshakes at once", event="refused",
                     client=client(peer), reason="handshakes")
            return
        conn.setblocking(False)
        hello = _Hello(conn, peer, time.monotonic() + self.config.handshake_timeout_s)
        self._hellos[conn.fileno()] = hello
        self._selector.register(conn, selectors.EVENT_READ, hello)

    def _out_of_files(self, listener: socket.socket) -> None:
        # At the open-files limit the pending connection stays in the backlog and the
        # listener stays readable: the loop would spin. Close it with the spare fd kept
        # for this (as servers do), then pause a moment so the sessions can end.
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
            with contextlib.suppress(OSError):
                conn, _ = listener.accept()
                close_quietly(conn)
        if self._spare is None:
            with contextlib.suppress(OSError):
                self._spare = os.open(os.devnull, os.O_RDONLY)
        self.log("out of file descriptors: a connection was closed unread", event="refused",
                 reason="open files")
        time.sleep(OUT_OF_FILES_PAUSE_S)

    def _hello_bytes(self, hello: _Hello) -> None:
        try:
            chunk = hello.conn.recv(hello.needed - len(hello.data))
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop_hello(hello, "closed before its hello (a port scan or a "
                                    "connect-and-close)", "no-hello")
            return
        hello.data += chunk
        try:
            if len(hello.data) == protocol.HELLO_BYTES:
                kind = protocol.unpack_hello(bytes(hello.data))
                if kind == protocol.KIND_DATA:
                    hello.needed = protocol.DATA_HELLO_BYTES
                elif kind == protocol.KIND_CONTROL:
                    self._start_session(hello)
                else:
                    self._drop_hello(hello, "sent no netprobe hello", "protocol")
                return
            if len(hello.data) == protocol.DATA_HELLO_BYTES:
                data = protocol.unpack_data_hello(bytes(hello.data[protocol.HELLO_BYTES:]))
                self._forget_hello(hello)
                hello.conn.setblocking(True)
                if not self._attach(data, hello.conn, hello.peer):
                    close_quietly(hello.conn)
                self._count_out(hello.peer[0])
                self._pending.release()
        except NetprobeError as exc:
            self._drop_hello(hello, f"bad hello: {escape(exc)}", "protocol")

    def _start_session(self, hello: _Hello) -> None:
        self._forget_hello(hello)
        threading.Thread(target=self._session, args=(hello.conn, hello.peer),
                         name="np-conn", daemon=True).start()

    def _expire_hellos(self) -> None:
        now = time.monotonic()
        for hello in [h for h in self._hellos.values() if h.deadline <= now]:
            self._drop_hello(hello, f"no hello within {self.config.handshake_timeout_s:g} s "
                                    "(--handshake-timeout)", "timeout")

    def _forget_hello(self, hello: _Hello) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(hello.conn)
        self._hellos.pop(hello.fd, None)

    def _drop_hello(self, hello: _Hello, why: Optional[str] = None,
                    reason: str = "") -> None:
        """Close a connection still in its hello; ``why`` is logged (a scan leaves a line),
        at most :data:`CLOSED_LINES_PER_S` lines a second (a flood cannot fill the disk)."""
        self._forget_hello(hello)
        close_quietly(hello.conn)
        self._count_out(hello.peer[0])
        self._pending.release()
        if why is not None:
            passed = self._closed_lines.take()
            if passed is not None:
                more = f" ({passed} more such lines not logged)" if passed else ""
                self.log(f"{client(hello.peer)}: {why}{more}", event="closed",
                         client=client(hello.peer), reason=reason)

    def _refuse_early(self, conn: socket.socket, peer: tuple, reason: str,
                      message: str) -> None:
        # Before any handshake: one small error frame without waiting (it fits the send
        # buffer), then close. The hello already here is read first, so that the close
        # is a FIN, not a reset that would discard the frame at the client.
        self.log(f"{client(peer)}: {message}", event="refused", client=client(peer),
                 reason=reason)
        with contextlib.suppress(OSError):
            conn.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                conn.recv(protocol.DATA_HELLO_BYTES)
            conn.send(protocol.encode({"type": "error", "code": reason, "message": message}))
        close_quietly(conn)

    def allows(self, address: str) -> bool:
        """Whether the --allow list accepts ``address`` (every address without one)."""
        return self._allowed(address)

    def _allowed(self, address: str) -> bool:
        if not self._networks:
            return True
        try:
            ip = _plain_address(ipaddress.ip_address(address.split("%", 1)[0]))
        except ValueError:
            return False
        return any(ip in network for network in self._networks)

    def _count_in(self, address: str) -> bool:
        with self._lock:
            count = self._per_address.get(address, 0)
            if count >= self.config.max_connections_per_address:
                return False
            self._per_address[address] = count + 1
            return True

    def _count_out(self, address: str) -> None:
        with self._lock:
            count = self._per_address.get(address, 1) - 1
            if count > 0:
                self._per_address[address] = count
            else:
                self._per_address.pop(address, None)

    def data_peer_ok(self, control_peer: tuple, peer: tuple) -> bool:
        """Whether a test's data may come from (and go to) ``peer``: the control
        connection's own address, or any with --allow-other-data-addresses."""
        if self.config.allow_other_data_addresses:
            return True
        return _same_address(control_peer[0], peer[0])

    def _attach(self, hello: DataHello, sock: socket.socket, peer: tuple) -> bool:
        with self._lock:
            session = self._sessions.get(hello.cookie)
        if session is None or not self.data_peer_ok(session.control_peer, peer):
            return False
        return session.attach(hello, sock)

    def _udp_hello(self, listener: socket.socket) -> None:
        # A UDP hello gets a challenge of its own size, sent to its source only when that
        # is the control connection's address; a stream is opened (and anything sent on
        # it) only for a proof that carries the challenge back: whoever forged the source
        # never saw the challenge (a return-routability check, like a TCP handshake).
        try:
            data, peer = listener.recvfrom(protocol.PROOF_BYTES + 1)
            kind, hello, nonce = protocol.unpack_udp(data)
        except (OSError, NetprobeError):
            return
        if not self._allowed(peer[0]):
            return
        with self._lock:
            session = self._sessions.get(hello.cookie)
        if session is None or not self.data_peer_ok(session.control_peer, peer):
            return
        expected = protocol.udp_nonce(session.udp_key, hello, peer)
        if kind == protocol.KIND_UDP:
            challenge = protocol.pack_challenge(hello, expected)
            with contextlib.suppress(OSError):
                close_quietly(udp_answer(listener.family, session.local_address, self.port,
                                         peer, challenge))
        elif hmac.compare_digest(nonce, expected):
            session.attach_udp(hello, peer, protocol.pack_data_hello(protocol.KIND_UDP, hello))

    # -- sessions ---------------------------------------------------------------------

    def _session(self, conn: socket.socket, peer: tuple) -> None:
        channel = Channel(conn, self.config.max_message_bytes)
        self.log(f"{client(peer)}: control connection", event="accepted", client=client(peer))
        session = Session(self, channel, peer)
        try:
            session.run()
        except SpecError:
            pass  # refused: the refusal is logged already
        except (OSError, NetprobeError) as exc:
            self.log(f"{client(peer)}: session ended: {escape(exc)}", event="session",
                     client=client(peer))
        finally:
            session.handshake_over()
            channel.close()
            self._count_out(peer[0])
            self._trim_when_idle()

    def _trim_when_idle(self) -> None:
        # Once no test runs, the memory the finished ones freed goes back to the system
        # (glibc keeps it in its arenas for reuse otherwise; a pass over the heap, ~1 ms).
        with self._lock:
            idle = self._active == 0
        if idle:
            core.trim_allocator()

    def _take_slot(self, key: int, doing: dict, memory: int, rate: float = 0.0,
                   streams: int = 0) -> Optional[str]:
        """Take a slot, ``memory`` bytes of the budget, ``rate`` bits/s of --max-rate and
        ``streams`` of --max-streams (all running tests share them); the reason if short."""
        cfg = self.config
        with self._lock:
            if self._active >= cfg.max_tests or self._closed.is_set():
                return f"{cfg.max_tests} test(s) running"
            if self._memory + memory > self.max_memory:
                return (f"the running tests' buffers leave {_mib(self.max_memory - self._memory)}"
                        f" of the memory limit, this test needs {_mib(memory)}")
            if cfg.max_rate_bps and self._rate + rate > cfg.max_rate_bps:
                return (f"the running tests use {_mbits(self._rate)} of the "
                        f"{_mbits(cfg.max_rate_bps)} this server allows in all (--max-rate), "
                        f"this test asks {_mbits(rate)}")
            if self._streams + streams > cfg.max_streams:
                return (f"the running tests have {self._streams} of the {cfg.max_streams} "
                        f"streams this server allows in all (--max-streams), this test asks "
                        f"{streams}")
            self._active += 1
            self._memory += memory
            self._rate += rate
            self._streams += streams
            self._charges[key] = (memory, rate, streams)
            self._running[key] = doing
            return None

    def _free_slot(self, key: int) -> None:
        with self._lock:
            memory, rate, streams = self._charges.pop(key, (0, 0.0, 0))
            self._active -= 1
            self._memory -= memory
            self._rate -= rate
            self._streams -= streams
            self._running.pop(key, None)
            self._served += 1
            if self.config.one_off:
                self._closed.set()

    def register(self, cookie: bytes, session: Attachable) -> None:
        """Make a session findable by its data connections."""
        with self._lock:
            self._sessions[cookie] = session

    def unregister(self, cookie: bytes) -> None:
        """Forget a finished session."""
        with self._lock:
            self._sessions.pop(cookie, None)

    def activity(self) -> list[dict]:
        """What each held slot is doing: kind, tool, peer, target, started (for ``status``)."""
        with self._lock:
            return [dict(doing) for doing in self._running.values()]

    @property
    def served(self) -> int:
        """Tests served since the server started."""
        with self._lock:
            return self._served

    @property
    def active_tests(self) -> int:
        """Tests holding a slot right now."""
        with self._lock:
            return self._active

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the server is closed (or, one-off, has served its test)."""
        return self._closed.wait(timeout)

    def close(self) -> None:
        """Stop accepting and release the listening sockets."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread is not None:
            self._thread.join(2.0)
        close_quietly(*self._listeners, self._wake_r, self._wake_w)
        self._listeners = []
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None


@attrs.define(eq=False)
class _Hello:
    """A connection still sending its hello (read by the accept loop, no thread of its own)."""

    conn: socket.socket
    peer: tuple
    deadline: float
    data: bytearray = attrs.Factory(bytearray)
    needed: int = protocol.HELLO_BYTES
    fd: int = -1

    def __attrs_post_init__(self) -> None:
        self.fd = self.conn.fileno()


class Session:
    """One client's control connection on the server: a native test, or an agent request
    (handlers get the session: its channel, peer, spec checks, slot and refusals)."""

    def __init__(self, server: Server, channel: Channel, peer: tuple) -> None:
        self.server = server
        self.channel = channel
        self.peer = peer
        self.control_peer = peer
        self.udp_key = secrets.token_bytes(16)
        self.spec: Optional[TestSpec] = None
        self.local_address = channel.sock.getsockname()[0]
        self._streams: dict[tuple[int, str], socket.socket] = {}
        self._lock = threading.Lock()
        self._complete = threading.Event()
        self._expected = 0
        self._sequence_base = 0
        self._handshaking = True

    def run(self) -> None:
        """Welcome, accept a test, gather its streams, run it, report."""
        cfg = self.server.config
        challenge = auth.new_challenge() if cfg.secret else None
        # With a secret set, nothing about this host (version, kernel) goes to a client
        # before it has proved itself: the auth_ok carries it instead.
        about = {} if challenge else _about()
        self.channel.send({"type": "welcome", "version": protocol.VERSION, **about,
                           "auth": auth.METHOD if challenge else None, "challenge": challenge})
        if cfg.secret and challenge:
            self._authenticate(cfg.secret, challenge)
        try:
            request = self.channel.recv(timeout=cfg.idle_timeout_s)
        except ProtocolError as exc:  # a request that cannot be read: say why, then end
            self.refuse(f"bad request: {exc}", code="protocol")
        self.handshake_over()
        handler = self.server.handlers.get(str(request["type"]))
        if handler is not None:  # an agent request (tools, far end, third party)
            handler(self, request)
            return
        if request["type"] != "test":
            self.refuse(f"unknown request {request['type']!r}", code="unknown")
        spec = self.checked_spec(request)
        features = request.get("features")
        if spec.protocol == "udp":
            self.require_udp_proof(request)
        keyed = isinstance(features, list) and "sequence_base" in features
        with self.slot(spec, memory=test_memory(spec)):
            self._serve(spec, secrets.randbits(64) if keyed else 0)

    def require_udp_proof(self, request: dict) -> None:
        """Refuse, naming this server's version, a client that does not make the UDP
        return-routability check (an older netprobe): its hellos would go unanswered, and
        it would wait for nothing."""
        features = request.get("features")
        if not isinstance(features, list) or protocol.UDP_PROOF_FEATURE not in features:
            self.refuse(f"this server ({_version()}) opens UDP streams only for clients that "
                        f"prove they receive at their address (feature "
                        f"'{protocol.UDP_PROOF_FEATURE}', which this client's request lacks): "
                        "use a netprobe client as new as the server", "version")

    def handshake_over(self) -> None:
        """The request is in (or the session ended): it no longer counts as a handshake."""
        if self._handshaking:
            self._handshaking = False
            self.server._pending.release()

    @contextlib.contextmanager
    def slot(
        self, spec: Optional[TestSpec] = None, kind: str = "test", memory: int = 0
    ) -> Iterator[None]:
        """Hold one of the server's test slots and ``memory`` bytes of its buffer budget
        (SpecError 'busy' if either is short); ``spec`` and ``kind`` say what it is used
        for, as the ``status`` request reports it.

        A slot is taken only by a valid test, and held until its connection ends; a
        refused, idle or unauthenticated client never holds one."""
        rate, streams = (test_rate(spec) or 0.0, spec.streams) if spec else (0.0, 0)
        short = self.server._take_slot(id(self), _doing(kind, self.peer, spec), memory, rate,
                                       streams)
        if short is not None:
            self.refuse(f"server busy: {short}", "busy")
        try:
            yield
        finally:
            self.server._free_slot(id(self))

    def _serve(self, spec: TestSpec, sequence_base: int) -> None:
        self.spec = spec
        who = client(self.peer)
        self.server.log(f"{who}: native test {spec_words(spec)}", event="test", client=who,
                        tool="native", spec=spec_words(spec))
        self._sequence_base = sequence_base
        cookie = secrets.token_bytes(16)
        self._expected = len(spec.flow_directions()) * spec.streams
        self.server.register(cookie, self)
        try:
            # The UDP sequence base keys the test's datagrams (see np_udp.c); an old client
            # that does not ask for one numbers from 0.
            self.channel.send({"type": "accept", "cookie": cookie.hex(),
                               "sequence_base": sequence_base})
            self._run_test(spec)
        finally:
            self.server.unregister(cookie)
            with self._lock:
                close_quietly(*self._streams.values())

    def _authenticate(self, secret: bytes, challenge: str) -> None:
        # Nothing but an auth message is accepted before the client has proved itself.
        cfg = self.server.config
        try:
            message = self.channel.recv(timeout=cfg.handshake_timeout_s)
        except (ProtocolError, OSError) as exc:
            # A client without the secret hangs up (or stays silent) at the challenge: that
            # is a refusal for want of the secret, not a session that merely ended.
            self.refuse(f"no shared secret: no answer to the challenge ({exc})", "auth")
        if message.get("type") != "auth" or not auth.verify(
            secret, challenge, "client", message.get("response")
        ):
            self.refuse("authentication failed: wrong or missing shared secret", "auth")
        theirs = message.get("challenge")
        if not isinstance(theirs, str) or len(theirs) > 2 * auth.CHALLENGE_BYTES:
            raise ProtocolError("bad client challenge")
        self.channel.send({"type": "auth_ok", "response": auth.respond(secret, theirs, "server"),
                           **_about()})

    def checked_spec(
        self, request: dict, refusals: Callable[[TestSpec], list[str]] = native_refusals
    ) -> TestSpec:
        """The request's spec, refused (to the client, and raised) if invalid, if the tool
        cannot run it (the same rules the CLI applies) or if it is over a limit."""
        cfg = self.server.config
        try:
            spec = convert.structure(request.get("spec"), TestSpec)
        except NetprobeError as exc:
            self.refuse(f"bad test spec: {exc}", "spec")
        found = refusals(spec)
        if found:
            self.refuse("; ".join(found), "spec")
        memory = test_memory(spec)
        if memory > self.server.max_memory:
            self.refuse(f"the test's buffers need {_mib(memory)} of memory, over this server's "
                        f"limit of {_mib(self.server.max_memory)}", "limit")
        planned = max(spec.planned_s() or 0.0, _paced_seconds(spec))  # warm-up on top
        if planned and planned > cfg.max_duration_s:
            self.refuse(
                f"duration {planned:g} s (with the warm-up; a byte count at its rate) exceeds "
                f"this server's limit of "
                f"{cfg.max_duration_s:g} s", "limit"
            )
        if spec.streams > cfg.max_streams:
            self.refuse(f"{spec.streams} streams exceed this server's limit of {cfg.max_streams}",
                        "limit")
        self._check_rate(spec)
        return spec

    def _check_rate(self, spec: TestSpec) -> None:
        # The limits bind before any byte leaves: a test whose streams together ask more
        # than --max-rate (or one unlimited stream) is refused, never started and cut.
        cfg = self.server.config
        rate, total = spec.rate_bits_per_second, test_rate(spec)
        limit = cfg.max_stream_rate_bps
        if limit and (rate is None or rate > limit):
            shown = "unlimited" if rate is None else _mbits(rate)
            self.refuse(f"rate {shown} a stream exceeds this server's limit of "
                        f"{_mbits(limit)} a stream (--max-stream-rate)", "limit")
        limit = cfg.max_rate_bps
        if limit and (total is None or total > limit):
            count = spec.streams * len(spec.flow_directions())
            shown = "unlimited" if total is None else f"{_mbits(total)} in all"
            self.refuse(f"rate {shown} ({count} stream(s) and directions together) exceeds "
                        f"this server's limit of {_mbits(limit)} for all its tests together "
                        f"(--max-rate): ask for at most {_mbits(limit / count)} a stream",
                        "limit")

    def refuse(self, message: str, code: str = "refused") -> NoReturn:
        """Tell the client why not, log it, then end the session (SpecError)."""
        who = client(self.peer)
        self.server.log(f"{who}: {escape(message)}", event="refused", client=who, reason=code)
        # What goes back is cut and escaped too: a refusal that echoes a client's value
        # must stay under the frame limit (it was never sent) and carry no escape codes.
        told = escape(message, REFUSAL_CHARS)
        with contextlib.suppress(OSError, NetprobeError):  # the refusal is the error
            self.channel.send({"type": "error", "code": code, "message": told})
        raise SpecError(told)

    def attach(self, hello: DataHello, sock: socket.socket) -> bool:
        """Take a TCP data connection for this test; False if it does not belong."""
        if self.spec is None or self.spec.protocol != "tcp":
            return False
        return self._add(hello, sock)

    def attach_udp(self, hello: DataHello, peer: tuple, datagram: bytes) -> None:
        """Open this test's UDP socket for a stream (connected to the client) and ack."""
        if self.spec is None or self.spec.protocol != "udp":
            return
        with self._lock:
            known = (hello.stream_id, hello.direction) in self._streams
        if known:
            return  # a retried hello: the client will see our ack on the stream socket
        try:
            sock = udp_answer(self.channel.sock.family, self.local_address, self.server.port,
                              peer, datagram)
        except OSError:
            return
        if not self._add(hello, sock):
            close_quietly(sock)

    def _add(self, hello: DataHello, sock: socket.socket) -> bool:
        assert self.spec is not None
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
        end = time.monotonic() + self.server.config.handshake_timeout_s
        while not self._complete.wait(0.1):
            if _peer_closed(self.channel.sock):
                raise ProtocolError("client left before opening its streams")
            if time.monotonic() > end:
                self.channel.send(
                    {
                        "type": "error",
                        "code": "streams",
                        "message": "not every data stream arrived in time",
                    }
                )
                raise ProtocolError("data streams missing")

    def _run_test(self, spec: TestSpec) -> None:
        self._wait_streams()
        streams = self._local_streams(spec)
        reader = Reader(self.channel)
        forward = _Forwarder()
        side = Side(spec, streams, on_interval=forward)
        # A byte-count test has no planned end; the duration limit still bounds it.
        planned = _planned(spec) or self.server.config.max_duration_s
        conductor = Conductor(self.channel, reader, side, lambda _s: None, planned)
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

    def _log_end(self, side: Side, error: Optional[str]) -> None:
        who, status = client(self.peer), "failed" if error else "ok"
        figures = _side_words(side)
        words = f"{status}, {figures}" + (f": {escape(error)}" if error else "")
        self.server.log(f"{who}: test ended {words}", event="test-end", client=who,
                        status=status, measured=figures, error=error)

    def _expire(self, side: Side) -> None:
        who = client(self.peer)
        self.server.log(f"{who}: test past its planned end: session closed", event="watchdog",
                        client=who)
        side.stop()
        self.channel.close()

    def _local_streams(self, spec: TestSpec) -> list[LocalStream]:
        streams = []
        for (stream_id, direction), sock in sorted(self._streams.items()):
            role = "receiver" if direction == "client_to_server" else "sender"
            sock.settimeout(None)
            try:
                apply_options(sock, spec)
            except SpecError as exc:
                self.channel.send({"type": "error", "code": "option", "message": str(exc)})
                raise
            stream = LocalStream(stream_id, direction, role, sock)
            stream.counters.sequence_base = self._sequence_base
            streams.append(stream)
        return streams


def test_rate(spec: TestSpec) -> Optional[float]:
    """What a test asks of the network, every stream and direction together (bits/s);
    None if unlimited."""
    if not spec.rate_bits_per_second:
        return None
    return spec.rate_bits_per_second * spec.streams * len(spec.flow_directions())


def _same_address(a: str, b: str) -> bool:
    """Whether two socket addresses name one host (a v4-mapped IPv6 one as its IPv4)."""
    try:
        return bool(_plain_address(ipaddress.ip_address(a.split("%", 1)[0]))
                    == _plain_address(ipaddress.ip_address(b.split("%", 1)[0])))
    except ValueError:
        return False


def _paced_seconds(spec: TestSpec) -> float:
    """How long a byte-count test at a fixed rate must take, warm-up included (0: not
    paced): -n 128k at -b 8 would hold a slot for days before --max-duration stopped it."""
    if spec.bytes_total is None or not spec.rate_bits_per_second:
        return 0.0
    return spec.bytes_total * 8 / spec.rate_bits_per_second + spec.omit_s


class _Forwarder:
    """Sends the server's interval samples to the client as they are taken."""

    def __init__(self) -> None:
        self.conductor: Optional[Conductor] = None

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


def _doing(kind: str, peer: tuple, spec: Optional[TestSpec]) -> dict:
    doing = {"kind": kind, "peer": peer[0], "started": utc_now_iso()}
    if spec is not None:
        doing.update(tool=spec.tool, target=spec.host if kind == "third_party" else None,
                     protocol=spec.protocol, streams=spec.streams, duration_s=spec.duration_s)
    return doing


def _peer_closed(sock: socket.socket) -> bool:
    """True if the peer has closed the connection (readable with nothing to read)."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_memory(spec: TestSpec) -> int:
    """Buffer memory a native test of ``spec`` takes on this side, every stream together."""
    total = 0
    for direction in spec.flow_directions():
        role = "receiver" if direction == "client_to_server" else "sender"
        total += spec.streams * buffer_bytes(spec, role)
    return total


def _quarter_of_memory() -> int:
    # A server shares its host (often a small router): a quarter of the memory for test
    # buffers leaves the rest to the system, whatever its size.
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


def describe(config: ServerConfig) -> str:
    """What a server with ``config`` allows, in one line for its start-up log: version,
    limits, ACL, secret and third-party mode (an operator reading the log after a restart
    sees what this process enforces, not what the unit file was meant to say)."""
    rate = _mbits(config.max_rate_bps) if config.max_rate_bps else "unlimited"
    stream = (f", {_mbits(config.max_stream_rate_bps)} a stream"
              if config.max_stream_rate_bps else "")
    memory = _mib(config.max_memory_bytes or _quarter_of_memory())
    allow = ", ".join(config.allow) if config.allow else "any address"
    return (f"{_version()}; tests at once {config.max_tests}, streams {config.max_streams} "
            f"in all, rate {rate} in all{stream}, duration {config.max_duration_s:g} s, "
            f"memory {memory}; clients: {allow}; shared secret: "
            f"{'required' if config.secret else 'none'}; third-party tests: "
            f"{'on' if config.allow_third_party else 'off'}")


def _mbits(rate: float) -> str:
    return f"{rate / 1e6:.4g} Mbit/s"


def _mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB"


def _planned(spec: TestSpec) -> Optional[float]:
    return spec.planned_s()


def _about() -> dict[str, str]:
    """What a client is told about this host (once it may know)."""
    return {"server": _version(), "system": system_name()}


def _networks(allow: tuple) -> list:
    try:
        return [_plain_network(ipaddress.ip_network(cidr, strict=False)) for cidr in allow]
    except ValueError as exc:
        raise SpecError(f"bad --allow network: {exc}") from None


def _plain_network(network: Any) -> Any:
    # ::ffff:a.b.c.d/n is an IPv4 network written as IPv6: compare it as IPv4, since an
    # IPv4 client's address is compared as IPv4 (and a v4-mapped one is made plain too).
    mapped = getattr(network.network_address, "ipv4_mapped", None)
    if mapped is None or network.prefixlen < 96:
        return network
    return ipaddress.ip_network(f"{mapped}/{network.prefixlen - 96}")


def _plain_address(ip: Any) -> Any:
    return getattr(ip, "ipv4_mapped", None) or ip


def _bind_addresses(bind: Optional[str]) -> list[tuple[int, str]]:
    if bind:
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        return [(family, bind)]
    return [(socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")]


def _version() -> str:
    return f"netprobe {__version__}"


ALLOCATOR_ARENAS = 2
"""Most malloc arenas a server process lets glibc make (8 a core by default). Every test
runs on new threads (its session, its streams, the far end's reader) and glibc gives
threads arenas of their own and keeps what they free for reuse, so a long-running server's
memory grew with the tests (25.8 -> 45.6 MiB over 1,000). Two are enough: the Python
threads allocate one at a time (the GIL), the stream loops once, at their start."""


def serve(
    config: ServerConfig, log: Log, ready: Optional[Callable[[int], None]] = None,
    handlers: Optional[dict[str, Handler]] = None,
) -> None:
    """Run a server until Ctrl-C (KeyboardInterrupt propagates) or, one-off, one test."""
    core.limit_allocator_arenas(ALLOCATOR_ARENAS)  # before any thread of ours allocates
    server = Server(config, log, handlers)
    port = server.start()
    if ready is not None:
        ready(port)
    try:
        while not server.wait(0.5):
            pass
    finally:
        server.close()
