"""Drawing trials and their statistics in the terminal, with rich: one line per trial with a
throughput sparkline, the tools left out of a comparison, and the statistics table (one
block of rows per figure, a row per tool or group, the ratio to the first).

Only the CLI imports this module. The numbers come from netprobe.results.analysis; their text
from netprobe.cli.tabulate, which the HTML page shares.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from netprobe.cli.latencyview import signed_ms
from netprobe.cli.tabulate import (
    DIRECTION_LABELS,
    sparkline,
    stats_header,
    stats_rows,
)
from netprobe.cli.textsafe import for_terminal
from netprobe.cli.units import format_length, format_rate
from netprobe.latency.figures import run_verdict
from netprobe.results.analysis import GroupStats, throughput_series
from netprobe.results.trials import CallLength, Skipped
from netprobe.schema import Result

SPARK_WIDTH = 30
"""Characters of a trial's sparkline per direction (a 10 s test at 1 s intervals uses 10)."""

_STATUS_STYLES = {"ok": "green", "failed": "bold red", "interrupted": "bold yellow"}


def series_top(results: Sequence[Result]) -> float:
    """The highest interval throughput among ``results``: one scale for all their
    sparklines, so that a slower trial looks lower."""
    return max((v for r in results for d in _directions(r) for _, v in throughput_series(r, d)),
               default=0.0)


def _directions(result: Result) -> tuple[str, ...]:
    return result.spec.flow_directions()


def trial_line(result: Result, top: float | None = None, total: int | None = None,
               width: int = SPARK_WIDTH, started: bool = False) -> Text:
    """One trial: index, tool, per direction the throughput and its sparkline, retransmits,
    the latency's bloat and grade when it has them, the status when not ``ok`` (and with
    ``started``, the start time). ``top`` is the sparklines' full scale (default: each
    trial its own)."""
    line = Text(_trial_label(result, total), style="bold")
    line.append(f" {for_terminal(result.tool.name, one_line=True):<8}")
    for direction in _directions(result):
        line.append(f"  {DIRECTION_LABELS[direction]} ")
        line.append(f"{format_rate(_throughput(result, direction)):>12} ", style="bold")
        values = [v for _, v in throughput_series(result, direction)]
        line.append(sparkline(values, top, width) or "(no intervals)", style="cyan")
        retransmits = _retransmits(result, direction)
        if retransmits is not None:
            line.append(f"  retr {retransmits}")
    latency = result.latency
    if latency is not None and latency.grade is not None and latency.bloat_us is not None:
        overall = latency.verdict or run_verdict(latency.phases) or latency.grade
        line.append(f"  latency bloat {signed_ms(latency.bloat_us)}, verdict {overall} "
                    f"(DSLReports {latency.grade})")
    if result.status != "ok":
        line.append(f"  {result.status}", style=_STATUS_STYLES[result.status])
        if result.errors:
            line.append(f": {result.errors[0]}")
    if started and result.start_time:
        line.append(f"  {result.start_time[:19].replace('T', ' ')}", style="dim")
    return line


def _trial_label(result: Result, total: int | None) -> str:
    if result.trial is None:
        return "#-"
    return f"#{result.trial}" + (f"/{total}" if total else "")


def _throughput(result: Result, direction: str) -> float | None:
    flow = result.summary(direction)
    for side in (flow.receiver, flow.sender) if flow else ():
        if side is not None:
            return side.bits_per_second
    return None


def _retransmits(result: Result, direction: str) -> int | None:
    flow = result.summary(direction)
    return flow.sender.retransmits if flow and flow.sender else None


def sparkline_text(result: Result, width: int = 60) -> Text:
    """``throughput c->s ▃▆▇█▇ peak 9.81 Gbit/s`` for one run, a line per direction."""
    text = Text()
    for direction in _directions(result):
        values = [v for _, v in throughput_series(result, direction)]
        if not values:
            continue
        if text:
            text.append("\n")
        text.append(f"throughput {DIRECTION_LABELS[direction]} ")
        text.append(sparkline(values, None, width), style="cyan")
        text.append(f" peak {format_rate(max(values))}", style="dim")
    return text


def skipped_text(skipped: Sequence[Skipped]) -> Text:
    """The tools left out of a comparison, a line each with every reason."""
    text = Text()
    for i, entry in enumerate(skipped):
        text.append("\n" if i else "")
        text.append("left out: ", style="bold yellow")
        text.append(f"{entry.tool}: {'; '.join(entry.reasons)}")
    return text


def call_length_table(lengths: Sequence[CallLength]) -> Group:
    """A row per tool: the call length it ran at and what each of its calls carried, under
    a title saying whether the tools ran like for like (one length asked of all)."""
    asked = {entry.asked for entry in lengths}
    common = asked.pop() if len(asked) == 1 else None
    batched = {entry.batched for entry in lengths if entry.protocol == "udp"}
    if common is None:
        title = "Call lengths: each tool's own, so the rates are not like for like"
    elif len(batched) > 1:  # one datagram size, but not the same datagrams per call
        title = (f"Call lengths: every tool at {format_length(common)} datagrams, sent "
                 "in unlike calls (below), so the rates are not like for like")
    else:
        title = f"Call lengths: every tool at {format_length(common)} (like for like)"
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name in ("Tool", "call length", "each call"):
        table.add_column(name, no_wrap=True)
    for entry in lengths:
        table.add_row(Text(for_terminal(entry.tool, one_line=True)),
                      "own default" if entry.asked is None else format_length(entry.asked),
                      _each_call(entry))
    return Group(Text(title, style="bold"), table)  # the title unwrapped, wider than the table


def _each_call(entry: CallLength) -> str:
    if entry.protocol == "udp":  # the rate per call, not the datagram, decides a fast path
        return ("many datagrams per call (sendmmsg of GSO messages)" if entry.batched
                else "one datagram per call")
    if not entry.sender and not entry.receiver:
        return "lengths not reported by the tool"
    return (f"writes {'/'.join(map(format_length, entry.sender)) or '-'}, "
            f"reads {'/'.join(map(format_length, entry.receiver)) or '-'}")


def stats_table(stats: Sequence[GroupStats], group_title: str = "Group",
                title: str | None = None) -> Table:
    """The statistics of ``stats`` (a row per group, a block per figure)."""
    header = stats_header(stats, group_title)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title=title,
                  title_justify="left", title_style="bold")
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i < 1 + (len(stats) > 1) else "right",
                         no_wrap=True)
    blocks = stats_rows(stats)
    for k, block in enumerate(blocks):
        for j, row in enumerate(block):
            table.add_row(*_cells(row), end_section=(j == len(block) - 1 and k < len(blocks) - 1
                                             and len(block) > 1))
    return table


def _cells(row: Sequence[str]) -> list[Text]:
    # A group's label is a tool's name or a spec's field from a saved file: data, no markup.
    return [Text(for_terminal(cell, one_line=True)) for cell in row]


def print_stats(console: Console, stats: Sequence[GroupStats], group_title: str = "Group",
                title: str | None = None) -> None:
    """The statistics table, or a line saying there is nothing to summarise. Where the
    table is wider than the console, one table per figure (titled with it), so that no
    group name and no number is cut."""
    if not stats or not stats_rows(stats):
        console.print(Text("no successful results to summarise", style="yellow"))
        return
    table = stats_table(stats, group_title, title)
    if console.measure(table, options=console.options.update_width(10_000)).maximum \
            <= console.width:
        console.print(table)
        return
    if title:
        console.print(Text(title, style="bold"))
    for block in stats_rows(stats):
        console.print(_figure_table(stats, group_title, block))


def _figure_table(stats: Sequence[GroupStats], group_title: str,
                  block: Sequence[Sequence[str]]) -> Table:
    # One figure: its name as the title, a row per group, the figure column left out.
    header = stats_header(stats, group_title)[1:]
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title=block[0][0],
                  title_justify="left", title_style="bold", collapse_padding=True)
    several = len(stats) > 1
    for i, name in enumerate(header):
        if several and i == len(header) - 1:
            name = "rel"  # named in the caption: a narrow table has no room for more
        table.add_column(name, justify="left" if i < several else "right", no_wrap=True)
    for row in block:
        table.add_row(*_cells(row[1:]))
    if several:
        table.caption = Text(f"rel: ratio to {for_terminal(stats[0].label, one_line=True)}")
        table.caption_justify = "left"
    return table


def print_trial_lines(console: Console, results: Sequence[Result]) -> None:
    """A line per result with its start time, all sparklines on one scale."""
    top = series_top(results)
    for result in results:
        console.print(trial_line(result, top, started=True), soft_wrap=True)
