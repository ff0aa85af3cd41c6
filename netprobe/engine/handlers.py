"""The server's handler contract: what whoever builds a netprobe server passes it, and what
each handler gets.

A control connection starts with a request; the server looks its ``type`` up in the
handlers it was given (``Server(config, handlers={...})``) and calls the handler with the
:class:`ControlConnection` and the request. The native test (``"test"``), the latency
echo (``"latency"``) and the agent's requests (tools, far ends, third-party tests, status)
are all handlers; a listener of another protocol on a port of its own (the
iperf3-compatible one) is a :class:`Service`. A handler refuses with ``control.refuse``
(the client is told why, the refusal is logged), holds one of the server's test slots with
``control.slot``, and hands the data connections and UDP streams it expects to the server
by cookie (``control.server.register``): they arrive on the server's port and are given
to the :class:`Attachable` registered under their cookie.

Names: a *session* is one test run (a native test, a latency probe session, a driven
tool's run, the road's :mod:`netprobe.session`); the connection a client opens to ask for
one is its *control connection*.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import NoReturn, Protocol

from netprobe.engine.admission import Admission
from netprobe.engine.config import ServerConfig
from netprobe.engine.log import Log
from netprobe.engine.protocol import Channel, DataHello
from netprobe.schema import TestSpec


class Attachable(Protocol):
    """What data connections and UDP hellos are handed to, by cookie: a native test, or a
    latency probe session's echo."""

    control_peer: tuple
    """The control connection's peer: data may come only from its address."""
    local_address: str
    """The control connection's local address: UDP answers leave from it."""
    udp_key: bytes
    """The test's secret for the UDP return-routability nonces."""

    def attach(self, hello: DataHello, sock: socket.socket) -> bool:
        """Take a TCP data connection; False if it does not belong."""

    def attach_udp(self, hello: DataHello, peer: tuple, datagram: bytes) -> None:
        """Take a UDP stream whose ``peer`` has proved it receives there, and answer it
        ``datagram`` (the hello) from the stream's own socket."""


class ServerFacts(Protocol):
    """The server as a handler sees it."""

    config: ServerConfig
    """What the server allows."""
    log: Log
    """The event log (one line and one record per event)."""
    port: int
    """The port it listens on (TCP and UDP)."""
    admission: Admission
    """Its slots, budgets, ACL and per-address counts."""

    def allows(self, address: str) -> bool:
        """Whether the --allow list accepts ``address``."""

    def data_peer_ok(self, control_peer: tuple, peer: tuple) -> bool:
        """Whether a test's data may come from (and go to) ``peer``."""

    def register(self, cookie: bytes, attached: Attachable) -> None:
        """Hand the data connections and UDP streams carrying ``cookie`` to ``attached``."""

    def unregister(self, cookie: bytes) -> None:
        """Stop handing them (the test is over)."""


class ControlConnection(Protocol):
    """One client's control connection, after its welcome (and proof of the secret)."""

    server: ServerFacts
    channel: Channel
    """The control connection's framed messages."""
    peer: tuple
    """The client's address and port."""
    control_peer: tuple
    """The same: the address data may come from."""
    local_address: str
    """This end's address on the control connection."""
    udp_key: bytes
    """The connection's secret for UDP return-routability nonces."""

    def refuse(self, message: str, code: str = "refused") -> NoReturn:
        """Tell the client why not, log it, then close the connection (SpecError)."""

    def slot(self, spec: TestSpec | None = None, kind: str = "test",
             memory: int = 0) -> AbstractContextManager[None]:
        """Hold one of the server's test slots and ``memory`` bytes of its budget."""

    def checked_spec(self, request: dict,
                     refusals: Callable[[TestSpec], list[str]] = ...) -> TestSpec:
        """The request's spec, refused if invalid, not runnable or over a limit."""

    def require_udp_proof(self, request: dict) -> None:
        """Refuse a client that does not make the UDP return-routability check."""


class Service(Protocol):
    """A listener of another kind a Server runs beside its port (iperf3's: a stock client
    speaks its own protocol from its first byte, on its own port). It is started with the
    server, takes its slots from ``server.admission`` and logs to ``server.log``."""

    def start(self, server: ServerFacts) -> int:
        """Listen (OSError if it cannot); returns the port."""

    def close(self) -> None:
        """Stop listening."""


Handler = Callable[[ControlConnection, dict], None]
"""A request's handler: called with the control connection and the request on the
connection's thread; it returns when the request is done (or raises: SpecError for a
refusal)."""


__all__ = ["Attachable", "ControlConnection", "Handler", "ServerFacts", "Service"]
