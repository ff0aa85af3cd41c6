"""Who a server admits and what it lets them take: the --allow list, connections per
address, handshakes in flight, and the test slots with their shares of the memory, rate and
stream budgets.

One :class:`Admission` per server, shared by its accept loop and every handler: a handler
takes a slot with :meth:`Admission.take` (the reason when it is short) and gives it back
with :meth:`Admission.release`; :meth:`ControlConnection.slot
<netprobe.engine.handlers.ControlConnection.slot>` does both around a test.
"""

from __future__ import annotations

import ipaddress
import os
import threading
from typing import Any

from netprobe.engine.config import ServerConfig
from netprobe.engine.side import buffer_bytes
from netprobe.errors import SpecError
from netprobe.host import utc_now_iso
from netprobe.schema import TestSpec


class Admission:
    """The admission state of one server (thread-safe)."""

    def __init__(self, config: ServerConfig, closed: threading.Event) -> None:
        self.config = config
        self.closed = closed
        """Set when the server closes (or, one-off, has served its test): no slot then."""
        self.max_memory = config.max_memory_bytes or quarter_of_memory()
        """Buffer memory all running tests may take together."""
        self.handshakes = threading.BoundedSemaphore(config.max_pending)
        """Connections in their handshake (a slot each until the request is in)."""
        self._networks = networks(config.allow)
        self._lock = threading.Lock()
        self._per_address: dict[str, int] = {}
        self._active = 0
        self._memory = 0
        self._rate = 0.0  # bits/s the running tests asked for together (--max-rate)
        self._streams = 0  # their streams together (--max-streams)
        self._served = 0
        self._charges: dict[int, tuple[int, float, int]] = {}  # per slot: memory, rate, streams
        self._running: dict[int, dict] = {}  # what each held slot is doing (status request)

    # -- addresses --------------------------------------------------------------------

    def allowed(self, address: str) -> bool:
        """Whether the --allow list accepts ``address`` (every address without one)."""
        if not self._networks:
            return True
        try:
            ip = plain_address(ipaddress.ip_address(address.split("%", 1)[0]))
        except ValueError:
            return False
        return any(ip in network for network in self._networks)

    def count_in(self, address: str) -> bool:
        """Count one more connection from ``address``; False (not counted) at its limit."""
        with self._lock:
            count = self._per_address.get(address, 0)
            if count >= self.config.max_connections_per_address:
                return False
            self._per_address[address] = count + 1
            return True

    def count_out(self, address: str) -> None:
        """One connection from ``address`` fewer."""
        with self._lock:
            count = self._per_address.get(address, 1) - 1
            if count > 0:
                self._per_address[address] = count
            else:
                self._per_address.pop(address, None)

    # -- slots ------------------------------------------------------------------------

    def take(self, key: int, doing: dict, memory: int, rate: float = 0.0,
             streams: int = 0) -> str | None:
        """Take a slot for ``key``, ``memory`` bytes of the budget, ``rate`` bits/s of
        --max-rate and ``streams`` of --max-streams (all running tests share them); None
        when taken, else the reason it is short. ``doing`` is what ``status`` reports."""
        cfg = self.config
        with self._lock:
            if self._active >= cfg.max_tests or self.closed.is_set():
                return f"{cfg.max_tests} test(s) running"
            if self._memory + memory > self.max_memory:
                return (f"the running tests' buffers leave {mib(self.max_memory - self._memory)}"
                        f" of the memory limit, this test needs {mib(memory)}")
            if cfg.max_rate_bps and self._rate + rate > cfg.max_rate_bps:
                return (f"the running tests use {mbits(self._rate)} of the "
                        f"{mbits(cfg.max_rate_bps)} this server allows in all (--max-rate), "
                        f"this test asks {mbits(rate)}")
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

    def release(self, key: int) -> None:
        """Give back the slot ``key`` took (a one-off server is then done)."""
        with self._lock:
            memory, rate, streams = self._charges.pop(key, (0, 0.0, 0))
            self._active -= 1
            self._memory -= memory
            self._rate -= rate
            self._streams -= streams
            self._running.pop(key, None)
            self._served += 1
            if self.config.one_off:
                self.closed.set()

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


def doing(kind: str, peer: tuple, spec: TestSpec | None) -> dict:
    """What a slot is used for, as the ``status`` request reports it."""
    found = {"kind": kind, "peer": peer[0], "started": utc_now_iso()}
    if spec is not None:
        found.update(tool=spec.tool, target=spec.host if kind == "third_party" else None,
                     protocol=spec.protocol, streams=spec.streams, duration_s=spec.duration_s)
    return found


def test_rate(spec: TestSpec) -> float | None:
    """What a test asks of the network, every stream and direction together (bits/s);
    None if unlimited."""
    if not spec.rate_bits_per_second:
        return None
    return spec.rate_bits_per_second * spec.streams * len(spec.flow_directions())


def test_memory(spec: TestSpec) -> int:
    """Buffer memory a native test of ``spec`` takes on this side, every stream together."""
    total = 0
    for direction in spec.flow_directions():
        role = "receiver" if direction == "client_to_server" else "sender"
        total += spec.streams * buffer_bytes(spec, role)
    return total


def quarter_of_memory() -> int:
    """A quarter of this host's memory: the default budget for test buffers. A server
    shares its host (often a small router); the rest is left to the system."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


def same_address(a: str, b: str) -> bool:
    """Whether two socket addresses name one host (a v4-mapped IPv6 one as its IPv4)."""
    try:
        return bool(plain_address(ipaddress.ip_address(a.split("%", 1)[0]))
                    == plain_address(ipaddress.ip_address(b.split("%", 1)[0])))
    except ValueError:
        return False


def networks(allow: tuple) -> list:
    """The --allow list as networks (SpecError for a bad one)."""
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


def plain_address(ip: Any) -> Any:
    """An address, a v4-mapped IPv6 one as its IPv4."""
    return getattr(ip, "ipv4_mapped", None) or ip


def mbits(rate: float) -> str:
    """A rate for a message: ``50 Mbit/s``."""
    return f"{rate / 1e6:.4g} Mbit/s"


def mib(count: int) -> str:
    """A byte count for a message: ``16.0 MiB``."""
    return f"{count / 2**20:.1f} MiB"
