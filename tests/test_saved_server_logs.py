"""Saved server logs read as their tests were run (issue 34 item 7).

The logs are real. tests/data: an iperf3 3.12 server, three clients one after another
(-t 1; -t 1 -P 2; -R); iperf 2.1.8 servers with -y C on loopback, two clients -t 1 one after
the other (iperf2-server-yC-2tests.txt), and with -i 0.5 a -t 1 then a -t 1 -P 2
(iperf2-server-yC-i05-2tests.txt). shared/fixtures/peers: -P 4 -i 1, -P 4 -y C.
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


def test_iperf2_csv_server_log_of_two_tests_gives_two_results() -> None:
    # no time on the rows (iperf 2.1.8 stamps a server's rows 19700101000000), same span:
    # one "2-stream" result at 14,304 Mbit/s before
    results = _parsed("iperf2", DATA / "iperf2-server-yC-2tests.txt")
    assert [r["spec"]["streams"] for r in results] == [1, 1]
    assert [r["summaries"][0]["receiver"]["bytes"] for r in results] == [1249771580, 538181692]


def test_iperf2_csv_server_log_keeps_a_test_out_of_the_next() -> None:
    # the first test's summary row was carried into the next test as its "banner": the
    # -P 2 test read as 3 streams
    results = _parsed("iperf2", DATA / "iperf2-server-yC-i05-2tests.txt")
    assert [len(r["streams"]) for r in results] == [1, 2]
    assert results[1]["summaries"][0]["receiver"]["bytes"] == 2548695100 + 834928700


@needs_fixtures
def test_iperf2_csv_streams_that_finished_out_of_order_stay_one_test() -> None:
    (result,) = _parsed("iperf2", PEER_FIXTURES / "iperf2-2.1.8-P4-yC-server.txt")
    assert result["spec"]["streams"] == 4
