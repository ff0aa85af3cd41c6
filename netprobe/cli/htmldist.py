"""The report page's distribution charts, what Flent users look for beside the time
series: per group, a box plot of the results' throughput with the 95% confidence interval
of the mean drawn over it, and the CDF of every interval's throughput.

Drawn with matplotlib's Figure (no pyplot), as inline SVG, like netprobe.cli.html's
charts; each group's box and CDF line is an SVG group with an id (``series-box-…-<n>``,
``series-cdf-…-<n>``) as the time series' are.
"""
from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from netprobe.cli.htmlparts import _RC, _label, _scoped
from netprobe.cli.tabulate import DIRECTION_LABELS, scale
from netprobe.results.analysis import Group, throughput_series
from netprobe.results.stats import mean_interval

HEADROOM = 1.15
"""The value axis reaches this far above the highest value, so no line runs on the frame."""


def distribution_html(groups: Sequence[Group], direction: str, tag: str) -> list[str]:
    """The box plot and the CDF for one direction (none without figures)."""
    per_result = [[_throughput(r, direction) for r in g.results] for g in groups]
    per_result = [[v for v in values if v is not None] for values in per_result]
    intervals = [sorted(v for r in g.results for _, v in throughput_series(r, direction))
                 for g in groups]
    charts = []
    arrow = DIRECTION_LABELS[direction]
    if any(per_result):
        charts.append(_figure(f"box-{tag}",
                              lambda axes, d: _boxes(axes, f"box-{tag}", groups, per_result, d),
                              f"Throughput of each result, {arrow}, per group (box: "
                              "quartiles; black bar: 95% CI of the mean)", per_result))
    if any(intervals):
        charts.append(_figure(f"cdf-{tag}",
                              lambda axes, d: _cdf(axes, f"cdf-{tag}", groups, intervals, d),
                              f"CDF of interval throughput, {arrow}, per group", intervals))
    return charts


def _throughput(result: Any, direction: str) -> Any:
    flow = result.summary(direction)
    side = flow and (flow.receiver or flow.sender)
    return side.bits_per_second if side else None


def _figure(chart_id: str, draw: Any, title: str, values: Sequence[Sequence[float]]) -> str:
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    top = max((v for group in values for v in group), default=0.0)
    divisor, unit = scale("rate", top)
    settings: Any = {**_RC, "svg.hashsalt": chart_id}  # (matplotlib types keys as Literals)
    with rc_context(settings):
        figure = Figure(figsize=(9, 3.2), layout="constrained")
        axes = figure.subplots()
        draw(axes, divisor)
        axes.set_title(_label(title), loc="left")
        if chart_id.startswith("box"):
            axes.set_ylabel(f"throughput ({unit})")
            # the CI bars may reach above the highest result: room for both
            axes.set_ylim(0, max(axes.get_ylim()[1], top / divisor * HEADROOM) or 1)
        else:
            axes.set_xlabel(f"throughput ({unit})")
            axes.set_ylabel("share of intervals")
            axes.set_xlim(0, top / divisor * HEADROOM or 1)
            axes.set_ylim(0, 1.05)
            axes.legend(loc="upper left", fontsize=8)
        svg = io.StringIO()
        figure.savefig(svg, format="svg", metadata={"Date": None})
    text = svg.getvalue()
    return f"<figure class=chart id=chart-{chart_id}>" \
           f"{_scoped(text[text.index('<svg'):], chart_id)}</figure>"


def _boxes(axes: Any, chart_id: str, groups: Sequence[Group],
           values: Sequence[Sequence[float]], divisor: float) -> None:
    shown = [(_label(g.label), [v / divisor for v in vs]) for g, vs in zip(groups, values) if vs]
    parts = axes.boxplot([vs for _, vs in shown], tick_labels=[label for label, _ in shown],
                         patch_artist=True, widths=0.5)
    for k, (box, (_, vs)) in enumerate(zip(parts["boxes"], shown)):
        box.set_facecolor(f"C{k % 10}")
        box.set_alpha(0.5)
        box.set_gid(f"series-{chart_id}-{k + 1}")
        interval = mean_interval(list(vs))
        mean = sum(vs) / len(vs)
        low, high = interval if interval else (mean, mean)
        axes.errorbar([k + 1], [mean], yerr=[[mean - max(low, 0.0)], [high - mean]],
                      fmt="o", color="black", capsize=8, linewidth=2, zorder=5)


def _cdf(axes: Any, chart_id: str, groups: Sequence[Group],
         values: Sequence[Sequence[float]], divisor: float) -> None:
    for k, (group, vs) in enumerate(zip(groups, values)):
        if not vs:
            continue
        xs = [v / divisor for v in vs]
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        (line,) = axes.step(xs, ys, where="post", color=f"C{k % 10}", linewidth=2,
                            label=_label(group.label))
        line.set_gid(f"series-{chart_id}-{k + 1}")


__all__ = ["HEADROOM", "distribution_html"]
