"""Charts and grades from real runs across a shaped namespace link (prefix ``nc``): what
the HTML report plots is read back out of its SVG (the series' paths, mapped to data by
the axes' own tick labels) and set against what the link can carry.

* A ``-P 4`` native run at 40 Mbit/s: each stream's record of a second and the sum end a
  millisecond apart; the plotted sum and the CDF never show one stream's rate as the flow's.
* A bufferbloat run with 22 % of the probes dropped on their way to the server (nftables,
  with a counter as the witness): its verdict counts the loss; its download line breaks
  where only the upload ran.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .netlab import A_ADDR, B_ADDR, Lab, measured_within, wait_listening

pytestmark = [pytest.mark.root, pytest.mark.slow]

why_not = Lab.available()
if why_not:
    pytestmark.append(pytest.mark.skip(reason=why_not))

NETPROBE = [sys.executable, "-m", "netprobe"]
RATE_MBIT = 40
PAYLOAD_MBIT = RATE_MBIT * 1448 / 1538  # TCP payload of the shaped Ethernet (netlab.shape)
DROP_PERCENT = 22


@pytest.fixture
def pair() -> Iterator[tuple[Lab, str, str]]:
    """(lab, client ns, server ns): 40 Mbit/s each way, a netprobe server in the second."""
    with Lab(prefix="nc") as lab:
        a, b = lab.host("a"), lab.host("b")
        dev_a, dev_b = lab.link(a, f"{A_ADDR}/24", b, f"{B_ADDR}/24")
        lab.shape(a, dev_a, RATE_MBIT, latency_ms=5)
        lab.shape(b, dev_b, RATE_MBIT, latency_ms=5)
        lab.start(b, [*NETPROBE, "server", "-B", B_ADDR], stdout=subprocess.DEVNULL,
                  stderr=subprocess.DEVNULL)
        wait_listening(lab, b, 5301)
        yield lab, a, b


def _html(lab: Lab, ns: str, saved: Path, out: Path) -> str:
    proc = lab.run(ns, [*NETPROBE, "report", str(saved), "--html", str(out)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out.read_text()


def _chart(html: str, chart: str) -> str:
    start = html.index(f"<figure class=chart id=chart-{chart}>")
    return html[start:html.index("</figure>", start)]


def _axis(svg: str, chart: str, axis: str) -> tuple[float, float]:
    """(value per pixel, value at pixel 0) of an axis, from two of its tick labels."""
    ticks = re.findall(rf'id="{re.escape(chart)}-{axis}tick_\d+">(.*?)</text>', svg, re.S)
    pairs = []
    for tick in ticks:
        where = re.search(rf'<use [^>]*\b{"y" if axis == "y" else "x"}="([-\d.]+)"', tick)
        label = re.search(r"<text[^>]*>([^<]*)$", tick)
        if where and label:
            pairs.append((float(where.group(1)), float(label.group(1).replace("\u2212", "-"))))
    (p0, v0), (p1, v1) = pairs[0], pairs[-1]
    per_pixel = (v1 - v0) / (p1 - p0)
    return per_pixel, v0 - p0 * per_pixel


def plotted(html: str, chart: str, series: str) -> list[list[tuple[float, float]]]:
    """The series' line as data (x, y), one list per unbroken piece."""
    svg = _chart(html, chart)
    path = re.search(rf'<g id="{re.escape(series)}">\s*<path d="([^"]*)"', svg)
    assert path is not None, f"no {series} in chart {chart}"
    xs, ys = _axis(svg, chart, "x"), _axis(svg, chart, "y")
    pieces: list[list[tuple[float, float]]] = []
    for op, x, y in re.findall(r"([ML])\s*([-\d.]+)\s+([-\d.]+)", path.group(1)):
        if op == "M":
            pieces.append([])
        pieces[-1].append((float(x) * xs[0] + xs[1], float(y) * ys[0] + ys[1]))
    return pieces


@pytest.mark.host_timing
def test_p4_run_is_plotted_at_the_links_rate_to_its_end(pair, tmp_path) -> None:  # type: ignore[no-untyped-def]
    lab, a, _ = pair
    saved = tmp_path / "p4.json"

    def measure() -> dict:
        proc = lab.run(a, [*NETPROBE, "run", B_ADDR, "-P", "4", "-t", "4", "-O", "1",
                           "--json", "-o", str(saved)], timeout=60)
        assert proc.returncode == 0, proc.stderr
        return json.loads(saved.read_text())

    def misses(document: dict) -> list[str]:
        # The chart is judged on a run that kept the link full: a host too busy to (a full
        # suite once saw the load average at 27 on 2 cores) is measured again, not blamed
        # on the drawing.
        receiver = document["summaries"][0]["receiver"]["bits_per_second"] / 1e6
        sums = [i["bits_per_second"] / 1e6 for i in document["intervals"]
                if i["role"] == "receiver" and i["stream_id"] is None
                and abs(i["end_s"] - i["start_s"] - 1) < 0.01]
        low = [round(v, 1) for v in sums if v < 0.8 * PAYLOAD_MBIT]
        return ([f"receiver {receiver:.1f} Mbit/s"] if receiver < 0.85 * PAYLOAD_MBIT
                else []) + ([f"seconds at {low} Mbit/s"] if low else [])

    document = measured_within(measure, misses, "a -P 4 run over the 40 Mbit/s link")
    html = _html(lab, a, saved, tmp_path / "p4.html")
    (line,) = plotted(html, "throughput-c2s", "series-throughput-c2s-1")
    values = [v for _, v in line]
    assert len(values) >= 3
    # Every second carried the link's rate; none is one stream's share of it (10 Mbit/s).
    # (The last interval runs on while the senders' buffers drain, 1.8 s at 31 Mbit/s as
    # measured, the streams ending one by one: 0.7 of the link, not 0.8.)
    assert min(values) > 0.7 * PAYLOAD_MBIT, values
    # The last bin holds the drain after the senders stopped, a partial interval: a full
    # suite once drew it at 44.4 on this 40 Mbit/s link (unexplained, noted in issue 34);
    # every whole second stays under the link.
    assert max(values[:-1]) < 1.1 * RATE_MBIT, values
    (steps,) = plotted(html, "cdf-c2s", "series-cdf-c2s-1")
    lowest = min(x for x, _ in steps)
    assert lowest > 0.7 * PAYLOAD_MBIT, steps
    # The streams' lines are on the same grid: at each full second they add up to the
    # sum's (the last interval's spans differ per stream, so there their rates do not add).
    by_time: dict[float, list[float]] = {}
    for n in range(1, 5):
        for piece in plotted(html, "streams-c2s-1", f"series-streams-c2s-1-{n}"):
            for t, v in piece:
                by_time.setdefault(round(t, 1), []).append(v)
    full = {round(i["end_s"]) for i in document["intervals"]
            if i["role"] == "receiver" and i["stream_id"] is None
            and abs(i["end_s"] - i["start_s"] - 1) < 0.01}
    for t, total in (point for point in line if round(point[0]) in full):
        assert len(by_time[round(t, 1)]) == 4, (t, by_time)
        assert sum(by_time[round(t, 1)]) == pytest.approx(total, rel=0.03), (t, by_time)


def _counters(lab: Lab, ns: str, table: str) -> list[int]:
    """The packet counts of a lab nftables table's counters, in rule order."""
    out = lab.run(ns, ["nft", "list", "table", "inet", table]).stdout
    found = [int(n) for n in re.findall(r"counter packets (\d+)", out)]
    assert found, out
    return found


def _count_probes_leaving(lab: Lab, ns: str) -> None:
    """Count the UDP datagrams to the server's port as they leave ``ns`` (its output hook,
    before the shaper's queue)."""
    nft = ["nft"]
    lab.run(ns, [*nft, "add", "table", "inet", "npsent"])
    lab.run(ns, [*nft, "add", "chain", "inet", "npsent", "out",
                 "{ type filter hook output priority 0; policy accept; }"])
    lab.run(ns, [*nft, "add", "rule", "inet", "npsent", "out", "udp", "dport", "5301",
                 "counter"])


def test_bufferbloat_verdict_counts_probe_loss_and_lines_break_when_idle(  # type: ignore[no-untyped-def]
        pair, tmp_path) -> None:
    lab, a, b = pair
    lab.drop_arriving(b, "udp", "dport", "5301", "numgen", "random", "mod", "100", "<",
                      str(DROP_PERCENT), "counter")
    # Before the drop: what arrived at all (the shaper's full queue drops probes too).
    lab.run(b, ["nft", "insert", "rule", "inet", "nplab", "in", "udp", "dport", "5301",
                "counter"])
    _count_probes_leaving(lab, a)
    saved = tmp_path / "bloat.json"
    proc = lab.run(a, [*NETPROBE, "bufferbloat", B_ADDR, "-t", "2", "--idle", "1",
                       "-o", str(saved)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    document = json.loads(saved.read_text())
    latency = document["latency"]
    assert latency["metric"] == "round_trip"
    loaded = [p for p in latency["phases"] if p["loaded"]]
    up_lost = sum(p["client_to_server"]["lost"] for p in latency["phases"])
    sent = sum(p["rtt"]["count"] + p["rtt"]["lost"] for p in latency["phases"])
    # nftables' counters are the witness: every probe the rule dropped is one the run lost
    # upstream (besides, at most, the last few still on their way when the session
    # closed); the rule also drops the UDP handshake's hello and proof datagrams, which are
    # retried and are no probes (a full suite once counted 45 drops for 44 lost). The
    # shaper's queue, full during the upload, drops some too: what left a and never
    # reached b's rule (a full suite once counted 43 lost for 39 dropped by the rule).
    arrived, dropped = _counters(lab, b, "nplab")
    (left,) = _counters(lab, a, "npsent")
    shaped_away = left - arrived
    assert dropped > 0 and shaped_away >= 0, (left, arrived, dropped)
    assert dropped - 3 <= up_lost <= dropped + shaped_away + 3, (up_lost, dropped, shaped_away)
    assert 0.1 < up_lost / sent < 0.35
    # The queue is 5 ms deep: the DSLReports grade (mean bloat) stays A, but a fifth of
    # the probes lost is a call no one can hold: the verdict is the loss's cap, never A.
    assert latency["grade"] in ("A+", "A")
    from netprobe.latency.figures import loss_cap, worst_grade  # (here: older code lacks them)

    expected = worst_grade(*(loss_cap(p["rtt"]["lost_percent"]) for p in loaded))
    assert latency["verdict"] == expected
    assert latency["verdict"] in ("B", "C", "D", "F")
    words = " ".join(proc.stdout.split())
    assert f"verdict {expected}" in words and "DSLReports grade" in words, words[-2000:]
    # The download ran in the download and both phases only: its line breaks between them.
    html = _html(lab, a, saved, tmp_path / "bloat.html")
    phases = {p["name"]: p for p in latency["phases"]}
    upload = phases["upload"]
    pieces = plotted(html, "throughput-s2c", "series-throughput-s2c-1")
    assert len(pieces) >= 2, pieces
    for piece in pieces:  # no piece runs through the upload phase
        assert not any(upload["start_s"] + 0.5 < x < upload["end_s"] - 0.5 for x, _ in piece)
    # The round trip's line breaks at every lost probe, not drawn across it.
    runs, answered = [], 0
    for sample in latency["samples"]:
        if sample["rtt_us"] is None:
            runs, answered = [*runs, answered], 0
        else:
            answered += 1
    runs = [r for r in [*runs, answered] if r]
    rtt_pieces = plotted(html, "lat1-time", "series-lat1-rtt")
    assert len([r for r in runs if r > 1]) <= len(rtt_pieces) <= len(runs), (runs, rtt_pieces)
    assert sum(len(p) for p in rtt_pieces) <= sum(runs)
    # The upload ran in the upload and both phases, one after the other: nothing before.
    up_pieces = plotted(html, "throughput-c2s", "series-throughput-c2s-1")
    assert all(x > upload["start_s"] for piece in up_pieces for x, _ in piece), up_pieces
