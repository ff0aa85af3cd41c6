"""``netprobe report`` over results that carry latency under load: per group the loaded
round trip's p50 and p99, the increase, the bloat, RPM, probe loss and the grade, with the
same statistics as throughput, in text, --json and --html. Figures worked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from netprobe.convert import to_json
from netprobe.latency import figures as latency
from netprobe.latency.figures import Phase, ProbeLog, ProbeSample
from netprobe.results.analysis import group_results, group_stats
from netprobe.schema import Result
from tests.test_report import result, run_main


def _probed(tool: str, bloat_ms: float, lost: int = 0) -> Result:
    """A result whose probes saw 1 ms idle and ``1 + bloat_ms`` loaded (20 probes each,
    ``lost`` more loaded probes unanswered): its median and mean rise by ``bloat_ms``."""
    samples = [ProbeSample(seq=i, phase=0, sent_s=i * 0.05, rtt_us=1000.0) for i in range(20)]
    samples += [ProbeSample(seq=20 + i, phase=1, sent_s=1 + i * 0.05,
                            rtt_us=1000.0 + bloat_ms * 1000) for i in range(20)]
    samples += [ProbeSample(seq=40 + i, phase=1, sent_s=2 + i * 0.05) for i in range(lost)]
    log = ProbeLog(samples=tuple(samples), transport="udp",
                   phases=(Phase("idle", False, 0.0, 1.0), Phase("loaded", True, 1.0, 3.0)))
    return attrs.evolve(result(tool), latency=latency.summarize(log))


def _results() -> list[Result]:
    # a: bloat 10, 20, 30 ms (grades A, A, B); b: 100 and 300 ms (C, D), one of its two
    # results with 5 of 25 loaded probes lost; c: throughput only, no probes.
    return [_probed("a", 10), _probed("b", 100, lost=5), _probed("a", 20), _probed("b", 300),
            _probed("a", 30), result("c")]


def test_group_stats_have_latency_figures_worked_by_hand() -> None:
    a, b, c = group_stats(group_results(_results(), ["tool"]))
    bloat = a.get("latency", "latency_bloat_us")
    assert bloat is not None and bloat.summary is not None
    assert (bloat.summary.n, bloat.summary.mean, bloat.summary.median) == (3, 20_000.0, 20_000.0)
    # sd 10 ms over 3: half width t(0.975, 2) x 10 / sqrt(3) = 24.84 ms, as for throughput.
    assert bloat.summary.ci_half_width == pytest.approx(24_841.38, rel=1e-6)
    p50 = b.get("latency", "latency_p50_us")
    assert p50 is not None and p50.summary is not None
    assert p50.summary.mean == pytest.approx(201_000.0)  # (101 + 301) / 2 ms
    assert p50.ratio == pytest.approx(201 / 21)  # against a's 21 ms
    rpm = a.get("latency", "latency_rpm")
    assert rpm is not None and rpm.summary is not None
    assert rpm.summary.median == pytest.approx(60 / 0.021)
    loss = b.get("latency", "latency_lost_percent")
    assert loss is not None and loss.summary is not None
    assert loss.summary.max == pytest.approx(20.0) and loss.summary.min == 0.0
    # A group without probes has no latency figures: known as unknown, not zero.
    none = c.get("latency", "latency_p50_us")
    assert none is not None and none.summary is None


def _saved(tmp_path: Path) -> str:
    path = tmp_path / "results.jsonl"
    path.write_text("".join(to_json(r, indent=None) + "\n" for r in _results()))
    return str(path)


def test_report_json_has_latency_records_and_grades(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    code, out, err = run_main(capsys, "report", "--json", _saved(tmp_path))
    assert code == 0, err
    records = {(r["group"], r["figure"]): r for r in json.loads(out)}
    bloat = records[("a", "latency_bloat_us")]
    assert bloat["direction"] == "latency" and bloat["mean"] == pytest.approx(20_000.0)
    assert bloat["ci_low"] is not None and bloat["n"] == 3
    grade_a, grade_b = records[("a", "latency_grade")], records[("b", "latency_grade")]
    # The grade of each statistic of the bloat: a's mean and median 20 ms are A, its best
    # 10 ms A, its worst 30 ms B; b's mean 200 ms is D, its best C.
    assert (grade_a["mean"], grade_a["median"], grade_a["min"], grade_a["max"]) == \
        ("A", "A", "A", "B")
    assert (grade_b["mean"], grade_b["min"], grade_b["max"]) == ("D", "C", "D")
    assert grade_a["stdev"] is None and grade_a["ratio"] is None
    assert records[("a", "latency_increase_us")]["median"] == pytest.approx(20_000.0)
    assert records[("c", "latency_p50_us")]["n"] is None


def test_report_text_and_html_show_latency_rows(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    saved = _saved(tmp_path)
    code, out, err = run_main(capsys, "report", "--summary-only", saved)
    assert code == 0, err
    text = " ".join(out.split())
    for label in ("latency p50 (ms)", "latency p99 (ms)", "latency increase (ms)",
                  "latency bloat (ms)", "RPM", "probe loss (%)", "DSLReports grade"):
        assert label in text, out
    code, lines, err = run_main(capsys, "report", saved)
    assert code == 0, err
    trials = [line for line in lines.splitlines() if line.startswith("#-")]
    # Each result's line carries its grade and bloat (a's third: 30 ms, B); c has none.
    assert "latency bloat +30.0 ms, verdict B (DSLReports B)" in trials[4], trials
    assert "grade" not in trials[5]
    grade_row = next(line for line in out.splitlines() if "DSLReports grade" in line)
    assert grade_row.split()[grade_row.split().index("grade") + 1:][:3] == ["a", "3", "A"]
    # --html's summary table is made of the same rows (the page itself, with its charts,
    # is drawn in test_latency_cli's bufferbloat test).
    from netprobe.cli.html import stats_html

    html = stats_html(group_stats(group_results(_results(), ["tool"])), ["tool"])
    assert "<td>latency bloat (ms)</td>" in html and "<td>DSLReports grade</td>" in html
    assert "<td>A+..B</td>" in html  # a's CI of the mean bloat, -4.8 to 44.8 ms, as grades



def test_a_tools_tcp_srtt_is_never_set_beside_a_probes_round_trip() -> None:
    """iperf 2's -e RTT (the sender's smoothed TCP RTT, metric tcp_srtt) and netprobe's
    probe round trip are two quantities: each has its own rows, and no ratio crosses them."""
    probed = _probed("iperf2", 50).latency
    assert probed is not None
    srtt = attrs.evolve(probed, metric="tcp_srtt", measured_by="iperf2")
    native, iperf2 = group_stats(group_results(
        [_probed("native", 10), attrs.evolve(result("iperf2"), latency=srtt)], ["tool"]))
    rtt = native.get("latency", "latency_p50_us")
    assert rtt is not None and rtt.summary is not None and rtt.summary.mean == 11_000.0
    not_rtt = iperf2.get("latency", "latency_p50_us")
    assert not_rtt is not None and not_rtt.summary is None  # an sRTT is not a round trip
    own = iperf2.get("latency", "tcp_srtt_p50_us")
    assert own is not None and own.summary is not None and own.summary.mean == srtt.p50_us
    assert own.ratio is None  # native has no sRTT to divide by
    # With --latency the probes take Result.latency and the tool's sRTT is tool_latency:
    # both rows are there, each from its own record.
    (beside,) = group_stats(group_results(
        [attrs.evolve(_probed("iperf2", 10), tool_latency=srtt)], ["tool"]))
    for key, mean in (("latency_p50_us", 11_000.0), ("tcp_srtt_p50_us", srtt.p50_us)):
        row = beside.get("latency", key)
        assert row is not None and row.summary is not None and row.summary.mean == mean


def test_html_page_says_which_way_the_probes_were_lost() -> None:
    """The page names each phase's lost probes per direction, as the terminal view does."""
    pytest.importorskip("matplotlib")
    from netprobe.cli.htmllatency import latency_html

    probed = _probed("native", 100, lost=5)
    assert probed.latency is not None
    loaded = probed.latency.phases[1]
    assert loaded.rtt is not None and loaded.rtt.lost == 5
    # The server's list of what reached it: 3 lost on the way there, 2 on the way back.
    ways = attrs.evolve(loaded, client_to_server=attrs.evolve(loaded.rtt, lost=3),
                        server_to_client=attrs.evolve(loaded.rtt, lost=2))
    latency = attrs.evolve(probed.latency, phases=(probed.latency.phases[0], ways))
    page = "".join(latency_html([attrs.evolve(probed, latency=latency)]))
    assert "5 probes lost (loaded: 3 client to server, 2 server to client)" in page
    assert "probes lost" not in "".join(latency_html([_probed("native", 100)]))
