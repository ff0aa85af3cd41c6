"""Issue 16: what a DrivenRun holds is bounded however much its tool prints. The samples
waiting for the reporter (a queue the run's thread empties every 50 ms) and the raw output
kept for the Result grew without limit: a tool printing faster than the reporter took its
lines, or printing without end, grew the client's memory with them."""

from __future__ import annotations

import re
import sys
import threading
import time
import tracemalloc
from typing import Callable

import pytest

from netprobe import reporting
from netprobe.driven import DrivenRun
from netprobe.driven import process as process
from netprobe.driven import run as run
from netprobe.plugin import NullReporter
from netprobe.schema import Interval

from .budget import scaled

LINES = scaled(40_000, floor=20_000)
# Prints LINES interval lines as fast as it can, then its whole-test total, as a tool does.
_PRINTER = r"""
import sys
n = int(sys.argv[1])
out = sys.stdout
for i in range(n):
    out.write(f"interval {i} bytes=1000 padding={'x' * 40}\n")
out.write(f"total bytes={n * 1000}\n")
"""


class _Slow(NullReporter):
    """A live output slower than the tool: a terminal, a pipe read slowly. Its first
    sample waits until the tool has printed everything, so the backlog is the whole
    output however fast this machine runs the tool (under qemu-user the printer is slow
    enough for a merely slow reporter to keep up)."""

    def __init__(self) -> None:
        self.shown = 0
        self.printed_all = threading.Event()

    def interval(self, sample: Interval) -> None:
        if not self.shown:
            self.printed_all.wait(60)
        self.shown += 1
        if self.shown % 50 == 0:
            time.sleep(0.001)


def _reader(live: DrivenRun, totals: list[int], reporter: _Slow) -> Callable[[str], None]:
    def on_line(line: str) -> None:
        if line.startswith("total "):
            totals.append(int(line.split("=")[1]))
            reporter.printed_all.set()
        elif line.startswith("interval "):
            n = int(line.split()[1])
            live.emit(Interval(direction="client_to_server", role="sender", stream_id=None,
                               start_s=n * 0.1, end_s=(n + 1) * 0.1, bytes=1000,
                               bits_per_second=80e3))
    return on_line


def test_a_tool_that_prints_fast_and_long_costs_a_bounded_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reporting, "MAX_INTERVALS_KEPT", 1_000)
    monkeypatch.setattr(run, "MAX_PENDING", 500)
    monkeypatch.setattr(process, "OUTPUT_HEAD_CHARS", 64 << 10)
    monkeypatch.setattr(process, "OUTPUT_TAIL_CHARS", 16 << 10)
    reporter, totals = _Slow(), []
    tracemalloc.start()
    try:
        with DrivenRun(reporter, tool="printer") as live:
            printer = live.start("client", [sys.executable, "-c", _PRINTER, str(LINES)],
                                 on_line=_reader(live, totals, reporter))
            live.wait_exit(printer, 120.0)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    warnings = live.warnings
    # the whole-test figure is exact: the total line is the last one, and it was kept
    assert totals == [LINES * 1000]
    assert printer.lines[-1] == f"total bytes={LINES * 1000}"
    # what was held stayed within its bounds, and the warnings say what was not kept
    assert len(printer.text) <= (64 << 10) + (16 << 10)
    output = next(w for w in warnings if "output:" in w)
    dropped = int(re.search(r"output: (\d+) lines", output).group(1))  # type: ignore[union-attr]
    assert dropped + len(printer.lines) == LINES + 1, output
    assert len(live.intervals) == 1_000
    not_shown = next(w for w in warnings if "not shown live" in w)
    count = int(not_shown.split()[0])
    assert count > 0 and reporter.shown + count == LINES, (reporter.shown, not_shown)
    assert peak < 4 << 20, f"peak {peak / 2**20:.1f} MiB traced for {LINES} lines"
