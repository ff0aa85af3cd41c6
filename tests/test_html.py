"""``netprobe report --html``: the page's content, the message without the charts extra, and
the page rendered by a real headless browser (Debian's chromium; skipped without it)."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import attrs
import pytest

from netprobe.convert import to_json
from netprobe.results.analysis import group_results, group_stats
from netprobe.schema import Result, ToolInfo
from tests.test_cli import assert_one_error_line, child_env
from tests.test_formats import sample_result
from tests.test_report import run_main

BROWSER_TIMEOUT = 90
needs_charts = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="matplotlib not installed (pip install 'netprobe-meter[charts]')")


def results(direction: str = "normal") -> list[Result]:
    """Two tools, two trials each, two streams, interleaved as compare runs them; tool b
    at half the rate (so that no line hides another)."""
    made = []
    for trial in range(1, 5):
        tool = "a" if trial % 2 else "b"
        base = sample_result(streams=2, direction=direction)
        share = 1.0 if tool == "a" else 0.5
        intervals = tuple(attrs.evolve(s, bits_per_second=s.bits_per_second * share)
                          for s in base.intervals)
        made.append(attrs.evolve(base, tool=ToolInfo(tool), run_id="r1", trial=trial,
                                 spec=attrs.evolve(base.spec, tool=tool), intervals=intervals))
    return made


def page(direction: str = "normal") -> str:
    from netprobe.cli.html import render_page

    found = results(direction)
    groups = group_results(found, ["tool"])
    return render_page(found, groups, group_stats(groups), sources=["runs.jsonl"])


class Ids(HTMLParser):
    """Every id in a document, and the tags used."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.tags: Counter[str] = Counter()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs_: list[tuple[str, str | None]]) -> None:
        self.tags[tag] += 1
        for name, value in attrs_:
            if name == "id" and value:
                self.ids.append(value)
            if name in ("src", "href") and value and not value.startswith("#"):
                self.urls.append(value)


def parsed(text: str) -> Ids:
    parser = Ids()
    parser.feed(text)
    return parser


def series_count(ids: list[str], chart: str) -> int:
    """The series a chart plots: SVG groups with ids ``series-<chart>-<n>``."""
    return sum(bool(re.fullmatch(rf"series-{re.escape(chart)}-\d+", i)) for i in ids)


EXPECTED_SERIES = {"throughput-c2s": 2, "streams-c2s-1": 2, "streams-c2s-2": 2,
                   "retransmits-c2s": 2, "rtt-c2s": 2, "box-c2s": 2, "cdf-c2s": 2}
"""Charts of :func:`results` and their series: per tool (2), per stream of each tool (2)."""


@needs_charts
def test_page_has_the_table_and_every_series() -> None:
    found = parsed(page())
    charts = [i.removeprefix("chart-") for i in found.ids if i.startswith("chart-")]
    assert charts == list(EXPECTED_SERIES)
    for chart, count in EXPECTED_SERIES.items():
        assert series_count(found.ids, chart) == count, chart
    # Behind each tool's mean line, each of its trials as a thin line.
    assert sum(i.startswith("trial-throughput-c2s-") for i in found.ids) == 4
    assert "stats" in found.ids and "results" in found.ids
    assert found.tags["svg"] == len(EXPECTED_SERIES)


@needs_charts
def test_page_is_self_contained() -> None:
    text = page()
    found = parsed(text)
    assert found.tags["script"] == 0 and found.tags["link"] == 0 and found.tags["img"] == 0
    assert found.urls == []  # nothing to fetch: no src, no href out of the page
    assert len(found.ids) == len(set(found.ids))  # matplotlib's ids do not clash across charts
    # ... and what refers to them (clip paths, markers) follows the renaming.
    for target in re.findall(r'(?:url\(#|href="#)([^")]+)', text):
        assert target in found.ids, target


@needs_charts
def test_bidir_page_charts_both_directions() -> None:
    charts = [i for i in parsed(page("bidir")).ids if i.startswith("chart-throughput")]
    assert charts == ["chart-throughput-c2s", "chart-throughput-s2c"]


@needs_charts
def test_report_html_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    saved = tmp_path / "runs.jsonl"
    code, _, err = run_main(capsys, "compare", "--tools", "replay,other", "-n", "2", "-t", "1",
                            "-o", str(saved), "-q")
    assert code == 0, err
    out_html = tmp_path / "report.html"
    code, out, err = run_main(capsys, "report", str(saved), "--html", str(out_html), "-q")
    assert code == 0, err
    assert out == ""
    ids = parsed(out_html.read_text()).ids
    assert series_count(ids, "throughput-c2s") == 2


def test_html_without_matplotlib_says_how_to_get_it(tmp_path: Path) -> None:
    saved = tmp_path / "r.json"
    saved.write_text(to_json(sample_result()))
    out_html = tmp_path / "out.html"
    code = ("import sys\nsys.modules['matplotlib'] = None  # as if not installed\n"
            "from netprobe.cli.main import main\n"
            f"sys.exit(main(['report', {str(saved)!r}, '--html', {str(out_html)!r}]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=child_env())
    assert done.returncode == 4
    assert_one_error_line(done.stderr)
    assert "pip install 'netprobe-meter[charts]'" in done.stderr
    assert done.stdout == "" and not out_html.exists()


# --- a real browser ----------------------------------------------------------------------


def chromium() -> str | None:
    """Debian's chromium, if installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def run_browser(*args: str) -> subprocess.CompletedProcess:
    """Run headless chromium (its own process group, killed by its id if it hangs)."""
    browser = chromium()
    assert browser is not None
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.Popen(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        try:
            out, err = proc.communicate(timeout=BROWSER_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)


def colour_share(path: Path, rgb: tuple[int, int, int]) -> float:
    """The fraction of the screenshot's pixels close to ``rgb`` (a series colour)."""
    from matplotlib.image import imread

    pixels = imread(str(path))[..., :3] * 255
    close = (abs(pixels - rgb) < 40).all(axis=-1)
    return float(close.mean())


@needs_charts
@pytest.mark.skipif(chromium() is None, reason="chromium not installed (apt-get install "
                                               "chromium)")
def test_page_in_a_headless_browser(tmp_path: Path) -> None:
    out_html = tmp_path / "report.html"
    out_html.write_text(page())
    url = out_html.as_uri()
    dom = run_browser("--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    ids = parsed(dom.stdout).ids
    for chart, count in EXPECTED_SERIES.items():
        assert series_count(ids, chart) == count, chart
    shot = tmp_path / "report.png"
    done = run_browser(f"--screenshot={shot}", "--window-size=1200,2000", url)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    assert png_size(shot) == (1200, 2000)
    # The two tools' lines are drawn: matplotlib's first two colours are on the screen.
    assert colour_share(shot, (0x1F, 0x77, 0xB4)) > 0.0005  # C0, tool a
    assert colour_share(shot, (0xFF, 0x7F, 0x0E)) > 0.0005  # C1, tool b
