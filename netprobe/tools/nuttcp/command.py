"""nuttcp's command lines: the plan of one run (ports, address) and both argvs, built
before anything runs, and what nuttcp's option units cannot express.

The client always runs with ``-v -fparse``: with ``-v`` the client prints both sides' totals,
CPU and socket settings (nuttcp servers print nothing; the receiver's half arrives on the
client), and ``-fparse`` makes every figure a key=value pair. For a test on this machine
the adapter starts a one-shot server (``-1 --nofork``: never ``-S``, and not ``-1`` alone,
which both fork a detached daemon out of reach of our process group) on free ports.

Option mapping (netprobe -> nuttcp): reverse ``-r``; streams ``-N`` (per-stream
retransmits and cwnd come only in the ``-v`` totals); duration ``-T``; bytes per stream
``-n`` buffers in total (``-n`` counts buffers over all streams, so the byte count must be
a whole number of buffers); interval ``-i``; length ``-l``; window ``-w`` in KB (1024
bytes; it sets the sender's send and the receiver's receive buffer); rate ``-R`` in Kbps
for all streams together (nuttcp's rate is the aggregate, netprobe's is per stream); MSS
``-M``; nodelay ``-D``; DSCP ``-c``; ``-4``/``-6``; port ``-P`` (control) with the data
port one above it.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from netprobe.driven import (
    Plan,
    client_deadline,
    family_for,
    free_port,
    free_port_block,
    is_numeric,
    local_server_wanted,
    loopback,
)
from netprobe.schema import TestSpec
from netprobe.tools.nuttcp.parse_output import version_major

DEFAULT_CONTROL_PORT = 5000
"""nuttcp's control port (6.x and 8.x)."""
DEFAULT_LENGTH = {"tcp": 65536, "udp": 8192}
"""nuttcp's buffer length when -l is not given."""
BYTES_TIMEOUT_S = 600.0
"""How long a byte-count test may run (option ``timeout_s``): its length is not known."""


@dataclass(frozen=True)
class NuttcpPlan(Plan):
    """A nuttcp run's plan: the common one and nuttcp's two ports."""

    control_port: int | None = None
    """``-P``: the server's control port (None: nuttcp's default, 5000)."""
    data_port: int | None = None
    """``-p``: the first data port (the next ``streams - 1`` are used too)."""


def make_plan(spec: TestSpec, binary: str, options: dict[str, Any]) -> NuttcpPlan:
    """Choose ports and build both command lines."""
    local = local_server_wanted(spec, options)
    family = family_for(spec)
    control: int | None
    data: int | None
    server: tuple[str, ...] | None = None
    if local:
        # A port the user asked for is used as given (the data port is the next one).
        control = spec.port or free_port(family)
        data = spec.port + 1 if spec.port else free_port_block(
            spec.streams, family, avoid=(control,))
        # A name ("localhost") might resolve to the other family than the server's.
        host = spec.host if spec.host and is_numeric(spec.host) else loopback(family)
        server = tuple(server_argv(binary, control, family))
    else:
        control = spec.port
        data = options.get("data_port") or (control + 1 if control else None)
        host = spec.host or loopback(family)
    timeout = client_deadline(spec) or float(options.get("timeout_s", BYTES_TIMEOUT_S))
    argv = (binary, *client_args(spec, control, data), host)
    return NuttcpPlan(local, family, host, argv, server, timeout, control, data)


def server_argv(binary: str, control_port: int, family: int) -> list[str]:
    """A one-shot server in the foreground (``-1 --nofork``) on ``control_port``."""
    extra = ["-6"] if family == socket.AF_INET6 else []
    return [binary, "-1", "--nofork", f"-P{control_port}", *extra]


def client_args(spec: TestSpec, control: int | None, data: int | None) -> list[str]:
    """nuttcp client options for ``spec`` (without the binary and the host)."""
    args = ["-v", "-fparse"]
    if control is not None:
        args.append(f"-P{control}")
    if data is not None:
        args.append(f"-p{data}")
    args += _amount_args(spec)
    if spec.interval_s is not None:
        args.append(f"-i{_number(spec.interval_s)}")
    args += _option_args(spec)
    return args


def _number(value: float) -> str:
    """A number as nuttcp reads it: no exponent, no needless decimals."""
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _amount_args(spec: TestSpec) -> list[str]:
    if spec.bytes_total is not None:
        length = spec.length_bytes or DEFAULT_LENGTH[spec.protocol]
        # -n counts buffers over all streams together; netprobe's bytes are per stream.
        return [f"-n{spec.bytes_total // length * spec.streams}"]
    assert spec.duration_s is not None  # TestSpec guarantees a duration or a byte count
    return [f"-T{_number(spec.duration_s)}"]


def _option_args(spec: TestSpec) -> list[str]:
    flags = [
        (spec.protocol == "udp", "-u"),
        (spec.direction == "reverse", "-r"),
        (spec.nodelay, "-D"),
        (spec.ip_version == 6, "-6"),
        (spec.ip_version == 4, "-4"),
    ]
    args = [flag for wanted, flag in flags if wanted]
    if spec.streams > 1:
        args.append(f"-N{spec.streams}")
    length = spec.length_bytes or (DEFAULT_LENGTH[spec.protocol] if spec.bytes_total else None)
    if length is not None:
        args.append(f"-l{length}")
    if spec.window_bytes is not None:
        args.append(f"-w{spec.window_bytes // 1024}")
    if spec.rate_bits_per_second is not None:
        # nuttcp's -R is in Kbps (10**3) and limits all streams together.
        args.append(f"-R{_number(spec.rate_bits_per_second * spec.streams / 1000)}")
    elif spec.protocol == "udp":
        args.append("-R0")  # no rate in the spec is unlimited; nuttcp's own UDP default is 1M
    if spec.mss_bytes is not None:
        args.append(f"-M{spec.mss_bytes}")
    if spec.dscp is not None:
        args.append(f"-c{spec.dscp}")
    return args


# --- what the options cannot express ---------------------------------------------------


def refusals(spec: TestSpec, version: Callable[[], str | None]) -> list[str]:
    """What nuttcp's option units (and 6.x's quirks) cannot honour, beyond capabilities.
    ``version()`` (which may run the binary) is asked only where the answer depends on it:
    anything else is refused before any process starts."""
    found: list[str] = []

    def refuse(option: str, why: str) -> None:
        found.append(f"nuttcp cannot honour {option}: {why}")

    if spec.window_bytes is not None and spec.window_bytes % 1024:
        refuse(f"--window {spec.window_bytes}", "nuttcp -w takes whole KB (1024 bytes)")
    if spec.protocol == "udp" and spec.mss_bytes is not None:
        refuse("--mss", "MSS is a TCP setting")
    if spec.protocol == "udp" and spec.nodelay:
        refuse("--nodelay", "TCP_NODELAY is a TCP setting")
    rate = spec.rate_bits_per_second
    if rate is not None and rate * spec.streams < 1000:
        refuse("--bitrate", "nuttcp's smallest rate is 1 Kbps (for all streams together)")
    if _unsteady_udp_reverse_reports(spec, version):
        refuse(
            f"--interval {spec.interval_s:g} with UDP and --reverse",
            "nuttcp 6.x then stops now and then with 'Error: not receiving data from "
            "server' (3 runs in 16 at 0.5 s here; none at 0.8 s or 1 s): use 1 s or more",
        )
    length = spec.length_bytes or DEFAULT_LENGTH[spec.protocol]
    if spec.bytes_total is not None and spec.bytes_total % length:
        refuse(
            f"--bytes {spec.bytes_total}",
            f"nuttcp counts whole buffers of {length} bytes (-n); "
            "give a byte count that is a multiple of the length",
        )
    return found


def _unsteady_udp_reverse_reports(spec: TestSpec, version: Callable[[], str | None]) -> bool:
    """True for the combination nuttcp 6.x fails now and then: a UDP receiver on the
    client (-u -r) reporting more often than every second."""
    return (
        spec.protocol == "udp"
        and spec.direction == "reverse"
        and spec.interval_s is not None
        and spec.interval_s < 1.0
        and version_major(version()) == 6
    )
