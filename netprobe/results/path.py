"""``netprobe path``: test every segment of a path, and the path end to end, with one spec,
and say which segment limits it.

Each segment ``A -> B`` is a third-party test asked of the agent on A (so every hop but the
last runs ``netprobe server --allow-third-party``); the end-to-end test is one more, from
the first hop to the last. No printing here: the CLI renders the report.
"""
from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Callable

import attrs
from attrs import frozen

from netprobe.errors import SpecError, TestFailed
from netprobe.plugin import Reporter
from netprobe.schema import Result, TestSpec

ThirdParty = Callable[[str, TestSpec, Reporter], Result]


@frozen
class Segment:
    """One tested pair of hops."""

    source: str
    """Where the traffic starts (the agent that ran the test)."""
    target: str
    """Where it goes."""
    end_to_end: bool
    """True for the first-to-last test."""
    result: Result | None = None
    """The test's result (partial if it failed), or None if nothing was measured."""
    error: str | None = None
    """Why the test failed."""

    @property
    def receiver_bits_per_second(self) -> float | None:
        """What arrived: the receiver's throughput of the first flow, if known."""
        if self.result is None or not self.result.summaries:
            return None
        flow = self.result.summaries[0]
        side = flow.receiver or flow.sender
        return side.bits_per_second if side else None


@frozen
class PathReport:
    """Every segment's result, and the segment that limits the path."""

    segments: tuple[Segment, ...]
    """The adjacent pairs in order, then the end-to-end test (if more than two hops)."""
    bottleneck: int | None
    """Index of the slowest adjacent segment; None if none was measured."""

    @property
    def end_to_end(self) -> Segment | None:
        """The first-to-last test (None for a path of two hops)."""
        return next((s for s in self.segments if s.end_to_end), None)


def pairs(hops: Sequence[str]) -> list[tuple[str, str, bool]]:
    """The segments to test: each adjacent pair, then first to last when they differ."""
    if len(hops) < 2:
        raise SpecError("a path needs at least two hops")
    found = [(a, b, False) for a, b in zip(hops, hops[1:])]
    if len(hops) > 2:
        found.append((hops[0], hops[-1], True))
    return found


def run_path(hops: Sequence[str], spec: TestSpec, reporter: Reporter,
             third_party: ThirdParty) -> PathReport:
    """Test each segment with ``spec`` (through ``third_party``); find the bottleneck."""
    run_id = uuid.uuid4().hex
    segments = []
    for index, (source, target, whole) in enumerate(pairs(hops), start=1):
        reporter.note(f"segment {source} -> {target}")
        try:
            result: Result | None = third_party(source, attrs.evolve(spec, host=target),
                                                   reporter)
            error = None
        except TestFailed as exc:
            result, error = exc.partial if isinstance(exc.partial, Result) else None, str(exc)
        if result is not None:
            result = attrs.evolve(result, run_id=run_id, trial=index)
        segments.append(Segment(source, target, whole, result, error))
    return PathReport(tuple(segments), bottleneck(segments))


def bottleneck(segments: Sequence[Segment]) -> int | None:
    """Index of the adjacent segment with the lowest receiver throughput."""
    measured = [(s.receiver_bits_per_second, i) for i, s in enumerate(segments)
                if not s.end_to_end and s.error is None and s.receiver_bits_per_second]
    return min(measured)[1] if measured else None
