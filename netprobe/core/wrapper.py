"""The data path on the compiled C core: the only module that touches ``netprobe._core``.

cffi's ``ffi``/``lib`` are used here and nowhere else. Where the compiled module cannot be
imported, or with ``NETPROBE_PURE=1`` in the environment, :data:`LOADED` is False and
:mod:`netprobe.core` runs on :mod:`netprobe.core.pure` instead. Import through
:mod:`netprobe.core`, never from here: the functions here are the bodies of
:class:`~netprobe.core.contract.DataPath`'s, given checked arguments. Each has one shape:
call the C function (cffi releases the GIL, so stream loops run in parallel with Python
threads sampling their :class:`Counters`), turn a negative result (-errno) into
:class:`~netprobe.errors.CoreError` naming the failed system call.
"""
from __future__ import annotations

import math
import os
from typing import Any

import attrs

from netprobe.core.contract import BaseCounters
from netprobe.core.records import HostCpu, LoopArgs, Rusage, TcpInfo
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

DATA_PATH = "c"
LOADED = _lib is not None
"""Whether the compiled core could be imported (and NETPROBE_PURE=1 is not set)."""


class Counters(BaseCounters):
    """The figures of one stream loop, in the C struct the loop updates (cffi releases the
    GIL, so other threads read them while it runs)."""

    __slots__ = ("_c",)

    def __init__(self) -> None:
        self._c = _ffi.new("struct np_counters *")

    def _read(self, figure: str) -> float:
        if figure == "sequence_base":
            return int(self._c.rx.seq_base)
        return getattr(_lib, f"np_counters_{figure}")(self._c)

    def _write_sequence_base(self, base: int) -> None:
        self._c.rx.seq_base = base

    def _request_stop(self) -> None:
        _lib.np_counters_stop(self._c)


def _struct(counters: object) -> Any:
    if not isinstance(counters, Counters):
        raise TypeError(f"counters must be netprobe.core.Counters, not {type(counters).__name__}")
    return counters._c


def _params(args: LoopArgs) -> Any:
    return _ffi.new("struct np_params *", {
        "length": args.length,
        "deadline": math.inf if args.deadline is None else args.deadline,
        "max_bytes": _UNBOUNDED if args.max_bytes is None else args.max_bytes,
        "max_packets": _UNBOUNDED if args.max_packets is None else args.max_packets,
        "rate_bps": args.rate_bps or 0.0,
        "rate_pps": args.rate_pps or 0.0,
        "batch": args.batch,
        "zerocopy": args.zerocopy,
        "skip_copy": args.skip_copy,
        "udp_gro": args.udp_gro,
        "udp_gso": args.udp_gso,
        "wake_bytes": args.wake_bytes or 0,
    })


def _checked(rc: int, failed_call: Any) -> int:
    if rc < 0:
        raise CoreError(_ffi.string(failed_call).decode(), -rc)
    return int(rc)


def _loop(run: Any, fd: int, counters: BaseCounters, args: LoopArgs) -> int:
    c = _struct(counters)
    return _checked(run(fd, c, _params(args)), c.failed_call)


def tcp_send(fd: int, counters: BaseCounters, args: LoopArgs) -> int:
    return _loop(_lib.np_tcp_send, fd, counters, args)


def tcp_recv(fd: int, counters: BaseCounters, args: LoopArgs) -> int:
    return _loop(_lib.np_tcp_recv, fd, counters, args)


def udp_send(fd: int, counters: BaseCounters, args: LoopArgs) -> int:
    return _loop(_lib.np_udp_send, fd, counters, args)


def udp_recv(fd: int, counters: BaseCounters, args: LoopArgs) -> int:
    return _loop(_lib.np_udp_recv, fd, counters, args)


def _none_if_negative(value: int) -> int | None:
    return None if value < 0 else int(value)


def tcp_info(fd: int) -> TcpInfo:
    out = _ffi.new("struct np_tcp_info *")
    failed = _ffi.new("const char **")
    _checked(_lib.np_tcp_info(fd, out, failed), failed[0])
    return TcpInfo(**{f.name: _none_if_negative(getattr(out, f.name))
                      for f in attrs.fields(TcpInfo)})


def rusage(thread: bool) -> Rusage:
    out = _ffi.new("struct np_rusage *")
    failed = _ffi.new("const char **")
    _checked(_lib.np_rusage(thread, out, failed), failed[0])
    return Rusage(user_s=out.user_s, system_s=out.system_s)


def host_cpu() -> HostCpu:
    out = _ffi.new("struct np_host_cpu *")
    failed = _ffi.new("const char **")
    _checked(_lib.np_host_cpu(out, failed), failed[0])
    return HostCpu(out.user, out.nice, out.system, out.idle, out.iowait, out.irq,
                   out.softirq, out.steal)


def monotonic() -> float:
    return float(_lib.np_monotonic())


def limit_allocator_arenas(count: int) -> bool:
    rc = _lib.np_malloc_arena_max(count)
    if rc < 0:
        raise CoreError("mallopt(M_ARENA_MAX)", -rc)
    return rc == 1


def trim_allocator() -> bool:
    return bool(_lib.np_malloc_trim() == 1)


def allocator_arenas() -> int | None:
    failed = _ffi.new("const char **")
    return _none_if_negative(_lib.np_malloc_arenas(failed))
