"""The agent's ``status`` request: idle or busy, and with what, answered without a slot
(a real ``netprobe server`` on loopback, real tests keeping it busy)."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from netprobe.errors import TestFailed
from netprobe.farend import agent_status

from .servers import NETPROBE, free_port, netprobe_server


def _wait_for(condition, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.1)
    return False


def test_status_idle_then_busy_with_a_third_party_test() -> None:
    with netprobe_server("--allow-third-party") as server:
        idle = agent_status("127.0.0.1", port=server.port)
        assert idle["state"] == "idle" and idle["running"] == [] and idle["slots"] == 2
        assert idle["third_party"] is True
        port = str(server.port)
        client = subprocess.Popen(
            [*NETPROBE, "run", "--from", "127.0.0.1", "--agent-port", port, "--to", "127.0.0.1",
             "-p", port, "-t", "2", "--json"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            assert _wait_for(lambda: len(agent_status("127.0.0.1", port=server.port)["running"])
                             == 2), "the third-party test and its native far end should show"
            busy = agent_status("127.0.0.1", port=server.port)
            kinds = {doing["kind"]: doing for doing in busy["running"]}
            assert busy["state"] == "busy" and set(kinds) == {"third_party", "test"}
            assert kinds["third_party"]["tool"] == "native"
            assert kinds["third_party"]["target"] == "127.0.0.1"
            assert kinds["test"]["peer"] == "127.0.0.1" and kinds["test"]["duration_s"] == 2.0
        finally:
            _, err = client.communicate(timeout=30)
        assert client.returncode == 0, err
        assert _wait_for(lambda: agent_status("127.0.0.1", port=server.port)["state"] == "idle")
        assert agent_status("127.0.0.1", port=server.port)["served"] == 2


def test_status_needs_the_secret(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret-for-status\n")
    with netprobe_server("--secret-file", str(secret)) as server:
        with pytest.raises(TestFailed, match="requires a shared secret"):
            agent_status("127.0.0.1", port=server.port)
        assert agent_status("127.0.0.1", b"s3cret-for-status", server.port)["state"] == "idle"


def test_status_of_nobody() -> None:
    with pytest.raises(TestFailed, match="no netprobe agent answers"):
        agent_status("127.0.0.1", port=free_port())
