"""Live interval samples for qperf, which prints nothing until a test ends.

Each sample is what a qperf process moved through its system calls since the previous
sample: ``wchar`` of the client (the sender) and, for TCP, ``rchar`` of the server's
per-test child (the receiver, when the server runs here), from ``/proc/PID/io``. These are
the kernel's running totals of the bytes the process's read/write calls moved, sockets
included; the few hundred bytes of qperf's control messages are in them too. qperf receives
UDP with recvfrom(), which rchar does not count: a UDP test has sender intervals only. The
summaries stay qperf's own figures; the result's warnings say where the intervals come from.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from netprobe.plugin import Reporter, bits_per_second
from netprobe.schema import Interval

NOTE = ("intervals: bytes the qperf processes moved through read/write calls "
        "(/proc/PID/io), sampled by netprobe; summaries are qperf's own figures")
"""Where the interval figures come from, for the result's warnings."""


def io_counter(pid: int, name: str) -> Optional[int]:
    """``rchar`` or ``wchar`` of process ``pid`` from /proc/PID/io; None if unreadable."""
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key == name:
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (qperf's server forks one per test)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []


@dataclass
class _Side:
    role: str
    counter: str
    pid: Optional[int] = None
    last: Optional[int] = 0
    """A process's counters start at 0 when it is forked: no baseline to read (and none to
    read late, on a busy machine, after the first bytes went out)."""


@dataclass
class Sampler:
    """Turns the qperf processes' I/O counters into interval samples every ``interval_s``."""

    reporter: Reporter
    interval_s: float
    client_pid: int
    server_pid: Optional[int] = None
    receiver_counted: bool = True
    """False for UDP: qperf receives datagrams with recvfrom(), which rchar does not count."""
    direction: str = "client_to_server"
    intervals: list[Interval] = field(default_factory=list)
    _sides: list[_Side] = field(default_factory=list)
    _t0: float = 0.0
    _last_t: float = 0.0

    def __post_init__(self) -> None:
        self._t0 = self._last_t = time.monotonic()
        self._sides = [_Side("sender", "wchar", self.client_pid)]
        if self.server_pid is not None and self.receiver_counted:
            self._sides.append(_Side("receiver", "rchar"))
        self._find_receiver()

    def _find_receiver(self) -> None:
        for side in self._sides:
            if side.pid is None and self.server_pid is not None:
                forked = children(self.server_pid)
                side.pid = forked[-1] if forked else None

    def poll(self) -> None:
        """Take a sample if an interval has passed (call often; cheap otherwise)."""
        now = time.monotonic()
        if now - self._last_t < self.interval_s:
            self._find_receiver()  # its process appears once the client connects
            return
        self._sample_all(now)

    def finish(self) -> None:
        """The last, shorter sample: call when the client has exited but is not yet reaped
        (its counters are still readable), before anything waits for it."""
        now = time.monotonic()
        if now - self._last_t > 0.0005:  # however short: what was moved since is counted
            self._sample_all(now)

    def _sample_all(self, now: float) -> None:
        start, end = self._last_t - self._t0, now - self._t0
        for side in self._sides:
            self._sample(side, start, end)
        self._last_t = now

    def _sample(self, side: _Side, start: float, end: float) -> None:
        value = io_counter(side.pid, side.counter) if side.pid is not None else None
        if value is None or side.last is None:
            side.last = None  # unreadable once: its later samples would not add up
            return
        moved, side.last = max(0, value - side.last), value
        item = Interval(direction=self.direction, role=side.role, stream_id=None,
                        start_s=start, end_s=end, bytes=moved,
                        bits_per_second=bits_per_second(moved, end - start))
        self.intervals.append(item)
        self.reporter.interval(item)
