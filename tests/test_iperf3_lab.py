"""Issue 37's matrix across a real 100 Mbit/s bottleneck: namespaces a and b joined by a
veth pair shaped with tbf, every stock iperf3 version present (3.9, 3.12, 3.16, 3.17.1,
3.21) as the client of ``netprobe server --iperf3`` in b, and as ``iperf3 -s`` in b for
``netprobe run B --iperf3`` in a.

The band, from tbf's arithmetic: each end's tbf is 100 Mbit/s with ``overhead 24`` and
``per_frame`` (netlab.Lab.shape), so every full frame costs 1514 + 24 = 1538 bytes of the
link and carries 1448 bytes of TCP payload (MSS 1460 less 12 bytes of timestamps): at
most 100 x 1448 / 1538 = 94.15 Mbit/s of payload. The issue asks 94.1 +/- 1 Mbit/s of
each TCP cell; the receiver's figure is asserted in [93.1, 95.1] (a figure above the
ceiling beyond tbf's 32 KiB burst would be a count error, one below it an idle link).

--bidir cannot reach that: each direction's tbf also carries the other direction's ACKs,
a 66-byte frame (+ 24 overhead) per one or two 1538-byte data frames, which leaves
94.15 x 1538 / 1628 = 88.9 to 94.15 x 3076 / 3166 = 91.5 Mbit/s for each direction's
payload; asserted in [87.9, 92.5] (that range, +/- 1). Stock 3.21 against its own -s
read 87.9-89.7 here, netprobe's server 85.8-90.4 (a loaded 2-CPU machine).

Besides the rate, each stock client's ``-J`` (read by netprobe's own iperf3 parser) and
the netprobe server's Result (``--iperf3-results``) must agree within 1 % on every
direction's sender and receiver bytes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netprobe.convert import to_json
from netprobe.tools.iperf3.parse_saved import parse_sources
from tests.peers import STOCK_IPERF3, stock_iperf3

from .netlab import Lab, measured_within, wait_listening

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.peers]
why_not = Lab.available()
if why_not:
    pytestmark.append(pytest.mark.skip(reason=why_not))

VERSIONS = STOCK_IPERF3
NETPROBE = [sys.executable, "-m", "netprobe"]
A_ADDR, B_ADDR = "10.76.1.1", "10.76.1.2"
PORT = 5201
SECONDS = "3"
CEILING_MBIT = 100 * 1448 / 1538  # 94.15: TCP payload of a 100 Mbit/s Ethernet
BAND_MBIT = (93.1, 95.1)  # the 94.1 +/- 1
BIDIR_BAND_MBIT = (87.9, 92.5)  # each direction of --bidir, ACKs sharing the link (above)
RESULT_WAIT_S = 5.0
CLIENT_TIMEOUT_S = 40
N_BYTES = 30 * 2**20
BLOCK = 128 * 2**10  # a stock client's TCP write (its default -l)
MULTISEND = 10  # the writes a stock client makes per turn of its loop (test->multisend)

# The stock client's cells against netprobe server --iperf3 (each -t 3, or -n 30M: ~2.7 s)
CELLS = {
    "-P 1": [],
    "-P 4": ["-P", "4"],
    "-R": ["-R"],
    "--bidir": ["--bidir"],
    "-n": ["-n", "30M"],  # N_BYTES
    "UDP -b 50M": ["-u", "-b", "50M", "-l", "1400"],
}


stock = stock_iperf3


def serve_iperf3(lab: Lab, ns: str, results: Path) -> None:
    """``netprobe server --iperf3`` in ``ns`` on PORT, each test's Result into ``results``;
    returns once it listens (the lab stops it)."""
    lab.start(ns, [*NETPROBE, "server", "-B", B_ADDR, "-p", str(PORT + 100), "--iperf3",
                   "--iperf3-port", str(PORT), "--iperf3-results", str(results)],
              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(lab, ns, PORT)


def shaped_lab(lab: Lab) -> tuple[str, str]:
    """Namespaces a and b of ``lab`` joined by a 100 Mbit/s link shaped per frame."""
    a, b = lab.host("a"), lab.host("b")
    dev_a, dev_b = lab.link(a, f"{A_ADDR}/24", b, f"{B_ADDR}/24")
    lab.shape(a, dev_a, 100, per_frame=True)
    lab.shape(b, dev_b, 100, per_frame=True)
    return a, b


def flows(result: dict) -> dict[str, dict]:
    """A Result document's summaries by direction."""
    return {f["direction"]: f for f in result["summaries"]}


def mbit(flow: dict) -> float:
    return float(flow["receiver"]["bits_per_second"]) / 1e6


def off_band(cell: str, direction: str, got: float) -> list[str]:
    low, high = BIDIR_BAND_MBIT if cell == "--bidir" else BAND_MBIT
    return [] if low <= got <= high else [f"{cell} {direction}: {got:.2f} Mbit/s"]


def disagreements(theirs: dict, ours: dict) -> list[str]:
    """Sender and receiver bytes of every direction: the client's -J against the server's
    Result, within 1 % (an empty list when they agree)."""
    found = []
    mine = flows(ours)
    for direction, flow in flows(theirs).items():
        assert direction in mine, (direction, list(mine))
        for side in ("sender", "receiver"):
            a, b = (flow.get(side) or {}).get("bytes"), (mine[direction].get(side) or {}).get(
                "bytes")
            if a is None or b is None:
                continue
            if abs(a - b) > 0.01 * max(a, b):
                found.append(f"{direction} {side}: -J {a} bytes, server {b} bytes")
    return found


def next_result(path: Path, seen: int) -> dict:
    """The server's Result of the test that just ended (the ``seen``-th line on), waited
    for within RESULT_WAIT_S: the server writes it once its test's teardown is done."""
    for _ in range(int(RESULT_WAIT_S / 0.05)):
        # whole lines only: one being written has no newline yet
        lines = path.read_text().splitlines(keepends=True) if path.exists() else []
        if len(lines) > seen and lines[seen].endswith("\n"):
            return dict(json.loads(lines[seen]))
        time.sleep(0.05)
    raise AssertionError(f"netprobe server wrote no Result within {RESULT_WAIT_S:g} s "
                         f"({seen} before)")


def n_overshoot_bytes(version: str) -> int:
    """How far past ``-n`` a stock client of ``version`` may send, from its send loop.

    3.9 checks the count inside its loop over streams, whose ``break`` leaves only that loop
    and not the turn of ``multisend`` writes around it: up to a whole turn past (on a loaded
    machine 67,128-323,424 bytes, up to 1.03 %; CI saw 1.03-1.20 % on three tries of three).
    3.16 and later check it in each stream's thread before every write of a turn but its
    last, at most two writes past; 3.12 and 3.21 sent exactly the count in five loaded
    runs each. Two writes are allowed to all but 3.9."""
    return (MULTISEND if version == "3.9" else 2) * BLOCK


def client_cell(lab: Lab, a: str, binary: str, results: Path, cell: str,
                version: str) -> tuple[dict, list[str]]:
    """One stock client run; (the server's Result, what missed: rate band, byte match)."""
    seen = len(results.read_text().splitlines()) if results.exists() else 0
    args = CELLS[cell]
    length = [] if "-n" in args else ["-t", SECONDS]
    out = lab.run(a, [binary, "-c", B_ADDR, "-p", str(PORT), "-J", *length, *args],
                  timeout=CLIENT_TIMEOUT_S)
    assert out.returncode == 0, f"{cell}: {out.stdout[-1500:]} {out.stderr[-500:]}"
    theirs = json.loads(to_json(parse_sources("iperf3", [("client.json", out.stdout)])))
    if "-n" in args:
        # The server keeps no Result of a -n test (test_bytes_mode_result). Nor is the
        # link's rate the figure: 3.16 and later notice the count reached on a timer, so
        # their time runs past the last byte (3.21 against its own -s, -n 30M: 83.8 Mbit/s
        # over 3.00 s): every byte asked sent, and never above the link.
        flow = flows(theirs)["client_to_server"]
        got = mbit(flow)
        sent = flow["sender"]["bytes"]
        over = n_overshoot_bytes(version)
        missed = [] if N_BYTES <= sent <= N_BYTES + over and got <= BAND_MBIT[1] else [
            f"-n: {sent} of {N_BYTES} bytes sent, {got:.2f} Mbit/s"]
        return theirs, [*missed, lab.qdisc_report()] if missed else []
    ours = next_result(results, seen)
    missed = disagreements(theirs, ours)
    if "-u" in args:
        flow = flows(ours)["client_to_server"]
        got = mbit(flow)
        lost = flow["receiver"].get("lost_packets") or 0
        packets = flow["receiver"].get("packets") or 0
        if not 49 <= got <= 51 or lost > 0.001 * max(packets, 1):
            missed.append(f"{cell}: {got:.2f} Mbit/s, {lost} of {packets} lost")
    else:
        for direction, flow in flows(ours).items():
            missed += off_band(cell, direction, mbit(flow))
    if missed:
        # what the two ends counted, for a miss that does not come back on the next try
        # (three full runs saw one --bidir read 0.00 Mbit/s both ways, never alone)
        missed.append(f"server's Result: {_counts(ours)}; the client's -J: {_counts(theirs)}")
        missed.append(lab.qdisc_report())
    return ours, missed


def _counts(doc: dict) -> str:
    """Each direction's sender and receiver bytes and seconds, and the test's duration."""
    def side(flow: dict, name: str) -> str:
        found = flow.get(name) or {}
        return f"{name} {found.get('bytes')} B/{found.get('end_s')} s"
    return (f"duration {doc.get('duration_s')} s, " + ", ".join(
        f"{direction}: {side(flow, 'sender')}, {side(flow, 'receiver')}"
        for direction, flow in flows(doc).items()))


@pytest.mark.host_timing
@pytest.mark.parametrize("version", list(VERSIONS))
def test_stock_client_against_netprobe_server(version: str, tmp_path: Path) -> None:
    """Every cell of one stock client version against ``netprobe server --iperf3`` across
    the link: each TCP direction's receiver in the band, UDP at 50 Mbit/s with no loss to
    speak of, and the client's -J bytes equal to the server's Result's within 1 %."""
    binary = stock(version)
    results = tmp_path / "iperf3.jsonl"
    with Lab(prefix="ib") as lab:
        a, b = shaped_lab(lab)
        serve_iperf3(lab, b, results)
        for cell in CELLS:
            # (3.9's -J of a --bidir test has one direction's sums: the parser makes each
            # direction's from its streams, tests/test_iperf3_old_bidir.py.)
            ours = measured_within(
                lambda cell=cell: client_cell(lab, a, binary, results, cell, version),
                lambda got: got[1], f"iperf3 {version} {cell}")[0]
            want = {"client_to_server", "server_to_client"} if cell == "--bidir" else {
                "server_to_client" if cell == "-R" else "client_to_server"}
            assert set(flows(ours)) == want, (cell, list(flows(ours)))
            if cell == "-P 4":
                assert len(ours["streams"]) == 4


def stock_pair_mbit(lab: Lab, a: str, binary: str) -> float:
    """What the stock client of ``binary`` reads against the same stock server (its -J's
    receiver figure, Mbit/s)."""
    out = lab.run(a, [binary, "-c", B_ADDR, "-p", str(PORT), "-t", SECONDS, "-J"],
                  timeout=CLIENT_TIMEOUT_S)
    assert out.returncode == 0, out.stdout[-1500:]
    return float(json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"]) / 1e6


def server_cell(lab: Lab, a: str, reverse: bool, binary: str) -> tuple[float, list[str]]:
    """``netprobe run B --iperf3`` once; (its receiver's Mbit/s, what missed)."""
    out = lab.run(a, [*NETPROBE, "run", B_ADDR, "--iperf3", "-p", str(PORT), "-t", SECONDS,
                      "-i", "0", "--json", *(["-R"] if reverse else [])],
                  timeout=CLIENT_TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-1500:]
    doc = json.loads(out.stdout)
    direction = "server_to_client" if reverse else "client_to_server"
    assert set(flows(doc)) == {direction}, list(flows(doc))
    got = mbit(flows(doc)[direction])
    missed = off_band("-R" if reverse else "normal", direction, got)
    if missed and not reverse and got < BAND_MBIT[0]:
        # A version's server whose own client cannot reach the band either: 3.9 starts
        # its time before the data flows (its first second 90.3 Mbit/s with its own
        # client as with ours; the pair reads 92.9). No lower than its own pair, then.
        theirs = stock_pair_mbit(lab, a, binary)
        if got >= theirs - 0.3:
            missed = []
        else:
            missed.append(f"(iperf3's own client: {theirs:.2f} Mbit/s)")
    if not reverse:
        # Ours is the sending end: its own figure is bounded by the wire as well (it read
        # 96.59 once the server closed at TEST_END with our last bytes unacknowledged).
        sent = flows(doc)[direction]["sender"]["bits_per_second"] / 1e6
        missed += off_band("normal, netprobe's sender", direction, sent)
    return got, [*missed, lab.qdisc_report()] if missed else []


def _against_stock_server(version: str, reverse: bool, tries: int) -> None:
    binary = stock(version)
    with Lab(prefix="ib") as lab:
        a, b = shaped_lab(lab)
        lab.start(b, [binary, "-s", "-B", B_ADDR, "-p", str(PORT)],
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_listening(lab, b, PORT)
        measured_within(lambda: server_cell(lab, a, reverse, binary), lambda got: got[1],
                        f"netprobe -> iperf3 {version} -s{' -R' if reverse else ''}", tries)


@pytest.mark.host_timing
@pytest.mark.parametrize("version", list(VERSIONS))
def test_netprobe_client_receives_from_stock_server(version: str) -> None:
    """``netprobe run B --iperf3 -R`` against ``iperf3 -s`` of one version across the
    link: netprobe's receiver reads the band."""
    _against_stock_server(version, reverse=True, tries=3)


@pytest.mark.host_timing
@pytest.mark.parametrize("version", list(VERSIONS))
def test_netprobe_client_sends_to_stock_server(version: str) -> None:
    """``netprobe run B --iperf3`` against ``iperf3 -s`` of one version across the link:
    the stock server's receiver figure (as netprobe's Result keeps it) and netprobe's
    sender in the band. (It read 91.5-92.9 on 7 of 10 tries while TEST_END waited for
    the last byte's acknowledgement, the link idle meanwhile; sent once every byte is on
    its way, 94.02-94.18 on 8 of 8.)"""
    _against_stock_server(version, reverse=False, tries=2)


def test_bytes_mode_result(tmp_path: Path) -> None:
    """A stock client's -n test against ``netprobe server --iperf3`` leaves a Result (its
    spec had neither a duration nor a byte count: refused, no Result, the client content)."""
    binary = stock("3.21")
    results = tmp_path / "iperf3.jsonl"
    with Lab(prefix="ib") as lab:
        a, b = shaped_lab(lab)
        serve_iperf3(lab, b, results)
        out = lab.run(a, [binary, "-c", B_ADDR, "-p", str(PORT), "-J", "-n", "10M"],
                      timeout=CLIENT_TIMEOUT_S)
        assert out.returncode == 0, out.stdout[-1500:]
        ours = next_result(results, 0)
    # What reached the server by TEST_END: at most what was sent (a stock server, too,
    # stops counting at TEST_END while the sender's buffer still drains).
    assert 0 < flows(ours)["client_to_server"]["receiver"]["bytes"] <= 10 * 2**20
