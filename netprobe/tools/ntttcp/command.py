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

from netprobe.driven import Plan as DrivenPlan
from netprobe.driven import (
    client_deadline,
    family_for,
    free_port,
    is_local_host,
    is_numeric,
    local_server_wanted,
    port_is_free,
)
from netprobe.errors import TestFailed
from netprobe.schema import TestSpec

DEFAULT_PORT = 5001
"""ntttcp's default base port (its sync port is one below)."""



@dataclass(frozen=True)
class Plan(DrivenPlan):
    """Everything decided before anything runs: the driven Plan (``address`` is numeric:
    ntttcp checks for '.' or ':' in it, so no names; ``client_argv`` the sender's, empty
    in receive-only mode; ``server_argv`` the receiver's, None when it is someone else's)
    and ntttcp's own parts."""

    base_port: int = DEFAULT_PORT
    """The first data port (the sync port is one below)."""
    files: dict[str, str] = field(default_factory=dict)
    """Result file paths by name (``sender.xml``, ``receiver.json``, ...)."""
    no_sync: bool = False
    """``-N``: no sync handshake (Windows NTttcp's ``-ns`` peers need it)."""

    @property
    def receive_only(self) -> bool:
        """Only a receiver here, waiting for an outside sender."""
        return not self.client_argv


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
        # strerror where there is one: "[Errno -2]" is getaddrinfo's code, not a reason
        reason = getattr(exc, "strerror", None) or exc
        raise TestFailed(f"ntttcp: cannot resolve {host!r}: {reason}") from None
    return str(infos[0][4][0])


def make_plan(
    spec: TestSpec, binary: str, options: dict[str, Any], workdir: str, help_text: str = ""
) -> Plan:
    """Choose the address and ports and build both command lines. Options: ``receive``
    (only a receiver, on this machine, for an outside sender), ``no_sync`` (``-N`` for
    both roles), ``start_server`` (False: never start a receiver)."""
    receive = bool(options.get("receive"))
    no_sync = bool(options.get("no_sync"))
    local = receive or local_server_wanted(spec, options)
    family = family_for(spec)
    address = listen_address(spec, family) if receive else resolve(spec, family, local)
    if spec.port:
        base = spec.port
    else:  # an outside sender expects ntttcp's default port
        base = free_base_port(spec.streams, family) if local and not receive else DEFAULT_PORT
    prefix = line_buffer_prefix(options)
    files = {
        f"{role}.{kind}": os.path.join(workdir, f"{role}.{kind}")
        for role in ("sender", "receiver")
        for kind in ("xml", "json")
    }
    json_ok = not help_text or "-j " in help_text
    common = common_args(spec, address, base, no_sync=no_sync)
    sender: tuple[str, ...] = ()
    if not receive:
        sender = (*prefix, binary, "-s", *common, *sender_args(spec),
                  *_file_args(files, "sender", json_ok))
    receiver = None
    if local:
        receiver = (*prefix, binary, "-r", *common, *_file_args(files, "receiver", json_ok))
    return Plan(local, family, address, sender, receiver, client_deadline(spec), base, files,
                no_sync)


def listen_address(spec: TestSpec, family: int) -> str:
    """Where a receive-only receiver listens: HOST if it is an address of this machine,
    else every address of the family."""
    if spec.host is not None:
        if not (is_numeric(spec.host) and is_local_host(spec.host)):
            raise TestFailed(f"ntttcp --receive listens on this machine: {spec.host!r} is "
                             "not one of its addresses (give a local address or none; "
                             "--from AGENT receives on that agent's host)")
        return spec.host
    return "::" if family == socket.AF_INET6 else "0.0.0.0"


def line_buffer_prefix(options: dict[str, Any]) -> tuple[str, ...]:
    """``stdbuf -oL -eL`` (unless the option ``line_buffered`` is False), if installed."""
    # Through a pipe ntttcp's stdio is block-buffered: its lines would arrive at exit.
    if not options.get("line_buffered", True):
        return ()
    stdbuf = shutil.which("stdbuf")
    return (stdbuf, "-oL", "-eL") if stdbuf else ()


def common_args(spec: TestSpec, address: str, base_port: int, *,
                no_sync: bool = False) -> tuple[str, ...]:
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
    if no_sync:
        args.append("-N")
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
    # Attached (-xPATH): -x and -j take an optional argument, and ntttcp 1.4.0 reads one
    # only when attached (later builds also take the next word).
    xml = f"-x{files[f'{role}.xml']}"
    return (xml, f"-j{files[f'{role}.json']}") if json_ok else (xml,)


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
