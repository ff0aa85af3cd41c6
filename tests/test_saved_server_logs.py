"""Saved server logs read as their tests were run (issue 34 item 7).

The iperf3 logs are real (tests/data: an iperf3 3.12 server, three clients one after
another: -t 1; -t 1 -P 2; -R; shared/fixtures/peers: -P 4 -i 1).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.peers import PEER_FIXTURES, needs_fixtures
from tests.test_cli import netprobe_cmd

DATA = Path(__file__).parent / "data"


def _parsed(tool: str, path: Path) -> list[dict]:
    proc = netprobe_cmd("parse", "--tool", tool, "--format", "jsonl", str(path))
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_iperf3_server_text_log_gives_each_test_its_streams() -> None:
    results = _parsed("iperf3", DATA / "iperf3-3.12-server-3tests.txt")
    assert [len(r["streams"]) for r in results] == [1, 2, 1]
    assert [r["spec"]["streams"] for r in results] == [1, 2, 1]


@needs_fixtures
def test_iperf3_four_stream_server_text_says_four_streams() -> None:
    (result,) = _parsed("iperf3", PEER_FIXTURES / "iperf3-3.12-P4-i1-server.txt")
    assert len(result["streams"]) == 4 and result["spec"]["streams"] == 4
