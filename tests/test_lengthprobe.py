"""The TCP call length a loop measures at its start (netprobe/engine/lengthprobe.py): the
rule that chooses, which tests it applies to, and the probe itself on real loopback
sockets, where every byte must still be counted once and a probe must never hold a loop
open past its peer or a stop."""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable

import pytest

from netprobe import core
from netprobe.engine import lengthprobe
from netprobe.engine.lengthprobe import LARGE_BYTES, SMALL_BYTES, Trial, choose
from netprobe.engine.side import buffer_bytes
from netprobe.schema import TestSpec


def _trial(length: int, bytes_: int, wall_s: float, cpu_s: float) -> Trial:
    return Trial(length, bytes_, wall_s, cpu_s)


@pytest.mark.parametrize(("small", "large", "chosen"), [
    # clearly faster: the larger (a CPU-bound pair on loopback)
    ((100, 1.0, 1.0), (130, 1.0, 1.0), LARGE_BYTES),
    # clearly slower: the smaller
    ((130, 1.0, 1.0), (100, 1.0, 1.0), SMALL_BYTES),
    # the same rate (a link is the limit), clearly cheaper per byte: the larger
    ((100, 1.0, 0.5), (101, 1.0, 0.3), LARGE_BYTES),
    # the same rate and about the same cost: the smaller buffer
    ((100, 1.0, 0.5), (102, 1.0, 0.49), SMALL_BYTES),
    # nothing moved at all (a peer that sends nothing): the smaller
    ((0, 1.0, 0.0), (0, 1.0, 0.0), SMALL_BYTES),
])
def test_the_rule_keeps_the_smaller_length_unless_the_larger_is_clearly_better(
    small: tuple, large: tuple, chosen: int
) -> None:
    assert choose(_trial(SMALL_BYTES, *small), _trial(LARGE_BYTES, *large)) == chosen


@pytest.mark.parametrize(("fields", "probed"), [
    ({}, True),
    ({"length_bytes": 65536}, False),  # -l: the user's length
    ({"rate_bits_per_second": 1e8}, False),  # paced: ~1 ms of data a call
    ({"bytes_total": 10 << 20, "duration_s": None}, False),  # -n: the count is exact
    ({"zerocopy": True}, False),
    ({"duration_s": 1.5}, False),  # the probe would be too much of the test
    ({"duration_s": 1.5, "omit_s": 1.0}, True),  # the warm-up is part of the run
    ({"protocol": "udp"}, False),
    ({"streams": lengthprobe.MOST_PROBED_STREAMS}, True),
    ({"streams": 128}, False),  # 128 MiB of large buffers a direction, for nothing
])
def test_which_tests_probe_their_length(fields: dict, probed: bool) -> None:
    spec = TestSpec(**{"host": "127.0.0.1", "duration_s": 5.0, **fields})
    assert lengthprobe.probed(spec) is probed
    # a server budgets the longest buffer a loop may take, and the probe's stay small
    assert buffer_bytes(spec, "receiver") >= (LARGE_BYTES if probed else 0)
    assert not probed or spec.streams * buffer_bytes(spec, "receiver") <= 16 << 20


def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    return client, server


def test_a_probed_pair_counts_every_byte_once_and_keeps_one_of_the_two_lengths() -> None:
    client, server = _pair()
    sent, got = core.Counters(), core.Counters()
    chosen: dict[str, int] = {}
    deadline = core.monotonic() + 1.0

    def receive() -> None:
        chosen["receiver"] = lengthprobe.run(
            lambda n, until: core.tcp_recv(server.fileno(), got, length=n, deadline=until),
            got, deadline + 5.0, receiver=True)

    reader = threading.Thread(target=receive)
    reader.start()
    try:
        chosen["sender"] = lengthprobe.run(
            lambda n, until: core.tcp_send(client.fileno(), sent, length=n, deadline=until),
            sent, deadline, receiver=False)
        client.shutdown(socket.SHUT_WR)
        reader.join(10.0)
        assert not reader.is_alive(), "the receiver did not end at the sender's close"
    finally:
        client.close()
        server.close()
    assert sent.bytes > 0 and got.bytes == sent.bytes  # nothing lost, nothing twice
    assert set(chosen.values()) <= {SMALL_BYTES, LARGE_BYTES}, chosen


def test_a_receiver_whose_peer_closes_without_sending_returns_at_once() -> None:
    client, server = _pair()
    client.close()  # the peer's FIN is all that comes
    got = core.Counters()
    started = time.monotonic()
    try:
        length = lengthprobe.run(
            lambda n, until: core.tcp_recv(server.fileno(), got, length=n, deadline=until),
            got, core.monotonic() + 30.0, receiver=True)
    finally:
        server.close()
    assert length == SMALL_BYTES and got.bytes == 0
    assert time.monotonic() - started < 5.0  # not the 10 s wait for data, nor the deadline


def test_a_stopped_sender_leaves_the_probe_within_a_tick() -> None:
    client, server = _pair()  # nobody reads: the sender blocks on a full buffer
    sent = core.Counters()
    timer = threading.Timer(0.02, sent.stop)
    timer.start()
    started = time.monotonic()
    try:
        lengthprobe.run(
            lambda n, until: core.tcp_send(client.fileno(), sent, length=n, deadline=until),
            sent, core.monotonic() + 30.0, receiver=False)
    finally:
        timer.cancel()
        client.close()
        server.close()
    assert time.monotonic() - started < 5.0  # the loops' 100 ms tick, not the 30 s deadline


def test_the_windows_judge_by_the_sides_sums_not_the_streams_own_figures() -> None:
    # With several streams the scheduler moves one stream's rate by more than the length
    # does, so a stream's windows read what all of its side's streams of its role moved:
    # here the stream itself moves nothing, and the side's sum says 1 MiB moved 30% more.
    moved = {"bytes": 0}
    lengths: list[int] = []

    def loop(length: int, until: float | None) -> None:
        lengths.append(length)
        if until is not None and len(lengths) <= len(lengthprobe.ORDER):
            time.sleep(max(0.0, until - core.monotonic()))
            moved["bytes"] += 130 if length == LARGE_BYTES else 100

    schedule = lengthprobe.Schedule(lambda: moved["bytes"], lambda: 0.0)
    chosen = lengthprobe.run(loop, core.Counters(), core.monotonic() + 5.0,
                             receiver=False, schedule=schedule)
    assert chosen == LARGE_BYTES == schedule.verdict
    assert lengths == [*lengthprobe.ORDER, LARGE_BYTES]  # A B B A, then the choice


def _streams_on_one_schedule(count: int, rate: Callable[[int], int],
                             ) -> tuple[list[int], list[int], int]:
    """Run ``count`` fake streams (threads) through one schedule. Each adds
    ``rate(length)`` to the side's sum every millisecond. Returns every stream's kept length,
    the lengths of every call, and how often the side's sums were read."""
    moved = {"bytes": 0}
    reads = {"count": 0}
    calls: list[int] = []
    lock = threading.Lock()

    def side_sum() -> int:
        reads["count"] += 1
        return moved["bytes"]

    schedule = lengthprobe.Schedule(side_sum, lambda: 0.0)
    kept: list[int] = []
    end = core.monotonic() + 1.0

    def stream() -> None:
        def loop(length: int, until: float | None) -> None:
            # Bytes come as time passes, as a real loop's do, so a window's end reads
            # what every stream moved in it, however late the scheduler wakes them.
            with lock:
                calls.append(length)
            if until is None or until >= end:
                return
            last = core.monotonic()
            while last < until:
                time.sleep(min(0.01, until - last))
                now = core.monotonic()
                with lock:
                    moved["bytes"] += round(rate(length) * (now - last) * 1000)
                last = now

        chosen = lengthprobe.run(loop, core.Counters(), end, receiver=False,
                                 schedule=schedule)
        with lock:
            kept.append(chosen)

    threads = [threading.Thread(target=stream) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10.0)
    assert not any(t.is_alive() for t in threads)
    return kept, calls, reads["count"]


@pytest.mark.parametrize("count", [1, 4, 32])
def test_a_side_reads_its_sums_once_a_window_whatever_its_stream_count(count: int) -> None:
    """Each stream reading the side's sums for itself was work growing with the square of
    the count (at -P 128 it held the interval sampler off); one schedule reads them once
    at the clock's start and once at each window's end."""
    kept, calls, reads = _streams_on_one_schedule(
        count, lambda n: 130 if n == LARGE_BYTES else 100)
    assert reads == len(lengthprobe.ORDER) + 1
    assert kept == [LARGE_BYTES] * count
    assert len(calls) <= count * (len(lengthprobe.ORDER) + 1)  # no window run twice


def test_streams_on_one_schedule_keep_one_verdict_at_the_threshold() -> None:
    """Near the threshold streams that judged their own windows chose apart (on an EPYC
    at -P 4, 2 of 4 kept 256K and 2 kept 1M); on one schedule all keep one length."""
    kept, _, _ = _streams_on_one_schedule(8, lambda n: 105 if n == LARGE_BYTES else 100)
    assert len(set(kept)) == 1, kept


def test_a_stream_that_leaves_its_windows_early_fixes_no_verdict() -> None:
    """A stream stopped in its first window asks for the length before the last window
    was read: it gets the smaller one, and the streams still probing decide later."""
    schedule = lengthprobe.Schedule(lambda: 0, lambda: 0.0)
    stopped = core.Counters()
    stopped.stop()
    assert lengthprobe.run(lambda n, until: None, stopped, None, receiver=False,
                           schedule=schedule) == SMALL_BYTES
    assert schedule.verdict is None
    small, large = schedule.trials()
    assert small.wall_s == large.wall_s == 0.0


def test_a_stream_joining_late_starts_at_the_window_the_clock_is_in() -> None:
    schedule = lengthprobe.Schedule(lambda: 0, lambda: 0.0)
    schedule.open()
    time.sleep(lengthprobe.WINDOW_S * 1.5)
    calls: list[int] = []

    def loop(length: int, until: float | None) -> None:
        calls.append(length)
        if until is not None:
            time.sleep(max(0.0, until - core.monotonic()))

    lengthprobe.run(loop, core.Counters(), core.monotonic() + 1.0, receiver=False,
                    schedule=schedule)
    windows = calls[:-1]  # then the verdict's call
    assert 0 < len(windows) < len(lengthprobe.ORDER)  # not from the first window
    assert windows == list(lengthprobe.ORDER[-len(windows):])  # the clock's, to its end
    assert schedule.verdict is not None


def test_a_side_gives_its_streams_of_one_role_one_schedule() -> None:
    """Side._probe is one object per role, so the verdict above is shared in a real run."""
    from netprobe.engine.side import Side
    side = Side(TestSpec(), [], lambda interval: None)
    assert side._probe("sender") is side._probe("sender")
    assert side._probe("sender") is not side._probe("receiver")
