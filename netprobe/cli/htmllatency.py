"""The latency charts of ``netprobe report --html`` for results with netprobe's probes:
round trip over time with the phases as bands (each way's queue drawn faintly beneath),
and the distribution of the round trip per phase as a CDF (what Flent users look at first).

Drawn like the page's other charts (matplotlib Figure, inline SVG, scoped ids); each series
is an SVG group ``series-lat<n>-...``; each phase band's id ends ``band-lat<n>-<k>``.
"""
from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

from netprobe.cli.htmlparts import _RC, _e, _label, _scoped
from netprobe.cli.latencyview import loss_words, signed_ms
from netprobe.latency.figures import run_verdict
from netprobe.schema import Latency, Result

_PHASE_COLOURS = {"idle": "#dddddd", "idle_tail": "#dddddd", "loaded": "#fdd0a2",
                  "download": "#c6dbef", "upload": "#fdd0a2", "both": "#dadaeb"}
_LINE_COLOURS = ("C0", "C1", "C2", "C3", "C4", "C5")


def latency_html(results: Sequence[Result]) -> list[str]:
    """A heading and two charts per result that carries probe samples (none otherwise)."""
    parts: list[str] = []
    for n, result in enumerate(results, start=1):
        latency = result.latency
        if latency is None or not latency.samples:
            continue
        grade = _grades(latency)
        parts.append(f"<h3>{_e(result.tool.name)} {_e(result.start_time or '')}: "
                     f"{_e(latency.measured_by or '')}{_e(grade)}</h3>")
        lost = loss_words(latency.phases)
        if lost is not None:  # which way the probes were lost, as the terminal says it
            parts.append(f"<p class=meta>{_e(lost)}</p>")
        parts.append(_figure(f"lat{n}-time", _over_time, latency, n))
        parts.append(_figure(f"lat{n}-cdf", _cdf, latency, n))
    return parts


def _grades(latency: Latency) -> str:
    """``, verdict D; DSLReports grade B, bloat +41.0 ms`` (empty without a grade)."""
    if not latency.grade:
        return ""
    overall = latency.verdict or run_verdict(latency.phases) or latency.grade
    bloat = "" if latency.bloat_us is None else f", bloat {signed_ms(latency.bloat_us)}"
    return f", verdict {overall}; DSLReports grade {latency.grade}{bloat}"


def _figure(chart_id: str, draw: Any, latency: Latency, n: int) -> str:
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    settings: Any = {**_RC, "svg.hashsalt": chart_id}
    with rc_context(settings):
        figure = Figure(figsize=(9, 3.2), layout="constrained")
        draw(figure.subplots(), latency, n)
        svg = io.StringIO()
        figure.savefig(svg, format="svg", metadata={"Date": None})
    text = svg.getvalue()
    return f"<figure class=chart id=chart-{chart_id}>" \
           f"{_scoped(text[text.index('<svg'):], chart_id)}</figure>"


def _over_time(axes: Any, latency: Latency, n: int) -> None:
    for k, phase in enumerate(latency.phases, start=1):
        band = axes.axvspan(phase.start_s, phase.end_s, color=_PHASE_COLOURS.get(phase.name,
                            "#eeeeee"), alpha=0.6, linewidth=0)
        band.set_gid(f"band-lat{n}-{k}")
        axes.text((phase.start_s + phase.end_s) / 2, 1.0, phase.name, ha="center", va="top",
                  transform=axes.get_xaxis_transform(), fontsize=8, color="#444")
    # Every probe is a point, a lost one NaN: the lines break where nothing came back
    # instead of being drawn across the gap.
    times = [s.t_s for s in latency.samples]
    for name, label, style in (("client_to_server_us", "queue c->s", ":"),
                               ("server_to_client_us", "queue s->c", "--")):
        values = [getattr(s, name) for s in latency.samples]
        if any(v is not None for v in values):
            (line,) = axes.plot(times, [math.nan if v is None else v / 1000 for v in values],
                                linestyle=style, linewidth=0.8, alpha=0.7, label=label)
            line.set_gid(f"series-lat{n}-{name[:16]}")
    (rtt,) = axes.plot(times, [math.nan if s.rtt_us is None else s.rtt_us / 1000
                               for s in latency.samples],
                       color="C3", linewidth=1.2, label="round trip")
    rtt.set_gid(f"series-lat{n}-rtt")
    lost = [s.t_s for s in latency.samples if s.rtt_us is None]
    if lost:
        marks = axes.scatter(lost, [0] * len(lost), marker="x", color="black", s=12,
                             label="lost", zorder=3)
        marks.set_gid(f"series-lat{n}-lost")
    axes.set_title("Latency over time", loc="left")
    axes.set_xlabel("seconds since the probes started")
    axes.set_ylabel("ms")
    axes.set_ylim(bottom=0)
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)


def _cdf(axes: Any, latency: Latency, n: int) -> None:
    for k, phase in enumerate(latency.phases):
        rtts = sorted(s.rtt_us for s in latency.samples if s.rtt_us is not None
                      and phase.start_s <= s.t_s < phase.end_s)
        if not rtts:
            continue
        fractions = [(i + 1) / len(rtts) for i in range(len(rtts))]
        (line,) = axes.step([v / 1000 for v in rtts], fractions, where="post",
                            color=_LINE_COLOURS[k % len(_LINE_COLOURS)], label=_label(phase.name))
        line.set_gid(f"series-lat{n}-cdf-{k + 1}")
    axes.set_title("Round trip per phase (CDF)", loc="left")
    axes.set_xscale("log")
    axes.set_xlabel("round trip (ms, log scale)")
    axes.set_ylabel("fraction of probes")
    axes.set_ylim(0, 1.02)
    axes.legend(loc="lower right", fontsize=8)
