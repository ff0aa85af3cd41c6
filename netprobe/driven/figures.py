"""The figures read from a driven tool's output (:class:`Figures`) and the one way they
become a Result (:func:`to_result`).

Every driven session (built-in or plugin, through :meth:`DrivenSession.build_result`) and
every reader of a saved output ends here, so each Result of a driven tool is put together
alike: summaries by direction, streams by direction and number, intervals on one time
order (each interval's start, then direction, role and stream, the sums after their
streams), and the call lengths the output states filled into the sides that lack one.
The CPU rule is not applied here but on the road (:func:`netprobe.session.checked`).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from netprobe.resultops import with_call_lengths
from netprobe.schema import (
    Endpoint,
    FlowSummary,
    Interval,
    Latency,
    RawOutput,
    Result,
    StreamResult,
    TestSpec,
    ToolInfo,
)


@attrs.define
class Figures:
    """Figures read from one tool's output (or a run so far), ready to be put into a
    Result by :func:`to_result`."""

    intervals: list[Interval] = attrs.Factory(list)
    streams: list[StreamResult] = attrs.Factory(list)
    summaries: list[FlowSummary] = attrs.Factory(list)
    warnings: list[str] = attrs.Factory(list)
    errors: list[str] = attrs.Factory(list)
    duration_s: float | None = None
    local: Endpoint | None = None
    remote: Endpoint | None = None
    start_time: str | None = None
    version: str | None = None
    latency: Latency | None = None
    call_lengths: dict[tuple[str, str], int] = attrs.Factory(dict)
    """What the output says each end's data loop asked of a call, by (direction, role)."""


def to_result(
    figures: Figures,
    *,
    tool: ToolInfo,
    spec: TestSpec,
    start_time: str | None,
    status: str = "ok",
    errors: Sequence[str] | None = None,
    raw: Sequence[RawOutput] = (),
) -> Result:
    """``figures`` as a Result of ``tool`` running ``spec``: ``errors`` (default: the
    figures' own), the start time the output gave or else ``start_time``, this machine as
    the client and ``spec.host`` as the server where the output named neither."""
    return with_call_lengths(Result(
        tool=tool,
        spec=spec,
        start_time=figures.start_time or start_time,
        local=figures.local or Endpoint(role="client"),
        remote=figures.remote or Endpoint(role="server", host=spec.host),
        status=status,
        duration_s=figures.duration_s,
        summaries=tuple(sorted(figures.summaries, key=lambda f: f.direction)),
        streams=tuple(sorted(figures.streams, key=lambda s: (s.direction, s.stream_id))),
        intervals=tuple(sorted(figures.intervals, key=interval_order)),
        latency=figures.latency,
        warnings=tuple(figures.warnings),
        errors=tuple(figures.errors if errors is None else errors),
        raw=tuple(raw),
    ), figures.call_lengths)


def interval_order(sample: Interval) -> tuple[float, str, str, int]:
    """The sort key of :func:`to_result`'s intervals: start (to the millisecond, so the
    processes' clocks a microsecond apart do not split one interval), direction, role, and
    the stream (a sum after its streams)."""
    stream = sample.stream_id if sample.stream_id is not None else 1 << 30
    return (round(sample.start_s, 3), sample.direction, sample.role, stream)


__all__ = ["Figures", "interval_order", "to_result"]
