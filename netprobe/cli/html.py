"""``netprobe report --html OUT.html``: one self-contained page (no scripts, no fonts, no
network needed to view it) with the statistics table and charts drawn by matplotlib as
inline SVG: throughput over time per tool (and per stream, for tests with several),
retransmits and RTT over time.

matplotlib is the optional extra ``netprobe-meter[charts]``: routers that only run tests never
install it. Charts are drawn through ``matplotlib.figure.Figure`` directly, never pyplot,
so no GUI backend or global figure state is involved. Each plotted series is an SVG group
with an id (``series-<chart>-<n>``), which is what the browser test counts.

Writes a file, prints nothing, and does not import rich.
"""
from __future__ import annotations

import datetime
import io
import math
from collections.abc import Sequence
from typing import Any

from netprobe.cli.htmldist import HEADROOM, distribution_html
from netprobe.cli.htmlparts import _RC, _e, _label, _scoped
from netprobe.cli.outfile import write_text
from netprobe.cli.tabulate import DIRECTION_LABELS, scale, stats_header, stats_rows
from netprobe.cli.textsafe import for_terminal
from netprobe.redact import redact
from netprobe.results.analysis import (
    GappedPoint,
    Group,
    GroupStats,
    Point,
    directions,
    jitter_series,
    loss_series,
    mean_series,
    retransmit_series,
    rtt_series,
    stream_series,
    throughput_series,
    with_gaps,
)
from netprobe.schema import Result
from netprobe.version import __version__

CHARTS_HINT = "pip install 'netprobe-meter[charts]'"
"""How to get the charting library (matplotlib)."""

_DIRECTION_IDS = {"client_to_server": "c2s", "server_to_client": "s2c"}
_GROUP_COLOURS = tuple(f"C{k}" for k in range(10))  # matplotlib's default cycle (tab10)
# ColorBrewer Dark2 (its orange last, being nearest tab10's), so streams never look like tools.
_STREAM_COLOURS = ("#1b9e77", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d",
                   "#666666", "#d95f02")
def charts_missing() -> str | None:
    """None if charts can be drawn here, else one line saying how to get matplotlib."""
    try:
        import matplotlib  # noqa: F401  (the whole library loads only to draw)
    except ImportError:
        return f"--html needs matplotlib, which is not installed: {CHARTS_HINT}"
    return None


def write_page(path: str, results: Sequence[Result], groups: Sequence[Group],
               stats: Sequence[GroupStats], *, sources: Sequence[str] = (),
               keys: Sequence[str] = ("tool",),
               sections: Sequence[tuple[str, str]] = ()) -> None:
    """Write the report page to ``path`` (OutputError if it cannot be)."""
    page = render_page(results, groups, stats, sources=sources, keys=keys, sections=sections)
    # The chart labels matplotlib wrote into the SVG are foreign text too: no control
    # character of a name reaches the file (the page's own text has only newlines).
    write_text(path, redact(for_terminal(page)))  # and no password of an archive URL


def render_page(results: Sequence[Result], groups: Sequence[Group],
                stats: Sequence[GroupStats], *, sources: Sequence[str] = (),
                keys: Sequence[str] = ("tool",),
                sections: Sequence[tuple[str, str]] = ()) -> str:
    """The report page as one HTML document; ``sections`` (title, HTML made safe by its
    maker) go after the summary, e.g. a fleet's matrix."""
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        f"<h1>netprobe report</h1><p class=meta>{len(results)} results in {len(groups)} "
        f"groups (by {_e(', '.join(keys))}) from {_e(', '.join(sources) or '-')}; made "
        f"{when} by netprobe {_e(__version__)}</p>",
        "<h2>Summary</h2>", stats_html(stats, keys),
        *(f"<h2>{_e(title)}</h2>{body}" for title, body in sections),
        "<h2>Over time</h2>", *charts_html(groups),
        *_latency_section(results),
        "<h2>Results</h2>", results_html(results, groups),
    ]
    return _PAGE.format(style=_STYLE, body="\n".join(parts))


def _latency_section(results: Sequence[Result]) -> list[str]:
    from netprobe.cli.htmllatency import latency_html  # its own module: latency charts

    charts = latency_html(results)
    return ["<h2>Latency under load</h2>", *charts] if charts else []


# --- tables ------------------------------------------------------------------------------


def stats_html(stats: Sequence[GroupStats], keys: Sequence[str]) -> str:
    """The statistics table (the same rows as the terminal's), a tbody per figure."""
    blocks = stats_rows(stats)
    if not blocks:
        return "<p>No successful results to summarise.</p>"
    title = "Tool" if list(keys) == ["tool"] else "Group"
    head = "".join(f"<th>{_e(name)}</th>" for name in stats_header(stats, title))
    bodies = "".join(
        "<tbody>" + "".join("<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in row) + "</tr>"
                            for row in block) + "</tbody>"
        for block in blocks)
    return f"<table id=stats class=stats><thead><tr>{head}</tr></thead>{bodies}</table>"


def results_html(results: Sequence[Result], groups: Sequence[Group] = ()) -> str:
    """One row per result: its group, run, trial, tool, start, status, throughput per
    direction."""
    head = "".join(f"<th>{name}</th>" for name in
                   ("group", "run", "trial", "tool", "started", "status", "throughput"))
    group_of = {id(r): g.label for g in groups for r in g.results}
    rows = []
    for result in results:
        rate = "; ".join(f"{DIRECTION_LABELS[f.direction]} {_rate_text(f)}"
                         for f in result.summaries)
        cells = [group_of.get(id(result), "-"), (result.run_id or "-")[:8],
                 result.trial or "-", result.tool.name,
                 result.start_time or "-", result.status, rate or "-"]
        rows.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    return f"<table id=results><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}" \
           "</tbody></table>"


def _rate_text(flow: Any) -> str:
    side = flow.receiver or flow.sender
    if side is None:
        return "-"
    divisor, unit = scale("rate", side.bits_per_second)
    return f"{side.bits_per_second / divisor:.3g} {unit}"


# --- charts ------------------------------------------------------------------------------


def charts_html(groups: Sequence[Group]) -> list[str]:
    """Every chart the results have data for, per flow direction."""
    good = [Group(g.label, tuple(r for r in g.results if r.status == "ok")) for g in groups]
    good = [g for g in good if g.results]
    figures = []
    for direction in directions(r for g in good for r in g.results):
        figures += _direction_charts(good, direction)
    return figures or ["<p>No interval samples to chart.</p>"]


def _direction_charts(groups: Sequence[Group], direction: str) -> list[str]:
    tag = _DIRECTION_IDS[direction]
    arrow = DIRECTION_LABELS[direction]
    charts = [_chart(f"throughput-{tag}", f"Throughput over time, {arrow}, per group "
                     "(thin lines: each result)", "rate", _per_group(groups, direction,
                                                                     throughput_series), True)]
    for i, group in enumerate(groups):
        streams = _per_stream(group, direction)
        if len(streams) > 1:
            charts.append(_chart(f"streams-{tag}-{i + 1}", f"Throughput per stream, {arrow}, "
                                 f"{group.label} (mean of its results)", "rate", streams,
                                 colours=_STREAM_COLOURS))
    for name, title, kind, extract in (
            ("retransmits", "Retransmits per interval", "count", retransmit_series),
            ("rtt", "RTT (smoothed, end of interval)", "us", rtt_series),
            ("loss", "UDP loss per interval", "percent", loss_series),
            ("jitter", "UDP jitter (end of interval)", "ms", jitter_series)):
        lines = _per_group(groups, direction, extract)
        if any(points for _, points, _ in lines):
            charts.append(_chart(f"{name}-{tag}", f"{title}, {arrow}, per group", kind, lines))

    return charts + distribution_html(groups, direction, tag)


Line = tuple[str, list[GappedPoint], list[list[GappedPoint]]]
"""(label, the plotted series, the thin lines behind it): None values are gaps, where
nothing was measured, drawn as breaks in the line."""


def _per_group(groups: Sequence[Group], direction: str, extract: Any) -> list[Line]:
    lines = []
    for group in groups:
        each = [extract(r, direction) for r in group.results]
        each = [points for points in each if points]
        lines.append((group.label, with_gaps(mean_series(each)),
                      [with_gaps(points) for points in each] if len(each) > 1 else []))
    return lines


def _per_stream(group: Group, direction: str) -> list[Line]:
    by_stream: dict[int, list[list[Point]]] = {}
    for result in group.results:
        for stream_id, points in stream_series(result, direction).items():
            by_stream.setdefault(stream_id, []).append(points)
    return [(f"stream {sid}", with_gaps(mean_series(runs)), [])
            for sid, runs in sorted(by_stream.items())]


def _chart(chart_id: str, title: str, kind: str, lines: Sequence[Line], thin: bool = False,
           colours: Sequence[str] = _GROUP_COLOURS) -> str:
    """One chart as ``<figure id=chart-…>`` holding an inline SVG; ``thin`` also draws
    each result's own series faintly behind its group's."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    top = max((v for _, points, behind in lines for series in (points, *behind)
               for _, v in series if v is not None), default=0.0)
    divisor, unit = scale(kind, top)
    settings: Any = {**_RC, "svg.hashsalt": chart_id}  # (matplotlib types keys as Literals)
    with rc_context(settings):  # the hash salt makes clip-path ids differ between charts
        figure = Figure(figsize=(9, 3.2), layout="constrained")
        axes = figure.subplots()
        for k, (label, points, behind) in enumerate(lines):
            color = colours[k % len(colours)]
            for j, faint in enumerate(behind if thin else []):
                _plot(axes, faint, divisor, f"trial-{chart_id}-{k + 1}-{j + 1}", color,
                      None, 0.8, 0.35)
            if points:
                _plot(axes, points, divisor, f"series-{chart_id}-{k + 1}", color, label, 2.0,
                      1.0)
        _decorate(axes, title, unit, kind, top / divisor if divisor else top)
        svg = io.StringIO()
        figure.savefig(svg, format="svg", metadata={"Date": None})
    text = svg.getvalue()
    # The title is in the SVG as text (svg.fonttype none): no caption repeating it.
    svg_text = _scoped(text[text.index("<svg"):], chart_id)
    return f"<figure class=chart id=chart-{chart_id}>{svg_text}</figure>"




def _plot(axes: Any, points: list[GappedPoint], divisor: float, gid: str, color: str,
          label: str | None, width: float, alpha: float) -> None:
    # NaN where nothing was measured: matplotlib breaks the line there
    (line,) = axes.plot([t for t, _ in points],
                        [math.nan if v is None else v / divisor for _, v in points],
                        color=color, linewidth=width, alpha=alpha,
                        label=None if label is None else _label(label),
                        marker="." if len(points) < 30 else None)
    line.set_gid(gid)


def _decorate(axes: Any, title: str, unit: str, kind: str, top: float) -> None:
    axes.set_title(_label(title), loc="left")
    axes.set_xlabel("seconds since the test started")
    names = {"rate": "throughput", "count": "segments", "us": "RTT", "percent": "lost",
             "ms": "jitter"}
    axes.set_ylabel(f"{names.get(kind, kind)} ({unit})" if unit else names.get(kind, kind))
    axes.set_ylim(bottom=0, top=top * HEADROOM if top > 0 else None)  # room above the lines
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc="best", fontsize=8)


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px;
       color: #222; padding: 0 1em; }
h1 { margin-bottom: 0.2em; } .meta { color: #666; margin-top: 0; }
table { border-collapse: collapse; font-size: 0.9em; margin: 1em 0; }
th, td { padding: 0.25em 0.7em; text-align: right; white-space: nowrap; }
th { white-space: normal; }  /* a long reference name in "ratio to ..." wraps */
table.stats td:nth-child(-n+2), #results td:first-child { white-space: normal;
       overflow-wrap: anywhere; }  /* long group names wrap, never widen the page */
table { max-width: 100%; }
th { border-bottom: 2px solid #444; } tbody { border-bottom: 1px solid #bbb; }
td:first-child, th:first-child, table.stats td:nth-child(2) { text-align: left; }
#results td { text-align: left; }
figure.chart { margin: 1.5em 0; } figure.chart svg { width: 100%; height: auto; }
"""

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>netprobe report</title>
<style>{style}</style></head>
<body>
{body}
</body></html>
"""
