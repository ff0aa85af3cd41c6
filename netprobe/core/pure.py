"""The data path in pure Python: the same functions and results as the compiled core.

Used where the C core could not be built or with NETPROBE_PURE=1, and as the reference
the compiled core is tested against. It moves one buffer or datagram per system call
(Python has no sendmmsg/recvmmsg), so it is slower; its figures mean the same things.
Import it through :mod:`netprobe.core`, never directly: the functions here are the bodies
of :class:`~netprobe.core.contract.DataPath`'s, given checked arguments.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import resource
import select
import socket
import struct
import sys
import tempfile
import termios
import time
from collections.abc import Iterator
from typing import Callable

from netprobe.core.contract import SEQUENCE_MASK, BaseCounters
from netprobe.core.records import (
    UDP_HEADER_BYTES,
    WAKE_BYTES,
    HostCpu,
    LoopArgs,
    Rusage,
    TcpInfo,
    pattern,
)
from netprobe.errors import CoreError

DATA_PATH = "python"

_NS = 1_000_000_000
_TICK_NS = 100_000_000  # how long a blocked call waits before looking at the stop flag
_PACED_MIN_CHUNK = 1024
_WINDOW = 65536  # sequence numbers remembered for duplicate detection
_AHEAD = 1 << 32  # farthest plausible jump past the highest number (np_udp.c NP_SEQ_AHEAD)
_HEADER = struct.Struct("!QQ")
# ICMP echoes of earlier datagrams, or a full device queue: a UDP test carries on.
_UDP_SOFT = (errno.ECONNREFUSED, errno.ENOBUFS)
_SOL_UDP = 17  # IPPROTO_UDP
_UDP_GRO = 104  # not in Python's socket module; see np_udp.c for why the receiver sets it
_GRO_SLOT = 65536  # a coalesced message is one IP packet's worth at most (np_udp.c)
_GRO_CMSG = socket.CMSG_SPACE(4) + 128  # the segment size, and room for others (np_udp.c)


class _RxState:
    """Receiver sequence bookkeeping, same algorithm as struct np_rx_state in C."""

    __slots__ = ("base", "foreign", "have_transit", "jitter_ns", "last_transit", "next_seq",
                 "unique", "window")

    def __init__(self) -> None:
        self.base = 0
        self.foreign = 0
        self.next_seq = 0
        self.unique = 0
        self.last_transit = 0
        self.jitter_ns = 0.0
        self.have_transit = False
        self.window = bytearray(_WINDOW)


class Counters(BaseCounters):
    """The figures of one stream loop, in Python attributes the loop updates."""

    __slots__ = ("_bytes", "_calls", "_duplicates", "_jitter_ms", "_lost", "_messages",
                 "_out_of_order", "_packets", "_rx", "_stopped")

    def __init__(self) -> None:
        self._bytes = self._calls = self._packets = self._messages = 0
        self._lost = self._out_of_order = self._duplicates = 0
        self._jitter_ms = 0.0
        self._stopped = False
        self._rx = _RxState()

    def _read(self, figure: str) -> float:
        if figure == "foreign":
            return self._rx.foreign
        if figure == "sequence_base":
            return self._rx.base
        return getattr(self, f"_{figure}")

    def _write_sequence_base(self, base: int) -> None:
        self._rx.base = base

    def _request_stop(self) -> None:
        self._stopped = True


def _counters(counters: object) -> Counters:
    if not isinstance(counters, Counters):
        raise TypeError(f"counters must be netprobe.core.Counters, not {type(counters).__name__}")
    return counters


class _Pacer:
    """Unit k is due at start + k / rate; late units go at once, so errors never add up."""

    def __init__(self, units_per_s: float, now_ns: int) -> None:
        self.start = now_ns
        self.ns_per_unit = _NS / units_per_s if units_per_s > 0 else 0.0

    def due(self, done: int) -> int:
        return self.start + int(done * self.ns_per_unit)

    def allowed(self, done: int, now_ns: int) -> int:
        if now_ns < self.due(done):
            return 0
        return max(1, int((now_ns - self.start) / self.ns_per_unit) + 1 - done)


class _Loop:
    """One loop's stop/deadline/pacing checks on a borrowed socket."""

    def __init__(self, sock: socket.socket, counters: Counters, args: LoopArgs,
                 units_per_s: float) -> None:
        self.sock = sock
        self.counters = counters
        self.nonblocking = not os.get_blocking(sock.fileno())
        self.deadline = _deadline_ns(args.deadline)
        self.now = time.monotonic_ns()
        self.pacer = _Pacer(units_per_s, self.now)
        self.timed = self.deadline is not None or self.pacer.ns_per_unit > 0

    def done(self) -> bool:
        if self.counters._stopped:
            return True
        if not self.timed:
            return False
        self.now = time.monotonic_ns()
        return self.deadline is not None and self.now >= self.deadline

    def sleep_until_due(self, done: int) -> None:
        """Sleep until unit ``done`` is due, a tick at most, never past the deadline."""
        until = min(self.pacer.due(done), self.now + _TICK_NS)
        if self.deadline is not None:
            until = min(until, self.deadline)
        time.sleep(max(0, until - self.now) / _NS)

    def wait(self, events: int) -> None:
        """After EAGAIN: a non-blocking socket waits here, a blocking one already did."""
        if not self.nonblocking:
            return
        wait_ns = _TICK_NS
        if self.deadline is not None:
            wait_ns = min(wait_ns, self.deadline - time.monotonic_ns())
        if wait_ns > 0:
            poller = select.poll()
            poller.register(self.sock.fileno(), events)
            try:
                poller.poll(wait_ns / 1e6)
            except OSError as exc:
                raise CoreError("poll", exc.errno or errno.EIO) from None


def _deadline_ns(deadline: float | None) -> int | None:
    if deadline is None or not deadline < 9.0e9:
        return None
    return int(deadline * _NS)


@contextlib.contextmanager
def _borrowed(fd: int, call: str) -> Iterator[socket.socket]:
    """A socket object on the caller's fd, detached (never closed) afterwards."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise CoreError(call, exc.errno or errno.EBADF) from None
    try:
        yield sock
    finally:
        sock.detach()


def _timeval_format() -> str:
    """``struct timeval`` as this C library lays it out: two fields the size of its time_t
    (a 32-bit CPU with a 64-bit time_t, as musl 1.2 and Debian's armhf since trixie have,
    makes suseconds_t 64-bit too). CPython refuses a time past 2038 where time_t has 32
    bits, and that is how its size is told; the length getsockopt returns cannot tell it:
    qemu-user answers musl's 64-bit timeout option with 4 bytes."""
    try:
        time.gmtime(2**31)
    except (OverflowError, OSError, ValueError):
        return "=2i"
    return "=2q"


_TIMEVAL = _timeval_format()


@contextlib.contextmanager
def _loop_socket(fd: int, send: bool) -> Iterator[socket.socket]:
    """The fd as a socket with a one-tick send/receive timeout, restored afterwards."""
    opt, name = ((socket.SO_SNDTIMEO, "SO_SNDTIMEO") if send
                 else (socket.SO_RCVTIMEO, "SO_RCVTIMEO"))
    size = struct.calcsize(_TIMEVAL)
    with _borrowed(fd, f"getsockopt({name})") as sock:
        try:
            saved = sock.getsockopt(socket.SOL_SOCKET, opt, size)
        except OSError as exc:
            raise CoreError(f"getsockopt({name})", exc.errno or errno.EIO) from None
        # a short answer (qemu-user's) is restored as the C core restores it: what was
        # read, the rest zero
        saved = saved.ljust(size, b"\0")
        tick = struct.pack(_TIMEVAL, 0, _TICK_NS // 1000)
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, tick)
        except OSError as exc:
            raise CoreError(f"setsockopt({name})", exc.errno or errno.EIO) from None
        try:
            yield sock
        finally:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, opt, saved)


def _soft(exc: OSError, loop: _Loop, events: int, udp: bool) -> bool:
    """True for errors the loop retries after (EAGAIN waits first); EINTR Python retries."""
    if isinstance(exc, BlockingIOError):
        loop.wait(events)
        return True
    return udp and exc.errno in _UDP_SOFT


def _paced_chunk(args: LoopArgs) -> int:
    """Paced writes carry ~1 ms of data, so the schedule bounds how far a write runs ahead."""
    if args.rate_bps is None:
        return args.length
    return min(args.length, max(_PACED_MIN_CHUNK, int(args.rate_bps / 8 / 1000)))


def _tcp_send_loop(loop: _Loop, write: Callable[[int], int], call: str, args: LoopArgs) -> int:
    c = loop.counters
    limit = args.max_bytes if args.max_bytes is not None else 1 << 64
    chunk, total = _paced_chunk(args), 0
    while not loop.done() and total < limit:
        if loop.pacer.ns_per_unit and not loop.pacer.allowed(total, loop.now):
            loop.sleep_until_due(total)
            continue
        c._calls += 1
        try:
            n = write(min(chunk, limit - total))
        except OSError as exc:
            if _soft(exc, loop, select.POLLOUT, udp=False):
                continue
            raise CoreError(call, exc.errno or errno.EIO) from None
        total += n
        c._bytes += n
    return total


@contextlib.contextmanager
def _pattern_file(data: bytes) -> Iterator[int]:
    """A file holding one buffer of the pattern, for sendfile(): memfd, else a temp file."""
    try:
        fd = os.memfd_create("netprobe", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        fd, path = tempfile.mkstemp(prefix="netprobe-")
        os.unlink(path)
    try:
        try:
            os.pwrite(fd, data, 0)
        except OSError as exc:
            raise CoreError("write", exc.errno or errno.EIO) from None
        yield fd
    finally:
        os.close(fd)


def _data_buffer(length: int, fill: bytes = b"") -> memoryview:
    """A buffer the kernel copies payload into or out of, starting on a page boundary (an
    anonymous mapping; a bytearray this large starts 16 bytes into glibc's): the receive
    copy runs up to 3x slower a few bytes off a page boundary (np_alloc_data in
    np_common.h says why). ``fill``, if given, is copied to its start."""
    view = memoryview(mmap.mmap(-1, max(1, length)))[:length]
    view[:len(fill)] = fill
    return view


def tcp_send(fd: int, counters: BaseCounters, args: LoopArgs) -> int:
    c = _counters(counters)
    with _loop_socket(fd, send=True) as sock:
        loop = _Loop(sock, c, args, (args.rate_bps or 0.0) / 8)
        data = pattern(args.length)
        if not args.zerocopy:
            view = _data_buffer(args.length, data)
            return _tcp_send_loop(
                loop, lambda n: sock.send(view[:n], socket.MSG_NOSIGNAL), "send", args)
        with _pattern_file(data) as src:
            return _tcp_send_loop(loop, lambda n: os.sendfile(fd, src, 0, n), "sendfile", args)


_RCV_LAG_S = 0.010  # NP_RCV_LAG_NS in np_tcp.c


def _queued(sock: socket.socket) -> int:
    """Bytes in the socket's receive queue (FIONREAD), 0 where that cannot be read."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]
    except (OSError, struct.error):
        return 0


class _WakeThreshold:
    """Wake the receive loop once min(max(length, wake_bytes), SO_RCVBUF / 4, what the flow
    brings in 10 ms) bytes are in (SO_RCVLOWAT), left at the caller's value until the
    flow's rate is known (timed from the first receive past the bytes queued when the loop
    began, judged 10 ms later) and then set again once a tick as the buffer and the rate
    change: the same rule and reasons as fewer_wakeups() and follow_flow() in np_tcp.c.
    Best effort throughout: it changes when the loop wakes, never what it counts."""

    def __init__(self, sock: socket.socket, length: int, wake_bytes: int | None) -> None:
        self.sock = sock
        self.wanted = max(length, wake_bytes or WAKE_BYTES)
        self.backlog = _queued(sock)
        self.saved = self.lowat = self.first_total = 0
        self.first = self.next_check = 0.0
        self.usable = False
        try:
            self.saved = self.lowat = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)
            self.usable = True
        except (OSError, AttributeError):
            pass

    def _threshold(self, bytes_per_s: float) -> int:
        lowat = min(self.wanted, self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4,
                    int(bytes_per_s * _RCV_LAG_S))
        return max(1, lowat)

    def follow(self, total: int) -> None:
        """After a receive, with the bytes received so far: the rate's clock starts at the
        first past the bytes queued when the loop began; then once a tick, the threshold
        from the buffer and the rate now."""
        if not self.usable or not (self.first or total > self.backlog):
            return
        now = time.monotonic()
        if not self.first:
            self.first, self.first_total = now, total
            self.next_check = now + _RCV_LAG_S
            return
        if now < self.next_check:
            return
        self.next_check = now + _TICK_NS / 1e9
        with contextlib.suppress(OSError):  # a failure keeps the threshold it has
            lowat = self._threshold((total - self.first_total) / (now - self.first))
            if lowat != self.lowat:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
                self.lowat = lowat

    def restore(self) -> None:
        """Put the caller's SO_RCVLOWAT back."""
        if self.usable and self.lowat != self.saved:
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, self.saved)


def tcp_recv(fd: int, counters: BaseCounters, args: LoopArgs) -> int:
    c = _counters(counters)
    limit = args.max_bytes if args.max_bytes is not None else 1 << 64
    buf = _data_buffer(args.length)
    flags = socket.MSG_TRUNC if args.skip_copy else 0
    total = 0
    with _loop_socket(fd, send=False) as sock:
        wake = _WakeThreshold(sock, args.length, args.wake_bytes)
        try:
            loop = _Loop(sock, c, args, 0.0)
            while not loop.done() and total < limit:
                c._calls += 1
                try:
                    ask = min(args.length, limit - total)
                    n = sock.recv_into(buf, ask, flags)
                except OSError as exc:
                    if _soft(exc, loop, select.POLLIN, udp=False):
                        continue
                    raise CoreError("recv", exc.errno or errno.EIO) from None
                if n == 0:
                    break  # peer closed or shut down its write side
                total += n
                c._bytes += n
                wake.follow(total)
        finally:
            wake.restore()
    return total


def udp_send(fd: int, counters: BaseCounters, args: LoopArgs) -> int:
    c = _counters(counters)
    limit = min(args.max_packets if args.max_packets is not None else 1 << 64,
                (args.max_bytes if args.max_bytes is not None else 1 << 64) // args.length)
    buf = bytearray(pattern(args.length))
    seq0, sent = c._packets, 0
    with _loop_socket(fd, send=True) as sock:
        loop = _Loop(sock, c, args, args.packets_per_s)
        while not loop.done() and sent < limit:
            if loop.pacer.ns_per_unit and not loop.pacer.allowed(sent, loop.now):
                loop.sleep_until_due(sent)
                continue
            _HEADER.pack_into(buf, 0, (c._rx.base + seq0 + sent) & SEQUENCE_MASK,
                              loop.now if loop.timed else time.monotonic_ns())
            c._calls += 1
            try:
                sock.send(buf)
            except OSError as exc:
                if _soft(exc, loop, select.POLLOUT, udp=True):
                    continue
                raise CoreError("send", exc.errno or errno.EIO) from None
            sent += 1
            c._packets += 1
            c._messages += 1  # one datagram a send: this path never asks for GSO
            c._bytes += args.length
    return sent * args.length


def _clear_window(window: bytearray, start: int, stop: int) -> None:
    """Forget the marks of sequence numbers start..stop-1 (their slots a window ago)."""
    if stop - start >= _WINDOW:
        window[:] = bytes(_WINDOW)
        return
    a, b = start % _WINDOW, stop % _WINDOW
    if a <= b:
        window[a:b] = bytes(b - a)
    else:
        window[a:] = bytes(_WINDOW - a)
        window[:b] = bytes(b)


def _account(c: Counters, data: memoryview, n: int, arrival_ns: int) -> None:
    """Count one received datagram: sequence accounting, then RFC 3550 jitter."""
    rx = c._rx
    if n >= UDP_HEADER_BYTES:
        seq, sent_ns = _HEADER.unpack_from(data)
        seq = (seq - rx.base) & SEQUENCE_MASK
        if seq >= rx.next_seq + _AHEAD:  # not the sender's: see np_udp.c
            rx.foreign += 1
            return
    c._packets += 1
    c._bytes += n
    if n < UDP_HEADER_BYTES:
        return  # too short to carry a sequence number: counted, nothing more
    slot = seq % _WINDOW
    if seq >= rx.next_seq:
        _clear_window(rx.window, rx.next_seq, seq)
        rx.next_seq = seq + 1
    elif rx.next_seq - seq <= _WINDOW:
        if rx.window[slot]:
            c._duplicates += 1
            return
        c._out_of_order += 1
    else:  # beyond the window: cannot be told from a duplicate, counted as late
        c._out_of_order += 1
    if rx.next_seq - seq <= _WINDOW:
        rx.window[slot] = 1
    rx.unique += 1
    c._lost = max(0, rx.next_seq - rx.unique)
    transit = arrival_ns - sent_ns
    if rx.have_transit:
        rx.jitter_ns += (abs(transit - rx.last_transit) - rx.jitter_ns) / 16.0
        c._jitter_ms = rx.jitter_ns / 1e6
    rx.last_transit = transit
    rx.have_transit = True


def _gro_on(sock: socket.socket, wanted: bool) -> bool:
    """Whether the socket coalesces datagrams: turned on when wanted, else as it was."""
    if wanted:
        with contextlib.suppress(OSError):
            sock.setsockopt(_SOL_UDP, _UDP_GRO, 1)
            return True
    try:
        return bool(sock.getsockopt(_SOL_UDP, _UDP_GRO))
    except OSError:
        return False  # a kernel before 5.0: one datagram per message


def _gso_size(ancdata: list[tuple[int, int, bytes]]) -> int:
    """The segment size the UDP_GRO cmsg gives, or 0 (a message of one datagram)."""
    for level, kind, data in ancdata:
        if level == _SOL_UDP and kind == _UDP_GRO and len(data) >= 4:
            return max(0, int.from_bytes(data[:4], sys.byteorder, signed=True))
    return 0


def _account_message(c: Counters, buf: memoryview, n: int, seg: int, arrival_ns: int) -> int:
    """Count each datagram of one message (segments of ``seg`` bytes, the last maybe
    shorter; those past the buffer are unreadable and not counted); returns how many."""
    if seg == 0 or seg >= n:
        _account(c, buf, n, arrival_ns)
        return 1
    walked, size = 0, len(buf)
    for off in range(0, n, seg):
        part = min(seg, n - off)
        if off + part > size:
            break
        _account(c, buf[off:], part, arrival_ns)
        walked += 1
    return walked


def _recv_message(sock: socket.socket, buf: memoryview, gro: bool) -> tuple[int, int]:
    """One message into buf: (its true length, the GRO segment size or 0)."""
    if not gro:
        return sock.recv_into(buf, len(buf), socket.MSG_TRUNC), 0
    n, ancdata, _flags, _addr = sock.recvmsg_into([buf], _GRO_CMSG, socket.MSG_TRUNC)
    return n, _gso_size(ancdata)


def udp_recv(fd: int, counters: BaseCounters, args: LoopArgs) -> int:
    c = _counters(counters)
    limit = args.max_packets if args.max_packets is not None else 1 << 64
    got, base = 0, c._bytes
    with _loop_socket(fd, send=False) as sock:
        gro = _gro_on(sock, args.udp_gro)
        buf = _data_buffer(max(args.length, _GRO_SLOT) if gro else args.length)
        loop = _Loop(sock, c, args, 0.0)
        while not loop.done() and got < limit:
            c._calls += 1
            try:
                n, seg = _recv_message(sock, buf, gro)
            except OSError as exc:
                if _soft(exc, loop, select.POLLIN, udp=True):
                    continue
                raise CoreError("recv", exc.errno or errno.EIO) from None
            got += _account_message(c, buf, n, seg, time.monotonic_ns())
            c._messages += 1
    return c._bytes - base


# struct tcp_info (include/uapi/linux/tcp.h): field -> (offset, struct format).
_TCPI = {
    "snd_mss": (16, "I"), "pmtu": (60, "I"), "rtt": (68, "I"), "rttvar": (72, "I"),
    "snd_cwnd": (80, "I"), "total_retrans": (100, "I"), "bytes_acked": (120, "Q"),
    "min_rtt": (148, "I"), "delivery_rate": (160, "Q"), "bytes_retrans": (208, "Q"),
}
_TCP_INFO = 11  # same value on every Linux architecture
_NO_MIN_RTT = 0xFFFFFFFF


def _tcpi(raw: bytes, name: str) -> int | None:
    """A field of the kernel's struct, or None where the returned length stops short."""
    offset, fmt = _TCPI[name]
    if len(raw) < offset + struct.calcsize(fmt):
        return None
    return int(struct.unpack_from("=" + fmt, raw, offset)[0])


def tcp_info(fd: int) -> TcpInfo:
    with _borrowed(fd, "getsockopt(TCP_INFO)") as sock:
        try:
            raw = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 256)
        except OSError as exc:
            raise CoreError("getsockopt(TCP_INFO)", exc.errno or errno.EIO) from None
    return tcp_info_from(raw)


def tcp_info_from(raw: bytes) -> TcpInfo:
    """The figures of a TCP_INFO answer: a field its length (an old kernel's is shorter)
    does not reach is None."""
    cwnd, mss, rate = _tcpi(raw, "snd_cwnd"), _tcpi(raw, "snd_mss"), _tcpi(raw, "delivery_rate")
    min_rtt = _tcpi(raw, "min_rtt")
    return TcpInfo(
        retransmits=_tcpi(raw, "total_retrans"), rtt_us=_tcpi(raw, "rtt"),
        rttvar_us=_tcpi(raw, "rttvar"),
        min_rtt_us=None if min_rtt == _NO_MIN_RTT else min_rtt,
        snd_cwnd_bytes=None if cwnd is None or mss is None else cwnd * mss,
        snd_mss_bytes=mss, pmtu_bytes=_tcpi(raw, "pmtu"),
        delivery_rate_bps=None if rate is None else rate * 8,
        bytes_acked=_tcpi(raw, "bytes_acked"), bytes_retrans=_tcpi(raw, "bytes_retrans"))


def rusage(thread: bool) -> Rusage:
    who = resource.RUSAGE_THREAD if thread else resource.RUSAGE_SELF
    try:
        ru = resource.getrusage(who)
    except OSError as exc:
        raise CoreError("getrusage", exc.errno or errno.EIO) from None
    return Rusage(user_s=ru.ru_utime, system_s=ru.ru_stime)


def host_cpu() -> HostCpu:
    try:
        fd = os.open("/proc/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise CoreError("open(/proc/stat)", exc.errno or errno.EIO) from None
    try:
        head = os.read(fd, 511)
    except OSError as exc:
        raise CoreError("read(/proc/stat)", exc.errno or errno.EIO) from None
    finally:
        os.close(fd)
    fields = head.split(b"\n", 1)[0].split()
    if len(fields) < 5 or fields[0] != b"cpu":
        raise CoreError("read(/proc/stat)", errno.EIO)
    ticks = [int(f) for f in fields[1:9]] + [0] * (9 - len(fields))
    return HostCpu(*ticks)


def limit_allocator_arenas(count: int) -> bool:
    return False  # the allocator is out of reach without the C core (or ctypes)


def trim_allocator() -> bool:
    return False


def allocator_arenas() -> int | None:
    return None


def monotonic() -> float:
    return time.monotonic()
