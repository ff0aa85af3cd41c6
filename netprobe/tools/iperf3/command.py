"""iperf3's command lines: the client and the one-off local server, built from a spec.

The client always writes JSON (``-J``), with ``--json-stream`` where the binary has it
(3.17+) and a connect timeout where it has that; the local server prints flushed human
intervals in Kbit/s. Option mapping (netprobe -> iperf3): reverse ``-R``; bidir
``--bidir``; streams ``-P``; duration ``-t`` (+ warm-up ``-O``) or bytes ``-n``; interval
``-i``; UDP rate ``-b`` (0: unlimited); length ``-l``; window ``-w``; MSS ``-M``; nodelay
``-N``; DSCP ``-S`` (the TOS byte); congestion ``-C``; ``-4``/``-6``; bind ``-B``;
zerocopy ``-Z``; ``--skip-rx-copy``.
"""

from __future__ import annotations

import attrs

from netprobe.schema import TestSpec
from netprobe.tools._iperf_common import Probed, arg_number

DEFAULT_PORT = 5201
"""iperf3's own default server port."""


@attrs.frozen
class Iperf3Binary(Probed):
    """What probing found: the binary, its version and the options its --help lists."""

    @property
    def json_stream(self) -> bool:
        """``--json-stream`` (3.17+): JSON events line by line, live."""
        return self.has("--json-stream")


def client_argv(binary: Iperf3Binary, spec: TestSpec, host: str, port: int) -> list[str]:
    """The iperf3 client command line for ``spec``."""
    argv = [binary.path, "-c", host, "-p", str(port), "-J"]
    if binary.json_stream:
        argv.append("--json-stream")
    if binary.has("--connect-timeout"):
        argv += ["--connect-timeout", "10000"]
    argv += _length_of_test(spec)
    argv += ["-i", arg_number(spec.interval_s) if spec.interval_s else "0"]
    argv += ["-P", str(spec.streams)]
    argv += {"reverse": ["-R"], "bidir": ["--bidir"]}.get(spec.direction, [])
    return argv + _protocol_args(spec) + _socket_args(spec)


def _length_of_test(spec: TestSpec) -> list[str]:
    if spec.bytes_total is not None:
        return ["-n", str(spec.bytes_total)]
    args = ["-t", arg_number(spec.duration_s or 10.0)]
    if spec.omit_s:
        args += ["-O", arg_number(spec.omit_s)]
    return args


def _protocol_args(spec: TestSpec) -> list[str]:
    args: list[str] = []
    if spec.protocol == "udp":
        args.append("-u")
        # The spec's None means unlimited; iperf3's UDP default would be 1 Mbit/s.
        args += ["-b", arg_number(spec.rate_bits_per_second or 0)]
    elif spec.rate_bits_per_second is not None:
        args += ["-b", arg_number(spec.rate_bits_per_second)]
    if spec.length_bytes is not None:
        args += ["-l", str(spec.length_bytes)]
    return args


def _socket_args(spec: TestSpec) -> list[str]:
    args: list[str] = []
    options: list[tuple[bool, list[str]]] = [
        (spec.window_bytes is not None, ["-w", str(spec.window_bytes)]),
        (spec.mss_bytes is not None, ["-M", str(spec.mss_bytes)]),
        (spec.nodelay, ["-N"]),
        (spec.dscp is not None, ["-S", str((spec.dscp or 0) << 2)]),  # TOS byte = DSCP << 2
        (spec.congestion is not None, ["-C", str(spec.congestion)]),
        (spec.ip_version == 4, ["-4"]),
        (spec.ip_version == 6, ["-6"]),
        (spec.bind_address is not None, ["-B", str(spec.bind_address)]),
        (spec.zerocopy, ["-Z"]),
        (spec.skip_rx_copy, ["--skip-rx-copy"]),
    ]
    for wanted, flags in options:
        if wanted:
            args += flags
    return args


def server_argv(binary: Iperf3Binary, spec: TestSpec, host: str, port: int) -> list[str]:
    """A one-off local server bound to the test address, printing flushed human intervals
    with rates in Kbit/s (the most precise unit iperf3 offers)."""
    interval = arg_number(spec.interval_s) if spec.interval_s else "0"
    argv = [binary.path, "-s", "-1", "-p", str(port), "-B", host, "-i", interval, "-f", "k"]
    if binary.has("--forceflush"):
        argv.append("--forceflush")
    return argv


def mode(spec: TestSpec) -> str:
    """The data path the spec asks of iperf3 (``ToolInfo.mode``)."""
    wanted = (("zerocopy", spec.zerocopy), ("skip-rx-copy", spec.skip_rx_copy))
    return "+".join(name for name, on in wanted if on) or "copy"
