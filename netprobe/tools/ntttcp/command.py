"""ntttcp's command lines: the plan of one run (address, ports, result files) and the argv
of each role, built before anything runs.

Option mapping (netprobe -> ntttcp): streams N -> ``-m N,*,ADDRESS`` on both sides (N
receiver ports, one sender thread and connection per port); duration ``-t`` (whole
seconds); omit ``-W`` warm-up (whole seconds, excluded from ntttcp's totals); UDP ``-u``;
rate ``-B`` in bit/s for all streams together (ntttcp divides it among its threads);
length ``-b`` (bytes per send/receive call, the UDP datagram size); nodelay ``--no-delay``;
IPv6 ``-6``; bind ``-a`` (sender's source address); port ``-p`` (base data port).
"""

from __future__ import annotations

import os
import shutil
import socket
from dataclasses import dataclass, field
from typing import Any

from netprobe.driven import family_for, free_port, is_local_host, is_numeric, port_is_free
from netprobe.errors import TestFailed
from netprobe.schema import TestSpec

DEFAULT_PORT = 5001
"""ntttcp's default base port (its sync port is one below)."""
_GRACE_S = 15.0



@dataclass(frozen=True)
class Plan:
    """Everything decided before anything runs."""

    local: bool
    family: int
    address: str
    """Numeric receiver address (ntttcp checks for '.' or ':' in it, so no names)."""
    base_port: int
    sender_argv: tuple[str, ...]
    receiver_argv: tuple[str, ...] | None
    files: dict[str, str] = field(default_factory=dict)
    """Result file paths by name (``sender.xml``, ``receiver.json``, ...)."""
    timeout_s: float = 60.0


def resolve(spec: TestSpec, family: int, local: bool) -> str:
    """The numeric address to put in ``-m`` (ntttcp takes no host names)."""
    if local and (spec.host is None or not is_numeric(spec.host)):
        return "::1" if family == socket.AF_INET6 else "127.0.0.1"
    host = str(spec.host)
    if is_numeric(host):
        return host
    try:
        infos = socket.getaddrinfo(host, None, family, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise TestFailed(f"ntttcp: cannot resolve {host!r}: {exc}") from None
    return str(infos[0][4][0])


def make_plan(
    spec: TestSpec, binary: str, options: dict[str, Any], workdir: str, help_text: str = ""
) -> Plan:
    """Choose the address and ports and build both command lines."""
    local = bool(options.get("start_server", True)) and is_local_host(spec.host)
    family = family_for(spec)
    address = resolve(spec, family, local)
    base = spec.port or (free_base_port(spec.streams, family) if local else DEFAULT_PORT)
    prefix = line_buffer_prefix(options)
    files = {
        f"{role}.{kind}": os.path.join(workdir, f"{role}.{kind}")
        for role in ("sender", "receiver")
        for kind in ("xml", "json")
    }
    json_ok = not help_text or "-j " in help_text
    sender = (*prefix, binary, "-s", *common_args(spec, address, base))
    sender += (*sender_args(spec), *_file_args(files, "sender", json_ok))
    receiver = None
    if local:
        receiver = (*prefix, binary, "-r", *common_args(spec, address, base))
        receiver += _file_args(files, "receiver", json_ok)
    timeout = (
        float(spec.duration_s or 0) + spec.omit_s + _GRACE_S + 0.2 * float(spec.duration_s or 0)
    )
    return Plan(local, family, address, base, sender, receiver, files, timeout)


def line_buffer_prefix(options: dict[str, Any]) -> tuple[str, ...]:
    """``stdbuf -oL -eL`` (unless the option ``line_buffered`` is False), if installed."""
    # Through a pipe ntttcp's stdio is block-buffered: its lines would arrive at exit.
    if not options.get("line_buffered", True):
        return ()
    stdbuf = shutil.which("stdbuf")
    return (stdbuf, "-oL", "-eL") if stdbuf else ()


def common_args(spec: TestSpec, address: str, base_port: int) -> tuple[str, ...]:
    """Options both roles must agree on."""
    assert spec.duration_s is not None  # refused otherwise (no byte-count mode)
    args = ["-m", f"{spec.streams},*,{address}", "-p", str(base_port)]
    args += ["-t", str(int(spec.duration_s)), "-V"]
    if spec.omit_s:
        args += ["-W", str(int(spec.omit_s))]
    if spec.protocol == "udp":
        args.append("-u")
    if ":" in address:
        args.append("-6")
    if spec.length_bytes is not None:
        args += ["-b", str(spec.length_bytes)]
    return tuple(args)


def sender_args(spec: TestSpec) -> tuple[str, ...]:
    """Sender-only options."""
    args: list[str] = []
    if spec.rate_bits_per_second is not None:
        # -B limits all sender threads together; netprobe's rate is per stream.
        args += ["-B", str(int(spec.rate_bits_per_second * spec.streams))]
    if spec.nodelay:
        args.append("--no-delay")
    if spec.bind_address is not None:
        args += ["-a", spec.bind_address]
    return tuple(args)


def _file_args(files: dict[str, str], role: str, json_ok: bool) -> tuple[str, ...]:
    args = ("-x", files[f"{role}.xml"])
    return (*args, "-j", files[f"{role}.json"]) if json_ok else args


def free_base_port(streams: int, family: int) -> int:
    """A base port such that it, the ``streams - 1`` above it and the sync port below it
    are all free for TCP and UDP."""
    for _ in range(100):
        base = free_port(family)
        ports = range(base - 1, base + streams)
        if base - 1 < 1024 or base + streams - 1 > 65535:
            continue
        if all(port_is_free(port, family) for port in ports if port != base):
            return base
    raise TestFailed(f"no block of {streams + 1} free ports found for ntttcp")
