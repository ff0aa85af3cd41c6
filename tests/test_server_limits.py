"""Issue 33 item 5: an owner's limits bind before the bytes leave, per test and per server.

``--max-rate`` was per stream: at ``--max-rate 50M`` a client got 200 Mbit/s from ``-P 4``
(6.4 Gbit/s at the default 128 streams). Now it bounds a test's streams and directions
together and all running tests together; a test that asks more is refused before any
byte is sent (one that does not fit beside the running ones is told the server is busy).
The witness is an nftables counter, in the client's namespace, of the UDP the server sent.

Measured before the fix: ``-u -R -P 4 -b 50M -t 1`` at ``--max-rate 50M`` ran, 25 MB
(200 Mbit/s) on the wire; two such tests at once, both ran.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time

import pytest

from .netlab import Lab, switched_hosts, wait_listening

pytestmark = [pytest.mark.root, pytest.mark.slow]

why_not = Lab.available() or (None if shutil.which("nft") else "nftables (nft) is not installed")
if why_not:
    pytestmark.append(pytest.mark.skip(reason=why_not))

NETPROBE = [sys.executable, "-m", "netprobe"]
SUBNET = "10.133.35"
LIMIT_BPS = 50e6
SLACK = 1.25  # IP and UDP headers (28 bytes a datagram) and the pacer's first burst


@pytest.fixture
def pair():  # type: ignore[no-untyped-def]
    """(lab, client namespace, server address) with ``--max-rate 50M`` served and the
    client's counter of the server's UDP installed."""
    with switched_hosts(["srv", "cli"], subnet=SUBNET, prefix="nu") as (lab, hosts):
        srv_ns, srv_addr = hosts["srv"]
        lab.start(srv_ns, [*NETPROBE, "server", "-B", srv_addr, "--max-rate", "50M"],
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_listening(lab, srv_ns, 5301)
        cli_ns = hosts["cli"][0]
        nft = ["ip", "netns", "exec", cli_ns, "nft"]
        for words in (["add", "table", "inet", "nu"],
                      ["add", "chain", "inet", "nu", "in",
                       "{ type filter hook input priority 0; policy accept; }"],
                      ["add", "rule", "inet", "nu", "in", "ip", "saddr", srv_addr,
                       "udp", "sport", "5301", "counter"]):
            subprocess.run([*nft, *words], check=True, capture_output=True, timeout=10)
        yield lab, cli_ns, srv_addr


def _wire_bytes(lab: Lab, ns: str) -> int:
    out = lab.run(ns, ["nft", "list", "chain", "inet", "nu", "in"]).stdout
    found = re.search(r"counter packets \d+ bytes (\d+)", out)
    assert found, out
    return int(found.group(1))


def _run(lab: Lab, ns: str, host: str, *args: str) -> subprocess.CompletedProcess:
    return lab.run(ns, [*NETPROBE, "run", host, "-u", "-R", *args], timeout=60)


def test_streams_together_may_not_pass_max_rate(pair) -> None:  # type: ignore[no-untyped-def]
    lab, ns, host = pair
    asked = _run(lab, ns, host, "-P", "4", "-b", "50M", "-t", "1")
    assert asked.returncode != 0 and "--max-rate" in asked.stderr, asked.stderr
    assert "Traceback" not in asked.stderr
    assert "12.5" in asked.stderr  # it says what a stream may ask
    assert _wire_bytes(lab, ns) < 1000, "a refused test sent data"
    unlimited = _run(lab, ns, host, "-P", "4", "-b", "0", "-t", "1")
    assert unlimited.returncode != 0 and "unlimited" in unlimited.stderr, unlimited.stderr


def test_a_test_within_max_rate_runs_and_stays_under_it(pair) -> None:  # type: ignore[no-untyped-def]
    lab, ns, host = pair
    seconds = 2
    ok = _run(lab, ns, host, "-P", "4", "-b", "12M", "-t", str(seconds))
    assert ok.returncode == 0, ok.stderr
    sent = _wire_bytes(lab, ns)
    assert sent > 0.5 * 48e6 / 8 * seconds, sent  # it did run
    assert sent <= LIMIT_BPS / 8 * seconds * SLACK, f"{sent * 8 / seconds / 1e6:.1f} Mbit/s"


def test_two_concurrent_tests_share_max_rate(pair) -> None:  # type: ignore[no-untyped-def]
    lab, ns, host = pair
    seconds = 4
    first = lab.start(ns, [*NETPROBE, "run", host, "-u", "-R", "-P", "2", "-b", "15M",
                           "-t", str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 15
    while _wire_bytes(lab, ns) == 0 and time.monotonic() < deadline:
        time.sleep(0.1)  # until the first test's data flows (a loaded host starts slowly)
    assert first.poll() is None, "the first test ended before the second was asked"
    second = _run(lab, ns, host, "-P", "2", "-b", "15M", "-t", "1")
    assert second.returncode != 0 and "busy" in second.stderr, second.stderr
    assert "--max-rate" in second.stderr
    _out, err = first.communicate(timeout=30)
    assert first.returncode == 0, err
    assert _wire_bytes(lab, ns) <= LIMIT_BPS / 8 * seconds * SLACK
