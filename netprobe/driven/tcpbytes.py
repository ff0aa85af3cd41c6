"""The kernel's byte counters of a driven tool's TCP connections, read from outside the
tool (Linux sock_diag netlink: one dump of the TCP sockets of a family, with each one's
``tcp_info``).

For a tool whose own live figures are untimed or missing, sampling these gives intervals
timed by netprobe's clock and measured where it matters: a sender's ``bytes_acked`` (what
the far end acknowledged, so never above the path's rate, unlike bytes written into a
socket buffer) and a receiver's ``bytes_received``. ``/proc/PID/io`` cannot do this: its
``rchar``/``wchar`` do not count send()/recv() on sockets.

The counters are running totals per connection; a connection that closes leaves the dump,
so each one's last value is kept (:class:`TcpBytes`).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable, Iterator
from typing import NamedTuple

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_INET_DIAG_INFO = 2
_TCP_LISTEN = 10
_HEADER = struct.Struct("=IHHII")  # nlmsghdr
_REQUEST = struct.Struct("=BBBxI48x")  # inet_diag_req_v2: family, protocol, ext, states, id
_MESSAGE = struct.Struct("=BBBB2H16s16sI8sIIIII")  # inet_diag_msg (ports big-endian)
_ATTRIBUTE = struct.Struct("=HH")
_BYTES_ACKED, _BYTES_RECEIVED = 120, 128
"""Offsets of tcpi_bytes_acked and tcpi_bytes_received in struct tcp_info (Linux 4.1+)."""


class Connection(NamedTuple):
    """One TCP socket as sock_diag shows it."""

    local_port: int
    remote_port: int
    bytes_acked: int
    bytes_received: int
    inode: int
    """The ``socket:[N]`` of the /proc/PID/fd link of the process that holds it."""
    remote_address: str


def dump(family: int) -> Iterator[tuple[int, int, int, int]]:
    """``(local port, remote port, bytes_acked, bytes_received)`` of every TCP socket of
    ``family`` on this host (in this network namespace) but the listening ones. OSError
    where sock_diag is not there (not Linux, or no permission)."""
    for found in connections(family):
        yield found[:4]


def sockets(family: int) -> Iterator[tuple[int, int, int, int, int]]:
    """As :func:`dump`, with each socket's inode last (the ``socket:[N]`` of the
    /proc/PID/fd link of the process that holds it)."""
    for found in connections(family):
        yield found[:5]


def connections(family: int) -> Iterator[Connection]:
    """Every TCP socket of ``family`` here but the listening ones, as :class:`Connection`
    (OSError where sock_diag is not there)."""
    states = 0xFFFFFFFF & ~(1 << _TCP_LISTEN)
    body = _REQUEST.pack(family, socket.IPPROTO_TCP, 1 << (_INET_DIAG_INFO - 1), states)
    request = _HEADER.pack(_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY,
                           _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0) + body
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(2.0)
        sock.sendto(request, (0, 0))
        while True:
            data = sock.recv(1 << 16)
            for kind, payload in _messages(data):
                if kind == _NLMSG_DONE:
                    return
                if kind == _NLMSG_ERROR:
                    raise OSError("sock_diag refused the dump")
                found = _socket_bytes(payload)
                if found is not None:
                    yield found


def _messages(data: bytes) -> Iterator[tuple[int, bytes]]:
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, _flags, _seq, _pid = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size:
            return
        yield kind, data[offset + _HEADER.size:offset + length]
        offset += (length + 3) & ~3


def _socket_bytes(payload: bytes) -> Connection | None:
    if len(payload) < _MESSAGE.size:
        return None
    fields = _MESSAGE.unpack_from(payload)
    local, remote = socket.ntohs(fields[4]), socket.ntohs(fields[5])
    size = 4 if fields[0] == socket.AF_INET else 16
    address = socket.inet_ntop(fields[0], fields[7][:size])
    offset = _MESSAGE.size
    while offset + _ATTRIBUTE.size <= len(payload):
        length, kind = _ATTRIBUTE.unpack_from(payload, offset)
        if length < _ATTRIBUTE.size:
            return None
        info = payload[offset + _ATTRIBUTE.size:offset + length]
        if kind == _INET_DIAG_INFO and len(info) >= _BYTES_RECEIVED + 8:
            acked, received = struct.unpack_from("=QQ", info, _BYTES_ACKED)
            return Connection(local, remote, acked, received, fields[-1], address)
        offset += (length + 3) & ~3
    return None


class TcpBytes:
    """A running total over the TCP connections of a test: a sender's acknowledged bytes
    (connections whose far port is one of ``ports``, to ``address`` when given) or a
    receiver's received bytes (whose local port is). Each connection's last value is kept
    after it closes."""

    def __init__(self, family: int, ports: Iterable[int], role: str,
                 address: str | None = None) -> None:
        self.family = family
        self.ports = frozenset(ports)
        self.role = role
        self.address = address
        self._last: dict[tuple[int, int], int] = {}

    def total(self) -> int:
        """The bytes so far (OSError if the kernel cannot be asked)."""
        for local, remote, acked, received, _inode, address in connections(self.family):
            if self.role == "sender" and self.address not in (None, address):
                continue
            if self.role == "sender" and remote in self.ports:
                self._last[(local, remote)] = max(0, acked - 1)  # the SYN is acked too
            elif self.role == "receiver" and local in self.ports:
                self._last[(local, remote)] = received
        return sum(self._last.values())


def available(family: int = socket.AF_INET) -> bool:
    """Whether this host answers sock_diag dumps (Linux)."""
    try:
        for _ in dump(family):
            break
    except (OSError, AttributeError):  # AttributeError: no AF_NETLINK (not Linux)
        return False
    return True


__all__ = ["Connection", "TcpBytes", "available", "connections", "dump", "sockets"]
