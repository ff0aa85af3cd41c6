"""``netprobe server --pidfile``: made as daemons make it, without following a link and
without clobbering (issue 33 item 7). Real server processes on loopback."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.servers import NETPROBE, free_port
from tests.servers import wait_listening as wait_port
from tests.test_cli import assert_one_error_line, child_env, needs_native


def _server(pid: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([*NETPROBE, "server", "-B", "127.0.0.1", "-p", str(port),
                             "--pidfile", str(pid)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env())
    return proc, port


def _stop(proc: subprocess.Popen) -> tuple[str, str]:
    proc.send_signal(signal.SIGINT)
    return proc.communicate(timeout=30)


def _refused(pid: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*NETPROBE, "server", "-B", "127.0.0.1", "-p", "0", "-1",
                           "--pidfile", str(pid)], capture_output=True, text=True,
                          timeout=20, env=child_env())


def _pid_in(pid: Path) -> str | None:
    # The server listens, then replaces a stale file: between its removal and the new
    # file's creation there is none (an emulated armv7l server was read there).
    try:
        return pid.read_text().strip()
    except FileNotFoundError:
        return None


@needs_native
def test_a_planted_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "shadow"
    victim.write_text("root:secret:19000::::::\n")
    os.chmod(victim, 0o600)
    link = tmp_path / "netprobe.pid"
    link.symlink_to(victim)
    done = _refused(link)
    assert done.returncode == 2, done.stderr
    assert_one_error_line(done.stderr)
    assert "symbolic link" in done.stderr
    assert victim.read_text() == "root:secret:19000::::::\n"
    assert link.is_symlink() and os.readlink(link) == str(victim)


@needs_native
def test_a_dangling_symlink_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    target = tmp_path / "made-by-root"
    link = tmp_path / "netprobe.pid"
    link.symlink_to(target)
    done = _refused(link)
    assert done.returncode == 2, done.stderr
    assert_one_error_line(done.stderr)
    assert not target.exists()


@needs_native
def test_a_stale_pidfile_is_replaced_and_a_live_one_refused(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=10)  # reaped: its pid names no process now
    pid = tmp_path / "netprobe.pid"
    pid.write_text(f"{dead.pid}\n")
    proc, port = _server(pid)
    try:
        wait_port(port)
        deadline = time.monotonic() + 10
        while _pid_in(pid) != str(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid.read_text().strip() == str(proc.pid)
        assert not pid.is_symlink()
        again = _refused(pid)
        assert again.returncode == 2 and str(proc.pid) in again.stderr
        assert_one_error_line(again.stderr)
        assert pid.read_text().strip() == str(proc.pid)
    finally:
        _stop(proc)
    assert not pid.exists()
