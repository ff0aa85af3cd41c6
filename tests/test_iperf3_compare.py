"""``netprobe compare HOST --iperf3``: netprobe's engine speaking iperf3's protocol and the
stock iperf3 client, interleaved against one real stock ``iperf3 -s`` on loopback (started
by the test, stopped by its PID), in one table; the server's own log is the witness that
both tests reached it and that no other server was started."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from netprobe.driven import free_port
from tests.peers import stock_iperf3
from tests.test_iperf3_client import listening

CLI_TIMEOUT_S = 90.0


@contextlib.contextmanager
def stock_server(log: Path) -> Iterator[int]:
    """A stock ``iperf3 -s`` (many tests, one at a time) on a free loopback port, its
    output in ``log``; killed by its PID at the end."""
    binary = stock_iperf3("3.12")
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen([binary, "-s", "-p", str(port), "--forceflush"],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        for _ in range(200):  # 10 s at most
            if listening(port) or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert listening(port), log.read_text()
        yield port
    finally:
        proc.kill()
        proc.wait(timeout=10)


def compare(*args: str) -> subprocess.CompletedProcess:
    # A wide terminal: the table then has one row per tool and figure, the ratio column named.
    return subprocess.run([sys.executable, "-m", "netprobe", "compare", *args],
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
                          env={**os.environ, "COLUMNS": "200"})


def served_bytes(log: Path) -> list[int]:
    """The bytes the stock server says it received, one figure per test it served."""
    found = re.findall(r"sec\s+([\d.]+) (\w?)Bytes .* receiver$", log.read_text(), re.M)
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return [int(float(n) * scale[unit]) for n, unit in found]


def test_native_and_stock_client_against_one_stock_server(tmp_path: Path) -> None:
    log = tmp_path / "iperf3-s.log"
    with stock_server(log) as port:
        out = compare("127.0.0.1", "--iperf3", "-p", str(port), "-t", "1", "-n", "1",
                      "--json")
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)
    assert [r["tool"]["name"] for r in results] == ["native", "iperf3"]  # native: reference
    served = served_bytes(log)
    assert log.read_text().count("Accepted connection from") == 2 and len(served) == 2
    for result, theirs in zip(results, served):
        assert result["status"] == "ok", result["errors"]
        assert result["spec"]["port"] == port and result["spec"]["length_bytes"] == 131072
        up = next(f for f in result["summaries"] if f["direction"] == "client_to_server")
        # iperf3 prints 3 significant digits: the server's figure within 1%.
        assert up["receiver"]["bytes"] > 0
        assert abs(up["receiver"]["bytes"] - theirs) <= theirs * 0.01, (up, theirs)


def test_table_names_both_clients_and_the_tools_left_out(tmp_path: Path) -> None:
    with stock_server(tmp_path / "iperf3-s.log") as port:
        out = compare("127.0.0.1", "--iperf3", "-p", str(port), "-t", "1", "-n", "1",
                      "--tools", "iperf3,native,nuttcp")
    assert out.returncode == 0, out.stderr
    table = out.stdout
    assert "ratio to iperf3" in table  # the first named is the reference
    row = re.search(r"c->s receiver throughput \(\w+/s\)\s+iperf3\s+1\s.*\n\s+native\s+1\s",
                    table)
    assert row is not None, table
    assert "nuttcp" in table and "only native and iperf3 speak its protocol" in table


@pytest.mark.parametrize(("extra", "said"), [
    ((), "--iperf3 needs HOST"),
    (("127.0.0.1", "--from", "127.0.0.1"), "not with --from"),
])
def test_iperf3_mistakes_are_one_line(extra: tuple[str, ...], said: str) -> None:
    out = compare(*extra, "--iperf3", "-t", "1")
    assert out.returncode == 2, out
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and said in lines[0] and "Traceback" not in out.stderr, out.stderr


def test_udp_call_lengths_say_how_the_iperf3_mode_sends(tmp_path: Path) -> None:
    # The native engine batches datagrams (sendmmsg of GSO messages) with its own header;
    # in its iperf3 mode it writes iperf3's header, one datagram per call, and the
    # call-length table must say so, not the engine's usual way.
    log = tmp_path / "iperf3-s.log"
    with stock_server(log) as port:
        out = compare("127.0.0.1", "--iperf3", "-p", str(port), "-t", "1", "-n", "1", "-u",
                      "-b", "10M")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines()
            if line.startswith(("native ", "iperf3 ")) and " B " in line}
    assert set(rows) == {"native", "iperf3"}, out.stdout
    assert all("one datagram per call" in row for row in rows.values()), rows
    assert log.read_text().count("Accepted connection from") == 2
