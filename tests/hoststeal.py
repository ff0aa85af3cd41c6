"""CPU time the host took from this machine while a test ran ("steal", /proc/stat).

On a virtual machine the hypervisor may run something else while one of our CPUs is ready
to run: Linux counts that time as steal. A test whose assertion needs our processes to run
when they are woken (a tbf link kept busy, a pacing gap, a wake-up count, a latency) cannot
be judged while the host holds the CPUs off: tbf banks at most ``burst`` of the link's
time (32,787 bytes at 100 Mbit/s: 2.6 ms), and on 7 December this VM, idle, had 20-26 % of
its time taken while a shaped-link test ran, in stalls of up to 62 ms (a spinning loop's
longest gap), and the link itself carried 80-87 of its 95 Mbit/s, whichever tool sent.

tests/conftest.py measures the steal around each test's call; a test marked
``host_timing`` that fails while the host took at least ``STEAL_LIMIT`` of the time is
reported as skipped, unjudged, with the steal and the failure's first line. Below that
limit it fails as any test does, and a test that passes is never touched.
"""

from __future__ import annotations

import os
import time

from netprobe import core
from netprobe.errors import CoreError

STEAL_LIMIT = 0.05
"""The share of the CPUs' time the host may take during a ``host_timing`` test before a
failure of it is unjudged: 1-4 % is what this VM shows when idle and well served (mostly
the wake-ups' own delay), 17-26 % what it showed while its shaped links lost a tenth of
their rate."""

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def steal_s() -> float | None:
    """Seconds of steal summed over every CPU since boot (netprobe's own /proc/stat reader,
    ``netprobe.core.host_cpu``); None where it cannot be read."""
    try:
        return core.host_cpu().steal * _TICK_S
    except CoreError:
        return None


def unjudged_reason(share: float | None, failure: str) -> str | None:
    """Why a failed ``host_timing`` test is unjudged, or None when its failure stands."""
    if share is None or share < STEAL_LIMIT:
        return None
    return (f"unjudged: the host took {share:.0%} of this machine's CPU time while it ran "
            f"(steal; the limit is {STEAL_LIMIT:.0%}, tests/hoststeal.py): {failure}")


class StealMeter:
    """The share of the CPUs' time the host took between ``start()`` and ``share()``."""

    def __init__(self) -> None:
        self._steal0: float | None = None
        self._wall0 = 0.0

    def start(self) -> None:
        """Begin a measurement."""
        self._steal0 = steal_s()
        self._wall0 = time.monotonic()

    def share(self) -> float | None:
        """Steal per CPU over the wall time since ``start()`` (0.0-1.0), or None."""
        now = steal_s()
        wall = time.monotonic() - self._wall0
        if now is None or self._steal0 is None or wall <= 0:
            return None
        return max(0.0, now - self._steal0) / (wall * (os.cpu_count() or 1))
