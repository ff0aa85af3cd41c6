"""The data path: stream loops and system figures, on the compiled C core when it loads.

One set of names, two implementations: :mod:`netprobe.core.wrapper` drives the compiled
C core (it is the only module that touches cffi); where that cannot be imported, or
with ``NETPROBE_PURE=1`` in the environment, the same names come from
:mod:`netprobe.core.pure` and :data:`DATA_PATH` says ``"python"``. Callers import from
here and cannot tell which data path they drive. The functions are written once, in
:class:`netprobe.core.contract.DataPath`; the records both paths return are in
:mod:`netprobe.core.records`.
"""
from __future__ import annotations

from netprobe.core import wrapper
from netprobe.core.contract import BaseCounters, DataPath
from netprobe.core.records import HostCpu, Rusage, TcpInfo
from netprobe.errors import CoreError

if wrapper.LOADED:
    from netprobe.core.wrapper import Counters

    _chosen = DataPath(wrapper)
else:
    from netprobe.core import pure
    from netprobe.core.pure import Counters  # type: ignore[assignment]

    _chosen = DataPath(pure)

DATA_PATH = _chosen.DATA_PATH
"""Which implementation runs the loops: ``"c"`` (compiled core) or ``"python"``."""
tcp_send = _chosen.tcp_send
tcp_recv = _chosen.tcp_recv
udp_send = _chosen.udp_send
udp_recv = _chosen.udp_recv
tcp_info = _chosen.tcp_info
rusage = _chosen.rusage
host_cpu = _chosen.host_cpu
monotonic = _chosen.monotonic
limit_allocator_arenas = _chosen.limit_allocator_arenas
trim_allocator = _chosen.trim_allocator
allocator_arenas = _chosen.allocator_arenas

__all__ = [
    "DATA_PATH",
    "BaseCounters",
    "CoreError",
    "Counters",
    "HostCpu",
    "Rusage",
    "TcpInfo",
    "allocator_arenas",
    "host_cpu",
    "limit_allocator_arenas",
    "monotonic",
    "rusage",
    "tcp_info",
    "tcp_recv",
    "tcp_send",
    "trim_allocator",
    "udp_recv",
    "udp_send",
]
