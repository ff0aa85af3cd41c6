"""The data path: stream loops and system figures, on the compiled C core when it loads.

One set of names, two implementations: :mod:`netprobe.core.wrapper` drives the compiled
C core (it is the only module that touches cffi); where that cannot be imported, or
with ``NETPROBE_PURE=1`` in the environment, the same names come from
:mod:`netprobe.core.pure` and :data:`DATA_PATH` says ``"python"``. Callers import from
here and cannot tell which data path they drive; the records both return are in
:mod:`netprobe.core.records`.
"""
from __future__ import annotations

from netprobe.core.records import HostCpu, Rusage, TcpInfo
from netprobe.core.wrapper import DATA_PATH
from netprobe.errors import CoreError

if DATA_PATH == "c":
    from netprobe.core.wrapper import (
        Counters,
        host_cpu,
        monotonic,
        rusage,
        tcp_info,
        tcp_recv,
        tcp_send,
        udp_recv,
        udp_send,
    )
else:
    from netprobe.core.pure import (  # type: ignore[assignment]
        Counters,
        host_cpu,
        monotonic,
        rusage,
        tcp_info,
        tcp_recv,
        tcp_send,
        udp_recv,
        udp_send,
    )

__all__ = [
    "DATA_PATH",
    "CoreError",
    "Counters",
    "HostCpu",
    "Rusage",
    "TcpInfo",
    "host_cpu",
    "monotonic",
    "rusage",
    "tcp_info",
    "tcp_recv",
    "tcp_send",
    "udp_recv",
    "udp_send",
]
