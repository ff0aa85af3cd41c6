"""The iperf3 listener's counters reach Prometheus: a real ``netprobe server --iperf3`` on
loopback, the stock iperf3 client (Debian's 3.12) served once, refused once (too many
streams) and told busy once (``--max-tests 1`` while a test runs), then a real ``netprobe
exporter`` process's ``/status`` read with prometheus_client's own parser."""
from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from netprobe.farend import agent_status

from .servers import exporter_process, free_port, netprobe_server, wait_listening
from .test_exporter import _get, _samples

IPERF3 = shutil.which("iperf3") or "/usr/bin/iperf3"
CLIENT_TIMEOUT_S = 30


def _iperf3() -> str:
    if not Path(IPERF3).is_file():
        pytest.skip("no stock iperf3 client (apt install iperf3)")
    return IPERF3


def _client(port: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([_iperf3(), "-c", "127.0.0.1", "-p", str(port), *args],
                          capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)


@contextlib.contextmanager
def _exporter(config: Path) -> Iterator[str]:
    with exporter_process("--config", str(config)) as (base, _):
        yield base


def _values(text: str, name: str) -> dict[str, float]:
    """``name``'s samples by their outcome label (or "" without one)."""
    return {sample.labels.get("outcome", ""): sample.value
            for sample in _samples(text).get(name.removesuffix("_total"), [])
            if sample.name == name}


def _wait_running(port: int, want: int) -> None:
    """Until the agent says ``want`` iperf3 tests run (bounded: 10 s)."""
    for _ in range(100):
        if agent_status("127.0.0.1", port=port)["iperf3"]["running"] == want:
            return
        time.sleep(0.1)
    raise AssertionError(f"the iperf3 listener never ran {want} test(s)")


def test_iperf3_counters_reach_the_exporter(tmp_path: Path) -> None:
    _iperf3()
    iperf3_port = free_port()
    with netprobe_server("--iperf3", "--iperf3-port", str(iperf3_port), "--max-tests", "1",
                         "--max-streams", "2") as server:
        wait_listening(iperf3_port)
        config = tmp_path / "exporter.toml"
        config.write_text(f'[modules.default]\ntargets = ["127.0.0.1"]\n'
                          f"agent_port = {server.port}\nport = {server.port}\n")
        with _exporter(config) as url:
            status, before = _get(f"{url}/status?target=127.0.0.1")
            assert status == 200, before
            assert _values(before, "netprobe_iperf3_tests_total") == {
                "served": 0, "refused": 0, "busy": 0}
            served = _client(iperf3_port, "-t", "1")
            assert served.returncode == 0, served.stdout + served.stderr
            refused = _client(iperf3_port, "-t", "1", "-P", "4")
            assert refused.returncode != 0, refused.stdout
            long = subprocess.Popen([_iperf3(), "-c", "127.0.0.1", "-p", str(iperf3_port),
                                     "-t", "3"], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            try:
                _wait_running(server.port, 1)
                _, during = _get(f"{url}/status?target=127.0.0.1")
                busy = _client(iperf3_port, "-t", "1")
                assert busy.returncode != 0 and "busy" in busy.stdout + busy.stderr, busy
            finally:
                out, _ = long.communicate(timeout=CLIENT_TIMEOUT_S)
            assert long.returncode == 0, out
            _wait_running(server.port, 0)
            status, after = _get(f"{url}/status?target=127.0.0.1")
    assert status == 200, after
    assert _values(during, "netprobe_iperf3_tests_running") == {"": 1}
    assert _values(after, "netprobe_iperf3_tests_total") == {
        "served": 2, "refused": 1, "busy": 1}
    assert _values(after, "netprobe_iperf3_tests_running") == {"": 0}
    assert _values(after, "netprobe_agent_up") == {"": 1}


def test_status_without_iperf3_or_agent(tmp_path: Path) -> None:
    """An agent without --iperf3 gives no iperf3 series (absent, not 0); a target with no
    agent gives netprobe_agent_up 0 and why; a target no module names is refused (403)."""
    dead = free_port()
    with netprobe_server() as server:
        config = tmp_path / "exporter.toml"
        config.write_text(f'[modules.default]\ntargets = ["127.0.0.1"]\n'
                          f"agent_port = {server.port}\n"
                          f'[modules.gone]\ntargets = ["127.0.0.1"]\nagent_port = {dead}\n')
        with _exporter(config) as url:
            status, plain = _get(f"{url}/status?target=127.0.0.1")
            _, gone = _get(f"{url}/status?target=127.0.0.1&module=gone")
            other, refused = _get(f"{url}/status?target=192.0.2.1")
            bad, unknown = _get(f"{url}/status?target=127.0.0.1&port=1")
    assert status == 200, plain
    assert _values(plain, "netprobe_agent_up") == {"": 1}
    assert "netprobe_iperf3" not in plain
    assert _values(gone, "netprobe_agent_up") == {"": 0}
    assert "netprobe_agent_status_failed_info" in gone
    assert other == 403, refused
    assert bad == 400 and "port" in unknown


def test_foreign_counts_in_a_status_reply_are_left_out() -> None:
    """The agent's reply is foreign data: a count that is not a non-negative integer (text,
    a boolean, negative, a float) is absent from the page, never exported as a number."""
    from netprobe.exporter_status import Watched, status_metrics

    watched = Watched("default", "lon", "192.0.2.1", 5301, None)
    reply = {"state": "idle", "running": [], "slots": True,
             "iperf3": {"served": 3, "refused": "lots", "busy": -1, "running": 1.5}}
    page = status_metrics(watched, reply, None).decode()
    assert _values(page, "netprobe_iperf3_tests_total") == {"served": 3}
    assert "netprobe_iperf3_tests_running" not in page
    assert "netprobe_agent_slots" not in page
    assert _values(page, "netprobe_agent_tests_running") == {"": 0}
    down = status_metrics(watched, None, 'no agent\n"answers" here').decode()
    assert _values(down, "netprobe_agent_up") == {"": 0}
    (failed,) = _samples(down)["netprobe_agent_status_failed_info"]
    assert failed.labels["reason"] == 'no agent "answers" here'
