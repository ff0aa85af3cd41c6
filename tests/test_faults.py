"""Faults mid-test, with real processes: the server killed, the client interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from .servers import NETPROBE, free_port, netprobe_server, wait_listening


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    with netprobe_server() as running:
        yield running.proc, running.port


def start_client(port: int, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*NETPROBE, "run", "127.0.0.1", "-p", str(port), "--json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_first_interval(seconds: float = 2.5) -> None:
    time.sleep(seconds)  # a couple of 1-second intervals have been reported by then


@pytest.mark.parametrize("protocol", [[], ["-u", "-b", "200M"]])
def test_server_killed_mid_test(server, protocol: list) -> None:  # type: ignore[no-untyped-def]
    proc, port = server
    client = start_client(port, "-t", "30", *protocol)
    wait_first_interval()
    killed_at = time.monotonic()
    proc.kill()
    proc.wait(5)
    out, err = client.communicate(timeout=15)
    assert time.monotonic() - killed_at < 8, "the client must give up within a few seconds"
    assert client.returncode == 5, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    result = json.loads(out)
    assert result["status"] == "failed" and result["errors"]
    assert any(i["role"] == "sender" and i["bytes"] > 0 for i in result["intervals"])


def test_ctrl_c_keeps_the_partial_result_and_frees_the_server(server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    proc, port = server
    saved = tmp_path / "partial.json"
    client = start_client(port, "-t", "30", "-o", str(saved))
    wait_first_interval()
    client.send_signal(signal.SIGINT)
    out, err = client.communicate(timeout=15)
    assert client.returncode == 130, err
    assert "Traceback" not in err
    for document in (json.loads(out), json.loads(saved.read_text())):
        assert document["status"] == "interrupted"
        assert sum(i["bytes"] for i in document["intervals"] if i["role"] == "sender") > 0
    # The server is free again at once and still serves.
    again = subprocess.run(
        [*NETPROBE, "run", "127.0.0.1", "-p", str(port), "-t", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["status"] == "ok"
    assert proc.poll() is None


def test_one_off_server_exits_after_its_test() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [*NETPROBE, "server", "-1", "-B", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port)
        done = subprocess.run(
            [*NETPROBE, "run", "127.0.0.1", "-p", str(port), "-t", "1", "--json"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
