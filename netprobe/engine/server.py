"""``netprobe server``: the native engine's far end, and the listener every other service
of the port plugs into.

One port serves control connections, TCP data connections and UDP streams. The
:class:`Server` listens, reads each new connection's hello on one thread, and then either
hands a data connection (or a proven UDP stream) to whoever registered its cookie, or
starts a control connection (:class:`~netprobe.engine.control.Connection`) on a thread of its
own, which runs the handler its request names (the contract:
:mod:`netprobe.engine.handlers`; the native test, :mod:`netprobe.engine.nativetest`, and
the latency echo, :mod:`netprobe.engine.echo`, are handlers like the agent's). Who is
admitted and what they may take is :class:`~netprobe.engine.admission.Admission`'s: a
session holds one of ``max_tests`` slots from the moment its test is accepted until its
control connection ends, whatever the reason, so the server is never stuck busy.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import importlib
import os
import selectors
import socket
import threading
import time
from collections.abc import Sequence
from typing import Callable

import attrs

from netprobe import core
from netprobe.engine import probes, protocol
from netprobe.engine.admission import Admission, mbits, mib, quarter_of_memory, same_address
from netprobe.engine.config import ServerConfig, check_config
from netprobe.engine.control import Connection, version
from netprobe.engine.echo import ProbeService
from netprobe.engine.handlers import Attachable, Handler, Service
from netprobe.engine.log import Log, Throttle, client, escape, null_log
from netprobe.engine.nativetest import native_test
from netprobe.engine.protocol import Channel, DataHello, close_quietly
from netprobe.engine.sockets import udp_answer
from netprobe.errors import NetprobeError, SpecError, listen_error

__all__ = ["ALLOCATOR_ARENAS", "Server", "ServerConfig", "describe", "serve"]

OUT_OF_FILES_PAUSE_S = 0.1  # accepting stops this long at the open-files limit
LOADED_BEFORE_SERVING = ("datetime", "hashlib", "hmac", "secrets")
"""Modules the serving code imports only where first used (a client's start-up need not
load them): a server loads them before it listens, because at the open-files limit an
import cannot open its file and would fail in the middle of serving (it killed the accept
loop once: the log's clock imported datetime at the limit). tests/test_server_faults.py
checks that this names every late import of the code a server runs."""
CLOSED_LINES_PER_S = 10
"""Lines a second of each event a client can cause at will (a connection refused, closed
in its hello, told busy): past it a flood of connects cannot fill the disk; the next line
that passes says how many were held back (see :meth:`Server.log_limited`)."""


class Server:
    """A running netprobe server (start() it; close() it)."""

    def __init__(
        self, config: ServerConfig, log: Log | None = None,
        handlers: dict[str, Handler] | None = None,
        services: Sequence[Service] = (),
    ) -> None:
        check_config(config)
        self.services = tuple(services)
        """Listeners of other kinds run beside the port (e.g. iperf3's, on its own port):
        started with the server and sharing its admission and log."""
        self.config = config
        self.handlers: dict[str, Handler] = {"test": native_test,
                                             probes.REQUEST: ProbeService(),
                                             **(handlers or {})}
        """The handler of each request type a session can start with (the native test, the
        latency echo, the agent's requests: see :mod:`netprobe.engine.handlers`)."""
        self.log: Log = log or null_log
        self.port = config.port
        self._closed = threading.Event()
        self.admission = Admission(config, self._closed)
        """Who is admitted and what they may take."""
        self._listeners: list[socket.socket] = []
        self._sessions: dict[bytes, Attachable] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._hellos: dict[int, _Hello] = {}  # connections in their hello, by fd
        self._selector = selectors.DefaultSelector()  # the accept loop's (see _accept_loop)
        self._spare: int | None = os.open(os.devnull, os.O_RDONLY)  # see _out_of_files
        self._limited = {event: Throttle(CLOSED_LINES_PER_S)
                         for event in ("refused", "closed", "busy", "error")}

    # -- listening --------------------------------------------------------------------

    def start(self) -> int:
        """Bind the TCP and UDP sockets and start accepting; returns the port."""
        for name in LOADED_BEFORE_SERVING:
            importlib.import_module(name)
        for family, address in _bind_addresses(self.config.bind_address):
            self._listen(family, address)
        if not self._listeners:
            raise OSError(f"cannot listen on port {self.config.port}")
        self._thread = threading.Thread(target=self._accept_loop, name="np-accept", daemon=True)
        self._thread.start()
        try:
            for service in self.services:
                service.start(self)
        except OSError:
            self.close()
            raise
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
                    self._guarded(self._event, key)
                self._guarded(self._expire_hellos)
            for hello in list(self._hellos.values()):
                self._guarded(self._drop_hello, hello)

    def _event(self, key: selectors.SelectorKey) -> None:
        if isinstance(key.data, _Hello):
            self._hello_bytes(key.data)
            return
        listener = key.fileobj
        assert isinstance(listener, socket.socket)
        if listener is self._wake_r:
            return  # close() wants the loop to look at _closed now
        if listener.type == socket.SOCK_STREAM:
            self._accept(listener)
        else:
            self._udp_hello(listener)

    def _guarded(self, step: Callable[..., None], *args: object) -> None:
        # This one thread accepts every connection: if it died, the port would stay open
        # and answer no one (a black hole that systemd does not restart). A step that
        # fails for any reason (a thread that cannot start at the tasks limit, a log sink
        # that raises, a bug) loses that connection, never the loop; the pause keeps a
        # failure that repeats from spinning.
        try:
            step(*args)
        except Exception as exc:  # any failure of one step: see above
            if isinstance(args[0] if args else None, _Hello):
                with contextlib.suppress(Exception):
                    self._drop_hello(args[0])  # type: ignore[arg-type]
            with contextlib.suppress(Exception):
                self.log_limited(f"internal error while accepting: {escape(repr(exc))}",
                                 event="error", reason="internal")
            self._closed.wait(OUT_OF_FILES_PAUSE_S)

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
        if not self.admission.allowed(peer[0]):
            self._refuse_early(conn, peer, "acl", "this server does not accept tests from "
                               f"{peer[0]} (--allow)")
            return
        if not self.admission.count_in(peer[0]):
            self._refuse_early(conn, peer, "per-address limit", "too many connections from "
                               f"{peer[0]} at once (--max-connections-per-address)")
            return
        if not self.admission.handshakes.acquire(blocking=False):
            self.admission.count_out(peer[0])
            close_quietly(conn)  # too many half-open handshakes: shed load, say nothing
            self.log_limited(f"{client(peer)}: too many handshakes at once", event="refused",
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
                    self._start_control(hello)
                else:
                    self._drop_hello(hello, "sent no netprobe hello", "protocol")
                return
            if len(hello.data) == protocol.DATA_HELLO_BYTES:
                data = protocol.unpack_data_hello(bytes(hello.data[protocol.HELLO_BYTES:]))
                self._forget_hello(hello)
                hello.conn.setblocking(True)
                if not self._attach(data, hello.conn, hello.peer):
                    close_quietly(hello.conn)
                self.admission.count_out(hello.peer[0])
                self.admission.handshakes.release()
        except NetprobeError as exc:
            self._drop_hello(hello, f"bad hello: {escape(exc)}", "protocol")

    def _start_control(self, hello: _Hello) -> None:
        self._forget_hello(hello)
        try:
            threading.Thread(target=self._control, args=(hello.conn, hello.peer),
                             name="np-conn", daemon=True).start()
        except RuntimeError:
            # At the tasks limit (systemd's TasksMax, a cgroup's pids.max) no thread
            # starts: this connection is closed unserved, and the next may find one.
            close_quietly(hello.conn)
            self.admission.count_out(hello.peer[0])
            self.admission.handshakes.release()
            self.log_limited(f"{client(hello.peer)}: no thread to serve it (the tasks "
                             "limit): closed", event="refused", client=client(hello.peer),
                             reason="threads")

    def _expire_hellos(self) -> None:
        now = time.monotonic()
        for hello in [h for h in self._hellos.values() if h.deadline <= now]:
            self._drop_hello(hello, f"no hello within {self.config.handshake_timeout_s:g} s "
                                    "(--handshake-timeout)", "timeout")

    def _forget_hello(self, hello: _Hello) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(hello.conn)
        self._hellos.pop(hello.fd, None)

    def _drop_hello(self, hello: _Hello, why: str | None = None,
                    reason: str = "") -> None:
        """Close a connection still in its hello; ``why`` is logged (a scan leaves a line,
        :meth:`log_limited`)."""
        self._forget_hello(hello)
        close_quietly(hello.conn)
        self.admission.count_out(hello.peer[0])
        self.admission.handshakes.release()
        if why is not None:
            self.log_limited(f"{client(hello.peer)}: {why}", event="closed",
                             client=client(hello.peer), reason=reason)

    def log_limited(self, message: str, /, event: str, **fields: object) -> None:
        """Log a line of an event a client can cause at will ("refused", "closed",
        "busy"): at most :data:`CLOSED_LINES_PER_S` of each a second (in any second, not
        only whole ones), the next that passes saying how many were held back."""
        throttle = self._limited.get(event)
        passed = throttle.take() if throttle is not None else 0
        if passed is not None:
            more = f" ({passed} more such lines not logged)" if passed else ""
            self.log(f"{message}{more}", event=event, **fields)

    def _refuse_early(self, conn: socket.socket, peer: tuple, reason: str,
                      message: str) -> None:
        # Before any handshake: one small error frame without waiting (it fits the send
        # buffer), then close. The hello already here is read first, so that the close
        # is a FIN, not a reset that would discard the frame at the client.
        self.log_limited(f"{client(peer)}: {message}", event="refused", client=client(peer),
                         reason=reason)
        with contextlib.suppress(OSError):
            conn.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                conn.recv(protocol.DATA_HELLO_BYTES)
            conn.send(protocol.encode({"type": "error", "code": reason, "message": message}))
        close_quietly(conn)

    def allows(self, address: str) -> bool:
        """Whether the --allow list accepts ``address`` (every address without one)."""
        return self.admission.allowed(address)

    def data_peer_ok(self, control_peer: tuple, peer: tuple) -> bool:
        """Whether a test's data may come from (and go to) ``peer``: the control
        connection's own address, or any with --allow-other-data-addresses."""
        if self.config.allow_other_data_addresses:
            return True
        return same_address(control_peer[0], peer[0])

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
        if not self.admission.allowed(peer[0]):
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

    # -- control connections ---------------------------------------------------------

    def _control(self, conn: socket.socket, peer: tuple) -> None:
        channel = Channel(conn, self.config.max_message_bytes)
        self.log(f"{client(peer)}: control connection", event="accepted", client=client(peer))
        control = Connection(self, self.handlers, channel, peer)
        try:
            control.run()
        except SpecError:
            pass  # refused: the refusal is logged already
        except (OSError, NetprobeError) as exc:
            self.log(f"{client(peer)}: session ended: {escape(exc)}", event="session",
                     client=client(peer))
        finally:
            control.handshake_over()
            channel.close()
            self.admission.count_out(peer[0])
            self._trim_when_idle()

    def _trim_when_idle(self) -> None:
        # Once no test runs, the memory the finished ones freed goes back to the system
        # (glibc keeps it in its arenas for reuse otherwise; a pass over the heap, ~1 ms).
        if self.admission.active_tests == 0:
            core.trim_allocator()

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
        return self.admission.activity()

    @property
    def served(self) -> int:
        """Tests served since the server started."""
        return self.admission.served

    @property
    def active_tests(self) -> int:
        """Tests holding a slot right now."""
        return self.admission.active_tests

    @property
    def max_memory(self) -> int:
        """Buffer memory all running tests may take together."""
        return self.admission.max_memory

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server is closed (or, one-off, has served its test)."""
        return self._closed.wait(timeout)

    def close(self) -> None:
        """Stop accepting and release the listening sockets."""
        self._closed.set()
        for service in self.services:
            service.close()
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


def describe(config: ServerConfig) -> str:
    """What a server with ``config`` allows, in one line for its start-up log: version,
    limits, ACL, secret and third-party mode (an operator reading the log after a restart
    sees what this process enforces, not what the unit file was meant to say)."""
    rate = mbits(config.max_rate_bps) if config.max_rate_bps else "unlimited"
    stream = (f", {mbits(config.max_stream_rate_bps)} a stream"
              if config.max_stream_rate_bps else "")
    memory = mib(config.max_memory_bytes or quarter_of_memory())
    allow = ", ".join(config.allow) if config.allow else "any address"
    return (f"{version()}; tests at once {config.max_tests}, streams {config.max_streams} "
            f"in all, rate {rate} in all{stream}, duration {config.max_duration_s:g} s, "
            f"memory {memory}; clients: {allow}; shared secret: "
            f"{'required' if config.secret else 'none'}; third-party tests: "
            f"{'on' if config.allow_third_party else 'off'}")


def _bind_addresses(bind: str | None) -> list[tuple[int, str]]:
    if bind:
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        return [(family, bind)]
    return [(socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")]


ALLOCATOR_ARENAS = 2
"""Most malloc arenas a server process lets glibc make (8 a core by default). Every test
runs on new threads (its session, its streams, the far end's reader) and glibc gives
threads arenas of their own and keeps what they free for reuse, so a long-running server's
memory grew with the tests (25.8 -> 45.6 MiB over 1,000). Two are enough: the Python
threads allocate one at a time (the GIL), the stream loops once, at their start."""


def serve(
    config: ServerConfig, log: Log, ready: Callable[[int], None] | None = None,
    handlers: dict[str, Handler] | None = None, services: Sequence[Service] = (),
) -> None:
    """Run a server until Ctrl-C (KeyboardInterrupt propagates) or, one-off, one test."""
    core.limit_allocator_arenas(ALLOCATOR_ARENAS)  # before any thread of ours allocates
    server = Server(config, log, handlers, services)
    port = server.start()
    if ready is not None:
        ready(port)
    try:
        while not server.wait(0.5):
            pass
    finally:
        server.close()
