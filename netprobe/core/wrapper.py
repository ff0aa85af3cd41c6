"""The data path on the compiled C core: the only module that touches ``netprobe._core``.

cffi's ``ffi``/``lib`` are used here and nowhere else. Where the compiled module cannot be
imported, or with ``NETPROBE_PURE=1`` in the environment, :data:`DATA_PATH` says
``"python"`` and :mod:`netprobe.core` takes the same names from :mod:`netprobe.core.pure`
instead. Import them through :mod:`netprobe.core`, never from here. Every wrapper has
one shape: check the arguments, call the C function (cffi releases the GIL, so stream loops
run in parallel with Python threads sampling their :class:`Counters`), turn a negative
result (-errno) into :class:`~netprobe.errors.CoreError` naming the failed system call.
"""
from __future__ import annotations

import math
import os
from typing import Any

import attrs

from netprobe.core.records import HostCpu, LoopArgs, Rusage, TcpInfo, check_fd
from netprobe.errors import CoreError


def _load_compiled() -> tuple[Any, Any]:
    if os.environ.get("NETPROBE_PURE") == "1":
        return None, None
    try:
        from netprobe._core import ffi, lib
    except ImportError:
        return None, None
    return ffi, lib


_ffi, _lib = _load_compiled()
_UNBOUNDED = (1 << 64) - 1

#: Which implementation runs the loops: ``"c"`` (compiled core) or ``"python"``.
DATA_PATH = "c" if _lib is not None else "python"


class Counters:
    """Live, thread-safe-to-read state of one stream loop (a C struct under the hood).

    Totals accumulate across the loops run with the same counters; a UDP receiver's
    sequence accounting carries over too.
    """

    __slots__ = ("_c",)

    def __init__(self) -> None:
        self._c = _ffi.new("struct np_counters *")

    @property
    def bytes(self) -> int:
        """Payload bytes moved so far."""
        return int(_lib.np_counters_bytes(self._c))

    @property
    def calls(self) -> int:
        """Data system calls made (including ones that returned a soft error)."""
        return int(_lib.np_counters_calls(self._c))

    @property
    def packets(self) -> int:
        """UDP datagrams sent (sender) or received (receiver)."""
        return int(_lib.np_counters_packets(self._c))

    @property
    def lost(self) -> int:
        """UDP receiver: datagrams missing (highest sequence + 1 - distinct received)."""
        return int(_lib.np_counters_lost(self._c))

    @property
    def out_of_order(self) -> int:
        """UDP receiver: datagrams that arrived below the highest sequence number seen."""
        return int(_lib.np_counters_out_of_order(self._c))

    @property
    def duplicates(self) -> int:
        """UDP receiver: datagrams whose sequence number had already arrived."""
        return int(_lib.np_counters_duplicates(self._c))

    @property
    def jitter_ms(self) -> float:
        """UDP receiver: RFC 3550 interarrival jitter, milliseconds."""
        return float(_lib.np_counters_jitter_ms(self._c))

    @property
    def foreign(self) -> int:
        """UDP receiver: datagrams numbered out of this test's reach, left out of every figure."""
        return int(_lib.np_counters_foreign(self._c))

    @property
    def sequence_base(self) -> int:
        """The test's first UDP sequence number (both ends set the same one before a loop)."""
        return int(self._c.rx.seq_base)

    @sequence_base.setter
    def sequence_base(self, base: int) -> None:
        self._c.rx.seq_base = base & _UNBOUNDED

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return bool(_lib.np_counters_stopped(self._c))

    def stop(self) -> None:
        """Ask the loop to return; it does within ~200 ms, even when blocked.

        The flag stays set: a later loop on these counters returns at once.
        """
        _lib.np_counters_stop(self._c)

    def __repr__(self) -> str:
        return (f"Counters(bytes={self.bytes}, calls={self.calls}, packets={self.packets}, "
                f"lost={self.lost}, out_of_order={self.out_of_order}, "
                f"duplicates={self.duplicates}, jitter_ms={self.jitter_ms:.3f})")


def _struct(counters: object) -> Any:
    if not isinstance(counters, Counters):
        raise TypeError(f"counters must be netprobe.core.Counters, not {type(counters).__name__}")
    return counters._c


def _params(args: LoopArgs, zerocopy: bool = False, skip_copy: bool = False) -> Any:
    return _ffi.new("struct np_params *", {
        "length": args.length,
        "deadline": math.inf if args.deadline is None else args.deadline,
        "max_bytes": _UNBOUNDED if args.max_bytes is None else args.max_bytes,
        "max_packets": _UNBOUNDED if args.max_packets is None else args.max_packets,
        "rate_bps": args.rate_bps or 0.0,
        "rate_pps": args.rate_pps or 0.0,
        "batch": args.batch,
        "zerocopy": zerocopy,
        "skip_copy": skip_copy,
    })


def _checked(rc: int, failed_call: Any) -> int:
    if rc < 0:
        raise CoreError(_ffi.string(failed_call).decode(), -rc)
    return int(rc)


def tcp_send(fd: int, counters: Counters, *, length: int, deadline: float | None = None,
             max_bytes: int | None = None, rate_bps: float | None = None,
             zerocopy: bool = False) -> int:
    """Send ``length``-byte buffers until the deadline, ``max_bytes`` (exact) or stop.

    Returns the bytes this call sent. ``rate_bps`` paces the payload (writes then carry
    ~1 ms of data each); ``zerocopy`` sends with sendfile() from a memory file.
    """
    args = LoopArgs(length=length, deadline=deadline, max_bytes=max_bytes, rate_bps=rate_bps)
    c = _struct(counters)
    return _checked(_lib.np_tcp_send(check_fd(fd), c, _params(args, zerocopy=zerocopy)),
                    c.failed_call)


def tcp_recv(fd: int, counters: Counters, *, length: int, deadline: float | None = None,
             max_bytes: int | None = None, skip_copy: bool = False) -> int:
    """Receive until the peer closes, the deadline, ``max_bytes`` (exact) or stop.

    Returns the bytes this call received. ``skip_copy`` uses recv(MSG_TRUNC): the kernel
    discards the data instead of copying it out.
    """
    args = LoopArgs(length=length, deadline=deadline, max_bytes=max_bytes)
    c = _struct(counters)
    return _checked(_lib.np_tcp_recv(check_fd(fd), c, _params(args, skip_copy=skip_copy)),
                    c.failed_call)


def udp_send(fd: int, counters: Counters, *, length: int, deadline: float | None = None,
             max_bytes: int | None = None, max_packets: int | None = None,
             rate_bps: float | None = None, rate_pps: float | None = None,
             batch: int = 32) -> int:
    """Send sequenced, timestamped datagrams on a connected UDP socket.

    Stops at the deadline, ``max_packets``, ``max_bytes`` (whole datagrams only) or stop.
    Paced by ``rate_bps`` (payload bits) or ``rate_pps``; up to ``batch`` datagrams per
    sendmmsg call. Returns the bytes this call sent.
    """
    args = LoopArgs(length=length, deadline=deadline, max_bytes=max_bytes,
                    max_packets=max_packets, rate_bps=rate_bps, rate_pps=rate_pps,
                    batch=batch).check_udp()
    c = _struct(counters)
    return _checked(_lib.np_udp_send(check_fd(fd), c, _params(args)), c.failed_call)


def udp_recv(fd: int, counters: Counters, *, length: int, deadline: float | None = None,
             max_packets: int | None = None, batch: int = 32) -> int:
    """Receive datagrams until the deadline, ``max_packets`` or stop; count loss and jitter.

    Up to ``batch`` datagrams per recvmmsg call. Returns the bytes this call received
    (true datagram sizes, even beyond ``length``).
    """
    args = LoopArgs(length=length, deadline=deadline, max_packets=max_packets,
                    batch=batch).check_udp()
    c = _struct(counters)
    return _checked(_lib.np_udp_recv(check_fd(fd), c, _params(args)), c.failed_call)


def _none_if_negative(value: int) -> int | None:
    return None if value < 0 else int(value)


def tcp_info(fd: int) -> TcpInfo:
    """The connection's TCP_INFO figures; None for what this kernel does not report."""
    out = _ffi.new("struct np_tcp_info *")
    failed = _ffi.new("const char **")
    _checked(_lib.np_tcp_info(check_fd(fd), out, failed), failed[0])
    return TcpInfo(**{f.name: _none_if_negative(getattr(out, f.name))
                      for f in attrs.fields(TcpInfo)})


def rusage(scope: str = "process") -> Rusage:
    """CPU time of this process (``"process"``) or of the calling thread (``"thread"``)."""
    if scope not in ("process", "thread"):
        raise ValueError(f"scope must be 'process' or 'thread', not {scope!r}")
    out = _ffi.new("struct np_rusage *")
    failed = _ffi.new("const char **")
    _checked(_lib.np_rusage(scope == "thread", out, failed), failed[0])
    return Rusage(user_s=out.user_s, system_s=out.system_s)


def host_cpu() -> HostCpu:
    """The host's cumulative CPU ticks from the first line of /proc/stat."""
    out = _ffi.new("struct np_host_cpu *")
    failed = _ffi.new("const char **")
    _checked(_lib.np_host_cpu(out, failed), failed[0])
    return HostCpu(out.user, out.nice, out.system, out.idle, out.iowait, out.irq,
                   out.softirq, out.steal)


def monotonic() -> float:
    """Seconds on CLOCK_MONOTONIC, the clock deadlines are given on (== time.monotonic())."""
    return float(_lib.np_monotonic())

