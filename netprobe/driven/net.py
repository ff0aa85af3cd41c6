"""The network around a driven tool: free ports, whether a server listens, whether a host
is this machine.

:func:`free_port`, :func:`port_is_free`, :func:`is_listening`, :func:`wait_port` and
:func:`is_local_host` help a plugin start the tool's server on this machine and know when
it is ready (:func:`free_port_block` for tools that take a run of ports); :func:`loopback`,
:func:`family_for`, :func:`is_numeric` and :func:`system_name` say what a result's
endpoints need.
"""

from __future__ import annotations

import ipaddress
import random
import socket
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Union

from netprobe.errors import TestFailed
from netprobe.host import system_name

if TYPE_CHECKING:
    from netprobe.schema import TestSpec

_Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

_POLL_S = 0.02
"""How often waiting loops look again."""


_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
_DEFAULT_EPHEMERAL = (32768, 60999)  # Linux's default, where the file cannot be read
_LOWEST_CHOSEN = 20000
"""Chosen ports start here: clear of the services' well-known ports (iperf 5001, iperf3
5201, netprobe 5301, ...) that a test may need free on the same host."""


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open(_EPHEMERAL_RANGE, encoding="ascii") as handle:
            low, high = (int(word) for word in handle.read().split()[:2])
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL
    return low, high


def _candidate_ranges() -> list[range]:
    """Where a chosen port may lie: outside the kernel's ephemeral range, whose ports any
    connect() on this machine may be given (the tool's own client among them) between the
    choice and the server's bind; a server then fails with "Address already in use"."""
    low, high = _ephemeral_range()
    ranges = [range(_LOWEST_CHOSEN, low), range(high + 1, 65536)]
    return [r for r in ranges if len(r) >= 256]


def free_port(
    family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM, host: str = "127.0.0.1"
) -> int:
    """A port on ``host`` that is free now for TCP and UDP alike (tools often use both),
    outside the kernel's ephemeral range where there is room for one (see
    :func:`_candidate_ranges`), else one the kernel picks.

    Another process may still bind it before the caller does; callers that start a
    server should check that it came up.
    """
    if family == socket.AF_INET6 and host == "127.0.0.1":
        host = "::1"
    ranges = _candidate_ranges()
    for _ in range(50):
        if ranges:
            port = random.choice(random.choice(ranges))
        else:
            with socket.socket(family, kind) as sock:
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
        if port_is_free(port, family, host):
            return port
    raise OSError(f"no free port found on {host}")


def free_port_block(count: int, family: int = socket.AF_INET, *, below: int = 0,
                    avoid: Collection[int] = (), lowest: int = 1024) -> int:
    """The first of ``count`` consecutive ports that are free now for TCP and UDP, with
    the ``below`` ports just under it free too (a tool's sync or control port), none of
    them in ``avoid`` nor under ``lowest``. TestFailed if 100 tries find none.

    Tools that open one data port per stream (nuttcp -N, ntttcp -m) need the whole run."""
    for _ in range(100):
        start = free_port(family)
        ports = range(start - below, start + count)
        if ports.start < lowest or ports.stop - 1 > 65535 or any(p in ports for p in avoid):
            continue
        if all(port_is_free(port, family) for port in ports if port != start):
            return start
    raise TestFailed(f"no block of {below + count} free ports found")


def loopback(family: int) -> str:
    """This machine's loopback address in ``family``: ``::1`` or ``127.0.0.1``."""
    return "::1" if family == socket.AF_INET6 else "127.0.0.1"


def port_is_free(port: int, family: int = socket.AF_INET, host: str | None = None) -> bool:
    """True if ``port`` can be bound now for both TCP and UDP on ``host`` (loopback)."""
    host = host or loopback(family)
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        try:
            with socket.socket(family, kind) as sock:
                sock.bind((host, port))
        except OSError:
            return False
    return True


def is_listening(port: int, family: int = socket.AF_INET, udp: bool = False) -> bool:
    """True if a TCP socket listens (or a UDP socket is bound) on ``port``, read from
    /proc/net. No connection is made: one-shot servers (iperf3 -1, nuttcp -1) would take
    a probe connection for their test, and ntttcp would take it for a sender."""
    name = ("udp" if udp else "tcp") + ("6" if family == socket.AF_INET6 else "")
    wanted = f":{port:04X}"
    try:
        with open(f"/proc/net/{name}") as table:
            rows = table.read().splitlines()[1:]
    except OSError:
        return False
    return any(
        len(cols) > 3 and cols[1].endswith(wanted) and (udp or cols[3] == "0A")
        for cols in (row.split() for row in rows)
    )


def wait_port(host: str, port: int, timeout: float) -> bool:
    """Poll with TCP connects until something listens on ``host:port`` (True) or ``timeout``
    passes (False). Each attempt opens a real connection the server will see."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.05, min(0.5, remaining))):
                return True
        except OSError:
            pass
        if time.monotonic() + _POLL_S >= deadline:
            return False
        time.sleep(_POLL_S * 2)


def is_local_host(host: str | None) -> bool:
    """True when ``host`` is this machine: None, ``localhost``, 127.0.0.0/8, ::1, an
    unspecified address, or a name or address assigned to one of this machine's interfaces."""
    if host is None or host.strip().lower() in ("", "localhost", "localhost.localdomain"):
        return True
    literal = host.strip().strip("[]").split("%", 1)[0]
    try:
        addresses: list[_Address] = [ipaddress.ip_address(literal)]
    except ValueError:
        addresses = _resolve_host(host)
        if not addresses:
            return False
    return all(_is_local_address(addr) for addr in addresses)


def _resolve_host(host: str) -> list[_Address]:
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    found: list[_Address] = []
    for info in infos:
        try:
            found.append(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]))
        except ValueError:
            continue
    return found


def _is_local_address(addr: _Address) -> bool:
    if addr.is_loopback or addr.is_unspecified:
        return True
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    # Binding succeeds only for an address assigned to this machine (EADDRNOTAVAIL otherwise).
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.bind((str(addr), 0))
    except OSError:
        return False
    return True


def family_for(spec: TestSpec) -> int:
    """The address family of ``spec``'s test: IPv6 when asked (``-6``) or when the host is
    an IPv6 literal, else IPv4."""
    if spec.ip_version == 6 or (spec.host is not None and ":" in spec.host):
        return socket.AF_INET6
    return socket.AF_INET


def is_numeric(host: str) -> bool:
    """True when ``host`` is an IPv4 or IPv6 address, not a name."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        return True
    return False


__all__ = ["family_for", "free_port", "free_port_block", "is_listening", "is_local_host",
           "is_numeric", "loopback", "port_is_free", "system_name", "wait_port"]
