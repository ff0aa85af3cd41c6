"""A side's TCP receive loops share one wake budget (side.wake_bytes, np_tcp.c).

Run through a real Side over real loopback pairs: the wake threshold each receiving socket
gets (SO_RCVLOWAT) is read off the socket itself while paced flows come in.
"""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from netprobe import core
from netprobe.core.records import WAKE_BYTES
from netprobe.engine import side
from netprobe.engine.side import LocalStream, Side
from netprobe.schema import TestSpec

SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
RATE_BPS = 1e9  # 1.25 MB in 10 ms: the flow's own bound is above every share below


def test_the_budget_is_one_mebibyte_shared_by_the_sides_receivers() -> None:
    assert side.wake_bytes(1) == WAKE_BYTES == 1 << 20
    assert side.wake_bytes(4) == 256 << 10
    assert side.wake_bytes(0) == WAKE_BYTES  # a side with no receiver asks nothing of it
    assert side.wake_bytes(1 << 30) == 1  # never 0, which the core reads as "the default"


@contextlib.contextmanager
def _pairs(count: int) -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        pairs = []
        try:
            for _ in range(count):
                client = socket.create_connection(listener.getsockname(), timeout=5)
                server, _ = listener.accept()
                pairs.append((client, server))
            yield pairs
        finally:
            for client, server in pairs:
                client.close()
                server.close()


@pytest.mark.parametrize("receivers", [1, 4])
def test_each_receiving_socket_wakes_at_its_share(receivers: int) -> None:
    # 16 KiB reads: before the budget a loop woke at its read length, 16 KiB, whatever the
    # flow; now one receiver waits for 1 MiB and each of four for 256 KiB.
    with _pairs(receivers) as pairs:
        for _, server in pairs:
            try:  # a quarter of the buffer must not be the bound that decides
                server.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 2 << 20)
            except PermissionError:
                pytest.skip("SO_RCVBUFFORCE needs CAP_NET_ADMIN")
        spec = TestSpec(streams=receivers, length_bytes=16 << 10, duration_s=1.5,
                        interval_s=None)
        streams = [LocalStream(i + 1, "client_to_server", "receiver", server)
                   for i, (_, server) in enumerate(pairs)]
        receiving = Side(spec, streams, lambda interval: None)
        receiving.start()
        senders = [threading.Thread(target=_send, args=(client,)) for client, _ in pairs]
        for thread in senders:
            thread.start()
        seen = _thresholds([server for _, server in pairs], side.wake_bytes(receivers))
        for thread in senders:
            thread.join(10)
        assert receiving.wait(10)
    assert not receiving.errors()
    assert seen == [side.wake_bytes(receivers)] * receivers


def _send(client: socket.socket) -> None:
    core.tcp_send(client.fileno(), core.Counters(), length=64 << 10, rate_bps=RATE_BPS,
                  deadline=time.monotonic() + 1.0)
    client.shutdown(socket.SHUT_WR)


def _thresholds(socks: list[socket.socket], wanted: int) -> list[int]:
    """Each socket's SO_RCVLOWAT once all have reached ``wanted`` (or after 1.5 s)."""
    end = time.monotonic() + 1.5
    while True:
        seen = [s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) for s in socks]
        if all(v == wanted for v in seen) or time.monotonic() > end:
            return seen
        time.sleep(0.01)
