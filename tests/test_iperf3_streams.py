"""The iperf3 server's TCP data loop (engine/iperf3/streams.py) on a real socket pair."""

from __future__ import annotations

import socket
import time

from netprobe.engine.iperf3.streams import Stream


def _until(predicate, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_a_receiver_counts_nothing_read_after_the_test_end() -> None:
    """What a receiver drains after TEST_END is not the test's: the test's time ends at
    TEST_END, and a stock server stops counting there. Counted, the data still queued in
    the client's send buffer and on the path (on a 100 Mbit/s tbf link: ~1 MB, 3 % of a
    3 s test) made the server's figure exceed what the link can carry (96.6 Mbit/s of
    TCP payload on a link whose ceiling is 94.15)."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        stream = Stream(ours, 1, sending=False, length=65536, rate_bps=0)
        stream.start()
        theirs.sendall(b"x" * 100_000)
        assert _until(lambda: stream.bytes == 100_000), stream.bytes
        stream.stop.set()  # TEST_END read on the control connection
        theirs.sendall(b"y" * 50_000)  # in flight when the test ended
        time.sleep(0.1)
        stream.finish()
        assert stream.counted == 100_000
