"""`netprobe parse` of a long saved log runs in bounded memory: a child under an address-
space limit reads a log of tens of megabytes made from real interval lines, keeps at most
plugin.MAX_INTERVALS_KEPT intervals (and says how many more it read), cuts its raw copy,
and gives the same summary as the short original (the tool's own final lines).

Before, iperf3's and nuttcp's parsers held the whole log several times over (a list of its
lines, a sample per line): 47-70x the log in memory, killed by the limit here."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from netprobe import plugin
from netprobe.tools import _bounded
from tests.budget import FRACTION

PEERS = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "peers"
if not PEERS.is_dir():
    PEERS = Path("/work/shared/fixtures/peers")

LOG_BYTES = 25 << 20  # 25 MB: 47-70x of it is far past the limit below
ADDRESS_SPACE = 1 << 30  # 1 GiB for the child


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _is_interval(tool: str, line: str) -> bool:
    if tool == "iperf3":
        return line.startswith("[") and " sec " in line and not line.rstrip().endswith(
            ("sender", "receiver"))
    return "MB /" in line and "%TX" not in line


def _long_log(fixture: Path, tool: str, out: Path) -> int:
    """``fixture`` with its interval lines repeated until the log is LOG_BYTES long; the
    number of interval lines written."""
    lines = fixture.read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if _is_interval(tool, line))
    last = max(i for i, line in enumerate(lines) if _is_interval(tool, line))
    block = "".join(lines[first:last + 1])
    copies = LOG_BYTES // len(block) + 1
    with out.open("w") as f:
        f.writelines(lines[:first])
        for _ in range(copies):
            f.write(block)
        f.writelines(lines[last + 1:])
    return copies * sum(_is_interval(tool, line) for line in lines[first:last + 1])


def _parse(tool: str, path: Path, limited: bool) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", "from netprobe.cli.main import main; raise SystemExit(main())",
         "parse", "--tool", tool, str(path), "--json"],
        capture_output=True, text=True, timeout=300,
        preexec_fn=_limited if limited else None, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize(("tool", "fixture"), [
    ("iperf3", "iperf3-3.12-tcp-i1-client.txt"),
    ("iperf3", "iperf3-3.12-P4-i1-client.txt"),
    ("nuttcp", "nuttcp8-8.2.2-i1-client.txt"),
    ("nuttcp", "nuttcp6-6.1.2-i1-client.txt"),
])
def test_a_long_log_parses_in_bounded_memory_with_the_short_log_s_summary(
        tool: str, fixture: str, tmp_path: Path) -> None:
    if FRACTION < 1:  # emulated (qemu-user): 25 MB takes many minutes, and qemu's own
        pytest.skip("reservation of guest memory does not fit the address-space limit")
    source = PEERS / fixture
    if not source.is_file():
        pytest.skip(f"no fixture {source}")
    short = _parse(tool, source, limited=False)
    path = tmp_path / "long.txt"
    written = _long_log(source, tool, path)
    assert written > plugin.MAX_INTERVALS_KEPT
    long = _parse(tool, path, limited=True)
    assert long["summaries"] == short["summaries"]
    assert long["streams"] == short["streams"]
    assert len(long["intervals"]) == plugin.MAX_INTERVALS_KEPT
    assert long["intervals"][0] == short["intervals"][0]  # intervals are sorted by time
    said = [w for w in long["warnings"] if "not kept" in w]
    assert said and f"{written - plugin.MAX_INTERVALS_KEPT} more" in said[0], long["warnings"]
    assert sum(len(r["text"]) for r in long["raw"]) < _bounded.RAW_KEPT_CHARS + 200


def test_a_spooled_log_reads_as_its_text() -> None:
    log = _bounded.SpooledLog(spool_chars=100)
    text = "".join(f"line {k}\n" for k in range(100))
    for line in text.splitlines(keepends=True):
        log.add(line)
    assert len(log) == len(text) and _bounded.held(log, 100) is log
    assert "".join(log) == text and "line 99" in log and "line 100" not in log
    said = f"\n[netprobe: {len(text) - 20} more characters not kept]\n"
    assert _bounded.kept_raw(log, 20) == text[:20] + said
    assert _bounded.held(log, len(text)) == text
