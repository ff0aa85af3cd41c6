"""``-O`` as iperf3 has it: the warm-up comes before ``-t``, not out of it, and the summary
covers the ``-t`` seconds after it; a warm-up that leaves nothing to summarise is an error,
never a summary of a few milliseconds. Real native tests on loopback, in-process."""
from __future__ import annotations

import contextlib
import fcntl
import socket
import struct
import termios
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from netprobe.convert import from_json
from netprobe.schema import TestSpec
from tests.test_cli import assert_one_error_line, builtin_registry, needs_native, run_main


def test_planned_time_is_warm_up_plus_duration() -> None:
    assert TestSpec(duration_s=2.0, omit_s=1.0).planned_s() == 3.0
    assert TestSpec(duration_s=None, bytes_total=1000, omit_s=1.0).planned_s() is None


@needs_native
@pytest.mark.parametrize("protocol", [[], ["-u", "-b", "50M"]])
def test_omit_is_added_to_the_duration(capsys: pytest.CaptureFixture[str],
                                       protocol: list[str]) -> None:
    code, out, err = run_main(capsys, "run", "-t", "1", "-O", "1", "-i", "0.5", *protocol,
                              "--json", registry=builtin_registry())
    assert code == 0, err
    result = from_json(out)
    [flow] = result.summaries
    for side in (flow.sender, flow.receiver):
        assert side is not None
        assert side.start_s == pytest.approx(1.0, abs=0.05)
        assert side.end_s - side.start_s == pytest.approx(1.0, abs=0.15)  # was ~0
        assert side.bits_per_second == pytest.approx(side.bytes * 8 / (side.end_s -
                                                                        side.start_s))
    warm = [i for i in result.intervals if i.omitted and i.stream_id is None]
    # The sender's clock says when -t ended (a UDP receiver's loop runs on to drain).
    measured = [i for i in result.intervals if not i.omitted and i.role == "sender"]
    assert warm and all(i.end_s <= 1.0 + 1e-6 for i in warm)
    assert max(i.end_s for i in measured) == pytest.approx(2.0, abs=0.15)


@needs_native
def test_warm_up_longer_than_a_byte_count_is_an_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "run", "-n", "64k", "-O", "2", "--json",
                              registry=builtin_registry())
    assert code == 5
    assert_one_error_line(err)
    assert "warm-up" in err
    assert from_json(out).status == "failed"


def _queued(sock: socket.socket) -> int:
    """The bytes waiting unread on ``sock``, asked of the kernel here (not through the
    code under test)."""
    return int(struct.unpack("=i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0])


@contextlib.contextmanager
def _arrived_unread(count: int) -> Iterator[socket.socket]:
    """The receiving end of a loopback TCP connection with ``count`` bytes arrived and
    none read."""
    listener = socket.create_server(("127.0.0.1", 0))
    sender = socket.create_connection(listener.getsockname())
    receiving, _ = listener.accept()
    try:
        sender.sendall(b"x" * count)
        for _ in range(200):  # bounded: loopback delivers within microseconds
            if _queued(receiving) == count:
                break
            time.sleep(0.005)
        yield receiving
    finally:
        for sock in (sender, receiving, listener):
            sock.close()


def test_a_tcp_receivers_warm_up_boundary_counts_what_arrived_not_what_was_read() -> None:
    """Bytes that reached the receiving socket before the warm-up's end belong to the
    warm-up, read or not: counted after it (a receive loop waits for ~1 MiB before it
    reads), they made the receiver's summary read above the wire (issue 34 item 6)."""
    from netprobe.engine.side import LocalStream, Side

    with _arrived_unread(50_000) as receiving:
        stream = LocalStream(1, "client_to_server", "receiver", receiving)
        side = Side(TestSpec(duration_s=1.0, omit_s=0.5), [stream], lambda sample: None)
        side._tick(0.0, 0.5, emit=False)  # the sampler's tick at the warm-up's end
        # Nothing was read (the loop's counter is 0), yet all of it arrived in the warm-up.
        assert stream.counters.bytes == 0
        assert stream.base.bytes == 50_000
        assert stream.last.bytes == 50_000  # the first measured interval starts there


@needs_native
@pytest.mark.parametrize("reverse", [[], ["-R"]])
def test_both_ends_summaries_start_at_the_same_byte(capsys: pytest.CaptureFixture[str],
                                                   reverse: list[str]) -> None:
    """One warm-up boundary for both ends of a TCP stream (issue 34 item 6): the bytes the
    sender wrote in its warm-up but the receiver had not yet received at its own clock's
    boundary (the sender's socket queue) were counted in the sender's warm-up and after the
    receiver's. The receiver now starts after the sender's boundary byte, no earlier than
    its own boundary's clock allows."""
    code, out, err = run_main(capsys, "run", "-t", "1", "-O", "0.5", *reverse, "--json",
                              registry=builtin_registry())
    assert code == 0, err
    [flow] = from_json(out).summaries
    assert flow.sender is not None and flow.receiver is not None
    assert flow.receiver.bytes == flow.sender.bytes
    # It starts where that byte arrived: after the start, within the test.
    assert 0.0 < flow.receiver.start_s < flow.receiver.end_s


def test_a_boundary_beyond_what_arrived_leaves_the_receivers_own() -> None:
    """A peer's boundary byte beyond what the receiver ever got cannot be: the receiver
    keeps its own clock's boundary and its own base, never a negative count."""
    import socket

    from netprobe.engine.side import LocalStream, Side

    left, right = socket.socketpair()
    try:
        stream = LocalStream(1, "client_to_server", "receiver", right)
        side = Side(TestSpec(duration_s=1.0, omit_s=0.5), [stream], lambda sample: None)
        side.shared_boundary = True
        stream.through.append((1.0, 0))
        side.peer_boundary({(1, "client_to_server"): 10_000})
        assert stream.boundary_bytes == 10_000
        assert side.shared_start(stream) is None
        [(_, summary)] = side.stream_summaries()
        assert summary.bytes == 0 and summary.start_s == 0.5
        side.peer_boundary({(1, "client_to_server"): 0})  # the first word stands
        assert stream.boundary_bytes == 10_000
    finally:
        left.close()
        right.close()


class _Unaware:
    """The protocol module as an end that does not know the warm-up feature sees it."""

    WARM_UP_FEATURE = "not-this-feature"

    def __getattr__(self, name: str) -> object:
        from netprobe.engine import protocol

        return getattr(protocol, name)


@needs_native
@pytest.mark.parametrize("unaware", ["netprobe.engine.client", "netprobe.engine.nativetest"])
def test_an_end_without_the_warm_up_feature_is_never_sent_it(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        unaware: str) -> None:
    """An older client or server neither offers nor echoes ``warm_up_boundary``: it must
    get no ``warm-up`` message (it would fail the test as an unexpected one), and its
    peer's receivers keep their own boundary; both ways at once (--bidir)."""
    import importlib

    monkeypatch.setattr(importlib.import_module(unaware), "protocol", _Unaware())
    code, out, err = run_main(capsys, "run", "-t", "1", "-O", "0.5", "--bidir", "--json",
                              registry=builtin_registry())
    assert code == 0, err
    result = from_json(out)
    assert result.status == "ok" and not result.errors
    for flow in result.summaries:
        assert flow.sender is not None and flow.receiver is not None
        assert flow.receiver.start_s == 0.5  # its own clock's boundary
        assert flow.sender.bytes > 0 and flow.receiver.bytes > 0


def test_a_read_racing_the_count_is_never_counted_twice_in_the_intervals(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A TCP receiver's count is its loop's plus what waits unread; a read that lands
    between the two, each of the few times they are read, was counted twice, and the last
    intervals of a test, carrying too little to give the surplus back, summed above the
    summary (212 bytes on an emulated aarch64 run). The intervals now sum to the final
    count; a boundary's count (arrived_bytes) stays late, never early."""
    from netprobe.engine import side as side_module
    from netprobe.engine.side import LocalStream, Side

    # the receive loop's counts, read while it reads
    loop = SimpleNamespace(bytes=0, packets=0, messages=0, lost=0, out_of_order=0,
                           duplicates=0, jitter_ms=0.0)

    def racing(sock: socket.socket) -> int:
        """The queue's length, then the loop's next read: the race, every time."""
        waiting = _queued(sock)
        loop.bytes += len(sock.recv(100))
        return waiting

    with _arrived_unread(1000) as receiving:
        stream = LocalStream(1, "client_to_server", "receiver", receiving,
                             counters=loop)  # type: ignore[arg-type]
        seen: list = []
        side = Side(TestSpec(duration_s=1.0), [stream], seen.append)
        monkeypatch.setattr(side_module, "unread_bytes", racing)
        side._tick(0.0, 0.5, emit=True)
        assert stream.arrived_bytes() >= 1000  # late: a boundary's side
        monkeypatch.setattr(side_module, "unread_bytes", _queued)
        while _queued(receiving):  # the loop reads the rest; nothing more comes
            loop.bytes += len(receiving.recv(4096))
        side._tick(0.5, 1.0, emit=True)
        mine = [i.bytes for i in seen if i.stream_id == 1]
        assert loop.bytes == 1000
        assert sum(mine) == 1000, mine  # was [1100, 0]
