"""Ctrl-C in the middle of a native test: the saved partial result has the receiver's
summary, computed from the receiver's interval reports that did arrive, and says so.

A real ``netprobe server`` and a real ``netprobe run`` process on loopback; SIGINT is sent
once the run has printed its second interval line."""
from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from netprobe.convert import from_json
from tests.servers import NETPROBE, netprobe_server
from tests.test_cli import child_env, needs_native


def _interrupt_after_lines(argv: list[str], lines: int, timeout: float = 30.0) -> int:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(COLUMNS="120"))
    try:
        seen, end = 0, time.monotonic() + timeout
        assert proc.stdout is not None
        while seen < lines and time.monotonic() < end:
            line = proc.stdout.readline()
            if not line:
                break
            seen += " c->s " in line  # an interval line ("0.00-1.00  s c->s sender ...")
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    return proc.returncode


@needs_native
def test_ctrl_c_keeps_the_receiver_summary(tmp_path: Path) -> None:
    saved = tmp_path / "partial.json"
    with netprobe_server() as server:
        code = _interrupt_after_lines(
            [*NETPROBE, "run", "127.0.0.1", "-p", str(server.port), "-t", "20", "-b", "200M",
             "-o", str(saved)], lines=4)
    assert code == 130
    result = from_json(saved.read_text())
    assert result.status == "interrupted"
    [flow] = result.summaries
    received = [i for i in result.intervals if i.role == "receiver" and i.stream_id is not None]
    assert received, "the receiver's interval reports should have arrived"
    assert flow.receiver is not None
    assert flow.receiver.bytes == sum(i.bytes for i in received if not i.omitted)
    assert flow.receiver.end_s == max(i.end_s for i in received)
    assert flow.receiver.bits_per_second is not None and flow.receiver.bits_per_second > 0
    assert any("receiver" in w and "interval" in w for w in result.warnings)
