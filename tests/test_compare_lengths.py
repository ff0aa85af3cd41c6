"""``compare`` like for like: every tool at one call length unless asked otherwise, and the
table saying each tool's call length (and, for UDP, how many datagrams a call carries).

Real tools on loopback: the native engine and whichever of iperf3, nuttcp and iperf 2 are
installed (a peer whose binary is absent is left out, as compare itself leaves it out)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.test_cli import builtin_registry, run_main

PEERS = {"iperf3": "iperf3", "nuttcp": "nuttcp", "iperf2": "iperf"}
TOOLS = ["native", *(name for name, binary in PEERS.items() if shutil.which(binary))]
# A comparison needs two tools (the wheels' emulated suites have no peer binaries).
pytestmark = pytest.mark.skipif(len(TOOLS) < 2, reason="no peer tool (iperf3, nuttcp, iperf) "
                                "installed: a comparison needs two tools")


def _compare(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    return run_main(capsys, "compare", "--tools", ",".join(TOOLS), "-t", "1", "-n", "1",
                    "--pause", "0", *extra, registry=builtin_registry())


def _sender_lengths(results: list[dict]) -> dict[str, object]:
    return {r["tool"]["name"]: r["summaries"][0]["sender"]["call_length_bytes"]
            for r in results}


def test_tcp_compare_runs_every_tool_at_one_length_and_says_so(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _compare(capsys, "--format", "json")
    assert code == 0, err
    results = json.loads(out)
    assert sorted(r["tool"]["name"] for r in results) == sorted(TOOLS)
    # was: null for all four, and native wrote 256 KiB or 1 MiB, nuttcp 64 KiB
    assert {r["spec"]["length_bytes"] for r in results} == {131072}
    assert set(_sender_lengths(results).values()) == {131072}
    assert "128K" in err  # the note says which length and how to change it

    code, out, err = _compare(capsys)
    assert code == 0, err
    assert "call length" in out and "every tool at 128K (like for like)" in out
    for tool in TOOLS:  # a row per tool naming its length
        assert any(line.split()[:2] == [tool, "128K"] for line in out.splitlines()), out


def test_own_lengths_runs_each_tool_at_its_default_and_the_table_says_so(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _compare(capsys, "--own-lengths", "--format", "json")
    assert code == 0, err
    results = json.loads(out)
    assert {r["spec"]["length_bytes"] for r in results} == {None}  # nothing was asked
    lengths = _sender_lengths(results)
    assert all(isinstance(length, int) and length > 0 for length in lengths.values()), lengths
    code, out, err = _compare(capsys, "--own-lengths")
    assert code == 0, err
    assert "own" in out and "not like for like" in out
    for tool in TOOLS:
        row = next(line.split() for line in out.splitlines() if line.split()[:1] == [tool])
        assert row[1:3] == ["own", "default"], row


def test_udp_table_says_how_many_datagrams_each_call_carries(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _compare(capsys, "-u", "-b", "20M")
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines()
            if line.split()[:2] in ([tool, "1448"] for tool in TOOLS)}
    assert set(rows) == set(TOOLS), out
    if len(TOOLS) > 1:  # one datagram size, but the calls differ: the title says so
        assert "not like for like" in out
    assert "many datagrams per call" in rows["native"]
    for peer in TOOLS[1:]:
        assert "one datagram per call" in rows[peer]


def test_own_lengths_and_length_together_is_a_one_line_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _compare(capsys, "--own-lengths", "-l", "64K")
    assert code != 0 and "Traceback" not in err
    assert "--own-lengths" in err and len(err.strip().splitlines()) == 1


def test_report_of_a_saved_comparison_says_the_call_lengths(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    saved = tmp_path / "compare.jsonl"
    code, _, err = _compare(capsys, "-u", "-b", "20M", "-q", "-o", str(saved))
    assert code == 0, err
    code, out, err = run_main(capsys, "report", str(saved), registry=builtin_registry())
    assert code == 0, err
    assert "every tool at 1448 B datagrams" in out  # was: the rates alone
    native = next(line for line in out.splitlines() if line.split()[:2] == ["native", "1448"])
    assert "many datagrams per call" in native


def test_a_tool_left_out_for_the_common_length_is_told_how_to_run_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    # tcponly takes no -l: left out of the like-for-like run, with the way to include it
    code, out, err = run_main(capsys, "compare", "--tools", "replay,tcponly", "-n", "1", "-t",
                              "1", "-i", "0")
    assert code == 0, err
    left_out = next(line for line in out.splitlines() if line.startswith("left out: tcponly"))
    assert "--own-lengths" in left_out
    code, out, err = run_main(capsys, "compare", "--tools", "replay,tcponly", "-n", "1", "-t",
                              "1", "-i", "0", "--own-lengths")
    assert code == 0, err
    assert "left out" not in out and "not like for like" in out
