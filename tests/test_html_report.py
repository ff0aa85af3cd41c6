"""The HTML report as people look at it (issue 17): at 1300 px nothing overflows
sideways, UDP gets loss and jitter charts, every group gets a box plot with its CI and a
CDF of its interval throughput, and the results table names each result's group.
Checked in headless Chromium where it is installed (tests.test_html's browser helper)."""
from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from netprobe.results.analysis import group_results, group_stats
from netprobe.schema import Result, ToolInfo
from tests.test_formats import sample_result
from tests.test_html import chromium, needs_charts, parsed, run_browser

_WIDTH = '<script>document.body.setAttribute("data-width", ' \
         'document.documentElement.scrollWidth + "/" + window.innerWidth)</script></body>'


def _udp_results() -> list[Result]:
    made = []
    for trial in range(1, 7):
        tool = "a-long-group-name-for-the-table" if trial % 2 else "b"
        base = sample_result(protocol="udp")
        share = 1.0 + 0.1 * trial
        intervals = tuple(attrs.evolve(s, bits_per_second=s.bits_per_second * share,
                                       packets=1000, lost_packets=trial, jitter_ms=0.01 * trial)
                          if s.role == "receiver" else s for s in base.intervals)
        made.append(attrs.evolve(base, tool=ToolInfo(tool), trial=trial, run_id="r1",
                                 spec=attrs.evolve(base.spec, tool=tool), intervals=intervals))
    return made


def _page() -> str:
    from netprobe.cli.html import render_page

    found = _udp_results()
    groups = group_results(found, ["tool"])
    return render_page(found, groups, group_stats(groups), sources=["runs.jsonl"])


@needs_charts
def test_page_has_udp_distribution_charts_and_named_groups() -> None:
    text = _page()
    ids = parsed(text).ids
    for chart in ("loss-c2s", "jitter-c2s", "box-c2s", "cdf-c2s"):
        assert f"chart-{chart}" in ids, chart
    for chart in ("box-c2s", "cdf-c2s"):  # one box and one CDF line per group
        assert sum(bool(re.fullmatch(rf"series-{chart}-\d+", i)) for i in ids) == 2
    results_table = text[text.index("<table id=results>"):]
    assert "<th>group</th>" in results_table
    assert results_table.count("a-long-group-name-for-the-table") >= 3


@needs_charts
@pytest.mark.skipif(chromium() is None, reason="chromium not installed")
def test_page_fits_1300_px_in_a_browser(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    out.write_text(_page().replace("</body>", _WIDTH))
    dom = run_browser("--window-size=1300,3000", "--dump-dom", out.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'data-width="(\d+)/(\d+)"', dom.stdout)
    assert found, dom.stdout[-500:]
    assert int(found.group(1)) <= int(found.group(2))  # no horizontal scrolling
