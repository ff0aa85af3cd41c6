"""The one time grid every chart, CDF and sparkline puts intervals on
(netprobe.results.analysis.time_grid): intervals by the bins they cover, never by their
exact end time; gaps where nothing was measured."""

from __future__ import annotations

import attrs

from netprobe.results.analysis import (
    retransmit_series,
    stream_series,
    throughput_series,
    time_grid,
    with_gaps,
)
from netprobe.schema import Interval
from tests.test_formats import sample_result

MBIT = 1e6


def _interval(start: float, end: float, mbit: float, stream: int | None,
              direction: str = "client_to_server", retransmits: int | None = None) -> Interval:
    return Interval(direction=direction, role="receiver", stream_id=stream, start_s=start,
                    end_s=end, bytes=int(mbit * MBIT / 8 * (end - start)),
                    bits_per_second=mbit * MBIT, retransmits=retransmits)


def _four_streams_stamped_apart() -> list[Interval]:
    """A steady 40 Mbit/s -P 4 run as a native side records it: each second's four
    stream records and the sum stamped a millisecond apart (the issue's figures)."""
    found = []
    for second in (0, 1):
        skew = (-0.001, 0.0, 0.001, 0.002)
        for n, offset in enumerate(skew, start=1):
            found.append(_interval(second + (offset if second else 0.0), second + 1 + offset,
                                   10.0, n))
        found.append(_interval(second - (0.001 if second else 0.0), second + 0.999, 40.0, None))
    return found


def test_records_stamped_apart_are_one_interval_of_the_flow() -> None:
    result = attrs.evolve(sample_result(streams=4), intervals=tuple(_four_streams_stamped_apart()))
    series = throughput_series(result, "client_to_server")
    assert [t for t, _ in series] == [1.0, 2.0]
    assert [v / MBIT for _, v in series] == [40.0, 40.0]
    streams = stream_series(result, "client_to_server")
    assert sorted(streams) == [1, 2, 3, 4]
    assert all([t for t, _ in points] == [1.0, 2.0] for points in streams.values())


def test_a_stream_outlasting_the_sum_is_not_the_flow() -> None:
    """The sum's closing record ends at 5.42 s, one stream's at 5.54 s: the bin after 5 s
    is the stream's alone, and is not drawn as the flow's 11.8 Mbit/s (measured so)."""
    closing = [_interval(4.0, 5.42, 39.8, None), _interval(4.0, 5.54, 11.8, 4),
               _interval(4.0, 5.26, 9.9, 3)]
    full = [_interval(s, s + 1.0, 38.0, None) for s in (0.0, 1.0, 2.0, 3.0)]
    result = attrs.evolve(sample_result(streams=4), intervals=(*full, *closing))
    series = throughput_series(result, "client_to_server")
    assert [t for t, _ in series] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert min(v for _, v in series) >= 38 * MBIT


def test_a_long_interval_fills_the_bins_it_covers_and_counts_once() -> None:
    samples = [_interval(0.0, 1.0, 40.0, None, retransmits=2),
               _interval(1.0, 2.0, 40.0, None, retransmits=2),
               _interval(2.0, 4.0, 30.0, None, retransmits=10)]
    bins = time_grid(samples, 1.0)
    assert sorted(bins) == [0, 1, 2, 3]
    assert [share for _, share in bins[3]] == [0.5]
    result = attrs.evolve(sample_result(), intervals=tuple(
        attrs.evolve(s, role="sender") for s in samples))
    assert retransmit_series(result, "client_to_server") == [(1.0, 2.0), (2.0, 2.0),
                                                             (3.0, 5.0), (4.0, 5.0)]


def test_gaps_where_nothing_was_measured() -> None:
    """A bufferbloat run's download: measured in its phase and in ``both``, nothing in
    the upload between them: the line breaks there."""
    points = [(1.0, 40.0), (2.0, 41.0), (6.0, 39.0), (7.0, 40.0)]
    gapped = with_gaps(points)
    assert gapped == [(1.0, 40.0), (2.0, 41.0), (4.0, None), (6.0, 39.0), (7.0, 40.0)]
    assert with_gaps(points[:2]) == points[:2]
    assert with_gaps([]) == []


def test_intervals_half_a_bin_off_the_grid_each_fill_one_bin() -> None:
    """A bufferbloat phase whose test began 1.5 s into the probes' clock: its 1 s
    intervals straddle two bins half and half; each is one point, not two."""
    samples = [_interval(1.5 + k, 2.5 + k, 40.0 + k, None) for k in range(3)]
    bins = time_grid(samples, 1.0)
    assert sorted(bins) == [2, 3, 4]
    assert [[s.bits_per_second / MBIT for s, _ in bins[k]] for k in (2, 3, 4)] == [
        [40.0], [41.0], [42.0]]
