"""The bytes a far end's UDP sockets move, counted by nftables.

The kernel keeps no byte counter per UDP socket (sock_diag gives UDP queue sizes only), and
/proc/PID/io counts read/write but not send/sendto/sendmsg/recv*: nuttcp, ntttcp and
iperf3 with ``--gsro`` move their UDP data with those. So the agent gives each rate-watched
far end an nftables table of its own (``inet`` family: IPv4 and IPv6) holding

* a set of UDP ports: the local ports of the far end's UDP sockets, learned from
  /proc/net/udp[6] by the guard as the far end opens them;
* two named counters fed by rules at the raw priority of the output and input hooks: a
  datagram leaving from one of those ports, or arriving at one, is counted once (on
  loopback a datagram passes both hooks, but with its source port going out and its
  destination port coming in).

The table's name carries the agent's pid and start time, so an agent starting up removes
what a killed predecessor left (:func:`remove_stale`). Everything goes through the ``nft``
command (a few milliseconds a call): no netlink code of our own to keep.
"""
from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from netprobe.driven.process import run_captured

PREFIX = "netprobe_guard_"
NFT_TIMEOUT_S = 20.0
"""How long one nft command may take: a CI run here saw `nft add element` take over 5 s
(the limit then) while the kernel tore network namespaces down, and the far end was
refused for it; a command that hangs still ends, and the far end with it."""
UNAVAILABLE = "cannot watch a UDP far end's rate here: needs CAP_NET_ADMIN and nftables"
"""The start of the reason a UDP far end is refused (or stopped) where no counter can be
installed (the detail follows it)."""
_HEADERS = {"v4": 20 + 8, "v6": 40 + 8}
"""IP and UDP header bytes per counted packet, taken off (the rate is of payload, as the
TCP counters are; a GSO packet is counted once, with its one header, before it is cut)."""
_NAME = re.compile(rf"^table inet ({PREFIX}(\d+)_(\d+)_\d+)$")
_serial = itertools.count(1)
_live: set[str] = set()  # tables of this process not yet removed


@atexit.register
def _remove_live() -> None:
    # SIGTERM and SIGINT end the agent without running its far-end threads' clean-up
    # (daemon threads): their tables go here. SIGKILL leaves them to remove_stale().
    for name in list(_live):
        UdpCounter(name).close()


class CounterUnavailable(Exception):
    """No counter can be installed here; the message says why, in one line."""


def _nft(*args: str, script: str | None = None) -> str:
    """Run ``nft ARGS`` (``script`` on its stdin); its stdout. CounterUnavailable when nft
    is missing or refuses (no CAP_NET_ADMIN, a kernel without nf_tables)."""
    binary = shutil.which("nft")
    if binary is None:
        raise CounterUnavailable(f"{UNAVAILABLE} (nft is not installed)")
    try:
        done = run_captured([binary, *args], NFT_TIMEOUT_S, input=script)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CounterUnavailable(f"{UNAVAILABLE} (nft: {exc})") from None
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["failed"])[0]
        raise CounterUnavailable(f"{UNAVAILABLE} (nft: {said})")
    return done.stdout


def _start_time(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks since boot), None if it is not running: with
    the pid it names one process, whatever pid reuse does."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _table_script(name: str) -> str:
    lines = [f"table inet {name} {{", "counter v4 { }", "counter v6 { }",
             "set ports { type inet_service; }"]
    for hook, field in (("output", "sport"), ("input", "dport")):
        lines += [f"chain {hook} {{", f"type filter hook {hook} priority raw; policy accept;",
                  f"meta nfproto ipv4 udp {field} @ports counter name v4",
                  f"meta nfproto ipv6 udp {field} @ports counter name v6", "}"]
    return "\n".join([*lines, "}", ""])


class UdpCounter:
    """One far end's UDP payload bytes, both ways, from the moment each port is watched.

    Create it with :meth:`install` (CounterUnavailable where it cannot be), give it the
    far end's UDP ports with :meth:`watch`, read :meth:`bytes`, and :meth:`close` it (the
    table goes; a context manager does that)."""

    def __init__(self, name: str) -> None:
        self.name = name
        """The nftables table (family inet) this counter owns."""
        self.ports: set[int] = set()
        """The ports counted so far."""

    @classmethod
    def install(cls) -> UdpCounter:
        """A new table of this process's own, counting nothing yet."""
        me = os.getpid()
        name = f"{PREFIX}{me}_{_start_time(me)}_{next(_serial)}"
        _nft("-f", "-", script=_table_script(name))
        _live.add(name)
        return cls(name)

    def watch(self, ports: Iterable[int]) -> None:
        """Count these ports too (those already counted are left as they are)."""
        new = sorted(set(ports) - self.ports)
        if new:
            _nft("add", "element", "inet", self.name, "ports",
                 "{ " + ", ".join(str(p) for p in new) + " }")
            self.ports.update(new)

    def bytes(self) -> int:
        """UDP payload bytes sent from and received at the watched ports so far."""
        found = json.loads(_nft("-j", "list", "counters", "table", "inet", self.name))
        total = 0
        for item in found.get("nftables", []):
            counter = item.get("counter")
            if isinstance(counter, dict) and counter.get("name") in _HEADERS:
                header = _HEADERS[counter["name"]]
                total += max(0, int(counter["bytes"]) - header * int(counter["packets"]))
        return total

    def close(self) -> None:
        """Remove the table (quietly: it may be gone already)."""
        _live.discard(self.name)
        with contextlib.suppress(CounterUnavailable):
            _nft("delete", "table", "inet", self.name)

    def __enter__(self) -> UdpCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tables() -> list[tuple[str, int, str]]:
    """The guard tables in this network namespace: (name, agent pid, agent start time);
    none where nft is not."""
    try:
        listing = _nft("list", "tables", "inet")
    except CounterUnavailable:
        return []
    return [(m.group(1), int(m.group(2)), m.group(3))
            for m in map(_NAME.match, listing.splitlines()) if m]


def remove_stale() -> list[str]:
    """Remove the tables of agents no longer running (a killed one leaves its own); the
    names removed."""
    removed = []
    for name, pid, started in tables():
        if _start_time(pid) != started:
            UdpCounter(name).close()
            removed.append(name)
    return removed


__all__ = ["PREFIX", "UNAVAILABLE", "CounterUnavailable", "UdpCounter", "remove_stale",
           "tables"]
