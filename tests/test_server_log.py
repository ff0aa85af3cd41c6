"""``netprobe server`` as a service: one event per line with a UTC timestamp (text or JSON),
control characters from clients escaped, ``--logfile``, ``--pidfile``, refusals logged with
their reason and told to the client, and no false warning after a good test.

Real server processes on loopback (and, for the false warning, across a veth pair, where
the timing that caused it happens on every test)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from netprobe.engine.log import EventLog, Throttle, escape
from tests.netlab import B_ADDR, Lab, shaped_pair, wait_listening
from tests.servers import NETPROBE, free_port
from tests.servers import wait_listening as wait_port
from tests.test_cli import assert_one_error_line, child_env, needs_native

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")


def test_escape_keeps_a_client_from_forging_lines_or_escapes() -> None:
    text = escape("evil\n2026-01-01T00:00:00Z accepted 1.2.3.4\x1b[2J\x07", limit=1000)
    assert "\n" not in text and "\x1b" not in text and "\x07" not in text
    assert "\\n" in text and "\\x1b" in text and "\\x07" in text
    assert escape("x" * 1000, limit=10) == "x" * 10 + "... (990 more characters)"


def test_event_log_text_and_json_lines() -> None:
    lines: list[str] = []
    EventLog(lines.append)("1.2.3.4:5: hello\r\n", event="accepted", client="1.2.3.4:5")
    EventLog(lines.append, "json")("busy", event="refused", client="a\nb", reason="busy")
    assert ISO.match(lines[0]) and lines[0].endswith(" accepted 1.2.3.4:5: hello\\r\\n")
    record = json.loads(lines[1])
    assert record["event"] == "refused" and record["reason"] == "busy"
    assert record["client"] == "a\\nb" and record["time"].endswith("Z")


def _server(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([*NETPROBE, "server", "-B", "127.0.0.1", "-p", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env())
    wait_port(port)
    return proc, port


def _stop(proc: subprocess.Popen) -> str:
    # 30 s: a CI run with other tests beside it once saw a server take more than 10 s to
    # exit after SIGINT (it exits in 0.01-0.03 s here, with three CPU hogs beside it too).
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    return out


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@needs_native
def test_logfile_json_and_pidfile(tmp_path: Path) -> None:
    log, pid = tmp_path / "server.log", tmp_path / "server.pid"
    proc, port = _server(tmp_path, "--logfile", str(log), "--log-format", "json",
                         "--pidfile", str(pid))
    try:
        deadline = time.monotonic() + 10
        while not pid.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid.read_text().strip() == str(proc.pid)
        done = subprocess.run([*NETPROBE, "run", "127.0.0.1", "-p", str(port), "-t", "1",
                               "-q"], capture_output=True, text=True, timeout=60,
                              env=child_env())
        assert done.returncode == 0, done.stderr
        again = subprocess.run([*NETPROBE, "server", "-p", "0", "--pidfile", str(pid)],
                               capture_output=True, text=True, timeout=60, env=child_env())
        assert again.returncode == 2 and str(proc.pid) in again.stderr
        assert_one_error_line(again.stderr)
    finally:
        out = _stop(proc)
    assert out == ""  # every line went to the log file
    assert not pid.exists()
    events = _events(log)
    kinds = [e["event"] for e in events]
    assert kinds[:4] == ["listening", "accepted", "test", "test-end"], kinds
    assert kinds[-1] == "stopped"
    test, end = events[2], events[3]
    assert test["tool"] == "native" and test["spec"] == "tcp normal x1 1 s"
    assert test["client"].startswith("127.0.0.1:")
    assert end["status"] == "ok" and "received" in end["measured"]
    assert all(e["time"].endswith("Z") for e in events)


@needs_native
def test_acl_refusal_is_logged_and_told_to_the_client(tmp_path: Path) -> None:
    proc, port = _server(tmp_path, "--allow", "192.0.2.0/24")
    try:
        done = subprocess.run([*NETPROBE, "run", "127.0.0.1", "-p", str(port), "-t", "1",
                               "--json"], capture_output=True, text=True, timeout=60,
                              env=child_env())
    finally:
        out = _stop(proc)
    assert done.returncode == 5
    assert "does not accept tests from 127.0.0.1" in done.stderr, done.stderr
    refused = [line for line in out.splitlines() if " refused " in line]
    assert len(refused) == 1 and "--allow" in refused[0] and ISO.match(refused[0])


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.skipif(bool(Lab.available()), reason=str(Lab.available()))
@needs_native
def test_no_false_warning_after_good_tests_over_veth(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with shaped_pair(100) as (lab, a, b):
        server = lab.start(b, [*NETPROBE, "server", "-B", B_ADDR, "--logfile", str(log)],
                           env={**os.environ, **child_env()})
        wait_listening(lab, b, 5301)
        for _ in range(2):
            done = lab.run(a, [*NETPROBE, "run", B_ADDR, "-t", "1", "-q"], timeout=60)
            assert done.returncode == 0, done.stderr
        lab.stop(server)
    text = log.read_text()
    assert text.count(" test-end ") == 2, text
    assert "unexpected" not in text and "failed" not in text, text


def test_the_line_throttle_holds_in_any_second_not_only_whole_ones() -> None:
    # A reader counts lines by the log's clock seconds, which need not line up with the
    # throttle's: ten events at 0.50-0.95 s and ten at 1.00-1.45 s once all passed (twenty
    # in one second of the log). Any window of a second must hold at most the limit.
    now = [0.0]
    throttle = Throttle(10, clock=lambda: now[0])
    passed, told = [], 0
    for i in range(40):
        now[0] = 0.5 + i * 0.05
        held = throttle.take()
        if held is not None:
            passed.append(now[0])
            told += held
    assert passed
    for start in passed:
        assert sum(1 for t in passed if start <= t < start + 1.0) <= 10, passed
    # what was held back is counted on the next line that passes: every event accounted
    now[0] = 10.0
    assert told + (throttle.take() or 0) == 40 - len(passed)
