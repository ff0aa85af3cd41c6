"""Latency under load for people: a table per phase, the verdict, and a terminal chart of
the round trip over time with the phases marked under it."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from netprobe.cli.tabulate import BLOCKS
from netprobe.cli.textsafe import for_terminal
from netprobe.cli.units import format_ms_from_us, format_rate
from netprobe.latency.figures import (
    PROBLEM_QUEUE_US,
    bloated_direction,
    phase_verdict,
    run_verdict,
    tail_increase,
)
from netprobe.schema import Latency, LatencyPhase, LatencySample, LatencyStats, Result

CHART_WIDTH = 64
CHART_ROWS = 5
_WHERE = {
    "client_to_server": "the queue builds from client to server (upload): shape or fix "
                        "the client side's egress",
    "server_to_client": "the queue builds from server to client (download): shape or fix "
                        "the server side's egress",
    "both": "queues build in both directions",
}


def has_phases(result: Result) -> bool:
    """True if the result carries netprobe's phased latency figures."""
    return result.latency is not None and bool(result.latency.phases)


def print_latency(console: Console, result: Result) -> None:
    """The phase table, the verdict and the chart of a phased latency result."""
    latency = result.latency
    assert latency is not None
    console.print(phase_table(latency.phases))
    rates = rate_table(latency.phases)
    if rates is not None:
        console.print(rates)
    console.print(verdict(latency))  # wrapped at words to the terminal's width
    lost = loss_text(latency.phases)
    if lost is not None:
        console.print(lost)
    chart = latency_chart(latency.samples, latency.phases)
    if chart:
        console.print(chart, soft_wrap=True)


def _ms(value: float | None) -> str:
    return format_ms_from_us(value)


def _num(value_us: float | None) -> str:
    """Microseconds as a bare number of milliseconds, for the table's ms columns."""
    if value_us is None:
        return "-"
    ms = value_us / 1000
    return f"{ms:.2f}" if abs(ms) < 10 else f"{ms:.1f}" if abs(ms) < 1000 else f"{ms:.0f}"


def signed_ms(value_us: float | None) -> str:
    """A latency increase in milliseconds, to three significant figures and never finer
    than 0.1 ms (``+9.0 ms``, ``+18.3 ms``, ``+188 ms``): one precision for every increase,
    as fine as the probes' timing, where ``+9.016 ms`` beside ``+187.7 ms`` claimed more."""
    if value_us is None:
        return "-"
    ms = value_us / 1000
    sign = "+" if ms >= 0 else "-"
    return f"{sign}{abs(ms):.1f} ms" if abs(ms) < 99.95 else f"{sign}{abs(ms):.0f} ms"


_signed_ms = signed_ms


def phase_table(phases: Sequence[LatencyPhase]) -> Table:
    """One row per phase: loss, round trip p50, mean, p99, each way's queue, the bloat the
    DSLReports grade is of (mean over the idle median), that grade, and the verdict (the
    worst of it, the tail's grade and the loss's cap; the verdict line gives the tail).

    Narrow enough for an 80-column terminal or pipe; throughput goes in a table of its own."""
    table = Table(title="Latency in ms (probe round trip; c->s, s->c: median one-way queue; "
                        "bloat: mean over idle; DSLR: its DSLReports grade; Grade: the "
                        "verdict)",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("Phase", no_wrap=True)
    # (the max is left to the chart below: the verdict's two grades need the room)
    for name in ("Lost", "p50", "mean", "p99", "c->s", "s->c", "bloat", "DSLR", "Grade"):
        table.add_column(name, justify="right", no_wrap=True)
    for phase in phases:
        rtt = phase.rtt or LatencyStats(count=0)
        sent = rtt.count + (rtt.lost or 0)
        lost = "-" if rtt.lost is None else f"{rtt.lost}/{sent}"
        shown = Text(for_terminal(phase.name, one_line=True))  # a saved file's: data
        table.add_row(shown, lost, _num(rtt.p50_us), _num(rtt.mean_us), _num(rtt.p99_us),
                      _one_way(phase.client_to_server),
                      _one_way(phase.server_to_client), _plus(phase.bloat_us),
                      phase.grade or "-", phase.verdict or phase_verdict(phase) or "-")
    return table


def _plus(value_us: float | None) -> str:
    """An increase for the table's ms columns, at :func:`signed_ms`'s precision."""
    return signed_ms(value_us).removesuffix(" ms")


def rate_table(phases: Sequence[LatencyPhase]) -> Table | None:
    """Each loaded phase's throughput, download and upload (None when none is known)."""
    rows = [p for p in phases
            if p.server_to_client_bits_per_second or p.client_to_server_bits_per_second]
    if not rows:
        return None
    table = Table(title="Throughput per phase (receiver)", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("Phase", no_wrap=True)
    table.add_column("Down (s->c)", justify="right", no_wrap=True)
    table.add_column("Up (c->s)", justify="right", no_wrap=True)
    for phase in rows:
        table.add_row(Text(for_terminal(phase.name, one_line=True)),
                      _rate(phase.server_to_client_bits_per_second),
                      _rate(phase.client_to_server_bits_per_second))
    return table


def _one_way(record: LatencyStats | None) -> str:
    return "-" if record is None else _num(record.p50_us)


def _rate(value: float | None) -> str:
    return format_rate(value) if value else "-"


def verdict(latency: Latency) -> Text:
    """``latency under load: +151 ms over idle, RPM 396, verdict D (upload: ...);
    DSLReports grade C (bloat ...); the queue builds ...``.

    The verdict (the worst loaded phase's, counting its tail and its probe loss) is what
    a person reads first; the DSLReports-compatible grade follows, labelled as such. A
    result from before schema 1.10 has its verdict worked out again from its phases."""
    text = Text.assemble(("latency under load: ", "bold"))
    if latency.grade is None or latency.increase_us is None:
        text.append(f"no loaded phase; idle p50 {_ms(latency.p50_us)}")
        return text
    graded = [p for p in latency.phases if p.increase_us is not None]
    if len(graded) > 1:  # the run's increase is its worst phase's: name it
        worst = max(graded, key=lambda p: p.increase_us or 0.0)
        text.append(f"{signed_ms(latency.increase_us)} over idle at the median in "
                    f"{worst.name} (p50 {_ms(worst.rtt.p50_us if worst.rtt else None)}), ")
    else:
        text.append(f"{signed_ms(latency.increase_us)} over idle "
                    f"(loaded p50 {_ms(latency.p50_us)}), ")
    if latency.rpm is not None:
        text.append(f"RPM {latency.rpm:,.0f}, ")
    overall = latency.verdict or run_verdict(latency.phases) or latency.grade
    text.append("verdict ")
    text.append(overall, style="bold green" if overall in ("A+", "A") else "bold red")
    text.append(f" ({'; '.join(_per_phase(latency.phases))})")
    text.append(f"; DSLReports grade {latency.grade}")
    if latency.bloat_us is not None:
        text.append(f" (bloat {signed_ms(latency.bloat_us)}{_averaged(latency)})")
    where = bloated_direction(latency)
    text.append(f"; {_WHERE[where]}" if where else
                f"; neither direction's queue reaches {PROBLEM_QUEUE_US / 1000:g} ms")
    text.append(f" (measured by {latency.measured_by})", style="dim")
    return text


def _per_phase(phases: Sequence[LatencyPhase]) -> list[str]:
    """``upload D: bloat +150 ms, p99 +204 ms, 22.5 % lost`` per loaded phase."""
    words = []
    for phase in phases:
        mark = phase.verdict or phase_verdict(phase)
        if mark is None:
            continue
        lost = phase.rtt.lost_percent if phase.rtt else None
        words.append(f"{phase.name} {mark}: bloat {signed_ms(phase.bloat_us)}, p99 "
                     f"{signed_ms(tail_increase(phase))}"
                     + (f", {lost:.1f} % of probes lost" if lost else ""))
    return words


def loss_text(phases: Sequence[LatencyPhase]) -> Text | None:
    """:func:`loss_words` for the terminal (None: no loss)."""
    words = loss_words(phases)
    return None if words is None else Text(words, style="yellow")


def loss_words(phases: Sequence[LatencyPhase]) -> str | None:
    """``3 probes lost (loaded: 2 client to server, 1 server to client)``: where each
    phase's probes were lost, from the server's list of what reached it (None: no loss)."""
    parts, total = [], 0
    for phase in phases:
        lost = phase.rtt.lost if phase.rtt is not None else None
        if not lost:
            continue
        total += lost
        up = phase.client_to_server.lost if phase.client_to_server else None
        down = phase.server_to_client.lost if phase.server_to_client else None
        where = (f"{up} client to server, {down} server to client"
                 if up is not None and down is not None else f"{lost}, direction unknown")
        parts.append(f"{phase.name}: {where}")
    if not total:
        return None
    return f"{total} probe{'s' if total > 1 else ''} lost ({'; '.join(parts)})"


def _averaged(latency: Latency) -> str:
    """`` (mean of download and upload)`` when the run's bloat averages several phases."""
    from netprobe.latency.bufferbloat import GRADED_PHASES

    loaded = [p.name for p in latency.phases if p.bloat_us is not None]
    graded = [name for name in GRADED_PHASES if name in loaded] or loaded
    return f" (mean of {' and '.join(graded)})" if len(graded) > 1 else ""


def latency_chart(samples: Sequence[LatencySample], phases: Sequence[LatencyPhase],
                  width: int = CHART_WIDTH, rows: int = CHART_ROWS) -> Text | None:
    """Round trip over time, the slowest probe of each column, ``rows`` lines high, with
    the phases' names under their start and lost probes marked ``x``."""
    if not samples:
        return None
    end = max(max(s.t_s for s in samples), max((p.end_s for p in phases), default=0.0))
    span = end or 1.0
    columns: list[float | None] = [None] * width
    lost = [False] * width
    for sample in samples:
        col = min(width - 1, int(sample.t_s / span * width))
        if sample.rtt_us is None:
            lost[col] = True
        else:
            columns[col] = max(columns[col] or 0.0, sample.rtt_us)
    top = max((c for c in columns if c is not None), default=0.0)
    if top <= 0:
        return None
    text = Text()
    for row in range(rows, 0, -1):
        label = {rows: f"{_ms(top):>9} |", 1: f"{'0':>9} |"}.get(row, f"{'':>9} |")
        text.append(label, style="dim")
        text.append("".join(_cell(c, top, row, rows) for c in columns) + "\n", style="cyan")
    text.append(f"{'':>9} |", style="dim")
    text.append("".join("x" if gone else " " for gone in lost) + "\n", style="red")
    text.append(f"{'':>10}" + _phase_ruler(phases, span, width), style="dim")
    return text


def _cell(value: float | None, top: float, row: int, rows: int) -> str:
    if value is None:
        return " "
    height = value / top * rows  # in rows, e.g. 2.4: rows 1-2 full, row 3 four tenths
    if height >= row:
        return BLOCKS[-1]
    if height <= row - 1:
        return " "
    fraction = height - (row - 1)
    return BLOCKS[max(0, min(len(BLOCKS) - 1, round(fraction * len(BLOCKS)) - 1))]


def _phase_ruler(phases: Sequence[LatencyPhase], span: float, width: int) -> str:
    ruler = [" "] * width
    for phase in phases:
        start = min(width - 1, int(phase.start_s / span * width))
        ruler[start] = "|"
        for i, char in enumerate(phase.name[: max(0, width - start - 1)]):
            if ruler[start + 1 + i] == " ":
                ruler[start + 1 + i] = char
    return "".join(ruler)
