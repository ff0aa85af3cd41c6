"""ntttcp's intervals on a real 100 Mbit/s bottleneck (issue 14 item 8): timed by netprobe
from the kernel's byte counters of the test's connections, they are as wide as asked and
none exceeds the link. A receiver's measured intervals sum to its total exactly (the last
takes the bytes that arrived after the last sample, checked by the same ceiling); a
sender's sum to its acknowledged bytes, a stated few percent below its total of bytes
written. Both counters: a sender's acknowledged bytes (netprobe sends to an ntttcp
receiver started in the far namespace) and a receiver's received bytes (netprobe
--receive --no-sync, an outside ntttcp -N sends: the Windows interop case, over a link)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .netlab import A_ADDR, B_ADDR, Lab, shaped_pair, wait_listening
from .peers import PeerBinary, peer_params

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.peers]
why_not = Lab.available()
if why_not:
    pytestmark.append(pytest.mark.skip(reason=why_not))

NETPROBE = [sys.executable, "-m", "netprobe"]
LINK_MBIT = 100.0
SECONDS = "4"
INTERVAL_S = 0.5
CEILING_BPS = LINK_MBIT * 1e6 * 1.01
"""The link's rate, plus tbf's 32 kB bucket spread over one interval (0.5 %) and rounding."""

WAKE_UP_S = 0.1
"""How late a sampling thread may wake on this shared 2-core machine (up to 79 ms seen
with seven test suites running)."""

needs_ntttcp = pytest.mark.parametrize("peer", peer_params("ntttcp"), indirect=True)


def _check_intervals(result: dict, role: str) -> list[dict]:
    measured = [i for i in result["intervals"] if i["role"] == role and not i["omitted"]]
    assert measured, result["warnings"]
    widths = [round(i["end_s"] - i["start_s"], 3) for i in measured]
    # Each ends when its sample was read: on schedule but for a busy machine's thread
    # wake-up, which does not add up (the schedule is kept from the start): the mean width
    # is the asked one. (Timed by the arrival of ntttcp's lines they were 0.57-0.60 s.)
    assert all(w == pytest.approx(INTERVAL_S, abs=WAKE_UP_S) for w in widths), widths
    assert sum(widths) / len(widths) == pytest.approx(INTERVAL_S, rel=0.01), widths
    rates = [i["bits_per_second"] for i in measured]
    assert max(rates) <= CEILING_BPS, [round(r / 1e6, 1) for r in rates]
    # The link is full: the sampling is live (the first interval: the flow opens). The last
    # too: its connection may close just before its end (READ_EVERY_S in intervals.py).
    assert min(rates[1:]) > 0.8 * LINK_MBIT * 1e6
    assert measured[-1]["end_s"] == pytest.approx(float(SECONDS), abs=WAKE_UP_S)
    assert any("byte counters" in w for w in result["warnings"])
    return measured


@pytest.mark.host_timing
@needs_ntttcp
def test_sender_intervals_from_acknowledged_bytes_fit_the_link(peer: PeerBinary) -> None:
    with shaped_pair(LINK_MBIT) as (lab, a, b):
        lab.start(b, [peer.path, "-r", "-m", f"1,*,{B_ADDR}", "-p", "5001", "-t", SECONDS],
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_listening(lab, b, 5001)
        done = lab.run(a, [*NETPROBE, "run", B_ADDR, "--tool", "ntttcp", "--no-agent", "-p",
                           "5001", "-t", SECONDS, "-i", str(INTERVAL_S), "--json"], timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    acked = sum(i["bytes"] for i in _check_intervals(result, "sender"))
    # No receiver total here (someone else's receiver): the intervals count acknowledged
    # bytes, ntttcp's sender total bytes written; the gap, at most the socket buffer's
    # content at the end (a few percent of 4 s at 100 Mbit/s), is stated.
    written = result["summaries"][0]["sender"]["bytes"]
    assert 0.95 * written <= acked <= written
    assert any("acknowledged bytes" in w and "below its total" in w for w in result["warnings"])
    assert not any("so that the intervals sum" in w for w in result["warnings"])


@pytest.mark.host_timing
@needs_ntttcp
def test_receive_only_intervals_from_received_bytes_fit_the_link(peer: PeerBinary) -> None:
    with shaped_pair(LINK_MBIT) as (lab, a, b):
        receiver = lab.start(b, [*NETPROBE, "run", "--tool", "ntttcp", "--receive",
                                 "--no-sync", "-p", "5001", "-t", SECONDS, "-i",
                                 str(INTERVAL_S), "--json", B_ADDR],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_listening(lab, b, 5001)
        lab.run(a, [peer.path, "-s", "-N", "-m", f"1,*,{B_ADDR}", "-p", "5001", "-t",
                    SECONDS], timeout=60)
        out, err = receiver.communicate(timeout=60)
    assert receiver.returncode == 0, err
    result = json.loads(out)
    assert result["remote"]["address"] == A_ADDR
    measured = _check_intervals(result, "receiver")
    assert sum(i["bytes"] for i in measured) == result["summaries"][0]["receiver"]["bytes"]
    assert any("so that the intervals sum" in w for w in result["warnings"])
