"""netprobe.driven.tcpbytes: the kernel's byte counters of other processes' TCP
connections (sock_diag), checked on real loopback connections against the bytes sent."""

from __future__ import annotations

import socket
import threading

import pytest

from netprobe.driven import tcpbytes

pytestmark = pytest.mark.skipif(not tcpbytes.available(), reason="no sock_diag here (Linux)")


def test_sender_acked_and_receiver_received_bytes_count_what_was_sent() -> None:
    payload = b"x" * 3_000_000
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        sent = tcpbytes.TcpBytes(socket.AF_INET, [port], "sender")
        got = tcpbytes.TcpBytes(socket.AF_INET, [port], "receiver")
        with socket.create_connection(("127.0.0.1", port)) as client:
            peer, _ = server.accept()
            with peer:
                reader = threading.Thread(target=lambda: _drain(peer, len(payload)))
                reader.start()
                client.sendall(payload)
                reader.join(10)
                assert got.total() == len(payload)
                assert sent.total() == len(payload)
    # closed and gone from the kernel's table: the last values are kept
    assert sent.total() == got.total() == len(payload)


def test_other_ports_are_not_counted() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            peer, _ = server.accept()
            with peer:
                client.sendall(b"y" * 1000)
                _drain(peer, 1000)
                assert tcpbytes.TcpBytes(socket.AF_INET, [port + 1], "receiver").total() == 0


def _drain(sock: socket.socket, count: int) -> None:
    left = count
    while left > 0:
        chunk = sock.recv(min(left, 1 << 16))
        if not chunk:
            return
        left -= len(chunk)
