"""``netprobe parse`` of saved logs that hold several tests (a server's log, appended runs):
one Result per test, each with its own figures, read line by line; and hostile saved
input (NaN, a string where a list belongs, absurd nesting, endless lines) refused with one
clear line, never an internal error.

The logs in tests/data are real: iperf 2.1.8 and iperf3 3.12 servers on loopback, three
clients one after another (-t 1; -t 2 -P 2 (iperf3: -t 1 -P 2); -t 2 -i 1 (iperf3: -R)).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from netprobe.convert import to_json
from netprobe.tools.iperf2 import parse_output as p2
from netprobe.tools.iperf3 import Iperf3Tool
from netprobe.tools.iperf3 import parse_output as p3
from tests.peers import PEER_FIXTURES
from tests.test_cli import assert_one_error_line, netprobe_cmd

DATA = Path(__file__).parent / "data"
_SUMMARY2 = re.compile(r"^\[(?:SUM|\s*\d+)\] 0\.0000-\S+ sec .*?(\S+) ([GM])bits/sec", re.M)


def _parsed(tool: str, *files: Path | str, fmt: str = "json") -> list[dict]:
    proc = netprobe_cmd("parse", "--tool", tool, "--format", fmt, *map(str, files))
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _receiver_rate(result: dict) -> float:
    flow = result["summaries"][0]
    return (flow["receiver"] or flow["sender"])["bits_per_second"]


@pytest.mark.parametrize("name", ["iperf2-server-3tests.txt", "iperf2-server-e-3tests.txt",
                                  "iperf2-server-i1-3tests.txt"])
def test_iperf2_server_log_gives_one_result_per_test(name: str) -> None:
    results = _parsed("iperf2", DATA / name)
    assert [r["spec"]["streams"] for r in results] == [1, 2, 1]
    # each test's own last summary line: the single stream's, or the [SUM] of two
    text = (DATA / name).read_text()
    tests = list(p2.split_tests(text.splitlines(keepends=True)))
    for result, test in zip(results, tests):
        value, unit = _SUMMARY2.findall(test)[-1]
        printed = float(value) * (1e9 if unit == "G" else 1e6)
        assert _receiver_rate(result) == pytest.approx(printed, rel=0.01)
        assert {r["spec"]["direction"] for r in results} == {"normal"}


def test_iperf2_csv_rows_of_tests_of_different_lengths_are_apart() -> None:
    results = _parsed("iperf2", DATA / "iperf2-server-yC-3tests.txt")
    first = results[0]["summaries"][0]["receiver"]
    assert first["bytes"] == 620757052 and results[0]["spec"]["streams"] == 1
    # The -P 2 test and the next 2 s test share span and stamp, and the -P 2 test's rows
    # came in the order its streams were accepted: nothing tells them from three tests one
    # after another, and three single results say no figure that was not measured.
    assert [r["spec"]["streams"] for r in results] == [1, 1, 1, 1]


def test_iperf3_server_json_log_gives_each_documents_own_figures() -> None:
    path = DATA / "iperf3-3.12-server-J-3tests.txt"
    results = _parsed("iperf3", path)
    documents = list(p3.split_tests(path.read_text().splitlines(keepends=True)))
    assert len(results) == len(documents) == 3  # the server's stop notice is no test
    for result, text in zip(results, documents):
        end = json.loads(text)["end"]
        received = end["sum_received"]["bytes"] if "sum_received" in end else None
        sent = end["sum_sent"]["bytes"]
        flow = result["summaries"][0]
        assert result["status"] == "ok"
        assert (flow["receiver"] or {}).get("bytes") in (received, None)
        assert (flow["sender"] or {}).get("bytes") in (sent, None)
    assert [r["spec"]["streams"] for r in results] == [1, 2, 1]


def test_iperf3_server_text_log_gives_one_result_per_test() -> None:
    results = _parsed("iperf3", DATA / "iperf3-3.12-server-3tests.txt")
    assert [round(_receiver_rate(r) / 1e9, 1) for r in results] == [15.1, 13.0, 28.9]


def test_human_output_shows_every_test() -> None:
    proc = netprobe_cmd("parse", "--tool", "iperf2", str(DATA / "iperf2-server-3tests.txt"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("Gbit/s") >= 3


@pytest.mark.parametrize("tool,pattern", [("iperf2", "iperf2-*"), ("iperf3", "iperf3-*")])
def test_every_single_test_fixture_stays_one_test(tool: str, pattern: str) -> None:
    if not PEER_FIXTURES.is_dir():
        pytest.skip(f"peer fixtures not found at {PEER_FIXTURES}")
    split = p2.split_tests if tool == "iperf2" else p3.split_tests
    many = {path.name: n for path in sorted(PEER_FIXTURES.glob(pattern))
            if (n := len(list(split(path.read_text().splitlines(keepends=True))))) != 1}
    assert many == {}


def test_files_with_different_numbers_of_tests_are_refused() -> None:
    if not PEER_FIXTURES.is_dir():
        pytest.skip(f"peer fixtures not found at {PEER_FIXTURES}")
    proc = netprobe_cmd("parse", "--tool", "iperf2", str(DATA / "iperf2-server-3tests.txt"),
                        str(PEER_FIXTURES / "iperf2-2.1.8-tcp-default-client.txt"))
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr)
    assert "different numbers of tests" in proc.stderr


# --- hostile input ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_document() -> dict:
    """A real result, as `parse --json` writes it."""
    text = (DATA / "iperf3-3.12-server-3tests.txt").read_text()
    first = next(iter(p3.split_tests(text.splitlines(keepends=True))))
    return json.loads(to_json(Iperf3Tool().parse([("server.txt", first)])))


@pytest.mark.parametrize("change,needle,command", [
    ({"duration_s": math.nan}, "not a finite number", ("report",)),
    ({"duration_s": math.inf}, "not a finite number", ("report", "--json")),
    ({"errors": "boom"}, "expected a list", ("report", "--json")),
    ({"warnings": {"a": 1}}, "expected a list", ("report",)),
])
def test_hostile_saved_results_are_refused_in_one_line(
    tmp_path: Path, saved_document: dict, change: dict, needle: str, command: tuple[str, ...]
) -> None:
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps({**saved_document, **change}))
    proc = netprobe_cmd(*command, str(path))
    assert proc.returncode == 2, proc.stderr
    assert_one_error_line(proc.stderr)
    assert needle in proc.stderr


@pytest.mark.parametrize("command", [("report",), ("parse", "--tool", "iperf3", "--json")])
def test_absurd_nesting_is_refused_in_one_line(tmp_path: Path, command: tuple[str, ...]) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"start": ' + "[" * 100_000 + "]" * 100_000 + "}")
    proc = netprobe_cmd(*command, str(path))
    assert proc.returncode == 2, proc.stderr
    assert_one_error_line(proc.stderr)
    assert "nested" in proc.stderr or "recursion" in proc.stderr


def test_an_endless_line_is_refused_not_held(tmp_path: Path) -> None:
    path = tmp_path / "one-line.txt"
    path.write_text("x" * (3 << 20))
    proc = netprobe_cmd("parse", "--tool", "iperf2", str(path))
    assert proc.returncode == 2, proc.stderr
    assert_one_error_line(proc.stderr)
    assert "longer than 1 MiB" in proc.stderr


def test_jsonl_to_a_full_device_exits_6() -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    proc = netprobe_cmd("parse", "--tool", "iperf2", "--format", "jsonl", "-o", "/dev/full",
                        str(DATA / "iperf2-server-3tests.txt"))
    assert proc.returncode == 6, proc.stderr
    assert_one_error_line(proc.stderr)
