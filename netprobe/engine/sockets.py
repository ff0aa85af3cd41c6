"""Socket set-up for data streams: the spec's options applied, and what the kernel gave back."""

from __future__ import annotations

import fcntl
import platform
import socket
import struct
import termios

from netprobe import core
from netprobe.errors import SpecError, unresolved
from netprobe.schema import SocketInfo, TestSpec

TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)
IPV6_TCLASS = getattr(socket, "IPV6_TCLASS", 67)
# SO_MEMINFO (Linux 3.9+) has one number on every architecture we ship for (the generic
# value 55 is also mips' and alpha's); sparc and parisc number it apart: not read there.
SO_MEMINFO = None if platform.machine().startswith(("sparc", "parisc")) else 55
_SK_MEMINFO_DROPS = 8  # the ninth u32 of the array: sk_drops


def apply_options(sock: socket.socket, spec: TestSpec) -> None:
    """Apply window, nodelay, MSS, DSCP and congestion control; SpecError if refused."""
    tcp = sock.type == socket.SOCK_STREAM
    if spec.window_bytes:
        _set(sock, socket.SOL_SOCKET, socket.SO_SNDBUF, spec.window_bytes, "--window")
        _set(sock, socket.SOL_SOCKET, socket.SO_RCVBUF, spec.window_bytes, "--window")
    elif not tcp:
        grow_udp_receive_buffer(sock)
    if tcp and spec.nodelay:
        _set(sock, socket.IPPROTO_TCP, socket.TCP_NODELAY, 1, "--nodelay")
    if tcp and spec.mss_bytes:
        _set(sock, socket.IPPROTO_TCP, socket.TCP_MAXSEG, spec.mss_bytes, "--mss")
    if spec.dscp is not None:
        tos = spec.dscp << 2
        if sock.family == socket.AF_INET6:
            _set(sock, socket.IPPROTO_IPV6, IPV6_TCLASS, tos, "--dscp")
        else:
            _set(sock, socket.IPPROTO_IP, socket.IP_TOS, tos, "--dscp")
    if tcp and spec.congestion:
        _set(sock, socket.IPPROTO_TCP, TCP_CONGESTION, spec.congestion.encode(), "--congestion")


# Why a UDP receiver asks for more than the kernel's default buffer. A UDP socket has no
# window: whatever arrives while its reader sleeps must fit in the buffer or is dropped,
# and counted as loss that was the tester's own. The default (net.core.rmem_default,
# 208 KiB on most hosts, charged with each packet's overhead) holds three 64 KiB GSO/GRO
# messages: 46 us of a 36 Gbit/s loopback flow, less than one wake-up of a sleeping vCPU.
# There 2-6% of the datagrams of an unlimited 512-byte test were lost at the receiver's
# own socket; with 4 MiB asked for, 1-1.5%. So the receiver asks for what the host allows
# (net.core.rmem_max: the administrator's bound, never passed: no SO_RCVBUFFORCE), up to
# UDP_RECEIVE_BUFFER_BYTES, about a millisecond at 32 Gbit/s. TCP needs none of this: its
# window stops the sender instead, and autotuning sizes its buffer. The memory is only
# used while datagrams wait; --window sets the size instead.
UDP_RECEIVE_BUFFER_BYTES = 4 << 20
RMEM_MAX = "/proc/sys/net/core/rmem_max"


def grow_udp_receive_buffer(sock: socket.socket) -> None:
    """Best effort: raise a UDP socket's receive buffer to what the host allows, up to
    UDP_RECEIVE_BUFFER_BYTES (see above); a host that refuses keeps its default."""
    try:
        with open(RMEM_MAX, encoding="ascii") as f:
            allowed = int(f.read().split()[0])
        wanted = min(allowed, UDP_RECEIVE_BUFFER_BYTES)
        # The kernel reports twice what was asked (its bookkeeping share): compare halves.
        if wanted > sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, wanted)
    except (OSError, ValueError, IndexError):
        pass


def udp_answer(family: int, local_address: str, port: int, peer: tuple,
               datagram: bytes) -> socket.socket:
    """A UDP socket on the server's port and ``local_address`` (so the answer leaves from
    the address the client spoke to), connected to ``peer``, that has sent ``datagram``."""
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((local_address, port))
        sock.connect(peer)
        sock.send(datagram)
    except OSError:
        sock.close()
        raise
    return sock


def _set(sock: socket.socket, level: int, option: int, value: int | bytes, flag: str) -> None:
    try:
        sock.setsockopt(level, option, value)
    except OSError as exc:
        shown = value.decode(errors="replace") if isinstance(value, bytes) else value
        raise SpecError(f"{flag} {shown} refused by the kernel: {exc.strerror}") from None


def socket_info(sock: socket.socket) -> SocketInfo:
    """Read back buffer sizes, MSS, path MTU and congestion control actually in use."""
    try:
        sndbuf = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        rcvbuf = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    except OSError:
        return SocketInfo()
    if sock.type != socket.SOCK_STREAM:
        return SocketInfo(send_buffer_bytes=sndbuf, receive_buffer_bytes=rcvbuf)
    info = _tcp_info(sock)
    return SocketInfo(
        send_buffer_bytes=sndbuf,
        receive_buffer_bytes=rcvbuf,
        mss_bytes=_getint(sock, socket.TCP_MAXSEG),
        pmtu_bytes=info.pmtu_bytes if info else None,
        congestion=congestion_of(sock),
    )


def socket_drops(sock: socket.socket) -> int | None:
    """Packets the kernel dropped at this one socket so far (``sk_drops``: for UDP, the
    datagrams that found its receive buffer full), or None where it cannot be read (no
    SO_MEMINFO, e.g. under qemu-user)."""
    if SO_MEMINFO is None:
        return None
    size = 4 * (_SK_MEMINFO_DROPS + 1)
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, size)
    except OSError:
        return None
    if len(raw) < size:
        return None
    return int(struct.unpack_from("=I", raw, 4 * _SK_MEMINFO_DROPS)[0])


def datagram_waiting(sock: socket.socket) -> bool:
    """Whether a datagram waits unread in this UDP socket (FIONREAD: the size of the next
    one). False where it cannot be asked."""
    try:
        size = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, ValueError):
        return False
    return bool(struct.unpack("=i", size)[0])


def unread_bytes(sock: socket.socket) -> int:
    """The bytes that reached this TCP socket and wait unread (FIONREAD, SIOCINQ); 0 where
    it cannot be asked."""
    try:
        queued = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, ValueError):
        return 0
    return max(0, struct.unpack("=i", queued)[0])


def unsent_bytes(sock: socket.socket) -> int | None:
    """The bytes a TCP socket holds that its peer has not yet acknowledged, sent or not
    (TIOCOUTQ, SIOCOUTQ); None where it cannot be asked."""
    try:
        queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (OSError, ValueError):
        return None
    return max(0, struct.unpack("=i", queued)[0])


SIOCOUTQNSD = 0x894B  # linux/sockios.h: a TCP socket's bytes not yet sent (since 2.6.39)


def untransmitted_bytes(sock: socket.socket) -> int | None:
    """The bytes a TCP socket holds that it has not yet handed to the network (its FIN
    counts one); None where it cannot be asked (an emulator, another system)."""
    try:
        queued = fcntl.ioctl(sock.fileno(), SIOCOUTQNSD, b"\0\0\0\0")
    except (OSError, ValueError):
        return None
    return max(0, struct.unpack("=i", queued)[0])


def _tcp_info(sock: socket.socket) -> core.TcpInfo | None:
    try:
        return core.tcp_info(sock.fileno())
    except OSError:
        return None


def _getint(sock: socket.socket, option: int) -> int | None:
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, option)
    except OSError:
        return None


def congestion_of(sock: socket.socket) -> str | None:
    """The congestion control a TCP socket runs (None where the kernel will not say)."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, 16)
    except OSError:
        return None
    return raw.split(b"\0", 1)[0].decode("ascii", "replace") or None


def family_for(spec: TestSpec) -> int:
    """AF_INET6 for ``-6``, AF_INET for ``-4``, 0 (either) otherwise."""
    return {4: socket.AF_INET, 6: socket.AF_INET6}.get(spec.ip_version or 0, 0)


def resolve(host: str, port: int, family: int, kind: int) -> tuple[int, tuple]:
    """The first address of ``host`` for the family; SpecError naming the host if none."""
    # getaddrinfo encodes a str with the idna codec, whose import (encodings.idna,
    # stringprep) is ~1.5 ms of a run's start-up; an ASCII name is the same bytes.
    name: str | bytes = host.encode("ascii") if host.isascii() else host
    try:
        infos = socket.getaddrinfo(name, port, family, kind)
    except socket.gaierror as exc:
        # strerror alone: "[Errno -2]" is getaddrinfo's EAI code, which tells a user nothing
        raise unresolved(host, exc.strerror) from None
    except UnicodeError as exc:
        raise unresolved(host, exc) from None
    fam, _, _, _, addr = infos[0]
    return fam, addr
