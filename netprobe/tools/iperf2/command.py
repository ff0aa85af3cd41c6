"""iperf 2's command lines: the client and the local server, built from a spec.

Both ends print enhanced reports (``-e``: the sender's retransmits, cwnd and RTT each
interval) in plain bytes and bits (``-f b``), so every figure is exact. Option mapping
(netprobe -> iperf 2): reverse ``-R``; bidir ``--full-duplex``; streams ``-P``; duration
``-t`` or bytes ``-n``; interval ``-i``; rate ``-b`` in plain bits/s; length ``-l``;
window ``-w``; MSS ``-M``; nodelay ``-N``; DSCP ``-S`` (the TOS byte); congestion ``-Z``;
IPv6 ``-V`` (iperf 2.1 has no ``-6``); bind ``-B``.
"""

from __future__ import annotations

from netprobe.schema import TestSpec
from netprobe.tools._iperf_common import Probed, arg_number

DEFAULT_PORT = 5001
"""iperf 2's own default server port."""
UNLIMITED_UDP_BPS = 10**12
"""Sent as the UDP rate when the spec sets none: iperf 2.1.8 rejects -b 0 for UDP."""


def client_argv(binary: Probed, spec: TestSpec, host: str, port: int) -> list[str]:
    """The iperf 2 client command line for ``spec``."""
    argv = [binary.path, "-c", host, "-p", str(port), "-e", "-f", "b"]
    if spec.interval_s is not None:
        argv += ["-i", arg_number(spec.interval_s)]
    if spec.bytes_total is not None:
        argv += ["-n", str(spec.bytes_total)]
    else:
        argv += ["-t", arg_number(spec.duration_s or 10.0)]
    if spec.streams > 1:
        argv += ["-P", str(spec.streams)]
    argv += {"reverse": ["-R"], "bidir": ["--full-duplex"]}.get(spec.direction, [])
    if spec.protocol == "udp":
        # Plain bits/s: iperf 2 reads "100M" as 100 * 2**20.
        argv += ["-u", "-b", arg_number(spec.rate_bits_per_second or UNLIMITED_UDP_BPS)]
    elif spec.rate_bits_per_second is not None:
        argv += ["-b", arg_number(spec.rate_bits_per_second)]
    return argv + _socket_args(spec)


def _socket_args(spec: TestSpec) -> list[str]:
    options: list[tuple[bool, list[str]]] = [
        (spec.length_bytes is not None, ["-l", str(spec.length_bytes)]),
        (spec.window_bytes is not None, ["-w", str(spec.window_bytes)]),
        (spec.mss_bytes is not None, ["-M", str(spec.mss_bytes)]),
        (spec.nodelay, ["-N"]),
        (spec.dscp is not None, ["-S", str((spec.dscp or 0) << 2)]),  # TOS byte = DSCP << 2
        (spec.congestion is not None, ["-Z", str(spec.congestion)]),
        (spec.ip_version == 6, ["-V"]),  # iperf 2.1 has no -6
        (spec.bind_address is not None, ["-B", str(spec.bind_address)]),
    ]
    args: list[str] = []
    for wanted, flags in options:
        if wanted:
            args += flags
    return args


def server_argv(binary: Probed, spec: TestSpec, host: str, port: int) -> list[str]:
    """A local server bound to the test address, with the client's report format."""
    argv = [binary.path, "-s", "-p", str(port), "-B", host, "-e", "-f", "b"]
    if spec.interval_s is not None:
        argv += ["-i", arg_number(spec.interval_s)]
    if spec.protocol == "udp":
        argv.append("-u")
    elif spec.length_bytes is not None:
        # The server reads with its own -l (it writes with the client's): without this a
        # --length test's reads were the server's default 128K.
        argv += ["-l", str(spec.length_bytes)]
    if ":" in host:
        argv.append("-V")
    return argv
