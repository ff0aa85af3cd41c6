"""When the port a native test reaches is not a netprobe server, the client says what is
there: HTTP (or other text), an iperf3 server, or nothing at all. Real servers on
loopback: Python's HTTP server and the iperf3 binaries."""
from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time

import pytest

from netprobe.driven import is_listening
from netprobe.engine.greeting import connect_failure, not_netprobe
from tests.servers import free_port
from tests.test_cli import assert_one_error_line, builtin_registry, needs_native, run_main

IPERF3 = [path for path in ("/usr/bin/iperf3",
                            "/root/.cache/netprobe-peers/bin/iperf3") if shutil.which(path)]


def _answer_like_a_web_server(listener: socket.socket) -> None:
    # What nginx and others do with bytes that are no request: 400 at once, then close.
    conn, _ = listener.accept()
    with conn:
        conn.recv(64)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


@needs_native
def test_http_server_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        thread = threading.Thread(target=_answer_like_a_web_server, args=(listener,),
                                  daemon=True)
        thread.start()
        code, _, err = run_main(capsys, "run", "127.0.0.1", "-p", str(port), "-t", "1",
                                registry=builtin_registry())
        thread.join(5)
    assert code == 5
    assert_one_error_line(err)
    assert f"127.0.0.1:{port} is not a netprobe server (it answered like HTTP)" in err, err


def _wait_either_family(port: int, timeout: float = 20.0) -> None:
    # iperf3 listens on both families through one IPv6 socket (or IPv4 only without v6).
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if is_listening(port, socket.AF_INET6) or is_listening(port, socket.AF_INET):
            return
        time.sleep(0.05)
    raise AssertionError(f"iperf3 does not listen on port {port}")


@needs_native
@pytest.mark.skipif(not IPERF3, reason="no iperf3 binary installed")
@pytest.mark.parametrize("binary", IPERF3)
def test_iperf3_server_is_named(capsys: pytest.CaptureFixture[str], binary: str) -> None:
    port = free_port()
    server = subprocess.Popen([binary, "-s", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_either_family(port)
        code, _, err = run_main(capsys, "run", "127.0.0.1", "-p", str(port), "-t", "1",
                                registry=builtin_registry())
    finally:
        server.kill()
        server.wait(5)
    assert code == 5
    assert_one_error_line(err)
    assert "is an iperf3 server" in err and "--tool iperf3" in err, err


def test_filtered_port_and_text_messages() -> None:
    assert connect_failure("h", 5301, socket.timeout("timed out"), 5.0) == (
        "no answer from h:5301 within 5 s (a firewall that drops the connection, or a host "
        "that is down)")
    refused = connect_failure("h", 5301, ConnectionRefusedError(111, "Connection refused"), 5)
    assert refused.endswith("Connection refused")
    assert "like SSH" in str(not_netprobe("h", 22, b"SSH-"))
    assert not_netprobe("h", 1, b"\x00\x00\x00\x40") is None  # a netprobe frame length
