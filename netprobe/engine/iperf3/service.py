"""The iperf3 listener a netprobe :class:`~netprobe.engine.server.Server` runs beside its
own port (``netprobe server --iperf3``): stock iperf3 clients speak iperf3 from their first
byte, so they get a port of their own (5201). Every new connection sends a 37-byte cookie:
one a running test registered is that test's data stream; any other starts a control
session (:class:`~netprobe.engine.iperf3.session.Iperf3Test`) that shares the server's
Admission (ACL, per-address counts, slots and budgets) and its log. Several tests run at
once up to ``--max-tests``; the rest get iperf3's busy byte."""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from typing import Any, Callable

from netprobe.engine.iperf3 import wire
from netprobe.engine.iperf3.session import Iperf3Test
from netprobe.engine.log import client, escape
from netprobe.schema import Result

DEFAULT_PORT = 5201


class Iperf3Service:
    """A second listener kind for a Server: iperf3's protocol on its own TCP port."""

    kind = "iperf3"
    """The key of :meth:`status` in the agent's ``status`` reply."""

    def __init__(self, port: int = DEFAULT_PORT,
                 on_result: Callable[[Result], None] | None = None,
                 auth: Any = None) -> None:
        self.port = port
        self.auth = auth
        """A :class:`~netprobe.engine.iperf3.auth.ServerAuth` every client's token must
        pass, or None (no authentication; this module does not import it: it needs the
        optional ``cryptography`` package)."""
        self.on_result = on_result
        """Called with the server's Result of each test served (e.g. to save it)."""
        self.server: Any = None
        self.counters = {"served": 0, "refused": 0, "busy": 0}
        """Tests served, refused (limits, ACL, bad params) and told busy (exporter)."""
        self._tests: dict[bytes, Iperf3Test] = {}
        self._lock = threading.Lock()
        # one count for every listener (an accept loop each): next() on it is atomic
        self._accepted = itertools.count()
        self._listeners: list[socket.socket] = []
        self._closed = threading.Event()
        self.udp_setup = threading.Lock()
        """Held by the one test setting up its UDP streams (they carry no cookie)."""

    def start(self, server: Any) -> int:
        """Listen beside ``server`` (its bind address, config, admission, log); the port."""
        self.server = server
        bind = server.config.bind_address
        families = ([(socket.AF_INET6 if ":" in bind else socket.AF_INET, bind)] if bind
                    else [(socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")])
        for family, address in families:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((address, self.port))
                self.port = sock.getsockname()[1]
                sock.listen(128)
            except OSError:
                sock.close()
                if bind or not self._listeners:
                    raise  # no IPv6 on this host is fine once IPv4 listens
                continue
            self._listeners.append(sock)
        for sock in self._listeners:
            threading.Thread(target=self._accept_loop, args=(sock,), daemon=True,
                             name="np-i3-accept").start()
        return self.port

    def close(self) -> None:
        """Stop accepting."""
        self._closed.set()
        for sock in self._listeners:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    # -- the tests' bookkeeping --------------------------------------------------------

    def remember(self, cookie: bytes, test: Iperf3Test) -> None:
        """Hand the data connections carrying ``cookie`` to ``test``."""
        with self._lock:
            self._tests[cookie] = test

    def forget(self, cookie: bytes) -> None:
        """The test is over."""
        with self._lock:
            self._tests.pop(cookie, None)

    def count(self, what: str) -> None:
        """One more served, refused or busy."""
        with self._lock:
            self.counters[what] += 1

    def status(self) -> dict[str, int]:
        """The counters since start (served, refused, busy), the tests running now and the
        port: the agent's ``status`` reply carries it, so an exporter can show it."""
        with self._lock:
            return {**self.counters, "running": len(self._tests), "port": self.port}

    def record(self, result: Result) -> None:
        """The server's Result of a test: to ``on_result`` if any (errors logged)."""
        if self.on_result is None:
            return
        try:
            self.on_result(result)
        except Exception as exc:  # a sink's failure must not end the server
            self.server.log(f"iperf3 result not kept: {escape(exc)}", event="error")

    # -- connections -------------------------------------------------------------------

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                conn, peer = listener.accept()
            except OSError:
                if self._closed.is_set():
                    return
                self._closed.wait(0.1)  # e.g. out of files: let the tests end
                continue
            # Numbered as accepted: a test's data connections take their roles in this
            # order, not in the order their threads read the cookies.
            order = next(self._accepted)
            # The limits come before a thread: a flood past them costs an accept and a
            # close each, not a thread each.
            try:
                if self._admitted(conn, peer):
                    self._start(conn, peer, order)
            except Exception as exc:  # this loop must outlive any one step
                # Were this thread to die, the port would stay open and answer no one.
                conn.close()
                with contextlib.suppress(Exception):
                    self.server.log_limited(f"iperf3: internal error while accepting: "
                                            f"{escape(repr(exc))}", event="error",
                                            reason="internal")
                self._closed.wait(0.1)

    def _start(self, conn: socket.socket, peer: tuple, order: int) -> None:
        """Serve an admitted connection on a thread of its own; at the tasks limit
        (TasksMax, pids.max) none starts: closed unserved, its holds given back."""
        try:
            _spawn(self._connection, conn, peer, order)
        except RuntimeError:
            conn.close()
            self.server.admission.count_out(peer[0])
            self.server.admission.handshakes.release()
            self.server.log_limited(f"{client(peer)}: no thread to serve it (the tasks "
                                    "limit): closed", event="refused", client=client(peer),
                                    reason="threads")

    def _admitted(self, conn: socket.socket, peer: tuple) -> bool:
        """Whether ``conn`` is within the per-address and handshake limits (it then holds
        one of each, which :meth:`_connection` gives back); else it is closed."""
        admission = self.server.admission
        if not admission.count_in(peer[0]):
            self.server.log_limited(f"{client(peer)}: too many connections at once "
                                    "(--max-connections-per-address)", event="refused",
                                    client=client(peer), reason="per-address limit")
            conn.close()
            return False
        if not admission.handshakes.acquire(blocking=False):
            admission.count_out(peer[0])
            conn.close()  # too many half-open handshakes: shed load, say nothing
            self.server.log_limited(f"{client(peer)}: too many handshakes at once",
                                    event="refused", client=client(peer), reason="handshakes")
            return False
        return True

    def _connection(self, conn: socket.socket, peer: tuple, order: int) -> None:
        try:
            self._first_bytes(conn, peer, order)
        finally:
            self.server.admission.count_out(peer[0])

    def _first_bytes(self, conn: socket.socket, peer: tuple, order: int) -> None:
        admission = self.server.admission
        try:
            conn.settimeout(self.server.config.handshake_timeout_s)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            cookie = wire.recv_exact(conn, wire.COOKIE_BYTES)
        except (OSError, wire.WireError) as exc:
            self.server.log_limited(f"{client(peer)}: iperf3 connection closed before its "
                                    f"cookie: {escape(exc)}", event="closed",
                                    client=client(peer), reason="no-cookie")
            conn.close()
            return
        finally:
            admission.handshakes.release()
        # iperf3 compares cookies up to the NUL (strncmp).
        cookie = cookie.split(b"\0", 1)[0]
        with self._lock:
            test = self._tests.get(cookie)
        if test is not None:
            if not test.attach(conn, peer, order):
                with contextlib.suppress(OSError):
                    wire.send_state(conn, wire.ACCESS_DENIED)
                conn.close()
            return
        if not admission.allowed(peer[0]):
            self.count("refused")
            self.server.log_limited(f"{client(peer)}: this server does not accept tests from "
                                    f"{peer[0]} (--allow)", event="refused",
                                    client=client(peer), reason="acl")
            with contextlib.suppress(OSError):
                conn.sendall(wire.error_frame(wire.IEAUTHTEST))
            wire.sync_close(conn)
            return
        self.server.log(f"{client(peer)}: iperf3 control connection", event="accepted",
                        client=client(peer))
        Iperf3Test(self, conn, peer, cookie).run()


def _spawn(target: Callable[..., None], *args: object) -> None:
    """Run ``target(*args)`` on a thread of its own (one per admitted connection)."""
    threading.Thread(target=target, args=args, daemon=True, name="np-i3-conn").start()
