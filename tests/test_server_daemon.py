"""``netprobe server`` as a daemon: logrotate's SIGHUP, a line for every refusal and every
connection that closed unheard, reasons that say which limit, and a start line that says
what this process enforces."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.servers import NETPROBE, free_port, wait_listening


def _start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, int, Path, Path]:
    port = free_port()
    log, pid = tmp_path / "server.log", tmp_path / "server.pid"
    proc = subprocess.Popen([*NETPROBE, "server", "-B", "127.0.0.1", "-p", str(port),
                             "--logfile", str(log), "--pidfile", str(pid), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_listening(port)
    return proc, port, log, pid


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(10)


def _wait_for(path: Path, text: str, timeout: float = 10.0) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        seen = path.read_text() if path.exists() else ""
        if text in seen:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never reached {path}: {seen[-1500:]}")


def _client(port: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*NETPROBE, "run", "127.0.0.1", "-p", str(port), "-t", "0.3",
                           *args], capture_output=True, text=True, timeout=60)


def test_sighup_reopens_the_log_after_logrotate_moved_it(tmp_path: Path) -> None:
    # SIGHUP killed the server silently and left its pidfile behind.
    proc, port, log, pid = _start(tmp_path)
    try:
        _wait_for(log, "listening")
        rotated = tmp_path / "server.log.1"
        os.rename(log, rotated)
        proc.send_signal(signal.SIGHUP)
        _wait_for(log, "reopened")
        assert proc.poll() is None and pid.exists()
        assert _client(port).returncode == 0
        fresh = _wait_for(log, "test-end")
        assert "listening" not in fresh and "listening" in rotated.read_text()
    finally:
        _stop(proc)
    assert not pid.exists()


def test_the_start_line_says_what_this_server_enforces(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret-of-the-fleet\n")
    proc, _, log, _ = _start(tmp_path, "--max-rate", "50M", "--max-streams", "4",
                             "--allow", "127.0.0.0/8", "--secret-file", str(secret))
    try:
        line = next(x for x in _wait_for(log, "listening").splitlines() if "listening" in x)
    finally:
        _stop(proc)
    assert "netprobe 0." in line and "rate 50 Mbit/s in all" in line
    assert "streams 4" in line and "clients: 127.0.0.0/8" in line
    assert "shared secret: required" in line and "third-party tests: off" in line
    assert "s3cret" not in line


def test_scans_and_refusals_are_logged_with_their_reasons(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret-of-the-fleet\n")
    proc, port, log, _ = _start(tmp_path, "--max-streams", "2", "--secret-file", str(secret))
    try:
        with socket.create_connection(("127.0.0.1", port)):
            pass  # a port scan's connect-and-close
        _wait_for(log, "closed before its hello")
        no_secret = _client(port)
        assert no_secret.returncode != 0
        text = _wait_for(log, "no shared secret")
        assert "connection closed by peer" not in text.split("no shared secret")[0][-300:]
        over = _client(port, "-P", "3", "--secret-file", str(secret))
        assert over.returncode != 0
        text = _wait_for(log, "streams exceed")
    finally:
        _stop(proc)
    lines = text.splitlines()
    closed = [x for x in lines if " closed " in x and "closed before its hello" in x]
    auth = [x for x in lines if "no shared secret" in x]
    limit = [x for x in lines if "streams exceed" in x]
    assert closed and auth and limit
    assert all(" refused " in x for x in auth + limit)


def test_json_log_names_the_reason_of_a_limit(tmp_path: Path) -> None:
    import json

    proc, port, log, _ = _start(tmp_path, "--log-format", "json", "--max-rate", "50M")
    try:
        assert _client(port, "-u", "-b", "200M").returncode != 0
        _wait_for(log, "exceeds")
    finally:
        _stop(proc)
    records = [json.loads(x) for x in log.read_text().splitlines()]
    (refusal,) = [r for r in records if r["event"] == "refused"]
    assert refusal["reason"] == "limit"
    assert "e+0" not in refusal["message"] and "Mbit/s" in refusal["message"]


def test_a_flood_of_connect_and_close_is_logged_at_a_bounded_rate(tmp_path: Path) -> None:
    # At most CLOSED_LINES_PER_S lines a second, and every connection accounted for: the
    # lines, the counts they say were held back, and the refusals (however fast this host
    # accepts: an emulated one may never reach the limit).
    import re

    from netprobe.engine.server import CLOSED_LINES_PER_S

    flood = 200
    proc, port, log, _ = _start(tmp_path)
    try:
        for _ in range(flood):
            with socket.create_connection(("127.0.0.1", port)):
                pass
        _wait_for(log, "closed before its hello")
        time.sleep(1.1)  # a new second: the next close is logged with what was held back
        with socket.create_connection(("127.0.0.1", port)):
            flood += 1
        end = time.monotonic() + 20
        while time.monotonic() < end:
            text = log.read_text()
            closed = [x for x in text.splitlines() if x.split()[1:2] == ["closed"]]
            held = sum(int(n) for n in re.findall(r"\((\d+) more such lines", text))
            # past --max-connections-per-address a connection is refused (its own line)
            refused = [x for x in text.splitlines() if x.split()[1:2] == ["refused"]]
            if len(closed) + held + len(refused) >= flood:
                break
            time.sleep(0.2)
    finally:
        _stop(proc)
    per_second: dict[str, int] = {}
    for line in closed:
        per_second[line[:19]] = per_second.get(line[:19], 0) + 1  # the timestamp's second
    assert max(per_second.values()) <= CLOSED_LINES_PER_S, per_second
    assert len(closed) + held + len(refused) == flood, (len(closed), held, len(refused), flood)


def _accounted(text: str, event: str) -> tuple[int, dict[str, int]]:
    """Lines of ``event`` plus the counts they say were held back; lines per second."""
    import re

    lines = [x for x in text.splitlines() if x.split()[1:2] == [event]]
    held = sum(int(n) for x in lines for n in re.findall(r"\((\d+) more such lines", x))
    per_second: dict[str, int] = {}
    for line in lines:
        per_second[line[:19]] = per_second.get(line[:19], 0) + 1
    return len(lines) + held, per_second


def _knock(port: int, iperf3: bool) -> None:
    """Connect, say hello (an iperf3 cookie, else nothing), wait for the answer, close."""
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(5)
        with contextlib.suppress(OSError):
            if iperf3:
                conn.sendall(b"c" * 36 + b"\0")
            conn.recv(256)  # the refusal (or the close) has come


@pytest.mark.parametrize("case", ["acl", "per-address", "iperf3-acl", "iperf3-per-address"])
def test_a_flood_of_refused_connections_is_logged_at_a_bounded_rate(tmp_path: Path,
                                                                    case: str) -> None:
    # Refusals before any hello (the allow-list, the per-address limit) are lines too: a
    # flood of them from one address wrote one line each (a disk filled at the rate of
    # connects). At most CLOSED_LINES_PER_S a second, every refusal still accounted for.
    from netprobe.engine.server import CLOSED_LINES_PER_S

    iperf3 = case.startswith("iperf3")
    extra = ["--allow", "192.0.2.0/24"] if case.endswith("acl") else [
        "--max-connections-per-address", "2"]
    if iperf3:
        extra += ["--iperf3", "--iperf3-port", str(free_port())]
    proc, port, log, _ = _start(tmp_path, *extra)
    if iperf3:
        port = int(extra[-1])
        wait_listening(port)
    held_open: list[socket.socket] = []
    flood = 120
    try:
        if case.endswith("per-address"):
            held_open = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        _wait_for(log, "listening")
        before, _ = _accounted(log.read_text(), "refused")
        for _ in range(flood):
            _knock(port, iperf3)
        end = time.monotonic() + 20
        time.sleep(1.1)  # a new second: the next refusal says what was held back
        _knock(port, iperf3)
        flood += 1
        while time.monotonic() < end:
            count, per_second = _accounted(log.read_text(), "refused")
            if count - before >= flood:
                break
            time.sleep(0.2)
    finally:
        for conn in held_open:
            conn.close()
        _stop(proc)
    count, per_second = _accounted(log.read_text(), "refused")
    assert max(per_second.values()) <= CLOSED_LINES_PER_S, per_second
    # Exactly the flood, or one more: wait_listening's own connect to a port that refuses
    # 127.0.0.1 may be logged after ``before`` was read.
    assert flood <= count - before <= flood + 1, (count, before, flood)
