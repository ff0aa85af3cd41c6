"""A far end's limits, held by the kernel before its bytes leave.

The guard (:mod:`netprobe.agent.guard`) watches a far end from outside and stops it at a
breach: after the fact (one iperf3 far end at ``--max-rate 1M`` sent 350 MB before it was
stopped). A fence binds first. Each far end runs in a cgroup v2 of its own, and an nftables
table of the agent's (``inet``: IPv4 and IPv6) matches its sockets by that cgroup
(``socket cgroupv2``) at the output and input hooks:

* a packet to or from any address but the client that asked for the far end is dropped:
  it may send to no one else (whatever the ``--allow`` list would accept);
* a new connection (TCP or UDP flow) past the streams the test asked for, plus the tool's
  control and sync connections, is refused at accept (``ct count``);
* with ``--max-rate``, packets past the rate are dropped (``limit rate over ... bytes``),
  from a bucket of one second's worth: what leaves is at most the rate plus one second of
  it (where a second's worth is less than :data:`MIN_BURST_BYTES`, that much).

When the far end ends, whatever of it is left in the cgroup is killed (``cgroup.kill``)
and the cgroup and table are removed. Names carry the agent's pid and start time, so an
agent starting up removes what a killed predecessor left (:func:`remove_stale`).

Where this cannot be done (no root, no cgroup v2, no nftables, nft without ``socket
cgroupv2``), :func:`unavailable` says why, and the agent says so: only the guard holds it.
"""
from __future__ import annotations

import atexit
import contextlib
import ipaddress
import itertools
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from netprobe.driven.process import run_captured

PREFIX = "netprobe_fence_"
NFT_TIMEOUT_S = 20.0
"""How long one nft command may take: a CI run here saw `nft add element` take over 5 s
(the limit then) while the kernel tore network namespaces down, and the far end was
refused for it; a command that hangs still ends, and the far end with it."""
MIN_BURST_BYTES = 2 * 65536
"""The smallest burst: a TCP packet at the output hook is one before GSO cuts it (up to
64 KiB), and a packet dearer than the whole burst would never pass."""
KILL_WAIT_S = 3.0
_NAME = re.compile(rf"^table inet ({PREFIX}(\d+)_(\d+)_\d+)$")
_serial = itertools.count(1)
_live: set[str] = set()  # fences of this process not yet removed


class FenceUnavailable(Exception):
    """No fence can be put up here; the message says why, in one line."""


@atexit.register
def _remove_live() -> None:
    # SIGTERM and SIGINT end the agent without its far-end threads' clean-up.
    for name in list(_live):
        Fence(name, "").close()


def cgroup2_root() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (a hybrid host has it under
    /sys/fs/cgroup/unified), None if it is not."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def _nft(script: str, *args: str) -> str:
    """Run ``nft ARGS`` (``script`` on stdin, ``-f -``, when given), seeing the cgroup v2
    hierarchy at /sys/fs/cgroup as nft expects it (bound there in a mount namespace of
    its own on a hybrid host). FenceUnavailable when it cannot or nft refuses."""
    binary, root = shutil.which("nft"), cgroup2_root()
    if binary is None:
        raise FenceUnavailable("nft is not installed")
    if root is None:
        raise FenceUnavailable("no cgroup v2 hierarchy is mounted")
    argv = [binary, *(("-f", "-") if script else ()), *args]
    if root != Path("/sys/fs/cgroup"):
        unshare = shutil.which("unshare")
        if unshare is None:
            raise FenceUnavailable("cgroup v2 is not at /sys/fs/cgroup and unshare is missing")
        argv = [unshare, "-m", "sh", "-c",
                'mount --bind "$0" /sys/fs/cgroup && exec "$@"', str(root), *argv]
    try:
        done = run_captured(argv, NFT_TIMEOUT_S, input=script or None)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FenceUnavailable(f"nft: {exc}") from None
    if done.returncode != 0:
        said = [line for line in done.stderr.strip().splitlines() if "Error" in line]
        raise FenceUnavailable(f"nft: {(said or ['failed'])[0].strip()}")
    return done.stdout


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _table_script(name: str, peer: str, max_connections: int,
                  bytes_per_s: float | None) -> str:
    """The fence's table: both hooks send the far end's packets (by cgroup) to a chain
    that drops what is not to or from ``peer``, refuses connections past the count and
    drops what is past the rate."""
    address = ipaddress.ip_address(peer)
    plain = getattr(address, "ipv4_mapped", None) or address
    ip, other, kind = (("ip", "ipv6", "ipv4_addr") if plain.version == 4
                       else ("ip6", "ipv4", "ipv6_addr"))
    lines = [f"table inet {name} {{",
             f"set conns {{ type {kind}; size 16; flags dynamic; }}"]
    for hook, field in (("output", "daddr"), ("input", "saddr")):
        limit = []
        if bytes_per_s:
            # The kernel's bucket holds a second's worth plus the burst: no burst, unless a
            # second's worth is less than one GSO packet.
            rate = max(int(bytes_per_s), 1)
            burst = max(0, MIN_BURST_BYTES - rate)
            limit = [f"limit rate over {rate} bytes/second"
                     + (f" burst {burst} bytes" if burst else "") + " counter drop"]
        lines += [f"chain {hook} {{", f"type filter hook {hook} priority filter; policy accept;",
                  f'socket cgroupv2 level 1 "{name}" goto fenced_{hook}', "}",
                  f"chain fenced_{hook} {{",
                  f"meta nfproto {other} counter drop",
                  # Refused coming in (a client fails at once), dropped going out.
                  f"{ip} {field} != {plain} counter " + ("reject" if hook == "input" else "drop"),
                  f"ct state new add @conns {{ {ip} {field} ct count over {max_connections} }} "
                  "counter reject",
                  *limit, "}"]
    return "\n".join([*lines, "}", ""])


class Fence:
    """One far end's cgroup and nftables table. :meth:`put_up` makes both; start the far
    end with :meth:`argv` (it joins the cgroup before it runs the tool); :meth:`close`
    kills what is left in the cgroup and removes both (a context manager does that)."""

    def __init__(self, name: str, peer: str) -> None:
        self.name = name
        """The cgroup's and the nftables table's name."""
        self.peer = peer
        """The one address the far end may talk to."""

    @property
    def cgroup(self) -> Path:
        """The far end's cgroup directory."""
        root = cgroup2_root()
        return (root or Path("/nonexistent")) / self.name

    @classmethod
    def put_up(cls, peer: str, max_connections: int,
               bytes_per_s: float | None) -> Fence:
        """A fence for a far end serving ``peer`` only, with at most ``max_connections``
        connections at once and ``bytes_per_s`` each way (None: no rate limit)."""
        me = os.getpid()
        fence = cls(f"{PREFIX}{me}_{_start_time(me)}_{next(_serial)}", peer)
        try:
            fence.cgroup.mkdir()
        except OSError as exc:
            raise FenceUnavailable(f"cannot make a cgroup: {exc.strerror}") from None
        _live.add(fence.name)
        try:
            _nft(_table_script(fence.name, peer, max_connections, bytes_per_s))
        except (FenceUnavailable, ValueError) as exc:
            fence.close()
            raise FenceUnavailable(str(exc)) from None
        return fence

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the fence: the shell joins the cgroup, then becomes the
        tool (same PID), so every socket the tool opens is the fence's."""
        procs = str(self.cgroup / "cgroup.procs")
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *argv]

    def dropped(self) -> int:
        """Packets the fence has dropped or refused so far (0 if it cannot be read)."""
        try:
            listing = _nft("", "list", "table", "inet", self.name)
        except FenceUnavailable:
            return 0
        return sum(int(n) for n in re.findall(r"counter packets (\d+)", listing))

    def close(self) -> None:
        """Kill what is left in the cgroup, remove it and the table (quietly: either may
        be gone already)."""
        _live.discard(self.name)
        cgroup = self.cgroup
        if cgroup.is_dir():
            with contextlib.suppress(OSError):
                (cgroup / "cgroup.kill").write_text("1")
            end = time.monotonic() + KILL_WAIT_S
            while time.monotonic() < end and _members(cgroup):
                time.sleep(0.05)
            # A killed far end's TCP sockets live on, orphaned, sending what it had queued
            # (1.4 MB of iperf 2's once left after its fence was gone): they are destroyed
            # while the fence still holds them.
            _destroy_sockets(self.name)
            while time.monotonic() < end:
                try:
                    cgroup.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
        with contextlib.suppress(FenceUnavailable):
            _nft("", "delete", "table", "inet", self.name)

    def __enter__(self) -> Fence:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _members(cgroup: Path) -> bool:
    try:
        return bool((cgroup / "cgroup.procs").read_text().strip())
    except OSError:
        return False


def _destroy_sockets(name: str) -> None:
    """Destroy the sockets of the cgroup ``name`` (``ss -K``: SOCK_DESTROY), quietly where
    ss or the kernel cannot."""
    binary = shutil.which("ss")
    if binary is None:
        return
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        run_captured([binary, "-K", "-tuan", "cgroup", f"/{name}"], NFT_TIMEOUT_S)


def unavailable() -> str | None:
    """Why no fence can be put up here (None: it can); tried once, with a real fence."""
    try:
        Fence.put_up("127.0.0.1", 1, 1.0).close()
    except FenceUnavailable as exc:
        return str(exc)
    return None


def remove_stale() -> list[str]:
    """Remove the fences of agents no longer running; the names removed."""
    try:
        listing = _nft("", "list", "tables", "inet")
    except FenceUnavailable:
        return []
    removed = []
    for match in map(_NAME.match, listing.splitlines()):
        if match and _start_time(int(match.group(2))) != match.group(3):
            Fence(match.group(1), "").close()
            removed.append(match.group(1))
    root = cgroup2_root()
    for path in root.glob(f"{PREFIX}*") if root else ():
        parts = path.name[len(PREFIX):].split("_")
        if len(parts) == 3 and parts[0].isdigit() and _start_time(int(parts[0])) != parts[1]:
            Fence(path.name, "").close()
            removed.append(path.name)
    return sorted(set(removed))


__all__ = ["PREFIX", "Fence", "FenceUnavailable", "cgroup2_root", "remove_stale",
           "unavailable"]
