"""``netprobe parse FILE`` tells the tool from the file where it can (issue 35 items 12, 14):
iperf3 JSON and text, iperf 2 text and CSV, nuttcp, ntttcp console, log, XML and JSON.
``--tool`` still decides when given; a file no tool is told from is one error line that
names the option and the tools.

Every saved output in shared/fixtures/peers and tests/data is real (see their READMEs).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from netprobe.tools.detect import DETECTABLE, detect_tool
from tests.peers import PEER_FIXTURES, needs_fixtures
from tests.test_cli import assert_one_error_line, netprobe_cmd

DATA = Path(__file__).parent / "data"

# Outputs that hold no test and no line only one tool prints: usage and version texts, a
# bad host name, nuttcp's traceroute (-xt), and nuttcp servers' logs (a nuttcp server prints
# nothing: its client prints both halves).
_NOT_TOLD = re.compile(r"-(?:help|version|err-badopt|err-noargs|err-badhost|xt)-")


def _made_by(path: Path) -> str:
    return next(tool for tool in DETECTABLE if tool in path.name or tool in path.parent.name)


def _saved_outputs() -> list[Path]:
    found = [*sorted(PEER_FIXTURES.glob("*")), *sorted(DATA.rglob("*"))]
    # A peer's outputs only (each named after its tool): netprobe's own results live in
    # tests/data too, and are no tool's output (test_a_netprobe_result_is_no_peers_output).
    return [p for p in found if p.is_file() and p.suffix in (".txt", ".log", ".xml", ".json")
            and p.name != "runs.jsonl"
            and any(tool in p.name or tool in p.parent.name for tool in DETECTABLE)]


@needs_fixtures
def test_every_saved_output_is_told_to_be_its_own_tools() -> None:
    told, untold = [], []
    for path in _saved_outputs():
        text = path.read_text(errors="replace")
        got = detect_tool(text.splitlines(keepends=True))
        if got is None:
            untold.append(path)
        else:
            told.append((path.name, _made_by(path), got))
    assert [t for t in told if t[1] != t[2]] == []  # never the wrong tool
    assert len(told) > 150 and {want for _, want, _ in told} == set(DETECTABLE)
    # an output that holds a test is always told; only the ones that hold none are not
    assert [p.name for p in untold if p.read_text().strip() and not _NOT_TOLD.search(p.name)
            ] == []


_CASES = [
    ("iperf3-3.12-tcp-i1-client.txt", "iperf3"),          # text
    ("iperf3-3.12-tcp-i1-server.txt", "iperf3"),
    ("iperf3-3.12-udp-b100M-J-client.txt", "iperf3"),     # -J
    ("iperf2-2.1.8-tcp-e-i1-client.txt", "iperf2"),       # text
    ("iperf2-2.1.8-udp-b100M-yC-server.txt", "iperf2"),   # -y C
    ("nuttcp8-8.2.2-default-client.txt", "nuttcp"),       # brief
    ("nuttcp6-6.1.2-fparse-client.txt", "nuttcp"),        # -fparse
    ("nuttcp8-8.2.2-v-client.txt", "nuttcp"),             # -v
    ("ntttcp-1.4.3-tcp-1port-sender.txt", "ntttcp"),      # console
    ("ntttcp-1.4.3-tcp-logfile-receiver.log", "ntttcp"),  # -O log file
    ("ntttcp-1.4.3-tcp-xml-sender.xml", "ntttcp"),        # -x
    ("ntttcp-1.4.3-tcp-json-receiver.json", "ntttcp"),    # -j
]


@needs_fixtures
@pytest.mark.parametrize(("name", "tool"), _CASES)
def test_parse_without_tool_gives_what_tool_gives(name: str, tool: str) -> None:
    path = str(PEER_FIXTURES / name)
    told = netprobe_cmd("parse", "--format", "json", path)
    named = netprobe_cmd("parse", "--tool", tool, "--format", "json", path)
    assert told.returncode == named.returncode == 0, told.stderr
    assert f'"name": "{tool}"' in told.stdout
    assert told.stdout == named.stdout


def test_a_servers_log_of_several_tests_and_stdin(tmp_path: Path) -> None:
    for name, tool in (("iperf3-3.12-server-J-3tests.txt", "iperf3"),
                       ("iperf2-server-yC-e-3tests.txt", "iperf2")):
        text = (DATA / name).read_text()
        told = netprobe_cmd("parse", "--format", "jsonl", "-", input=text)
        named = netprobe_cmd("parse", "--tool", tool, "--format", "jsonl", "-", input=text)
        assert told.returncode == 0, told.stderr
        assert told.stdout == named.stdout and len(told.stdout.splitlines()) >= 3


@needs_fixtures
def test_a_client_and_a_silent_server_log_are_told_by_the_client() -> None:
    client = PEER_FIXTURES / "nuttcp8-8.2.2-i1-client.txt"
    server = PEER_FIXTURES / "nuttcp8-8.2.2-i1-server.txt"
    assert server.read_text() == ""  # nuttcp servers print nothing
    told = netprobe_cmd("parse", "--format", "json", str(client), str(server))
    named = netprobe_cmd("parse", "--tool", "nuttcp", "--format", "json", str(client),
                         str(server))
    assert told.returncode == 0, told.stderr
    assert told.stdout == named.stdout


@needs_fixtures
def test_tool_overrides_what_the_file_says() -> None:
    path = str(PEER_FIXTURES / "iperf3-3.12-tcp-i1-client.txt")
    overridden = netprobe_cmd("parse", "--tool", "nuttcp", path)
    assert overridden.returncode != 0
    assert_one_error_line(overridden.stderr)
    assert "not nuttcp output" in overridden.stderr  # nuttcp's parser read it, as asked


def test_an_untold_file_is_one_line_naming_the_options(tmp_path: Path) -> None:
    for text in ("", "some notes about last week's tests\n12 34 56\n"):
        path = tmp_path / "notes.txt"
        path.write_text(text)
        done = netprobe_cmd("parse", str(path))
        assert done.returncode == 2
        assert_one_error_line(done.stderr)
        assert "--tool" in done.stderr and str(path) in done.stderr
        assert all(tool in done.stderr for tool in DETECTABLE)


@needs_fixtures
def test_files_of_different_tools_are_refused() -> None:
    done = netprobe_cmd("parse", str(PEER_FIXTURES / "iperf3-3.12-tcp-i1-client.txt"),
                        str(PEER_FIXTURES / "iperf2-2.1.8-tcp-i1-server.txt"))
    assert done.returncode == 2
    assert_one_error_line(done.stderr)
    assert "iperf3" in done.stderr and "iperf2" in done.stderr and "--tool" in done.stderr


def test_a_netprobe_result_is_no_peers_output(tmp_path: Path) -> None:
    # netprobe's own saved Result has an "intervals" key, which read alone is iperf3's mark:
    # parse must not take it for iperf3 output (it said "iperf3" before).
    saved = DATA / "result-1.11-latency-phases.json"
    assert detect_tool(saved.read_text().splitlines(keepends=True)) is None
