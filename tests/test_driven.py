"""netprobe.driven on real subprocesses: output capture, live lines, stopping whole groups."""

from __future__ import annotations

import os
import socket
import stat
import sys
import threading

import pytest

from netprobe.driven import (
    DrivenProcess,
    find_binary,
    free_port,
    free_port_block,
    is_local_host,
    run_once,
    wait_port,
)
from netprobe.errors import ToolUnavailable


def _alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):  # gone, or reaped between the open and the read (ESRCH)
        return False
    return state != "Z"


def test_lines_text_and_exit_code() -> None:
    seen: list[str] = []
    proc = DrivenProcess(["sh", "-c", "echo one; echo two >&2; exit 3"], on_line=seen.append)
    with proc:
        assert proc.wait(10) == 3
    assert seen == ["one", "two"]
    assert proc.text == "one\ntwo\n"
    raw = proc.raw()
    assert raw.name == "client"
    assert raw.exit_code == 3
    assert raw.command == ("sh", "-c", "echo one; echo two >&2; exit 3")


def test_last_line_without_newline_is_kept() -> None:
    seen: list[str] = []
    proc = DrivenProcess(["printf", "a\\nb"], on_line=seen.append).start()
    assert proc.wait(10) == 0
    assert seen == ["a", "b"]


def test_on_line_is_called_live_before_exit() -> None:
    got_first = threading.Event()

    def on_line(line: str) -> None:
        if line == "first":
            got_first.set()

    # The child waits for a file that the test creates only after it has seen "first".
    flag = f"/tmp/netprobe-driven-{os.getpid()}"
    script = (
        f"echo first; i=0; while [ ! -e {flag} ] && [ $i -lt 500 ]; do sleep 0.02; "
        f"i=$((i+1)); done; echo second"
    )
    proc = DrivenProcess(["sh", "-c", script], on_line=on_line).start()
    try:
        assert got_first.wait(10)
        assert proc.returncode is None  # still running: the line came live
        open(flag, "w").close()
        assert proc.wait(10) == 0
        assert "second" in proc.lines
    finally:
        proc.stop()
        if os.path.exists(flag):
            os.unlink(flag)


def test_large_output_does_not_block() -> None:
    # 1 MiB + a bit, far more than a 64 KiB pipe buffer; without a reader the child blocks.
    code = "import sys\nfor i in range(16400): sys.stdout.write('x' * 63 + '\\n')\n"
    proc = DrivenProcess([sys.executable, "-c", code]).start()
    try:
        assert proc.wait(30) == 0
    finally:
        proc.stop()
    assert len(proc.text) == 16400 * 64
    assert len(proc.lines) == 16400


def test_stop_kills_process_ignoring_signals() -> None:
    script = "trap '' INT TERM; echo ready; while true; do sleep 0.1; done"
    proc = DrivenProcess(["sh", "-c", script]).start()
    assert proc.wait_for_line(lambda line: line == "ready", 10)
    code = proc.stop(grace_s=0.2)
    assert code == -9
    assert not _alive(proc.pid)
    assert proc.stop() == -9  # idempotent


def test_stop_kills_grandchild() -> None:
    script = "sleep 300 & echo child=$!; wait"
    proc = DrivenProcess(["sh", "-c", script]).start()
    assert proc.wait_for_line(lambda line: line.startswith("child="), 10)
    child = int(proc.lines[0].split("=")[1])
    assert _alive(child)
    proc.stop(grace_s=0.5)
    assert not _alive(child)


def test_stop_reaches_leftovers_after_leader_exited() -> None:
    # The leader exits at once; its background child stays in the group until stop().
    proc = DrivenProcess(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo child=$!"]).start()
    assert proc.wait(10) == 0
    child = int(proc.lines[0].split("=")[1])
    assert _alive(child)
    assert proc.stop(grace_s=0.5) == 0
    assert not _alive(child)


def test_wait_timeout_does_not_kill() -> None:
    proc = DrivenProcess(["sleep", "30"]).start()
    try:
        assert proc.wait(0.1) is None
        assert _alive(proc.pid)
    finally:
        proc.stop(grace_s=0.5)
    assert not _alive(proc.pid)


def test_wait_for_line_false_when_output_ends() -> None:
    proc = DrivenProcess(["sh", "-c", "echo nothing"]).start()
    assert not proc.wait_for_line(lambda line: line == "never", 10)
    proc.stop()


def test_on_line_error_is_kept_and_reading_continues() -> None:
    def broken(line: str) -> None:
        raise ValueError(line)

    proc = DrivenProcess(["sh", "-c", "echo a; echo b"], on_line=broken).start()
    assert proc.wait(10) == 0
    assert isinstance(proc.callback_error, ValueError)
    assert proc.lines == ["a", "b"]


def test_start_missing_binary_raises_tool_unavailable() -> None:
    with pytest.raises(ToolUnavailable, match="/nonexistent/tool"):
        DrivenProcess(["/nonexistent/tool"]).start()


def test_run_once() -> None:
    assert run_once(["sh", "-c", "echo v1.2 >&2; exit 1"], 10) == (1, "v1.2\n")
    with pytest.raises(ToolUnavailable, match="did not finish"):
        run_once(["sleep", "30"], 0.2)


def test_find_binary_order(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    tool = tmp_path / "mytool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    other = tmp_path / "other"
    other.write_text("#!/bin/sh\n")
    other.chmod(other.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("NETPROBE_TEST_TOOL", raising=False)
    assert find_binary("mytool") == str(tool)
    monkeypatch.setenv("NETPROBE_TEST_TOOL", str(other))
    assert find_binary("mytool", env_var="NETPROBE_TEST_TOOL") == str(other)
    assert find_binary("mytool", override=str(tool), env_var="NETPROBE_TEST_TOOL") == str(tool)
    assert find_binary("mytool", override=str(tmp_path / "missing")) is None
    assert find_binary("absent-tool") is None


def test_free_port_and_wait_port() -> None:
    port = free_port()
    assert not wait_port("127.0.0.1", port, 0.2)
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        assert wait_port("127.0.0.1", port, 5)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", free_port(kind=socket.SOCK_DGRAM)))


def test_free_ports_are_never_ones_the_kernel_hands_to_outgoing_connections() -> None:
    # A port from bind(0) is an ephemeral port: any connect() on the machine (the tool's
    # own client, another test) may be given it between the choice and the server's bind,
    # and the server then fails with "Address already in use" (seen in CI: nuttcp -r).
    # Ports chosen outside the kernel's ephemeral range are never handed out that way.
    with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
        low, high = (int(word) for word in handle.read().split())
    chosen = [free_port() for _ in range(20)] + [free_port(socket.AF_INET6)]
    chosen += [free_port_block(4, below=1) for _ in range(5)]
    inside = [port for port in chosen if low <= port <= high]
    assert inside == [], f"ports inside the ephemeral range {low}-{high}: {inside}"
    assert all(1024 <= port <= 65535 for port in chosen)
    assert len(set(chosen)) > 1  # not one fixed port


def test_is_local_host() -> None:
    assert is_local_host(None)
    assert is_local_host("localhost")
    assert is_local_host("127.0.0.1")
    assert is_local_host("127.3.2.1")
    assert is_local_host("::1")
    assert is_local_host("[::1]")
    assert not is_local_host("192.0.2.1")  # TEST-NET-1, never assigned here
    assert not is_local_host("no-such-host.invalid")
