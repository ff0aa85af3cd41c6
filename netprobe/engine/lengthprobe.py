"""The TCP length a stream's loop uses when the spec leaves it open: measured on the path
at hand, not assumed.

Why measured. Every send() or recv() has a fixed cost (the system call, the socket lock,
the push or window update it sets off, the wake-up of the other end's thread, which on
loopback and virtual NICs the sender's own thread pays) and every byte a cost that grows
once the buffer no longer stays in the cache beside the kernel's pages. The balance
differs between machines, not only by cache size: on two 2-vCPU Intel Xeons with the same
48 KiB L1d and 2 MiB L2, with 4 streams 1 MiB calls were 0.74-0.85x of 256 KiB ones on one
and 1.33x on the other, and with one stream 1 MiB was 1.5x on the second
(docs/performance.md). No constant is near the best point on both. So a time-limited,
unpaced test's loop runs both candidates in 100 ms windows at its start, in the order
A B B A (a figure still rising as the flow opens favours neither), and keeps the larger
only when its windows moved clearly more bytes per second, or at the same rate (a link,
not the tester, is the limit) cost clearly less CPU per byte; otherwise the smaller,
because every buffer is memory on a router too.

The windows are the side's, not the stream's (:class:`Schedule`): all its streams of one
role run the same windows on one clock, one reading of the side's sums at each window's
end measures it for all of them, and one verdict is kept for all. Both ends choose at
about the same time, and their windows overlap, so each sees what the pair does at both
lengths. What each window moved is counted like any other byte of the test; only the
length of the calls differs.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

import attrs

from netprobe import core
from netprobe.schema import TestSpec

SMALL_BYTES = 256 * 1024
"""Four maximum-size GSO packets (64 KiB, the IP packet limit) a call: whole packets, so
autocorking never holds a partial one back; the length when nothing is measured."""
LARGE_BYTES = 1024 * 1024
"""A quarter of the fixed share of SMALL_BYTES per byte, at four times its memory."""
WINDOW_S = 0.1
"""One window of the probe. With several streams on few cores, where the scheduler puts
the threads moves a window's rate by more than the length does: 50 ms windows chose
differently in runs of one setting (-P 4 here: 256K in one of three runs, at 52 Gbit/s
where 1 MiB gave 66-69); 100 ms windows chose the same in 6 of 6."""
ORDER = (SMALL_BYTES, LARGE_BYTES, LARGE_BYTES, SMALL_BYTES)
SHORTEST_PROBED_S = 2.0
"""Tests shorter than this keep SMALL_BYTES: the probe (0.4 s) would be more than a fifth
of them."""
CLEAR_GAIN = 1.05
"""How much faster (or cheaper) the larger length must be to be chosen: runs of one
setting differ by a few percent, and a tie keeps the smaller buffer."""
WAIT_SLICE_S = 0.005
"""A receiver waits for the first byte in calls that end this soon, so that its windows
open as the data starts (they do once the first recv() returns)."""
WAIT_FOR_DATA_S = 10.0
"""A receiver that got nothing in this long stops waiting to probe and keeps SMALL_BYTES."""
MOST_PROBED_STREAMS = 16
"""Above this many streams per direction the loops keep SMALL_BYTES without a probe. A
probed loop holds a LARGE_BYTES buffer, and a server budgets that for every stream: 16 MiB
a direction at 16 streams, 128 MiB at -P 128, a small router's whole budget. And there the
probe buys nothing: on an AMD EPYC (2 cores, 32 MiB L3) 1 MiB calls moved 0.87x, 0.85x,
0.88x and 0.89x of what 256 KiB calls did at -P 8, 16, 32 and 128 (medians of 3), and at
-P 16 the probe kept 256K in 2 runs of 2. (The probe itself no longer costs more per
stream with more streams: the side reads its sums once a window, see :class:`Schedule`.)"""


def probed(spec: TestSpec) -> bool:
    """Whether the loops of ``spec`` choose their length by the probe: TCP, no ``-l``, no
    pacing (a paced loop cuts its calls to ~1 ms of data), no byte count (the windows
    would have to split it), no zero-copy (its own path), at most
    :data:`MOST_PROBED_STREAMS` streams, and long enough."""
    planned = spec.planned_s()
    return (spec.protocol == "tcp" and not spec.length_bytes
            and not spec.rate_bits_per_second and spec.bytes_total is None
            and not spec.zerocopy and spec.streams <= MOST_PROBED_STREAMS
            and planned is not None and planned >= SHORTEST_PROBED_S)


def largest(spec: TestSpec) -> int:
    """The longest buffer a TCP loop of ``spec`` may allocate (a server's memory budget)."""
    if spec.length_bytes:
        return spec.length_bytes
    return LARGE_BYTES if probed(spec) else SMALL_BYTES


@attrs.define
class Trial:
    """What the windows of one length moved, in how long, at what CPU cost."""

    length: int
    bytes: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0

    @property
    def rate(self) -> float:
        """Bytes per second (0 when nothing was timed)."""
        return self.bytes / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cost(self) -> float | None:
        """CPU seconds per byte (None when nothing moved)."""
        return self.cpu_s / self.bytes if self.bytes > 0 else None


def choose(small: Trial, large: Trial) -> int:
    """The length to keep: the larger only when it moved clearly more, or (at the same
    rate) cost clearly less CPU per byte."""
    if large.rate > small.rate * CLEAR_GAIN:
        return large.length
    if small.rate > large.rate * CLEAR_GAIN or small.cost is None or large.cost is None:
        return small.length
    return large.length if large.cost * CLEAR_GAIN < small.cost else small.length


Loop = Callable[[int, Optional[float]], object]
"""A stream loop: ``loop(length, deadline)`` runs the C (or pure) loop until then."""


Reading = tuple[float, int, float]
"""One reading of a schedule's gauges: (monotonic seconds, bytes moved, CPU seconds)."""


@attrs.define
class Schedule:
    """The probe of one side's streams of one role: one clock of windows, each measured
    once, and one verdict.

    Measured on the side's sums, not the stream's: with several streams, which of them the
    scheduler favours moves one stream's rate by more than the length does (-P 4 here: one
    stream 12.2 Gbit/s at 256K and 11.4 at 1M while the four together rose from 51.9 to
    56.6). Measured once: when each stream read those sums for itself, the work grew with
    the square of the count and at -P 128 held the interval sampler off; and streams whose
    windows ended a few ms apart chose apart near the threshold (on an AMD EPYC at -P 4,
    2 of 4 kept 256K and 2 kept 1M). Now the first stream back from a window's end reads
    the sums for all, and the first to finish the windows chooses for all.

    ``moved`` is what the streams of this role have moved so far, ``cpu_s`` the CPU
    seconds their process (or, for a lone stream, its thread) has spent."""

    moved: Callable[[], int]
    cpu_s: Callable[[], float]
    _readings: list[Reading | None] = attrs.field(
        factory=lambda: [None] * (len(ORDER) + 1), init=False)
    _verdict: int | None = attrs.field(default=None, init=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    @property
    def verdict(self) -> int | None:
        """The length every stream of this schedule keeps; None until the windows end."""
        return self._verdict

    def open(self) -> float:
        """Start the clock if no stream has (the first reading); when it started."""
        with self._lock:
            first = self._readings[0]
            if first is None:
                first = self._readings[0] = self._read()
            return first[0]

    def window_end(self, index: int) -> float:
        """When window ``index`` ends on this schedule's clock (after :meth:`open`)."""
        return self._opened_at() + (index + 1) * WINDOW_S

    def current(self) -> int:
        """The window the clock is in now; ``len(ORDER)`` once all have ended."""
        elapsed = core.monotonic() - self._opened_at()
        return min(len(ORDER), max(0, int(elapsed / WINDOW_S)))

    def _opened_at(self) -> float:
        first = self._readings[0]
        if first is None:
            raise RuntimeError("the schedule's clock has not been opened")
        return first[0]

    def passed(self) -> None:
        """A stream is back from a window: read the sums at every window end that is past
        and not yet read (once, whichever stream comes back first)."""
        now = core.monotonic()
        with self._lock:
            for index in range(len(ORDER)):
                if self._readings[index + 1] is None and now >= self.window_end(index):
                    self._readings[index + 1] = self._read()

    def decide(self) -> int:
        """The length to keep: the verdict of the whole schedule once its last window has
        been read (fixed by the first caller then). A stream asking before that left its
        windows early (stopped, or its peer closed) and gets SMALL_BYTES, fixing nothing."""
        with self._lock:
            if self._verdict is None:
                if self._readings[-1] is None:
                    return SMALL_BYTES
                self._verdict = choose(*self.trials())
            return self._verdict

    def trials(self) -> tuple[Trial, Trial]:
        """What the windows read so far, summed by length: (small, large)."""
        small, large = Trial(SMALL_BYTES), Trial(LARGE_BYTES)
        for index, length in enumerate(ORDER):
            begin, end = self._readings[index], self._readings[index + 1]
            if begin is None or end is None:
                continue
            trial = small if length == SMALL_BYTES else large
            trial.wall_s += end[0] - begin[0]
            trial.bytes += end[1] - begin[1]
            trial.cpu_s += end[2] - begin[2]
        return small, large

    def _read(self) -> Reading:
        return (core.monotonic(), self.moved(), self.cpu_s())


def run(loop: Loop, counters: core.Counters, deadline: float | None,
        receiver: bool, schedule: Schedule | None = None) -> int:
    """Run ``loop`` through the windows of ``schedule`` (joining at whichever window its
    clock is in), then to ``deadline`` at the length it chose; the length. The schedule
    defaults to this stream's own bytes and thread CPU. A receiver first waits for the
    first byte. Every window ends early once the loop is stopped or the peer has closed
    (a loop then returns at once), so the probe never holds a test open."""
    if receiver and not _first_byte(loop, counters, deadline):
        loop(SMALL_BYTES, deadline)
        return SMALL_BYTES
    schedule = schedule or Schedule(lambda: counters.bytes, _thread_cpu_s)
    schedule.open()
    index = schedule.current()
    # Each window at most once: a loop that returns early (stopped, peer gone) must not
    # spin through the rest of the clock.
    while index < len(ORDER) and not (counters.stopped or _past(deadline)):
        end = schedule.window_end(index)
        loop(ORDER[index], end if deadline is None else min(end, deadline))
        schedule.passed()
        index = max(index + 1, schedule.current())
    chosen = schedule.decide()
    loop(chosen, deadline)
    return chosen


def _thread_cpu_s() -> float:
    used = core.rusage("thread")
    return used.user_s + used.system_s


def _first_byte(loop: Loop, counters: core.Counters, deadline: float | None) -> bool:
    # A call past its deadline returns as soon as its first recv() does, i.e. once data
    # comes (or after the loops' 100 ms tick), so the windows open as the flow starts.
    give_up = core.monotonic() + WAIT_FOR_DATA_S
    while counters.bytes == 0:
        now = core.monotonic()
        if counters.stopped or now >= give_up or _past(deadline, now):
            return False
        loop(SMALL_BYTES, now + WAIT_SLICE_S)
        if counters.bytes == 0 and core.monotonic() < now + WAIT_SLICE_S:
            return False  # back before its deadline with nothing: the peer closed
    return True


def _past(deadline: float | None, now: float | None = None) -> bool:
    return deadline is not None and (core.monotonic() if now is None else now) >= deadline
