"""The report as plain text cells, shared by the terminal tables (rich, in report.py), the
HTML page (html.py, which must not import rich) and ``report --format json|csv``: numbers
scaled to one unit per figure, the statistics rows, and sparklines.

One unit per figure, chosen from the largest mean, so that a column of a lab report reads
down without unit changes (``9.42`` and ``0.87`` Gbit/s, not ``9.42 Gbit/s`` and
``870 Mbit/s``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from netprobe.latency.figures import grade
from netprobe.results.analysis import (
    LATENCY,
    Figure,
    FigureStats,
    GroupStats,
    shown_figures,
)
from netprobe.results.stats import Summary
from netprobe.units import PREFIX_LETTERS

DIRECTION_LABELS = {"client_to_server": "c->s", "server_to_client": "s->c"}
"""Flow directions as the tables label them (as the run's summary table does)."""

_RATE_UNITS = tuple(f"{letter}bit/s" for letter in PREFIX_LETTERS)


def scale(kind: str, magnitude: float) -> tuple[float, str]:
    """(divisor, unit) to show numbers of ``kind`` around ``magnitude`` (SI for rates)."""
    if kind == "rate":
        power = 0
        while power < len(_RATE_UNITS) - 1 and abs(magnitude) >= 999.5 * 1000**power:
            power += 1
        return 1000.0**power, _RATE_UNITS[power]
    if kind == "us":  # RTT: microseconds on a LAN, milliseconds across the world
        return (1000.0, "ms") if abs(magnitude) >= 1000 else (1.0, "µs")
    return 1.0, {"ms": "ms", "percent": "%", "count": "", "grade": ""}[kind]


def number(value: float | None) -> str:
    """Three significant figures, never in exponent form; ``-`` when unknown."""
    if value is None or math.isnan(value):
        return "-"
    rounded = float(f"{value:.3g}")  # 0.09999 is 0.100: count digits after rounding
    if rounded == 0:
        return "0"
    digits = math.floor(math.log10(abs(rounded)))
    decimals = min(max(2 - digits, 0), 4)
    return f"{value:.{decimals}f}"


def ratio_text(value: float | None) -> str:
    """A ratio to the reference with two decimals (``0.58``); ``-`` when undefined."""
    return "-" if value is None else f"{value:.2f}"


def figure_label(direction: str, figure: Figure[Any], unit: str) -> str:
    """``c->s receiver throughput (Gbit/s)``; a latency figure has no direction."""
    where = "" if direction == LATENCY else f"{DIRECTION_LABELS[direction]} "
    return f"{where}{figure.label}" + (f" ({unit})" if unit else "")


# --- the statistics table ----------------------------------------------------------------

STATS_COLUMNS = ("Figure", "Group", "n", "mean", "median", "sd", "min", "max", "±95% CI",
                 "ratio")
"""Columns of the statistics table; with one group, Group and ratio are left out."""


def stats_header(stats: Sequence[GroupStats], group_title: str = "Group") -> list[str]:
    """The column titles for ``stats`` (the ratio is to the first group)."""
    if len(stats) < 2:
        return [c for c in STATS_COLUMNS if c not in ("Group", "ratio")]
    titles = list(STATS_COLUMNS)
    titles[1] = group_title
    titles[-1] = f"ratio to {stats[0].label}"
    return titles


def stats_rows(stats: Sequence[GroupStats]) -> list[list[list[str]]]:
    """The table body, one block of rows per figure (a row per group), cells as text."""
    blocks = []
    for direction, figure in shown_figures(stats):
        cells = [g.get(direction, figure.key) for g in stats]
        means = [c.summary.mean for c in cells if c is not None and c.summary is not None]
        divisor, unit = scale(figure.kind, max((abs(m) for m in means), default=0.0))
        label = figure_label(direction, figure, unit)
        rows = [_row(label if i == 0 else "", g, c, divisor, len(stats) > 1,
                     graded=figure.kind == "grade")
                for i, (g, c) in enumerate(zip(stats, cells))]
        blocks.append(rows)
    return blocks


def _row(label: str, group: GroupStats, cell: FigureStats | None, divisor: float,
         grouped: bool, graded: bool = False) -> list[str]:
    summary = cell.summary if cell is not None else None
    count = summary.n if summary is not None else 0
    values: list[float | None] = [None] * 6
    if summary is not None:
        values = [summary.mean, summary.median, summary.stdev, summary.min, summary.max,
                  summary.ci_half_width]
    scaled = [number(None if v is None else v / divisor) for v in values]
    scaled[-1] = "-" if scaled[-1] == "-" else f"±{scaled[-1]}"
    if graded:
        scaled = _grade_cells(summary)
    n = str(count) if count == group.total else f"{count}/{group.total}"
    row = [label, group.label, n, *scaled, ratio_text(cell.ratio if cell else None)]
    return row if grouped else [row[0], *row[2:-1]]


def _grade_cells(summary: Summary | None) -> list[str]:
    """mean, median, sd, min, max, CI of a bloat as grades (``C..D``: the CI's two ends)."""
    if summary is None:
        return ["-"] * 6
    ci = "-"
    if summary.ci_low is not None and summary.ci_high is not None:
        low, high = grade(summary.ci_low), grade(summary.ci_high)
        ci = low if low == high else f"{low}..{high}"
    return [grade(summary.mean), grade(summary.median), "-", grade(summary.min),
            grade(summary.max), ci]


def stats_records(stats: Sequence[GroupStats]) -> list[dict[str, Any]]:
    """The statistics as plain records (unscaled: bits/s, µs, ms, percent) for JSON/CSV;
    the grade's record holds letters (the grade of each statistic of the bloat)."""
    records = []
    for direction, figure in shown_figures(stats):
        for group in stats:
            cell = group.get(direction, figure.key)
            summary = cell.summary if cell is not None else None
            values = {name: getattr(summary, name) if summary else None for name in RECORD_STATS}
            if figure.kind == "grade":
                values.update({name: _letter(values[name]) for name in
                               ("mean", "median", "min", "max", "ci_low", "ci_high")},
                              stdev=None)
            records.append({
                "group": group.label, "results": group.total, "ok": group.ok,
                "direction": direction, "figure": figure.key, **values,
                "ratio": cell.ratio if cell is not None else None,
            })
    return records


def _letter(bloat_us: float | None) -> str | None:
    return None if bloat_us is None else grade(bloat_us)


RECORD_STATS = ("n", "mean", "median", "stdev", "min", "max", "ci_low", "ci_high",
                "confidence")
"""The summary fields of a statistics record (see :func:`stats_records`)."""


# --- sparklines --------------------------------------------------------------------------

BLOCKS = "▁▂▃▄▅▆▇█"
"""Eight levels; a zero is a space, so that a stall shows as a gap."""


def sparkline(values: Sequence[float], top: float | None = None, width: int = 60) -> str:
    """``values`` as block characters from 0 to ``top`` (default: their maximum); more
    values than ``width`` are averaged in buckets so that the line keeps its width."""
    points = _buckets(list(values), width)
    ceiling = top if top is not None else max(points, default=0.0)
    if ceiling <= 0:
        return " " * len(points)
    return "".join(_block(v / ceiling) for v in points)


def _block(fraction: float) -> str:
    if fraction <= 0:
        return " "
    return BLOCKS[min(len(BLOCKS) - 1, max(0, math.ceil(fraction * len(BLOCKS)) - 1))]


def _buckets(values: list[float], width: int) -> list[float]:
    if len(values) <= width:
        return values
    edges = [round(i * len(values) / width) for i in range(width + 1)]
    return [sum(values[a:b]) / (b - a) for a, b in zip(edges, edges[1:]) if b > a]
