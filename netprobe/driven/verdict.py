"""Whether a driven tool's run measured the test asked for: one rule for every adapter.

Driven tools often exit 0 from a broken run: iperf 2, its data connection reset by the far
end, prints ``tcp write failed: Connection reset by peer``, then a summary over the second
it ran, and exits 0; its sender figure then counts what filled the socket buffer (5,114
Mbit/s on a 100 Mbit/s link, 43,040 Mbit/s over 0.3 ms on loopback). :func:`run_faults`
names what makes such a run failed: a connection reset or a broken pipe in any process's
output, a time-mode test that measured well under its length, a byte-count test that moved
fewer bytes than asked. The adapter then fails the test with these reasons and keeps every
figure it read (the partial Result), as for any other failure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from netprobe.schema import Result, SideSummary

SHORT_SHARE = 0.8
"""A time-mode test whose longest side measured less than this share of the time asked
ran short: the tools measure their asked time to a few milliseconds (iperf 2 and 3,
nuttcp, ntttcp: 3.00-3.06 s of 3 s on loopback), so a fifth missing is a broken run."""

BROKEN = re.compile(
    r"connection reset by peer|broken pipe|\bECONNRESET\b|\bEPIPE\b|connection reset",
    re.IGNORECASE,
)
"""The words of a data connection broken under a tool (as strerror prints them, and the
errno names some tools print instead)."""


def broken_connection(texts: Iterable[tuple[str, str]]) -> str | None:
    """The first line of ``(name, text)`` outputs that says a connection was reset or a
    pipe broken, as ``NAME: LINE``; None when none does."""
    for name, text in texts:
        for line in text.splitlines():
            if BROKEN.search(line):
                return f"{name}: {line.strip()}"
    return None


def _sides(result: Result) -> list[SideSummary]:
    return [side for flow in result.summaries for side in (flow.sender, flow.receiver)
            if side is not None]


def measured_span(result: Result) -> float | None:
    """The longest span a side of the result measured over (the result's duration when no
    side gives one); None when nothing was measured."""
    spans = [side.end_s - side.start_s for side in _sides(result)]
    if spans:
        return max(spans)
    return result.duration_s


def shortfall(result: Result) -> str | None:
    """Why the run measured less than its spec asked, or None: under :data:`SHORT_SHARE`
    of the time asked (time mode), fewer bytes sent than asked (byte-count mode)."""
    spec = result.spec
    if spec.bytes_total is not None:
        sent = sum(flow.sender.bytes for flow in result.summaries if flow.sender is not None)
        received = sum(flow.receiver.bytes for flow in result.summaries
                       if flow.receiver is not None)
        moved = sent or received
        if moved < spec.bytes_total:
            return (f"the run moved {moved} bytes of the {spec.bytes_total} asked: it ended "
                    "early")
        return None
    if spec.duration_s is None:
        return None
    span = measured_span(result)
    if span is None or span >= SHORT_SHARE * spec.duration_s:
        return None
    return (f"the run measured {_seconds(span)} of the {spec.duration_s:g} s asked: it ended "
            "early, and a rate over so short a time is not the link's")


def _seconds(span: float) -> str:
    return f"{span * 1000:.3g} ms" if span < 1 else f"{span:.3g} s"


def run_faults(result: Result) -> list[str]:
    """What makes a driven run that its tool did not call failed a broken one: a reset
    connection or broken pipe in any process's output (:attr:`Result.raw`), a run short
    of what was asked. Empty when the run measured the test asked for."""
    found = []
    broken = broken_connection((raw.name, raw.text) for raw in result.raw)
    if broken is not None:
        found.append(f"the data connection broke ({broken})")
    short = shortfall(result)
    if short is not None:
        found.append(short)
    return found


__all__ = ["BROKEN", "SHORT_SHARE", "broken_connection", "measured_span", "run_faults",
           "shortfall"]
