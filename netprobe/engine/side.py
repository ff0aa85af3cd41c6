"""One side of a native test: its streams' loops (one thread each, in the C core with the
GIL released), the interval sampler, and the side's final report.

Client and server both use :class:`Side`; it knows nothing of the control protocol.
Kernel counters (bytes moved, TCP retransmits) are running totals; every interval value
is the difference of two snapshots, and the summary is the difference between the end
and the warm-up boundary (``omit_s``).

The warm-up boundary is one byte for both ends of a TCP stream, not one clock reading
each: at its own boundary the sender counts the bytes it has written (B) and tells the
peer (:meth:`Side.peer_boundary`). Both ends' summaries are of the bytes after B, each
from the last instant it saw no more than B through (the receiver: arrived; the sender:
acknowledged) to the instant the last byte was (EOF; every byte acknowledged). Why: at
the sender's boundary its socket still holds up to megabytes written but not yet
delivered (0.8-2.2 MB at 100 Mbit/s in the lab); each end cutting at its own clock put
them in the sender's warm-up and after the receiver's, so the two summaries described
different bytes, and the sender's window, ending at its last write's return with its
socket full, read above the wire. Every byte after B came through after the start
instant (late by at most one poll, :data:`BOUNDARY_POLL_S`), so neither figure is above
what the path carried over its window. UDP keeps each end's own clock boundary: a
datagram is not held in the sender's socket.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import gc
import math
import os
import socket
import threading
import time
from typing import Callable

import attrs

from netprobe import core
from netprobe.core.records import (
    UDP_HEADER_BYTES,
    UDP_MAX_PAYLOAD,
    UDP_SEND_CALL_BYTES,
    WAKE_BYTES,
)
from netprobe.engine import features, kernel, lengthprobe, summary
from netprobe.engine.sockets import (
    datagram_waiting,
    socket_drops,
    socket_info,
    unread_bytes,
    unsent_bytes,
)
from netprobe.errors import CoreError
from netprobe.schema import Cpu, Interval, SideSummary, SocketInfo, TestSpec
from netprobe.starvation import WATCH_EVERY_S, Starvation, run_wait_s, task_cpu

# Why TCP moves 256 KiB or 1 MiB per call, measured at the start of a test: see
# netprobe/engine/lengthprobe.py. The kernel's window, not the write size, decides
# throughput on a real path; paced writes are cut to ~1 ms of data in the loops.
GSO_MAX_BYTES = 64 * 1024
TCP_DEFAULT_LENGTH = lengthprobe.SMALL_BYTES
UDP_DEFAULT_LENGTH = 1448  # fits one datagram in a 1500-byte MTU over IPv4 and IPv6
RECEIVER_GRACE_S = 10.0  # how long a receiver outlives the sender's deadline at most
UDP_RECV_LENGTH = UDP_MAX_PAYLOAD  # a UDP receiver reads into slots any datagram fits
UDP_BATCH = 32  # messages per recvmmsg/sendmmsg (the core's default batch)
NICE_STEP_WEIGHT = 1.25  # the scheduler's weight ratio between two adjacent nice values
MAX_NICE = 19
# The receiver reads coalesced datagrams (UDP_GRO, see np_udp.c for why). NETPROBE_UDP_GRO=0
# takes the path of a kernel without it, one datagram per slot: the before and after of the
# same run in bench/engine.py (native-nogro).
UDP_GRO = os.environ.get("NETPROBE_UDP_GRO", "1") != "0"
# Below this datagram length a UDP sender sends one datagram a call unless told (--gso).
# Why: a GSO message is cut into datagrams only where it leaves the host on a device that
# cannot carry it whole. Over veth (namespaces, containers, Kubernetes, OVS) it crosses
# every hop, a router's forwarding too, as one packet, and the receiver's UDP_GRO reads it
# whole: at 64 bytes 128 datagrams a packet, and a run counted 19.5 M datagrams a second
# where the receiving namespace's kernel counted 1/128 of them. Small datagrams are sent
# to measure a path's packet rate, which only one datagram a packet exercises; from this
# length on the bit rate is the figure, and GSO spares the sender's CPU for it (a warning
# still says when the datagrams never travelled apart).
GSO_MIN_LENGTH = 512
BOUNDARY_POLL_S = 0.001
"""How often a TCP receiver's arrived bytes are read around the warm-up's end, until the
sender's boundary byte has arrived (for up to 8 streams; slower in proportion above)."""
BOUNDARY_LEAD_S = 0.05
"""How long before its own warm-up end a receiver starts that watch: the peer's clock
starts one control message later or earlier than this side's."""
SENDER_DRAIN_S = 5.0
"""How long a TCP sender waits, once its last write returned, for its peer to acknowledge
what its socket still holds: the end of its data (see :meth:`Side._data_end`)."""
BOUNDARY_POLLS_KEPT = 8192
"""Polls kept per stream (the oldest go first): 8 s of them at the fastest."""
LATE_TICK_SHARE = 0.01
"""How late (a share of the step) the sampler may read a step's figures and still label
them with the step's boundary: later than that (a CPU-starved sampler, a slow reporter),
the interval ends when they were read, so its rate is its bytes over the time they took."""
CPUS_NOTED_PER_TICK = 16
"""The most data threads whose CPU one sample notes (in turn): reading /proc for each of
128 threads every tick took the sampler a third of its time at -P 128 -i 0.1."""


def udp_gso(spec: TestSpec, length: int) -> bool:
    """Whether a UDP sender of ``length``-byte datagrams sends them many a message (GSO):
    as the spec says, or by default from :data:`GSO_MIN_LENGTH` bytes up."""
    if spec.udp_gso is not None:
        return spec.udp_gso
    return length >= GSO_MIN_LENGTH


def default_length(spec: TestSpec) -> int:
    """Buffer length used when the spec leaves it open."""
    if spec.length_bytes:
        return spec.length_bytes
    return UDP_DEFAULT_LENGTH if spec.protocol == "udp" else TCP_DEFAULT_LENGTH


def udp_datagrams(total: int, length: int) -> tuple[int, tuple[int, ...]]:
    """A UDP byte count as ``(n, tail)``: ``n`` datagrams of ``length`` bytes, then the
    ``tail`` datagrams' sizes, so that exactly ``total`` bytes go out. A remainder too
    short to carry the datagram header is folded into the last full datagram (split in
    two when that would not fit one datagram)."""
    full, rest = divmod(total, length)
    if rest == 0:
        return full, ()
    if rest >= UDP_HEADER_BYTES or full == 0:
        return full, (rest,)
    merged = length + rest
    if merged <= UDP_MAX_PAYLOAD:
        return full - 1, (merged,)
    return full - 1, (merged // 2, merged - merged // 2)


def wake_bytes(receivers: int) -> int:
    """What each of a side's ``receivers`` TCP receive loops lets queue before it is woken:
    :data:`~netprobe.core.records.WAKE_BYTES` shared between them.

    Why shared: fewer wake-ups spare the sender's thread (on loopback and virtual NICs it
    pays for waking the reader), but what waits in a queue is read later, from further out
    in the cache, and the waiting bytes add up over the side's streams: shared, the side's
    streams together wait for about 1 MiB, not 1 MiB each. No loop waits for less than its
    own read length (np_tcp.c says more). The measurements behind both halves are in
    docs/performance.md, *Not per call, and shared between the streams*.
    """
    return max(1, WAKE_BYTES // max(1, receivers))


def data_nice(streams: int, cpus: int) -> int:
    """How many nice levels below the process a side's stream loops run: 0 up to one
    stream per CPU, then enough that all of them weigh about as much as ``cpus`` ordinary
    threads.

    Why: the sampler, the control reader and the conductor are Python threads that need a
    few ms of CPU every interval. The scheduler shares a busy CPU by weight, so beside 64
    stream loops (128 over loopback, both ends) at the same weight each got about 1/130 of
    it and fell seconds behind at ``-i 0.1``: steps not taken were lost into one tail and
    samples arrived after the result. Each nice level is a weight ratio of 1.25, so at
    log1.25(streams / cpus) levels the loops together still claim every CPU (a weight
    only matters when something else wants the CPU) while a control thread weighs as much
    as a CPU's worth of them. Nothing changes for tests with no more streams than CPUs.
    """
    if cpus < 1 or streams <= cpus:
        return 0
    return min(MAX_NICE, round(math.log(streams / cpus) / math.log(NICE_STEP_WEIGHT)))


def _cpus() -> int:
    # The CPUs this process may run on (a container or taskset may allow fewer than exist).
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _lower_thread_priority(levels: int) -> None:
    """Make the calling thread ``levels`` nicer (Linux: a thread's own nice value); an
    unprivileged process may always lower its own priority."""
    if levels <= 0:
        return
    with contextlib.suppress(AttributeError, OSError):
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(MAX_NICE, current + levels))


def buffer_bytes(spec: TestSpec, role: str) -> int:
    """Memory one stream's loop allocates for its buffers (what a server must budget)."""
    if spec.protocol == "udp":
        # A receiver's slots; a sender's datagrams of one call, back to back, bounded by the
        # core's 256 KiB a call (one datagram is at most 64 KiB).
        return UDP_RECV_LENGTH * UDP_BATCH if role == "receiver" else UDP_SEND_CALL_BYTES
    return lengthprobe.largest(spec)  # one buffer


@attrs.define(eq=False)
class LocalStream:
    """One stream as seen from this side: its socket, counters and sampling state."""

    stream_id: int
    direction: str
    role: str
    sock: socket.socket
    counters: core.Counters = attrs.field(factory=lambda: core.Counters())
    error: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    peer_done_at: float | None = None
    last_arrival_at: float | None = None  # UDP receiver: when its last datagram came
    drops_base: int | None = None  # UDP receiver: its socket's own drops at the start
    drops_end: int | None = None  # ... and when its loop returned
    peer_sent_packets: int | None = None  # UDP receiver: what the peer says it sent
    boundary_bytes: int | None = None
    """TCP: the sender's bytes at its warm-up end (B): its own base, or the peer's word."""
    through: collections.deque = attrs.field(
        factory=lambda: collections.deque(maxlen=BOUNDARY_POLLS_KEPT))
    """TCP: (monotonic time, bytes through) polls around the warm-up's end: a receiver's
    bytes arrived, a sender's bytes acknowledged (see :meth:`through_bytes`)."""
    call_length_bytes: int | None = None  # TCP: the length its loop's calls kept
    wrote_until: float | None = None  # TCP sender: when its last write returned
    ack_base: int | None = None  # ... what its peer acknowledged before the data
    drained_at: float | None = None  # ... and when its peer had acknowledged every byte
    user_s: float = 0.0
    system_s: float = 0.0
    waited_s: float | None = None  # waiting on a run queue while its loop ran
    ran_on: set[int] = attrs.field(factory=set)  # the CPUs its loop was seen on
    arrived_max: int = 0  # TCP receiver: the highest of arrived_floor's answers
    last: summary.Snapshot = attrs.field(factory=summary.Snapshot)
    base: summary.Snapshot = attrs.field(factory=summary.Snapshot)
    rtt_samples: list = attrs.field(factory=list)
    max_cwnd_bytes: int | None = None
    socket_info: SocketInfo = attrs.field(factory=SocketInfo)
    unavailable: list[str] = attrs.field(factory=list)  # kernel features refused, and cost
    gso_usable: bool = True  # UDP sender: the kernel confirmed UDP_SEGMENT
    thread: threading.Thread | None = None
    # Read once: socket.type builds an enum at every read, and the sampler asks each tick.
    is_tcp: bool = attrs.field(init=False, default=attrs.Factory(
        lambda self: self.sock.type == socket.SOCK_STREAM, takes_self=True))
    """True for a TCP stream."""

    def snapshot(self) -> summary.Snapshot:
        """Current running totals of this stream (a TCP receiver's bytes: those that
        arrived, read or not, never more: see :meth:`arrived_floor`)."""
        c = self.counters
        tcp_receiver = self.is_tcp and self.role == "receiver"
        snap = summary.Snapshot(
            bytes=self.arrived_floor() if tcp_receiver else c.bytes,
            packets=c.packets,
            messages=c.messages,
            lost=c.lost + self.unseen_tail(),
            out_of_order=c.out_of_order,
            duplicates=c.duplicates,
            jitter_ms=c.jitter_ms,
        )
        if self.is_tcp and self.role == "sender":
            snap = summary.with_tcp_info(snap, self._tcp_info())
        return snap

    def arrived_bytes(self) -> int:
        """TCP receiver: the bytes that reached the socket so far, read or still waiting,
        never fewer (a read racing the count makes it late by that read, never early).

        A receive loop reads once ~1 MiB waits (see :func:`wake_bytes`). What waited unread
        at the warm-up's end came in the warm-up: counted after it, it made the receiver's
        summary read above the wire (up to 60 KB a boundary at 100 Mbit/s, +0.2%). Late is
        the side a boundary wants: what came before it is never counted after it."""
        return self._arrived()[1]

    def arrived_floor(self) -> int:
        """TCP receiver: the bytes that reached the socket so far, never more, and never
        below an earlier call's answer: what its intervals are cut from.

        An interval cut from a late count gave its surplus back to the next only if that
        one carried as much; the last ones of a test seldom do, and the intervals then
        summed above the summary (212 bytes, once, under emulation, where the race is
        likeliest). Counts that never run ahead and never go back sum to the final one."""
        self.arrived_max = max(self.arrived_max, self._arrived()[0])
        return self.arrived_max

    def _arrived(self) -> tuple[int, int]:
        """(never more, never fewer) than the bytes arrived while it looked.

        The loop's count is read on both sides of the queue's length, a few times until no
        read came between them. The loop adds a read to its count after the read took the
        bytes off the queue, so the count before the queue's length plus that length is at
        most what had arrived; the count after it may hold a read the length no longer
        does."""
        before = self.counters.bytes
        for _ in range(4):
            waiting = unread_bytes(self.sock)
            after = self.counters.bytes
            low, high = before + waiting, after + waiting
            if after == before:
                break
            before = after
        return low, high

    def through_bytes(self) -> int | None:
        """TCP: the bytes through this end: a receiver's arrived, a sender's data bytes its
        peer acknowledged (the kernel's count, less what the connection carried before
        the data: see :meth:`note_ack_base`); None where the kernel does not say.

        Not the bytes written less the socket's queue: a write call under way has put
        bytes in the queue that its count does not hold yet (up to a call's length, 1 MiB),
        and the acknowledged figure came out that much too low."""
        if self.role == "receiver":
            return self.arrived_bytes()
        info = self._tcp_info()
        if info is None or info.bytes_acked is None or self.ack_base is None:
            return None
        return info.bytes_acked - self.ack_base

    def note_ack_base(self) -> None:
        """TCP sender, before its first write: what the connection has carried so far
        (its SYN, a data hello), acknowledged or queued: the base of :meth:`through_bytes`."""
        info, queued = self._tcp_info(), unsent_bytes(self.sock)
        if info is not None and info.bytes_acked is not None and queued is not None:
            self.ack_base = info.bytes_acked + queued

    def unseen_tail(self) -> int:
        """UDP receiver: the datagrams numbered above the highest that came, lost.

        A gap in the sequence numbers shows only below the highest one seen, so the last
        datagrams of a test, dropped, leave none. They are counted once the loop has
        returned (nothing more can come) by the sender's own count, from its ``sent``.
        0 for every other stream (only a UDP receiver gets the peer's count)."""
        if self.ended_at is None or self.peer_sent_packets is None:
            return 0
        c = self.counters
        seen = c.lost + c.packets - c.duplicates  # the highest sequence number seen + 1
        return max(0, self.peer_sent_packets - seen)

    def _tcp_info(self) -> core.TcpInfo | None:
        try:
            return core.tcp_info(self.sock.fileno())
        except (OSError, ValueError):
            return None


_heap_frozen = threading.Event()


def _late(stream: LocalStream, snap: summary.Snapshot) -> summary.Snapshot:
    """``snap`` as the base of a summary: a TCP receiver's bytes read late, never early
    (:meth:`LocalStream.arrived_bytes`), so that nothing of the warm-up is counted after."""
    if not (stream.is_tcp and stream.role == "receiver"):
        return snap
    return attrs.evolve(snap, bytes=max(snap.bytes, stream.arrived_bytes()))


def _freeze_start_up_heap() -> None:
    """Move the heap as it is at the first test out of the collector's sight, once.

    The start-up heap (imports, the parser, the registry) is tens of thousands of objects: a
    full collection of it in the middle of a test is CPU stolen from the data threads'
    process. Once per process only: frozen objects are never collected, so freezing at every
    test made a long-running server keep every finished test's reference cycles (its
    Session, Side, Reader and their threads: about 40 KiB a test) for ever.
    """
    if not _heap_frozen.is_set():
        _heap_frozen.set()
        gc.freeze()


class Side:
    """Runs this side's streams for one test and samples them at every interval."""

    def __init__(
        self, spec: TestSpec, streams: list[LocalStream], on_interval: Callable[[Interval], None]
    ) -> None:
        self.spec = spec
        self.streams = streams
        self.on_interval = on_interval
        self.t0 = 0.0
        self.ended_at: float | None = None
        self._done = threading.Event()
        self._sampler: threading.Thread | None = None
        self._cpu_start: tuple[core.Rusage, core.HostCpu] | None = None
        self._cpu_end: tuple[core.Rusage, core.HostCpu] | None = None
        self._sampler_user_s = 0.0
        self._sampler_system_s = 0.0
        self._starvation: Starvation | None = None
        self._cpus_noted = 0.0
        self._cpus_turn = 0
        self._rcvbuf_base: int | None = None
        self._lock = threading.Lock()
        self._nice = 0
        self._wake_bytes = WAKE_BYTES
        self._probes: dict[str, lengthprobe.Schedule] = {}
        self.reporter_errors: list[str] = []
        self.on_change: Callable[[], None] | None = None
        """Called (from a stream thread) whenever a loop returns, to wake whoever waits."""
        self.shared_boundary = False
        """Whether the peer sends and takes the TCP senders' counts at the warm-up's end."""
        self.on_boundary: Callable[[dict[tuple[int, str], int]], None] | None = None
        """Called (from the sampler) with this side's TCP senders' bytes at the warm-up's end."""

    # -- running ----------------------------------------------------------------------

    def start(self) -> None:
        """Start every stream loop and the sampler, now."""
        _freeze_start_up_heap()
        self.t0 = core.monotonic()
        receivers = self.udp_receivers()
        for stream in receivers:
            stream.drops_base = socket_drops(stream.sock)
        if len(receivers) == 1 and receivers[0].drops_base is None:
            # The host's count stands in only for a lone receiver whose own cannot be read.
            self._rcvbuf_base = kernel.udp_receive_buffer_errors()
        self._cpu_start = (core.rusage("process"), core.host_cpu())
        self._starvation = Starvation.begin()
        self._nice = data_nice(len(self.streams), _cpus())
        self._wake_bytes = wake_bytes(sum(s.role == "receiver" and s.is_tcp for s in self.streams))
        for stream in self.streams:
            stream.socket_info = socket_info(stream.sock)
        # The sampler first: started after 128 loops, it read its first 0.1 s step 0.4 s
        # late. It reads counters that exist before their loops do.
        self._sampler = threading.Thread(target=self._sample_loop, name="np-sampler", daemon=True)
        self._sampler.start()
        for stream in self.streams:
            self._note_features(stream)
            stream.thread = threading.Thread(
                target=self._run_stream,
                args=(stream,),
                name=f"np-stream-{stream.stream_id}",
                daemon=True,
            )
            stream.thread.start()
            if stream.role == "receiver" and not stream.is_tcp:
                watch_from = self.t0 + max(0.0, (self.spec.planned_s() or 0.0) - 0.1)
                threading.Thread(target=_watch_arrivals, args=(stream, watch_from),
                                 name=f"np-arrivals-{stream.stream_id}", daemon=True).start()
        # A sender's boundary is its own; a receiver's only where the peer says it.
        watched = [s for s in self.streams if s.is_tcp and
                   (s.role == "sender" or self.shared_boundary)]
        if self.spec.omit_s > 0 and watched:
            threading.Thread(target=self._watch_boundary, args=(watched,),
                             name="np-boundary", daemon=True).start()
        if not self.streams:
            self._done.set()

    def _note_features(self, stream: LocalStream) -> None:
        """Confirm the optional kernel features the stream's loop would use (see
        netprobe.engine.features); note each refused one."""
        udp_sender = not stream.is_tcp and stream.role == "sender"
        wants_gso = udp_sender and core.DATA_PATH == "c" \
            and udp_gso(self.spec, default_length(self.spec))
        if udp_sender:
            stream.gso_usable = features.gso_usable(stream.sock)
        stream.unavailable = features.unavailable(stream.sock, stream.role, gso=wants_gso,
                                                  gro=UDP_GRO)

    def _run_stream(self, stream: LocalStream) -> None:
        _lower_thread_priority(self._nice)
        stream.started_at = core.monotonic()
        before = core.rusage("thread")
        waited = run_wait_s()
        first_cpu = task_cpu()
        try:
            if stream.is_tcp and stream.role == "sender":
                stream.note_ack_base()
            self._loop(stream)
            if stream.is_tcp and stream.role == "receiver":
                _ack_now(stream.sock)
            if stream.is_tcp and stream.role == "sender":
                stream.wrote_until = core.monotonic()
                stream.drained_at = _wait_drained(stream)
        except CoreError as exc:
            if not stream.counters.stopped:
                stream.error = f"stream {stream.stream_id} ({stream.role}): {exc}"
        except (OSError, ValueError) as exc:
            stream.error = f"stream {stream.stream_id} ({stream.role}): {exc}"
        finally:
            after = core.rusage("thread")
            stream.user_s = after.user_s - before.user_s
            stream.system_s = after.system_s - before.system_s
            now_waited = run_wait_s()
            if waited is not None and now_waited is not None:
                stream.waited_s = now_waited - waited
            stream.ran_on.update(c for c in (first_cpu, task_cpu()) if c is not None)
            if stream.drops_base is not None:
                # Read as the loop returns: what arrives once nothing reads is not the
                # test's loss (the peer's last words, stray datagrams).
                stream.drops_end = socket_drops(stream.sock)
            stream.ended_at = core.monotonic()
            self._stream_finished()

    def _loop(self, stream: LocalStream) -> None:
        spec, fd, c = self.spec, stream.sock.fileno(), stream.counters
        length = default_length(spec)
        planned = spec.planned_s()
        deadline = None if planned is None else self.t0 + planned
        if stream.role == "sender":
            rate = spec.rate_bits_per_second
            if stream.is_tcp and lengthprobe.probed(spec):
                stream.call_length_bytes = lengthprobe.run(
                    lambda n, until: core.tcp_send(fd, c, length=n, deadline=until),
                    c, deadline, receiver=False, schedule=self._probe(stream.role))
                _shutdown_write(stream.sock)
            elif stream.is_tcp:
                stream.call_length_bytes = length
                core.tcp_send(
                    fd,
                    c,
                    length=length,
                    deadline=deadline,
                    max_bytes=spec.bytes_total,
                    rate_bps=rate,
                    zerocopy=spec.zerocopy,
                )
                _shutdown_write(stream.sock)
            else:
                self._udp_send(fd, c, length, deadline, rate, stream.gso_usable)
            return
        limit = None if deadline is None else deadline + RECEIVER_GRACE_S
        skip = spec.skip_rx_copy
        wake = self._wake_bytes
        if stream.is_tcp and lengthprobe.probed(spec):
            stream.call_length_bytes = lengthprobe.run(
                lambda n, until: core.tcp_recv(fd, c, length=n, deadline=until, skip_copy=skip,
                                               wake_bytes=wake),
                c, limit, receiver=True, schedule=self._probe(stream.role))
        elif stream.is_tcp:
            stream.call_length_bytes = length
            core.tcp_recv(fd, c, length=length, deadline=limit, skip_copy=skip, wake_bytes=wake)
        else:
            core.udp_recv(fd, c, length=UDP_RECV_LENGTH, deadline=limit, batch=UDP_BATCH,
                          gro=UDP_GRO)

    def _probe(self, role: str) -> lengthprobe.Schedule:
        """The length probe of this side's TCP streams of ``role``: one schedule for all,
        which reads their summed bytes and the process's CPU (see
        :class:`lengthprobe.Schedule`), so that they run one clock and keep one length."""
        with self._lock:
            if role not in self._probes:
                self._probes[role] = self._new_probe(role)
            return self._probes[role]

    def _new_probe(self, role: str) -> lengthprobe.Schedule:
        mine = [s.counters for s in self.streams if s.role == role and s.is_tcp]

        def cpu_s() -> float:
            used = core.rusage("process")
            return used.user_s + used.system_s

        return lengthprobe.Schedule(lambda: sum(c.bytes for c in mine), cpu_s)

    def _udp_send(self, fd: int, c: core.Counters, length: int, deadline: float | None,
                  rate: float | None, gso_usable: bool = True) -> None:
        # The core sends whole datagrams only; a byte count is made exact by a short
        # last datagram (or two), sent by the same counters so sequence numbers go on.
        total = self.spec.bytes_total
        full, tail = udp_datagrams(total, length) if total else (None, ())
        if full != 0:
            core.udp_send(fd, c, length=length, deadline=deadline, max_packets=full,
                          rate_bps=rate, gso=gso_usable and udp_gso(self.spec, length))
        for size in tail:
            if c.stopped:
                return
            core.udp_send(fd, c, length=size, max_packets=1, rate_bps=rate)

    def _stream_finished(self) -> None:
        with self._lock:
            if all(s.ended_at is not None for s in self.streams):
                self.ended_at = core.monotonic()
                self._done.set()
        if self.on_change is not None:
            self.on_change()

    def senders_done(self) -> bool:
        """True once every sending loop of this side has returned."""
        return all(s.ended_at is not None for s in self.streams if s.role == "sender")

    def wait_senders(self, timeout: float) -> bool:
        """Wait until every sending loop has returned."""
        end = core.monotonic() + timeout
        for stream in self.streams:
            if stream.role == "sender" and stream.thread is not None:
                stream.thread.join(max(0.0, end - core.monotonic()))
        return self.senders_done()

    def stop(self, role: str | None = None) -> None:
        """Ask the loops (of one role, or all) to return; they do within ~200 ms."""
        for stream in self.streams:
            if role is None or stream.role == role:
                stream.counters.stop()

    def wait(self, timeout: float) -> bool:
        """Wait for every loop and the sampler to finish."""
        finished = self._done.wait(timeout)
        if finished and self._sampler is not None:
            self._sampler.join(timeout)
        return finished

    @property
    def done(self) -> bool:
        """True once every stream loop has returned."""
        return self._done.is_set()

    # -- sampling ---------------------------------------------------------------------

    def _sample_loop(self) -> None:
        before = core.rusage("thread")
        emit = self.spec.interval_s is not None
        step = self.spec.interval_s or 1.0
        omit = self.spec.omit_s
        prev = 0.0
        k = 1
        while True:
            tick = k * step
            boundary = omit if prev < omit < tick else tick
            if boundary == tick and self._near_the_end(tick, step):
                k += 1  # as iperf3: the few ms left join the last interval, no tail line
                continue
            if self._done.wait(max(0.0, self.t0 + boundary - core.monotonic())):
                break
            if boundary == tick:
                boundary, k = self._read_at(tick, k, step)
            self._tick(prev, boundary, emit)
            prev = boundary
        end = (self.ended_at or core.monotonic()) - self.t0
        if end > prev:
            self._tick(prev, end, emit, tail=True)
        self._cpu_end = (core.rusage("process"), core.host_cpu())
        if self._starvation is not None:
            self._starvation.end()
        after = core.rusage("thread")
        self._sampler_user_s = after.user_s - before.user_s
        self._sampler_system_s = after.system_s - before.system_s

    def _read_at(self, tick: float, k: int, step: float) -> tuple[float, int]:
        """Where the step ending at ``tick`` (the ``k``-th boundary) is read to, and the
        number of the next boundary.

        On time, ``tick`` itself. Late by more than :data:`LATE_TICK_SHARE` of a step, the
        figures read now hold the bytes of every moment up to now: labelled with the
        boundary, they made a 0.1 s step read 224 Gbit/s (0.5 s of bytes) and the steps
        after it too little. The interval then ends now, and the grid resumes at its first
        boundary at least half a step away (no sliver of a step after it). A late read
        never passes the warm-up's end, whose own read sets the summaries' base."""
        now = core.monotonic() - self.t0
        omit = self.spec.omit_s
        if now - tick <= LATE_TICK_SHARE * step or tick <= omit <= now:
            return tick, k + 1
        return now, max(k + 1, math.ceil((now + 0.5 * step) / step))

    def _note_cpus(self) -> None:
        """Note the CPU each running data thread is on (at most every ``WATCH_EVERY_S``):
        the cores a starvation warning names are those its threads were seen on."""
        now = core.monotonic()
        if now - self._cpus_noted < WATCH_EVERY_S:
            return
        self._cpus_noted = now
        count = len(self.streams)
        turn = [self.streams[(self._cpus_turn + i) % count]
                for i in range(min(count, CPUS_NOTED_PER_TICK))]
        self._cpus_turn += len(turn)
        for stream in turn:
            tid = stream.thread.native_id if stream.thread is not None else None
            if tid is not None and stream.ended_at is None:
                cpu = task_cpu(f"/proc/self/task/{tid}/stat")
                if cpu is not None:
                    stream.ran_on.add(cpu)

    def _near_the_end(self, tick: float, step: float) -> bool:
        """True if ``tick`` falls within a tenth of an interval of the planned end."""
        planned = self.spec.planned_s()
        return planned is not None and abs(planned - tick) < 0.1 * step

    def _tick(self, start_s: float, end_s: float, emit: bool, tail: bool = False) -> None:
        omitted = end_s <= self.spec.omit_s + 1e-9 and self.spec.omit_s > 0
        self._note_cpus()
        samples = []
        boundary = False
        for stream in self.streams:
            snap = stream.snapshot()
            # The tail of each stream ends where its own data did (as its summary does),
            # not where this side's last stream ended (a bidir receiver drains on).
            end = max(start_s, min(end_s, self._data_end(stream) - self.t0)) if tail else end_s
            sample = summary.interval(stream, stream.last, snap, start_s, end, omitted)
            stream.last = snap
            if abs(end_s - self.spec.omit_s) < 1e-9:
                stream.base = _late(stream, snap)
                boundary = True
                if stream.is_tcp and stream.role == "sender":
                    stream.boundary_bytes = snap.bytes
            if not omitted:
                summary.note_tcp_sample(stream, snap)
            samples.append(sample)
        if boundary:
            self._tell_boundary()
        # The tail is reported however short, so that no byte goes missing, unless it
        # carries nothing at all (the loops ended right on an interval boundary).
        empty_tail = tail and not any(s.bytes or s.packets for s in samples)
        if emit and not empty_tail:
            for sample in [*samples, *summary.sum_intervals(samples)]:
                self._emit(sample)

    def _tell_boundary(self) -> None:
        """Hand the peer this side's TCP senders' bytes at the warm-up's end (their base)."""
        counts = {(s.stream_id, s.direction): s.base.bytes
                  for s in self.streams if s.role == "sender" and s.is_tcp}
        if counts and self.on_boundary is not None:
            try:
                self.on_boundary(counts)
            except Exception as exc:  # outside the sampler's concern: noted, never raised
                self.reporter_errors.append(f"warm-up boundary not sent: {exc!r}")

    def _watch_boundary(self, streams: list[LocalStream]) -> None:
        """Poll the TCP streams' bytes through (a receiver's arrived, a sender's
        acknowledged) from just before this side's warm-up end until each has passed the
        sender's boundary byte (or its loop ended, or the planned end): the times its
        summary may start at (see :meth:`shared_start`)."""
        start = self.t0 + max(0.0, self.spec.omit_s - BOUNDARY_LEAD_S)
        if self._done.wait(max(0.0, start - core.monotonic())):
            return
        step = BOUNDARY_POLL_S * max(1.0, len(streams) / 8)
        planned = self.spec.planned_s()
        # A peer that never says where its boundary was is watched until the planned end
        # (a byte count's: 10 s past the warm-up); the deque bounds what is kept.
        until = self.t0 + (planned if planned is not None else self.spec.omit_s + 10.0)
        while core.monotonic() < until:
            waiting = [s for s in streams if s.ended_at is None and not _boundary_seen(s)]
            if not waiting:
                return
            for stream in waiting:
                # The time is read first: the count, read after, can only be later.
                now = core.monotonic()
                through = stream.through_bytes()
                if through is None:  # the kernel does not say: its own boundary stands
                    streams.remove(stream)
                else:
                    stream.through.append((now, through))
            if self._done.wait(step):
                return

    def _emit(self, sample: Interval) -> None:
        self.emit_to(self.on_interval, sample)

    def emit_to(self, sink: Callable[[Interval], None], sample: Interval) -> None:
        """Hand a sample to ``sink``; a failing sink is noted once in the result, never raised."""
        # A reporter is outside code (the CLI, a plugin host): its failure must not kill
        # the sampler or the test loop, or the test's figures would stop being taken.
        try:
            sink(sample)
        except Exception as exc:
            if not self.reporter_errors:
                self.reporter_errors.append(f"interval reporter failed: {exc!r}")

    # -- report -----------------------------------------------------------------------

    def errors(self) -> list[str]:
        """What went wrong in the loops."""
        return [s.error for s in self.streams if s.error]

    def warnings(self) -> list[str]:
        """What the figures should be read with: a failed reporter, foreign datagrams."""
        notes = list(self.reporter_errors)
        for s in self.streams:
            notes.extend(f"{s.direction} {s.role}: {note}" for note in s.unavailable
                         if f"{s.direction} {s.role}: {note}" not in notes)
            foreign = 0 if s.is_tcp or s.role != "receiver" else s.counters.foreign
            if foreign:
                notes.append(f"stream {s.stream_id} ({s.direction}): {foreign} datagrams not "
                             "of this test (forged or stray) left out of the figures")
        starved = self._starved()
        if starved:
            notes.append(starved)
        return notes

    def _starved(self) -> str | None:
        """The warning when this side's cgroup quota or a CPU's other tasks held its data
        threads back (netprobe.starvation), None otherwise or before the end."""
        if self._starvation is None or self._cpu_end is None:
            return None
        starvation = self._starvation
        ran = [(s, s.waited_s, s.started_at, s.ended_at) for s in self.streams]
        known = [(s, waited, ended - started) for s, waited, started, ended in ran
                 if waited is not None and started is not None and ended is not None]
        starvation.waits = [(waited, wall, s.user_s + s.system_s) for s, waited, wall in known]
        starvation.ran_on = [frozenset(s.ran_on) for s, _, _ in known]
        wall = (self.ended_at or core.monotonic()) - self.t0
        return starvation.warning(wall, "tester")

    def stream_summaries(self) -> list[tuple[LocalStream, SideSummary]]:
        """Each stream's summary over the test (after the warm-up; a TCP receiver's from
        the peer's boundary byte where it is known: see :meth:`shared_start`)."""
        host = self._rcvbuf_drops()
        found = []
        for s in self.streams:
            start, base = self.spec.omit_s, None
            shared = self.shared_start(s)
            if shared is not None:
                start, base = shared - self.t0, s.boundary_bytes
            found.append((s, summary.side_summary(s, start, self._data_end(s) - self.t0,
                                                  _stream_drops(s, host), base_bytes=base)))
        return found

    def shared_start(self, stream: LocalStream) -> float | None:
        """The monotonic time a TCP stream's summary starts at: its last poll that saw no
        more than the sender's boundary byte B through (arrived at a receiver,
        acknowledged at a sender): every byte after B came through later. None where
        the stream keeps its own clock's boundary: no B (a receiver's older peer, UDP, no
        warm-up), a B beyond what came (a peer's figure that cannot be), or no poll before
        B was through (it was before the watch began)."""
        boundary = stream.boundary_bytes
        if boundary is None or boundary > stream.snapshot().bytes:
            return None
        before = [t for t, n in list(stream.through) if n <= boundary]
        return before[-1] if before else None

    def peer_boundary(self, counts: dict[tuple[int, str], int]) -> None:
        """Note the peer's TCP senders' bytes at their warm-up end (a ``warm-up`` message),
        by stream id and direction; the first word for a stream stands."""
        for stream in self.streams:
            if stream.role == "receiver" and stream.is_tcp \
                    and stream.boundary_bytes is None:
                stream.boundary_bytes = counts.get((stream.stream_id, stream.direction))

    def _rcvbuf_drops(self) -> int | None:
        # The kernel counts drops of full UDP receive buffers host-wide (per namespace),
        # from the start: loss in this tester, which must not be charged to the path.
        # Only the fall-back for a lone receiver whose socket's own count cannot be read.
        if self._rcvbuf_base is None:
            return None
        now = kernel.udp_receive_buffer_errors()
        return None if now is None else max(0, now - self._rcvbuf_base)

    def _data_end(self, stream: LocalStream) -> float:
        # A UDP receiver cannot see the end of the data; its loop runs on for the drain
        # time. Its span is its own: to the last datagram, which is the peer's "sent" plus
        # the time the path's queues took to drain. The sender's end alone would divide the
        # drained bytes by too short a time (105 Mbit/s "received" over a 100 Mbit/s hop).
        end = stream.ended_at or core.monotonic()
        if stream.is_tcp and stream.role == "sender" and stream.wrote_until is not None:
            # A TCP sender's data ends when its peer has acknowledged the last byte, not
            # when its last write returned: the socket then still held up to megabytes,
            # and its figure read above the wire (96.76 Mbit/s over a 100 Mbit/s tbf whose
            # payload ceiling is 94.15, after a warm-up whose boundary queue left the
            # window). Where that is not seen (a peer that stopped acknowledging), the
            # last write's return, as before.
            end = stream.drained_at or stream.wrote_until
        if stream.peer_done_at is not None and not stream.is_tcp:
            end = min(end, max(stream.peer_done_at, stream.last_arrival_at or 0.0))
        return end

    def peer_done(self, elapsed_s: float | None,
                  sent_packets: dict[tuple[int, str], int] | None = None) -> None:
        """Note that the peer stopped sending ``elapsed_s`` after its start (its ``sent``),
        and the UDP datagrams it sent on each stream (by stream id and direction)."""
        now = core.monotonic()
        if elapsed_s is not None and elapsed_s >= 0:
            now = min(now, self.t0 + elapsed_s)
        for stream in self.streams:
            if stream.role == "receiver" and stream.peer_done_at is None:
                stream.peer_done_at = now
                if not stream.is_tcp and sent_packets:
                    stream.peer_sent_packets = sent_packets.get(
                        (stream.stream_id, stream.direction))

    def udp_receivers(self) -> list[LocalStream]:
        """This side's UDP receiving streams."""
        return [s for s in self.streams if s.role == "receiver" and not s.is_tcp]

    def udp_backlog(self) -> bool:
        """Whether a datagram waits unread in the socket of a UDP receiver still running."""
        return any(datagram_waiting(s.sock) for s in self.udp_receivers() if s.ended_at is None)

    def sent_packets(self) -> dict[tuple[int, str], int]:
        """The UDP datagrams each sending stream of this side sent (for the peer's
        receivers: see :meth:`LocalStream.unseen_tail`)."""
        return {(s.stream_id, s.direction): s.counters.packets
                for s in self.streams if s.role == "sender" and not s.is_tcp}

    def data_ended_s(self) -> float:
        """Seconds from the start until the last stream's data ended."""
        return max((self._data_end(s) - self.t0 for s in self.streams), default=0.0)

    def sending_elapsed(self) -> float | None:
        """Seconds from the start until the last sending loop returned."""
        ends = [s.ended_at for s in self.streams if s.role == "sender" and s.ended_at]
        return max(ends) - self.t0 if ends else None

    def cpu(self) -> Cpu | None:
        """This side's CPU: its loop and sampler threads (process) and the host."""
        if self._cpu_start is None:
            return None
        end = self._cpu_end or (core.rusage("process"), core.host_cpu())
        wall = (self.ended_at or core.monotonic()) - self.t0
        user = sum(s.user_s for s in self.streams) + self._sampler_user_s
        system = sum(s.system_s for s in self.streams) + self._sampler_system_s
        process = attrs.evolve(summary.process_cpu(user, system, wall),
                               max_thread_percent=self._busiest_thread_percent())
        return Cpu(process=process, host=summary.host_cpu(self._cpu_start[1], end[1]))

    def _busiest_thread_percent(self) -> float | None:
        # Each stream's loop thread over its own run: the figure that says whether one
        # core was the limit (the process total, over several threads, cannot).
        shares = [
            100 * (s.user_s + s.system_s) / (s.ended_at - s.started_at)
            for s in self.streams
            if s.started_at is not None and s.ended_at is not None and s.ended_at > s.started_at
        ]
        return max(shares) if shares else None


ARRIVAL_POLL_S = 0.002
"""How often a UDP receiver's count is looked at near and after the planned end: the last
datagram's time is known to within this (the C loop keeps no timestamps; 2 ms is 0.1% of
a 2 s test). Before that only the end matters, so the watcher sleeps."""


def _wait_drained(stream: LocalStream) -> float | None:
    """When a TCP sender's socket had nothing left unacknowledged, polled every
    :data:`BOUNDARY_POLL_S` for up to :data:`SENDER_DRAIN_S`; when the last acknowledgement
    came if the peer reset the connection first; None if neither was seen (no answer from
    the kernel, the test stopped, or a peer that stopped acknowledging).

    It costs the test no time: the receiver's side waits for the same bytes (its EOF).
    The FIN the loop sent takes one more place in the queue, and its acknowledgement may
    be delayed (40 ms, measured): one place left is every byte of data acknowledged."""
    until = core.monotonic() + SENDER_DRAIN_S
    acked, acked_at = stream.through_bytes(), core.monotonic()
    while not stream.counters.stopped:
        queued = unsent_bytes(stream.sock)
        now = core.monotonic()
        if queued is not None and queued <= 1:
            return now
        if queued is None or now >= until:
            return None
        if _was_reset(stream.sock):
            # The peer closed with bytes of ours unread, so the last of them will never
            # be acknowledged (a stock iperf3 server closes its data sockets at TEST_END,
            # and its delayed ACK of the last segments goes with them): the data ended
            # with the last acknowledgement seen. Waiting on to the limit, the last
            # write's return was taken instead, and the sender read above the wire (96.59
            # Mbit/s over a 100 Mbit/s tbf whose payload ceiling is 94.15).
            return acked_at
        now_acked = stream.through_bytes()
        if now_acked != acked:
            acked, acked_at = now_acked, now
        time.sleep(BOUNDARY_POLL_S)
    return None


def _was_reset(sock: socket.socket) -> bool:
    """Whether the peer reset the connection (the socket's pending error, read once)."""
    try:
        return sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNRESET
    except OSError:
        return True


def _boundary_seen(stream: LocalStream) -> bool:
    """Whether a TCP stream's polls have passed the sender's boundary byte."""
    known = stream.boundary_bytes
    return known is not None and bool(stream.through) and stream.through[-1][1] >= known


def _stream_drops(stream: LocalStream, host: int | None) -> int | None:
    """A UDP receiver's receive-buffer drops over the test: its own socket's count where the
    kernel gives it (SO_MEMINFO), else ``host``: the host's count where this is the side's
    only UDP receiver (other sockets' drops may swell it), None otherwise."""
    if stream.drops_base is not None and stream.drops_end is not None:
        return max(0, stream.drops_end - stream.drops_base)
    return host


def _watch_arrivals(stream: LocalStream, watch_from: float) -> None:
    # From just before the planned end (the start, for a byte count) until the receiving
    # loop ends: conduct stops it once no datagram came for a while, within its drain time.
    # The peer's "sent" cannot start this: on a queued path it arrives behind the data.
    while stream.ended_at is None and core.monotonic() < watch_from:
        time.sleep(min(0.1, max(0.0, watch_from - core.monotonic())))
    seen = stream.counters.packets
    while stream.ended_at is None:
        time.sleep(ARRIVAL_POLL_S)
        now = stream.counters.packets
        if now != seen:
            seen, stream.last_arrival_at = now, core.monotonic()


def _ack_now(sock: socket.socket) -> None:
    # Acknowledge the last data and the FIN at once (TCP_QUICKACK sends an acknowledgement
    # the kernel holds back): a delayed one (40 ms and more) put off the end of the
    # sender's data (Side._data_end), and its figure read 2% low on a 2 s test.
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)


def _shutdown_write(sock: socket.socket) -> None:
    # Tells the receiver the stream is complete (EOF), so byte counts end exactly.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
