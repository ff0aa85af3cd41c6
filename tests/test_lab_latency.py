"""Latency under load across real queues: namespaces ``...lata`` (client) and ``...latb``
(server) joined by a veth pair, the client's egress shaped by tc tbf, TCP cubic filling
the queue (the machine's default is bbr, which keeps queues short by design).

tbf's queue holds ``limit = rate x latency + burst`` bytes, and drains at the rate counted
on the wire (frame + 24 bytes, see Lab.shape), so a full queue delays a packet by
``limit x 8 / rate x 1538 / 1514`` seconds: the figure the probes' one-way delay from
client to server must reach, and cannot exceed by more than the host's own noise.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from netprobe.latency.figures import grade

from .netlab import A_ADDR, B_ADDR, Lab, wait_listening

pytestmark = [pytest.mark.root, pytest.mark.slow]

why_not = Lab.available()
if why_not:
    pytestmark.append(pytest.mark.skip(reason=why_not))

NETPROBE = [sys.executable, "-m", "netprobe"]
LINK_PAYLOAD_BPS = 100e6 * 1448 / 1538  # TCP payload of a 100 Mbit/s Ethernet (netlab.shape)
RATE_MBIT = 20
BURST_BYTES = 10 * 1024  # small, so the shallow queue is the latency asked for, not the burst


def tbf_queue_delay_ms(rate_mbit: float, latency_ms: float, burst_bytes: int) -> float:
    """How long a full tbf queue delays a packet, from its limit and rate (see above)."""
    rate_bytes_s = rate_mbit * 1e6 / 8
    limit = rate_bytes_s * latency_ms / 1000 + burst_bytes
    return limit / rate_bytes_s * 1000 * 1538 / 1514


@pytest.fixture
def pair() -> Iterator[tuple[Lab, str, str, str]]:
    """(lab, client ns, server ns, client's device); a netprobe server runs in b."""
    with Lab() as lab:
        a, b = lab.host("lata"), lab.host("latb")
        dev_a, _ = lab.link(a, f"{A_ADDR}/24", b, f"{B_ADDR}/24")
        lab.start(b, [*NETPROBE, "server", "-B", B_ADDR], stdout=subprocess.DEVNULL,
                  stderr=subprocess.DEVNULL)
        wait_listening(lab, b, 5301)
        yield lab, a, b, dev_a


def run_latency(lab: Lab, ns: str, *args: str) -> dict:
    proc = lab.run(ns, [*NETPROBE, "run", B_ADDR, "--json", "--latency", *args], timeout=90)
    assert proc.returncode == 0, proc.stderr
    document: dict = json.loads(proc.stdout)
    return document


def phase(document: dict, name: str) -> dict:
    found: dict = next(p for p in document["latency"]["phases"] if p["name"] == name)
    return found


@pytest.mark.host_timing
def test_idle_link_probes_answer_within_a_millisecond(pair) -> None:  # type: ignore[no-untyped-def]
    lab, a, _, _ = pair
    document = run_latency(lab, a, "-t", "1", "-b", "1M", "--latency-idle", "1")
    idle = phase(document, "idle")
    assert idle["rtt"]["count"] >= 18  # 1 s at 20 per second
    assert idle["rtt"]["p50_us"] < 1000
    for each in document["latency"]["phases"]:
        assert each["rtt"]["lost"] == 0
    assert document["latency"]["grade"] in ("A+", "A")


@pytest.mark.host_timing
def test_deep_queue_shows_as_bufferbloat_upstream(pair) -> None:  # type: ignore[no-untyped-def]
    lab, a, _, dev_a = pair
    lab.shape(a, dev_a, RATE_MBIT, burst=f"{BURST_BYTES}b", latency_ms=200)
    document = run_latency(lab, a, "-t", "8", "-P", "4", "--congestion", "cubic",
                           "--latency-idle", "1.5")
    latency = document["latency"]
    loaded, idle = phase(document, "loaded"), phase(document, "idle")
    expected_ms = tbf_queue_delay_ms(RATE_MBIT, 200, BURST_BYTES)  # 207.5 ms
    increase_ms = latency["increase_us"] / 1000
    assert increase_ms >= 100
    assert loaded["rtt"]["p50_us"] - idle["rtt"]["p50_us"] == pytest.approx(
        latency["increase_us"])
    # The queue fills to tbf's limit, and no further: its delay is the one-way figure.
    up_p99_ms = loaded["client_to_server"]["p99_us"] / 1000
    assert 0.8 * expected_ms <= up_p99_ms <= 1.15 * expected_ms + 5
    assert increase_ms <= expected_ms + 5
    # Graded as DSLReports grades: the mean loaded round trip over idle (the bloat).
    assert latency["bloat_us"] == pytest.approx(loaded["rtt"]["mean_us"] - idle["rtt"]["p50_us"])
    assert latency["grade"] == grade(latency["bloat_us"])
    # D needs a mean bloat of 200 ms, 96 % of the full queue's 207.5 ms all the time; cubic
    # backs off by 30 % at each loss and refills, and the ramp of slow start counts too,
    # so the mean sits below the full queue: the same 100 ms bar as the median's increase,
    # never more than the queue holds; C (60-200 ms) or, with the queue near full
    # throughout, D; never better, never F.
    assert 100 <= latency["bloat_us"] / 1000 <= expected_ms + 5
    assert latency["grade"] in ("C", "D")
    # The other direction has no queue: its delay stays low.
    assert loaded["server_to_client"]["p50_us"] < 5000


@pytest.mark.host_timing
def test_shallow_queue_keeps_latency_low(pair) -> None:  # type: ignore[no-untyped-def]
    lab, a, _, dev_a = pair
    lab.shape(a, dev_a, RATE_MBIT, burst=f"{BURST_BYTES}b", latency_ms=5)
    document = run_latency(lab, a, "-t", "6", "-P", "4", "--congestion", "cubic",
                           "--latency-idle", "1.5")
    latency = document["latency"]
    expected_ms = tbf_queue_delay_ms(RATE_MBIT, 5, BURST_BYTES)  # 9.2 ms
    assert latency["increase_us"] / 1000 < 15
    assert latency["increase_us"] / 1000 <= expected_ms + 3
    assert latency["grade"] in ("A+", "A")
    # The link is full all the same: the probes measured it loaded, not idle.
    receiver = document["summaries"][0]["receiver"]
    assert receiver["bits_per_second"] > 0.9 * RATE_MBIT * 1e6 * 1448 / 1538


@pytest.mark.host_timing
def test_bufferbloat_on_an_asymmetric_link_blames_the_upload(pair, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """100 Mbit/s down with a shallow queue, 20 Mbit/s up with a deep one (a cable or DSL
    line without SQM): each direction runs at its ceiling and the bloat is the upload's."""
    lab, a, b, dev_a = pair
    lab.shape(a, dev_a, RATE_MBIT, burst=f"{BURST_BYTES}b", latency_ms=200)
    dev_b = next(line.split(":")[1].strip().split("@")[0]
                 for line in lab.run(b, ["ip", "-o", "link"]).stdout.splitlines()
                 if "link/ether" in line)
    lab.shape(b, dev_b, 100, latency_ms=5)
    saved = tmp_path / "bloat.json"
    proc = lab.run(a, [*NETPROBE, "bufferbloat", B_ADDR, "-t", "4", "-O", "1", "--idle", "1",
                       "--congestion", "cubic", "-o", str(saved)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    document = json.loads(saved.read_text())
    phases = {p["name"]: p for p in document["latency"]["phases"]}
    down_ceiling = 100e6 * 1448 / 1538  # TCP payload of a 100 Mbit/s Ethernet: 94.1 Mbit/s
    up_ceiling = RATE_MBIT * 1e6 * 1448 / 1538  # 18.8 Mbit/s
    down = phases["download"]["server_to_client_bits_per_second"]
    up = phases["upload"]["client_to_server_bits_per_second"]
    assert down == pytest.approx(down_ceiling, rel=0.02)
    assert up == pytest.approx(up_ceiling, rel=0.02)
    # The upload's queue is the deep one; the download's stays shallow.
    assert phases["upload"]["client_to_server"]["p50_us"] > 100_000
    assert phases["download"]["server_to_client"]["p50_us"] < 15_000
    assert phases["upload"]["grade"] in ("C", "D", "F")
    assert phases["download"]["grade"] in ("A+", "A")
    words = " ".join(proc.stdout.split())
    assert "the queue builds from client to server (upload)" in words, proc.stdout[-3000:]


@pytest.mark.host_timing
def test_probes_cost_under_two_percent_of_a_100_mbit_link() -> None:
    """The same 100 Mbit/s TCP test with and without the probes (twice each, interleaved,
    the better of each kept: the host is shared and noisy)."""
    with Lab() as lab:
        a, b = lab.host("lata"), lab.host("latb")
        dev_a, dev_b = lab.link(a, f"{A_ADDR}/24", b, f"{B_ADDR}/24")
        lab.shape(a, dev_a, 100)
        lab.shape(b, dev_b, 100)
        lab.start(b, [*NETPROBE, "server", "-B", B_ADDR], stdout=subprocess.DEVNULL,
                  stderr=subprocess.DEVNULL)
        wait_listening(lab, b, 5301)
        rates: dict[bool, list[float]] = {False: [], True: []}
        for probes in (False, True, False, True):
            extra = ["--latency", "--latency-idle", "0.5"] if probes else []
            proc = lab.run(a, [*NETPROBE, "run", B_ADDR, "--json", "-t", "2", "-O", "0.5",
                               *extra], timeout=60)
            assert proc.returncode == 0, proc.stderr
            document = json.loads(proc.stdout)
            rates[probes].append(document["summaries"][0]["receiver"]["bits_per_second"])
            assert (document["latency"] is not None) == probes
    # The reference is at most what the link carries (100 x 1448/1538 = 94.1 Mbit/s of
    # TCP payload): the receiver's figure of these 2 s tests after a 0.5 s warm-up was
    # once seen at 95.9-99.0 Mbit/s without probes, and one such run made the probes look
    # 4% dear. The cause, since fixed, was the wake threshold holding up to 1 MiB
    # uncounted at the warm-up's end (test_lab_native's never_read_above_the_wire); what
    # is left above 94.1 (95.2 at most) is tbf adding its per-frame overhead once per GSO
    # packet.
    reference = min(max(rates[False]), LINK_PAYLOAD_BPS)
    assert max(rates[True]) >= 0.98 * reference, rates


@pytest.mark.skipif(not shutil.which("nft"), reason="nftables (nft) is not installed")
def test_probes_fall_back_to_tcp_where_udp_is_dropped(pair) -> None:  # type: ignore[no-untyped-def]
    lab, a, b, _ = pair
    lab.drop_arriving(b, "meta", "l4proto", "udp")
    document = run_latency(lab, a, "-t", "1", "-b", "1M", "--latency-idle", "1")
    latency = document["latency"]
    assert latency["measured_by"] == "netprobe-tcp"
    assert latency["phases"][0]["rtt"]["count"] >= 15 and latency["lost"] == 0
    assert latency["phases"][0]["rtt"]["p50_us"] < 5000
