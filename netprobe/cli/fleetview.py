"""The fleet's views: the plan, the progress of a run and its records, the agents' status
and the pair matrix, as rich tables (and the matrix as HTML for ``report --html``). Every
text from a fleet file, an archive or an agent is data here: drawn with ``plain``, escaped in
HTML. Only netprobe/cli draws; the fleet command (cli/commands/fleet.py) decides what."""
from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from netprobe.archives import figures
from netprobe.cli.render import plain, print_note, stderr_console, stdout_console
from netprobe.cli.units import format_rate

if TYPE_CHECKING:
    from netprobe.archives import PairRecord
    from netprobe.fleet.config import Fleet
    from netprobe.fleet.matrix import Cell, Matrix
    from netprobe.fleet.schedule import Plan, PlannedRound

PLAN_LISTED_TESTS = 5000
"""A plan with more tests is summed up (rounds, tests, time per group), not listed pair by
pair: a 10,000-agent mesh is 10^8 pairs. ``--json`` still lists every round, streamed."""


def print_plan(fleet: Fleet, rounds: Plan) -> None:
    """Each group's design, rounds, tests and the time one run may take (its rounds times
    each round's limit); then the rounds themselves, unless the plan is too large to list."""
    longest = sum(len(g_rounds) * group.round_limit_s() for group, g_rounds in rounds.groups)
    stdout_console().print(plain(f"{fleet.path}: {len(rounds):,} rounds, {rounds.tests:,} "
                                 f"tests, at most {_span(longest)}"),
                           soft_wrap=True, highlight=False)
    table = Table()
    for column in ("group", "type", "agents", "rounds", "tests", "each round up to",
                   "a run up to"):
        table.add_column(column)
    for group, g_rounds in rounds.groups:
        limit = group.round_limit_s()
        table.add_row(plain(group.name), _design(group, g_rounds.run),
                      f"{_agent_count(group):,}", f"{len(g_rounds):,}",
                      f"{g_rounds.tests:,}", f"{limit:g} s", _span(limit * len(g_rounds)))
    stdout_console().print(table)
    if rounds.tests > PLAN_LISTED_TESTS:
        print_note(f"{rounds.tests:,} tests are too many to list; --json lists every "
                   "round")
        return
    listing = Table()
    for column in ("group", "round", "pairs (source -> target)"):
        listing.add_column(column)
    for r in rounds:
        listing.add_row(plain(r.group), f"{r.index}/{r.of}",
                        plain("  ".join(f"{a}->{b}" for a, b in r.pairs)))
    stdout_console().print(listing)


def _design(group: Any, run: int) -> str:
    """The group's type with what sizes it: its references, or its peers, seed and run
    (and in how many runs a random group meets every pair)."""
    from netprobe.fleet.config import RandomPairs, ReferencePairs
    from netprobe.fleet.schedule import runs_to_cover

    pairs = group.pairs
    ways = "" if getattr(pairs, "both", True) else ", one way"
    if isinstance(pairs, ReferencePairs):
        return f"reference x {len(pairs.references):,}{ways}"
    if isinstance(pairs, RandomPairs):
        return (f"random, {pairs.peers:,} peers{ways}, seed {pairs.seed}, run {run}: each "
                f"ordered pair within {runs_to_cover(pairs) * (1 if pairs.both else 2):,} "
                "runs")
    return f"{group.kind}{ways}"


def _agent_count(group: Any) -> int:
    """How many agents take part in the group (a list's pairs are held already)."""
    pairs = group.pairs
    if hasattr(pairs, "members"):
        return len(pairs.members)
    if hasattr(pairs, "side_a"):
        return len(pairs.side_a) + len(pairs.side_b)
    return len({h for pair in pairs for h in pair})


def _span(seconds: float) -> str:
    """A length of time in its largest sensible unit."""
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size * 2:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:g} s"


class FleetBar:
    """The fleet's progress on stderr: round k of n, pairs done; a line per pair."""

    def __init__(self) -> None:
        # markup off: a group's name is the fleet file's text, not rich's
        self.progress: Progress = Progress(TextColumn("{task.description}", markup=False),
                                           BarColumn(),
                                           MofNCompleteColumn(), TextColumn("pairs"),
                                           console=stderr_console(), transient=True)
        self.task = self.progress.add_task("starting", total=None)
        self.progress.start()

    def round_started(self, number: int, total: int, planned: PlannedRound) -> None:
        """Show the round and reset the pair count."""
        self.progress.update(self.task, description=f"round {number} of {total} "
                             f"({planned.group} {planned.index}/{planned.of})",
                             total=len(planned.pairs), completed=0)

    def pair_done(self, record: PairRecord) -> None:
        """Count the pair and print its line."""
        self.progress.advance(self.task)
        self.progress.console.print(record_line(record), soft_wrap=True, highlight=False)

    def fleet_done(self, done: int, total: int) -> None:
        """A shared run's pairs done by every runner: the bar shows the fleet's."""
        self.progress.update(self.task, description="shared run", total=total,
                             completed=done)

    def note(self, message: str) -> None:
        """A dimmed line."""
        self.progress.console.print(plain(message, "dim"), soft_wrap=True, highlight=False)

    def stop(self) -> None:
        """Remove the bar."""
        self.progress.stop()


def _mbit(record: PairRecord) -> float | None:
    bps = figures(record.result)["receiver_bits_per_second"]
    return None if bps is None else bps / 1e6


def record_line(record: PairRecord) -> Any:
    mbit = _mbit(record)
    figure = format_rate(mbit * 1e6) if mbit is not None else "-"
    tail = "" if record.outcome == "ok" else f"  {record.outcome}: {record.error}"
    return plain(f"{record.group} {record.round}: {record.source} -> {record.target}  "
                 f"{figure}{tail}")  # the error is the far end's words: data


def print_run(records: list[PairRecord]) -> None:
    table = Table()
    for column in ("group", "round", "source", "target", "received", "outcome"):
        table.add_column(column, justify="right" if column == "received" else "left")
    for r in records:
        mbit = _mbit(r)
        table.add_row(plain(r.group), str(r.round), plain(r.source), plain(r.target),
                      format_rate(mbit * 1e6) if mbit is not None else "-",
                      plain(r.outcome if r.outcome == "ok" else f"{r.outcome}: {r.error}"))
    stdout_console().print(table)


def print_status(rows: list[dict[str, Any]]) -> None:
    table = Table()
    for column in ("agent", "address", "state", "doing", "served"):
        table.add_column(column)
    for row in rows:  # every cell but the agent's name is the agent's (or its error's) word
        doing = "; ".join(f"{d.get('kind')} {d.get('tool') or ''} "
                          f"{d.get('peer')} -> {d.get('target') or 'here'} since "
                          f"{d.get('started')}" for d in row["running"]
                          if isinstance(d, dict)) or (row["error"] or "")
        table.add_row(plain(row["agent"]), plain(f"{row['address']}:{row['port']}"),
                      plain(row["state"]), plain(doing),
                      "" if row.get("served") is None else plain(row["served"]))
    stdout_console().print(table)


def print_matrices(matrices: list[Matrix], empty_note: str | None) -> None:
    """Each group's matrix as a table (``empty_note`` first when the archive is empty)."""
    if empty_note:
        print_note(empty_note)
    for m in matrices:
        stdout_console().print(matrix_table(m))


def matrix_rows(m: Matrix) -> list[tuple[str, list[tuple[str, bool, Cell | None]]]]:
    """Each source and its row: per target the text (the received rate when ok, else what
    went wrong; empty when untested), whether it is ok, and the cell."""
    rows = []
    for source in m.hosts:
        row: list[tuple[str, bool, Cell | None]] = []
        for target in m.hosts:
            cell = None if source == target else m.cells.get((source, target))
            if cell is None:
                row.append(("", True, None))
            elif cell.outcome == "ok" and cell.receiver_bits_per_second is not None:
                row.append((format_rate(cell.receiver_bits_per_second), True, cell))
            else:
                row.append((cell.outcome, False, cell))
        rows.append((source, row))
    return rows


def matrix_table(m: Matrix) -> Any:
    """A rich table: sources down, targets across, received rate or what went wrong."""
    table = Table(title=plain(f"group {m.group}") if m.group else None, title_justify="left")
    table.add_column("from \\ to")
    for host in m.hosts:
        table.add_column(plain(host), justify="right")
    for source, row in matrix_rows(m):  # names from an archive are never markup
        table.add_row(plain(source), *(plain(text, "" if ok else "red")
                                       for text, ok, _ in row))
    return table


def matrix_html(m: Matrix) -> str:
    """A matrix as an HTML table (every text escaped): received rate or what went wrong."""
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in m.hosts)
    rows = []
    for source, row in matrix_rows(m):
        cells = "".join(
            "<td></td>" if cell is None else
            f"<td{'' if ok else ' class=bad'} title='{e(cell.time if ok else str(cell.error))}'>"
            f"{e(text)}</td>" for text, ok, cell in row)
        rows.append(f"<tr><th>{e(source)}</th>{cells}</tr>")
    return (f"<table class=matrix><tr><th>from \\ to</th>{head}</tr>{''.join(rows)}"
            "</table>")
