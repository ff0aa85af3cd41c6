"""ntttcp's live intervals, timed by netprobe's clock.

TCP: every interval the kernel's byte counters of the test's connections are sampled
(:class:`netprobe.driven.tcpbytes.TcpBytes`: a sender's acknowledged bytes, a receiver's
received bytes), from the moment the test starts (``Network activity progressing...``, or
a no-sync test's first connection) to its end (warm-up plus duration). ntttcp's own
``Real-time throughput`` lines carry no timestamps: timed by their arrival they came out
1.12-1.37 s wide for 1 s, summing short of the total, the first above the link (the socket
buffer's fill counted as sent).

UDP has no such counter (sock_diag keeps no UDP byte counts, and /proc/PID/io does not
count send()/recv()): its intervals are still the real-time lines timed on arrival
(:class:`IntervalBuilder`). Either way, once the report is read, the last measured interval
takes what its counter missed (a connection's final bytes after its last sample), so that
the measured intervals sum to the total (:func:`reconcile`).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import attrs

from netprobe.schema import Interval
from netprobe.tools.ntttcp import parse_output as p

REALTIME_PERIOD_S = 0.5
"""ntttcp prints a real-time throughput line about this often (not settable)."""
READ_EVERY_S = 0.05
"""How often the counter is read between interval ends. A connection that has closed is
gone from sock_diag, and the counter keeps what it last read of it, so without reads in
between the bytes of its last stretch went unseen: in one CI run ntttcp closed just before
the last of 0.5 s ends and that interval said 0 bytes where the link carried 94 Mbit/s."""


def schedule(interval_s: float, omit_s: float, duration_s: float) -> list[float]:
    """Interval ends, in seconds from the start: every ``interval_s`` through the warm-up,
    one at its end, then every ``interval_s`` to the end of the test."""
    ends: list[float] = []
    for start, length in ((0.0, omit_s), (omit_s, duration_s)):
        count = max(1, int(length / interval_s + 0.999999)) if length > 0 else 0
        ends += [round(min(start + interval_s * k, start + length), 6)
                 for k in range(1, count + 1)]
    return ends


class CounterSampler:
    """Samples a running byte counter at each end of :func:`schedule`, on its own thread,
    and hands each Interval to ``emit``."""

    def __init__(self, role: str, ends: list[float], omit_s: float,
                 counter: Callable[[], int], emit: Callable[[Interval], None]) -> None:
        self.role = role
        self.ends = ends
        self.omit_s = omit_s
        self.counter = counter
        self.emit = emit
        self.failed: str | None = None
        """Why sampling stopped early (the counter could not be read)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, t0: float) -> None:
        """The test started at ``t0`` (monotonic): sample from now on."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, args=(t0,), daemon=True,
                                            name="ntttcp-sampler")
            self._thread.start()

    def stop(self) -> None:
        """Stop sampling (at once) and wait for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _run(self, t0: float) -> None:
        # From 0: the counters are the test's own connections', which start with it (a
        # first sample taken now would miss what they moved before this thread ran).
        last, start = 0, 0.0
        try:
            for planned in self.ends:
                if self._wait_reading(t0 + planned):
                    return
                value = self.counter()
                # the time it was read, not the one planned: a thread woken late on a
                # busy machine would otherwise put more bytes into the same width
                end = round(time.monotonic() - t0, 3)
                self.emit(_interval(self.role, start, end, value - last,
                                    omitted=planned <= self.omit_s and self.omit_s > 0))
                last, start = value, end
        except OSError as exc:
            self.failed = f"the connections' byte counters could not be read: {exc}"

    def _wait_reading(self, until: float) -> bool:
        """Wait for ``until`` (monotonic), reading the counter every READ_EVERY_S on the
        way, so that it holds each connection's bytes until shortly before it closed;
        True if stopped."""
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return False
            if self._stop.wait(min(left, READ_EVERY_S)):
                return True
            if until - time.monotonic() > 0:
                self.counter()


def _interval(role: str, start: float, end: float, count: int, omitted: bool) -> Interval:
    span = end - start
    return Interval(direction="client_to_server", role=role, stream_id=None,
                    start_s=round(start, 3), end_s=round(end, 3), bytes=count,
                    bits_per_second=count * 8 / span if span > 0 else 0.0, omitted=omitted)


def reconcile(intervals: tuple[Interval, ...], total: int | None, role: str
              ) -> tuple[Interval, ...]:
    """The last measured interval of ``role`` given what the others leave of ``total``
    (never less than 0), so that they sum to it."""
    mine = [i for i, item in enumerate(intervals) if item.role == role and not item.omitted]
    if total is None or not mine:
        return intervals
    last = intervals[mine[-1]]
    rest = total - sum(intervals[i].bytes for i in mine[:-1])
    if rest < 0 or rest == last.bytes:
        return intervals
    span = last.end_s - last.start_s
    fixed = attrs.evolve(last, bytes=rest, bits_per_second=rest * 8 / span if span > 0 else 0.0)
    return (*intervals[:mine[-1]], fixed, *intervals[mine[-1] + 1:])


# --- live intervals -------------------------------------------------------------------


class IntervalBuilder:
    """Turns ntttcp's untimed ~0.5 s real-time lines into Interval samples, timed by their
    arrival and summed to the requested interval. Bytes are derived (rate x time)."""

    def __init__(self, role: str, interval_s: float | None) -> None:
        self.role = role
        self.interval_s = interval_s
        self.t0: float | None = None
        self.last = 0.0
        self.usable = True
        self._start = 0.0
        self._bytes = 0
        self._omitted = False

    def start(self, now: float) -> None:
        """``Network activity progressing...`` arrived: the clock starts."""
        self.t0 = self.last = now
        self._start = 0.0

    def add(self, sample: p.RealtimeSample, now: float) -> Interval | None:
        """One sample at ``now``; an Interval when a whole interval has been gathered."""
        if sample.batched:
            self.usable = False  # terminal-style updates arrived together: no timing
        if self.t0 is None or not self.usable or self.interval_s is None:
            return None
        done = None
        if self._bytes and sample.during_warmup != self._omitted:
            done = self._emit()  # never mix warm-up and measured time in one sample
        span = now - self.last
        self._omitted = sample.during_warmup
        self._bytes += round(sample.bits_per_second * span / 8)
        self.last = now
        if self.last - self.t0 - self._start >= self.interval_s - REALTIME_PERIOD_S / 2:
            return self._emit()
        return done

    def flush(self) -> Interval | None:
        """The last, partly filled interval (at the end of the test), if any."""
        if self.t0 is None or not self.usable or not self._bytes:
            return None
        return self._emit()

    def _emit(self) -> Interval:
        assert self.t0 is not None
        start, end = self._start, self.last - self.t0
        item = Interval(
            direction="client_to_server",
            role=self.role,
            stream_id=None,
            start_s=round(start, 3),
            end_s=round(end, 3),
            bytes=self._bytes,
            bits_per_second=self._bytes * 8 / (end - start) if end > start else 0.0,
            omitted=self._omitted,
        )
        self._start, self._bytes = end, 0
        return item


