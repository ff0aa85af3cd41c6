"""Holding a far end to the agent's limits, whatever its client asks of it.

A stock tool server (``iperf3 -s``, ``iperf -s``, ``nuttcp -S``) obeys its client: the
spec the agent checked is only what the client *said* it would run. So while a far end
runs, the agent watches it from outside, through /proc, and stops it (by PID) at the first
breach:

* its planned end plus a small grace has passed;
* it holds more established TCP connections than the spec's streams allow (plus the
  tool's control and sync connections);
* a connected socket of it talks to an address the agent's ``--allow`` list refuses;
* with ``--max-rate``, it moves more bytes per second than the test may (the limit is the
  test's, every stream and direction together). Two counts, the larger taken: its
  sockets' own byte counts, which see every way of sending (write, send, sendto, sendmsg,
  sendfile, splice, zero-copy, GSO): for TCP each connection's ``tcp_info`` through
  sock_diag (:mod:`netprobe.driven.tcpbytes`), for UDP an nftables counter on its UDP
  sockets' ports (:mod:`netprobe.agent.udpcount`: the kernel keeps no per-socket UDP
  count); and the bytes it read and wrote (/proc/PID/io, read/write only). Where no UDP
  counter could be installed, a far end that opens a UDP socket is stopped: its rate could
  not be held.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import attrs

from netprobe.agent.udpcount import CounterUnavailable, UdpCounter
from netprobe.driven import tcpbytes

CHECK_S = 0.2  # how often the far end is looked at
GRACE_S = 5.0  # past the planned end, how long a far end may run on
EXTRA_CONNECTIONS = 2  # a tool's control connection and, for ntttcp, its sync connection
RATE_SLACK = 1.5  # headroom over the allowed rate (bursts, protocol overhead)
RATE_FLOOR_BYTES_S = 256 * 1024  # control traffic and a slow start's overshoot
_NO_COUNTER = "has no counter for UDP"
_TCP_ESTABLISHED = "01"
_TCP_LISTEN = "0A"


@attrs.define
class Limits:
    """What one far end may do."""

    deadline: float
    """time.monotonic() by which it must have ended."""
    max_connections: int
    """Established TCP connections it may hold at once."""
    max_bytes_per_s: float | None
    """Bytes it may read and write per second, together; None: no limit."""
    allowed: Callable[[str], bool]
    """Whether the agent would accept this address as a client (its --allow list)."""


def limits_for(streams: int, directions: int, planned_s: float, rate_bps: float | None,
               allowed: Callable[[str], bool]) -> Limits:
    """The limits of a far end for ``streams`` per direction, starting now."""
    per_s = None
    if rate_bps:
        # The test's total, streams and directions together (--max-rate is per test).
        per_s = rate_bps / 8 * RATE_SLACK + RATE_FLOOR_BYTES_S
    return Limits(deadline=time.monotonic() + planned_s + GRACE_S,
                  max_connections=streams * directions + EXTRA_CONNECTIONS,
                  max_bytes_per_s=per_s, allowed=allowed)


class Guard:
    """Watches one far end's process (and its children); :meth:`breach` says why it must
    be stopped, or None."""

    def __init__(self, pid: int, limits: Limits, udp: UdpCounter | None = None,
                 no_udp: str | None = None) -> None:
        """``udp`` counts the far end's UDP bytes (the guard tells it the ports);
        ``no_udp`` says why there is none, when a rate limit needs one."""
        self.pid = pid
        self.limits = limits
        self.udp = udp
        self.no_udp = no_udp
        self._io: tuple[float, int] | None = None
        self._tcp: dict[str, int] = {}  # inode -> its last byte count (closed ones kept)

    def breach(self) -> str | None:
        """The first limit broken right now, in words; None if all hold."""
        if time.monotonic() > self.limits.deadline:
            return "it ran past the test's planned end"
        pids = _family(self.pid)
        inodes = _socket_inodes(pids)
        rows = list(_rows(inodes))
        connections, foreign = _connections(rows)
        if connections > self.limits.max_connections:
            return (f"it held {connections} connections, more than the "
                    f"{self.limits.max_connections} the test's streams need")
        for address in foreign:
            if not self.limits.allowed(address):
                return f"it talked to {address}, which this agent's --allow list refuses"
        return self._udp_breach(rows) or self._rate_breach(pids, inodes)

    def _udp_breach(self, rows: list[tuple[str, list[str]]]) -> str | None:
        """Count the far end's UDP ports from now on (their bytes before are not seen: at
        most one look, CHECK_S); where they cannot be counted, that is the breach."""
        if self.limits.max_bytes_per_s is None:
            return None
        ports = {_decode(fields[1])[1] for table, fields in rows if table.startswith("udp")}
        if not ports:
            return None
        if self.udp is None:
            return f"it opened a UDP socket and this agent {self.no_udp or _NO_COUNTER}"
        try:
            self.udp.watch(ports)
        except CounterUnavailable as exc:
            return f"its UDP traffic could not be counted: {exc}"
        return None

    def _rate_breach(self, pids: list[int], inodes: set[str]) -> str | None:
        if self.limits.max_bytes_per_s is None:
            return None
        # The TCP counts are read at every look, so that a connection that comes and goes
        # is seen; the rate is taken over at least a second (bursts are allowed).
        self._count_tcp(inodes)
        now = time.monotonic()
        if self._io is not None and now - self._io[0] < 1.0:
            return None
        moved = self._moved(pids)
        if self._io is None:
            self._io = (now, moved)
            return None
        start, before = self._io
        self._io = (now, moved)
        rate = (moved - before) / (now - start)
        if rate > self.limits.max_bytes_per_s:
            return (f"it moved {rate * 8 / 1e6:.1f} Mbit/s, over the "
                    f"{self.limits.max_bytes_per_s * 8 / 1e6:.1f} Mbit/s the test's limits allow")
        return None

    def _count_tcp(self, inodes: set[str]) -> None:
        """Keep the latest byte count of each of the far end's TCP connections."""
        for family in (socket.AF_INET, socket.AF_INET6):
            try:
                for _local, _remote, acked, received, inode in tcpbytes.sockets(family):
                    if str(inode) in inodes:
                        self._tcp[str(inode)] = acked + received
            except OSError:  # no sock_diag here: the read/write counters only
                break

    def _moved(self, pids: list[int]) -> int:
        """Bytes the far end has moved so far: the larger of its sockets' own counts (TCP
        and UDP) and its read/write counters (each misses what the other sees; neither
        overcounts)."""
        counted = sum(self._tcp.values()) + self._udp_bytes()
        return max(counted, sum(_io_bytes(pid) for pid in pids))

    def _udp_bytes(self) -> int:
        if self.udp is None:
            return 0
        try:
            return self.udp.bytes()
        except CounterUnavailable:  # its table removed under it: read/write counters only
            return 0


def listens(pid: int, port: int) -> bool:
    """Whether ``pid`` (or a child of it) has a TCP socket listening, or a UDP socket
    bound, on ``port``: whoever else may be on it, the far end started is ready."""
    for table, fields in _rows(_socket_inodes(_family(pid))):
        listening = table.startswith("udp") or fields[3] == _TCP_LISTEN
        if listening and _decode(fields[1])[1] == port:
            return True
    return False


def _rows(inodes: set[str]) -> Iterator[tuple[str, list[str]]]:
    """The /proc/net/{tcp,udp}[6] rows of the sockets ``inodes``: (table, fields)."""
    for table in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) >= 10 and fields[9] in inodes:
                yield table, fields


def _family(pid: int) -> list[int]:
    """``pid`` and its descendants (a tool may fork a server per client)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo += [int(child) for child in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
    return found


def _socket_inodes(pids: list[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            entries = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for entry in entries:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{entry}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def _connections(rows: list[tuple[str, list[str]]]) -> tuple[int, list[str]]:
    """Established TCP connections among ``rows`` (of :func:`_rows`), and the remote
    addresses of every connected TCP or UDP socket among them."""
    established, remotes = 0, []
    for table, fields in rows:
        address, port = _decode(fields[2])
        if table.startswith("tcp") and fields[3] == _TCP_ESTABLISHED:
            established += 1
        if port:
            remotes.append(address)
    return established, remotes


def _decode(text: str) -> tuple[str, int]:
    """An address:port of /proc/net/{tcp,udp}[6] (hex, host-order 32-bit words)."""
    raw, port = text.split(":")
    words = [int(raw[i:i + 8], 16) for i in range(0, len(raw), 8)]
    packed = b"".join(struct.pack("<I", word) for word in words)
    family = socket.AF_INET if len(packed) == 4 else socket.AF_INET6
    ip = ipaddress.ip_address(socket.inet_ntop(family, packed))
    plain = getattr(ip, "ipv4_mapped", None) or ip
    return str(plain), int(port, 16)


def _io_bytes(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return 0
    values = dict(line.split(": ") for line in text.splitlines() if ": " in line)
    return int(values.get("rchar", 0)) + int(values.get("wchar", 0))
