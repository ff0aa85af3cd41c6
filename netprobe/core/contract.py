"""What both data paths promise, written once: the figures of :class:`BaseCounters`, and
the public functions of :class:`DataPath` (signatures, docstrings, argument checks).
:mod:`netprobe.core.wrapper` (compiled) and :mod:`netprobe.core.pure` each subclass
BaseCounters and give the bodies of the functions, on arguments already checked.
"""
from __future__ import annotations

import abc
from types import ModuleType
from typing import Any, Callable, Generic, TypeVar, overload

from netprobe.core.records import HostCpu, LoopArgs, Rusage, TcpInfo, check_fd

T = TypeVar("T")

SEQUENCE_MASK = (1 << 64) - 1
"""UDP sequence numbers are 64-bit, and wrap."""


class _Figure(Generic[T]):
    """A read-only figure of a Counters, read through its implementation's ``_read``."""

    def __init__(self, kind: Callable[[Any], T], doc: str) -> None:
        self._kind = kind
        self._name = ""
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, counters: None, owner: type) -> _Figure[T]: ...

    @overload
    def __get__(self, counters: BaseCounters, owner: type) -> T: ...

    def __get__(self, counters: BaseCounters | None, owner: type) -> _Figure[T] | T:
        if counters is None:
            return self
        return self._kind(counters._read(self._name))

    def __set__(self, counters: BaseCounters, value: object) -> None:
        raise AttributeError(f"{self._name} is read-only")


class BaseCounters(abc.ABC):
    """Live, thread-safe-to-read state of one stream loop.

    Totals accumulate across the loops run with the same counters; a UDP receiver's
    sequence accounting carries over too.
    """

    __slots__ = ()

    bytes = _Figure(int, "Payload bytes moved so far.")
    calls = _Figure(int, "Data system calls made (including ones that returned a soft error).")
    packets = _Figure(int, "UDP datagrams sent (sender) or received (receiver).")
    lost = _Figure(int, "UDP receiver: datagrams missing (highest sequence + 1 - distinct "
                        "received).")
    out_of_order = _Figure(int, "UDP receiver: datagrams that arrived below the highest "
                                "sequence number seen.")
    duplicates = _Figure(int, "UDP receiver: datagrams whose sequence number had already "
                              "arrived.")
    jitter_ms = _Figure(float, "UDP receiver: RFC 3550 interarrival jitter, milliseconds.")
    messages = _Figure(int, "UDP: messages sent or read, each of one datagram or of many "
                            "(GSO sends, GRO reads); packets / messages is the datagrams "
                            "a message carried.")
    foreign = _Figure(int, "UDP receiver: datagrams numbered out of this test's reach, left "
                           "out of every figure.")
    stopped = _Figure(bool, "Whether :meth:`stop` was called.")

    @property
    def sequence_base(self) -> int:
        """The test's first UDP sequence number (both ends set the same one before a loop)."""
        return int(self._read("sequence_base"))

    @sequence_base.setter
    def sequence_base(self, base: int) -> None:
        self._write_sequence_base(base & SEQUENCE_MASK)

    def stop(self) -> None:
        """Ask the loop to return; it does within ~200 ms, even when blocked.

        The flag stays set: a later loop on these counters returns at once.
        """
        self._request_stop()

    @abc.abstractmethod
    def _read(self, figure: str) -> float:
        """The figure's current value (any of the names above, ``sequence_base`` too)."""

    @abc.abstractmethod
    def _write_sequence_base(self, base: int) -> None:
        """Set the first sequence number (already masked to 64 bits)."""

    @abc.abstractmethod
    def _request_stop(self) -> None:
        """Set the flag the loop looks at."""

    def __repr__(self) -> str:
        return (f"Counters(bytes={self.bytes}, calls={self.calls}, packets={self.packets}, "
                f"lost={self.lost}, out_of_order={self.out_of_order}, "
                f"duplicates={self.duplicates}, jitter_ms={self.jitter_ms:.3f})")


class DataPath:
    """The public functions over one data path (a module: the wrapper or the pure twin).

    Each function is written here once: its signature, its docstring and its argument
    checks (:class:`~netprobe.core.records.LoopArgs`, :func:`check_fd`); the path's own
    function of the same name gets the checked arguments and does the work.
    :mod:`netprobe.core` exports the methods of the one it chose.
    """

    def __init__(self, path: ModuleType) -> None:
        self._path = path
        self.DATA_PATH: str = path.DATA_PATH
        """``"c"`` (the compiled core) or ``"python"``."""
        self.Counters: type[BaseCounters] = path.Counters
        """This path's :class:`BaseCounters`; its loops refuse another path's."""

    def tcp_send(self, fd: int, counters: BaseCounters, *, length: int,
                 deadline: float | None = None, max_bytes: int | None = None,
                 rate_bps: float | None = None, zerocopy: bool = False) -> int:
        """Send ``length``-byte buffers until the deadline, ``max_bytes`` (exact) or stop.

        Returns the bytes this call sent. ``rate_bps`` paces the payload (writes then carry
        ~1 ms of data each); ``zerocopy`` sends with sendfile() from a memory file.
        """
        args = LoopArgs(length=length, deadline=deadline, max_bytes=max_bytes,
                        rate_bps=rate_bps, zerocopy=zerocopy)
        return int(self._path.tcp_send(check_fd(fd), counters, args))

    def tcp_recv(self, fd: int, counters: BaseCounters, *, length: int,
                 deadline: float | None = None, max_bytes: int | None = None,
                 skip_copy: bool = False, wake_bytes: int | None = None) -> int:
        """Receive until the peer closes, the deadline, ``max_bytes`` (exact) or stop.

        Returns the bytes this call received. ``skip_copy`` uses recv(MSG_TRUNC): the kernel
        discards the data instead of copying it out. ``wake_bytes``: how much a sleeping
        loop lets queue before it is woken (see :class:`~netprobe.core.records.LoopArgs`).
        """
        args = LoopArgs(length=length, deadline=deadline, max_bytes=max_bytes,
                        skip_copy=skip_copy, wake_bytes=wake_bytes)
        return int(self._path.tcp_recv(check_fd(fd), counters, args))

    def udp_send(self, fd: int, counters: BaseCounters, *, length: int,
                 deadline: float | None = None, max_bytes: int | None = None,
                 max_packets: int | None = None, rate_bps: float | None = None,
                 rate_pps: float | None = None, batch: int = 32, gso: bool = True) -> int:
        """Send sequenced, timestamped datagrams on a connected UDP socket.

        Stops at the deadline, ``max_packets``, ``max_bytes`` (whole datagrams only) or
        stop. Paced by ``rate_bps`` (payload bits) or ``rate_pps``; up to ``batch``
        messages per call (sendmmsg in C, a message of up to 64 KiB of datagrams where UDP
        GSO cuts them, up to 256 KiB a call; one datagram at a time in Python). Without
        ``gso`` every message is one datagram. Returns the bytes this call sent.
        """
        args = LoopArgs(length=length, deadline=deadline, max_bytes=max_bytes,
                        max_packets=max_packets, rate_bps=rate_bps, rate_pps=rate_pps,
                        batch=batch, udp_gso=gso).check_udp()
        return int(self._path.udp_send(check_fd(fd), counters, args))

    def udp_recv(self, fd: int, counters: BaseCounters, *, length: int,
                 deadline: float | None = None, max_packets: int | None = None,
                 batch: int = 32, gro: bool = True) -> int:
        """Receive datagrams until the deadline, ``max_packets`` or stop; count loss and
        jitter.

        Up to ``batch`` messages per call (recvmmsg in C; one at a time in Python). With
        ``gro`` the socket is set to UDP_GRO where the kernel has it (and left so): a
        message may then hold many datagrams, each counted as if it came alone, and
        ``max_packets`` is reached at the end of the message that crosses it. Returns
        the bytes this call received (true datagram sizes, even beyond ``length``).
        """
        args = LoopArgs(length=length, deadline=deadline, max_packets=max_packets,
                        batch=batch, udp_gro=gro).check_udp()
        return int(self._path.udp_recv(check_fd(fd), counters, args))

    def tcp_info(self, fd: int) -> TcpInfo:
        """The connection's TCP_INFO figures; None for what this kernel does not report."""
        info: TcpInfo = self._path.tcp_info(check_fd(fd))
        return info

    def rusage(self, scope: str = "process") -> Rusage:
        """CPU time of this process (``"process"``) or of the calling thread (``"thread"``)."""
        if scope not in ("process", "thread"):
            raise ValueError(f"scope must be 'process' or 'thread', not {scope!r}")
        used: Rusage = self._path.rusage(scope == "thread")
        return used

    def host_cpu(self) -> HostCpu:
        """The host's cumulative CPU ticks from the first line of /proc/stat."""
        ticks: HostCpu = self._path.host_cpu()
        return ticks

    def limit_allocator_arenas(self, count: int) -> bool:
        """Let the C allocator make at most ``count`` arenas from now on (glibc's
        ``M_ARENA_MAX``); call it before threads allocate. False where there are no arenas
        to bound (musl, or the pure-Python path, which cannot reach the allocator)."""
        if count < 1:
            raise ValueError(f"count must be at least 1, not {count}")
        return bool(self._path.limit_allocator_arenas(count))

    def trim_allocator(self) -> bool:
        """Give the memory the C allocator holds free back to the system (glibc's
        ``malloc_trim``); True if some was."""
        return bool(self._path.trim_allocator())

    def allocator_arenas(self) -> int | None:
        """How many arenas the C allocator has now; None where that cannot be known."""
        count: int | None = self._path.allocator_arenas()
        return count

    def monotonic(self) -> float:
        """Seconds on CLOCK_MONOTONIC, the clock deadlines are given on (==
        time.monotonic())."""
        return float(self._path.monotonic())
