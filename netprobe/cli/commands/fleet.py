"""``netprobe fleet plan|run|status|matrix``: tests among many agents on a conflict-free
schedule, archived as each ends (netprobe.fleet, netprobe.archives)."""
from __future__ import annotations

import argparse
import json
import os
import threading
from typing import TYPE_CHECKING, Any, Optional

from netprobe.cli import args as opts
from netprobe.cli.common import RegistryLoader
from netprobe.cli.exitcodes import ExitCode, UsageError
from netprobe.cli.outfile import write_stdout

if TYPE_CHECKING:
    from rich.progress import Progress

    from netprobe.archives import Record
    from netprobe.fleet.config import Fleet
    from netprobe.fleet.matrix import Cell, Matrix
    from netprobe.fleet.schedule import PlannedRound


def add_parser(commands: Any, summary: str, epilog: str) -> None:
    """The ``fleet`` command and its actions."""
    parser = opts.subparser(commands, "fleet", summary, epilog,
                            "%(prog)s {plan,run,status,matrix} ...")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    plan = _action(actions, "plan", "print the rounds of a fleet file without running them",
                   epilog)
    plan.set_defaults(handler=handle_plan)
    run = _action(actions, "run", "run every round once (or keep the schedule: --forever)",
                  epilog)
    run.set_defaults(handler=handle_run)
    run.add_argument("--forever", action="store_true",
                     help="keep each group's schedule (every, slip) until Ctrl-C or SIGTERM")
    run.add_argument("--group", action="append", metavar="NAME",
                     help="run only this group (repeatable)")
    _archive_option(run)
    _secret_option(run)
    run.add_argument("-q", "--quiet", action="store_true",
                     help="no progress bar and no table, only errors")
    status = _action(actions, "status", "what each agent of the fleet is doing now", epilog)
    status.set_defaults(handler=handle_status)
    _secret_option(status)
    matrix = _action(actions, "matrix", "the latest pair-by-pair throughput from the archive",
                     epilog, file_required=False)
    matrix.set_defaults(handler=handle_matrix)
    matrix.add_argument("--group", metavar="NAME", help="only this group (default: each)")
    _archive_option(matrix)


def _action(actions: Any, name: str, summary: str, epilog: str,
            file_required: bool = True) -> argparse.ArgumentParser:
    parser = opts.subparser(actions, name, summary, epilog, f"netprobe fleet {name} "
                            + ("FILE" if file_required else "[FILE] [--archive URL]")
                            + " [options]")
    parser.add_argument("file", nargs=None if file_required else "?", metavar="FILE",
                        help="the fleet file (TOML: agents, groups; see docs/fleet.md)")
    parser.add_argument("--json", action="store_true", help="JSON on stdout")
    return parser


def _archive_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--archive", metavar="URL",
                        help="where results go: sqlite:///path.db (or a path), "
                             "postgresql://... (default: the fleet file's [fleet] archive, "
                             "else FILE's name with .db beside it)")


def _secret_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--secret-file", metavar="FILE",
                        help="the agents' shared secret, for each agent the fleet file gives "
                             "none (its [fleet] or agent secret_file wins); else "
                             "$NETPROBE_SECRET")


def _load(path: str, secret_file: Optional[str] = None) -> Fleet:
    """The fleet file; ``secret_file`` (``--secret-file``, read once here so that a bad
    one is one error, not one per pair) for each agent it gives no secret."""
    import attrs

    from netprobe.engine.auth import load_secret
    from netprobe.fleet.config import load

    fleet = load(path)
    if secret_file is None:
        return fleet
    load_secret(secret_file)
    agents = {name: agent if agent.secret_file else attrs.evolve(agent, secret_file=secret_file)
              for name, agent in fleet.agents.items()}
    return attrs.evolve(fleet, agents=agents)


def archive_url(args: argparse.Namespace, fleet: Optional[Fleet]) -> str:
    """--archive, else the fleet file's, else ``<fleet file>.db`` beside it."""
    if args.archive:
        return str(args.archive)
    if fleet is not None and fleet.archive:
        return fleet.archive
    if fleet is None:
        raise UsageError("name the archive: --archive URL, or a fleet FILE")
    return os.path.splitext(fleet.path)[0] + ".db"


# --- plan ---------------------------------------------------------------------------------


PLAN_LISTED_TESTS = 5000
"""A plan with more tests is summed up (rounds, tests, time per group), not listed pair by
pair: a 10,000-agent mesh is 10^8 pairs. ``--json`` still lists every round, streamed."""


def handle_plan(args: argparse.Namespace, _load_registry: RegistryLoader) -> int:
    """Print the rounds, group by group (or, for a large plan, each group's sums)."""
    from netprobe.fleet.schedule import plan

    fleet = _load(args.file)
    rounds = plan(fleet)
    if args.json:  # one round at a time: never the whole plan in memory
        write_stdout("[")
        for n, r in enumerate(rounds):
            write_stdout(("," if n else "") + "\n" + json.dumps(
                {"group": r.group, "round": r.index, "of": r.of,
                 "pairs": [list(p) for p in r.pairs]}))
        write_stdout("\n]\n")
        return ExitCode.OK
    from rich.table import Table

    from netprobe.cli.render import plain, print_note, stdout_console

    longest = sum(len(g_rounds) * _round_limit_s(group) for group, g_rounds in rounds.groups)
    title = plain(f"{fleet.path}: {len(rounds):,} rounds, {rounds.tests:,} tests, "
                  f"at most {_span(longest)}")
    if rounds.tests > PLAN_LISTED_TESTS:
        stdout_console().print(title, soft_wrap=True, highlight=False)
        table = Table()
        for column in ("group", "type", "agents", "rounds", "tests", "each round up to",
                       "in all up to"):
            table.add_column(column)
        for group, g_rounds in rounds.groups:
            hosts = _agent_count(group)
            limit = _round_limit_s(group)
            table.add_row(group.name, group.kind, f"{hosts:,}", f"{len(g_rounds):,}",
                          f"{g_rounds.tests:,}", f"{limit:g} s",
                          _span(limit * len(g_rounds)))
        stdout_console().print(table)
        print_note(f"{rounds.tests:,} tests are too many to list; --json lists every "
                        "round")
        return ExitCode.OK
    table = Table(title=title, title_justify="left")
    for column in ("group", "round", "pairs (source -> target)"):
        table.add_column(column)
    for r in rounds:
        table.add_row(plain(r.group), f"{r.index}/{r.of}",
                      plain("  ".join(f"{a}->{b}" for a, b in r.pairs)))
    stdout_console().print(table)
    return ExitCode.OK


def _agent_count(group: Any) -> int:
    """How many agents take part in the group (a list's pairs are held already)."""
    pairs = group.pairs
    if hasattr(pairs, "members"):
        return len(pairs.members)
    if hasattr(pairs, "side_a"):
        return len(pairs.side_a) + len(pairs.side_b)
    return len({h for pair in pairs for h in pair})


def _round_limit_s(group: Any) -> float:
    """The longest one of the group's rounds may take (the runner's deadline)."""
    from netprobe.fleet.runner import BYTES_ROUND_S, ROUND_MARGIN_S

    if group.round_timeout_s is not None:
        return float(group.round_timeout_s)
    planned = group.spec.planned_s()
    return (BYTES_ROUND_S if planned is None else planned) + ROUND_MARGIN_S


def _span(seconds: float) -> str:
    """A length of time in its largest sensible unit."""
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size * 2:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:g} s"


# --- run ----------------------------------------------------------------------------------


def handle_run(args: argparse.Namespace, _load_registry: RegistryLoader) -> int:
    """Run the fleet once, or keep its schedule; each record goes to the archive as it ends."""
    from netprobe.archives import open_archive
    from netprobe.fleet.runner import FleetRunner, QuietProgress

    fleet = _load(args.file, args.secret_file)
    known = {g.name for g in fleet.groups}
    unknown = sorted(set(args.group or ()) - known)
    if unknown:
        raise UsageError(f"no such group in {fleet.path}: {', '.join(unknown)}")
    with open_archive(archive_url(args, fleet)) as archive:
        quiet = args.quiet or args.json
        bar = None if quiet else _Bar()
        runner = FleetRunner(fleet, archive, bar or QuietProgress())
        try:
            if args.forever:
                runner.run_forever(threading.Event())  # ends with Ctrl-C or SIGTERM
                return ExitCode.OK
            summary = runner.run_once(args.group)
        finally:
            if bar is not None:
                bar.stop()
        records = list(summary.records)
        if args.json:
            write_stdout(json.dumps({"run_id": summary.run_id, "status": summary.status,
                                     "archive": archive.url,
                                     "records": [_record_json(r) for r in records]},
                                    indent=2) + "\n")
        elif not args.quiet:
            _print_run(records)
    return ExitCode.OK if all(r.outcome == "ok" for r in records) else ExitCode.TEST_FAILED


class _Bar:
    """The fleet's progress on stderr: round k of n, pairs done; a line per pair."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        from netprobe.cli.render import stderr_console

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

    def pair_done(self, record: Record) -> None:
        """Count the pair and print its line."""
        self.progress.advance(self.task)
        self.progress.console.print(_record_line(record), soft_wrap=True, highlight=False)

    def note(self, message: str) -> None:
        """A dimmed line."""
        from netprobe.cli.render import plain

        self.progress.console.print(plain(message, "dim"), soft_wrap=True, highlight=False)

    def stop(self) -> None:
        """Remove the bar."""
        self.progress.stop()


def _mbit(record: Record) -> Optional[float]:
    from netprobe.archives import figures

    bps = figures(record.result)["receiver_bits_per_second"]
    return None if bps is None else bps / 1e6


def _record_line(record: Record) -> Any:
    from netprobe.cli.render import plain
    from netprobe.cli.units import format_rate

    mbit = _mbit(record)
    figure = format_rate(mbit * 1e6) if mbit is not None else "-"
    tail = "" if record.outcome == "ok" else f"  {record.outcome}: {record.error}"
    return plain(f"{record.group} {record.round}: {record.source} -> {record.target}  "
                 f"{figure}{tail}")  # the error is the far end's words: data


def _record_json(record: Record) -> dict[str, Any]:
    from netprobe.archives import figures

    return {"group": record.group, "round": record.round, "source": record.source,
            "target": record.target, "time": record.time, "outcome": record.outcome,
            "error": record.error, **{k: v for k, v in figures(record.result).items()}}


def _print_run(records: list[Record]) -> None:
    from rich.table import Table

    from netprobe.cli.render import plain, stdout_console
    from netprobe.cli.units import format_rate

    table = Table()
    for column in ("group", "round", "source", "target", "received", "outcome"):
        table.add_column(column, justify="right" if column == "received" else "left")
    for r in records:
        mbit = _mbit(r)
        table.add_row(plain(r.group), str(r.round), plain(r.source), plain(r.target),
                      format_rate(mbit * 1e6) if mbit is not None else "-",
                      plain(r.outcome if r.outcome == "ok" else f"{r.outcome}: {r.error}"))
    stdout_console().print(table)


# --- status -------------------------------------------------------------------------------


def handle_status(args: argparse.Namespace, _load_registry: RegistryLoader) -> int:
    """Ask every agent of the fleet, all at once, what it is doing."""
    from netprobe.fleet.runner import agent_status

    fleet = _load(args.file, args.secret_file)
    answers: dict[str, Any] = {}

    def ask(name: str) -> None:
        try:
            answers[name] = agent_status(fleet.agents[name])
        except Exception as exc:  # one broken agent must not hide the others
            answers[name] = str(exc) or type(exc).__name__

    threads = [threading.Thread(target=ask, args=(n,), daemon=True) for n in fleet.agents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    rows = [_status_row(name, fleet, answers.get(name, "no answer in 10 s"))
            for name in fleet.agents]
    if args.json:
        write_stdout(json.dumps(rows, indent=2) + "\n")
    else:
        _print_status(rows)
    return ExitCode.OK if all(r["state"] != "unreachable" for r in rows) else \
        ExitCode.TEST_FAILED


def _status_row(name: str, fleet: Fleet, answer: Any) -> dict[str, Any]:
    agent = fleet.agents[name]
    row: dict[str, Any] = {"agent": name, "address": agent.address, "port": agent.port}
    if isinstance(answer, str):
        return {**row, "state": "unreachable", "error": answer, "running": []}
    return {**row, "state": answer["state"], "running": answer["running"],
            "slots": answer.get("slots"), "served": answer.get("served"), "error": None}


def _print_status(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    from netprobe.cli.render import plain, stdout_console

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


# --- matrix -------------------------------------------------------------------------------


def handle_matrix(args: argparse.Namespace, _load_registry: RegistryLoader) -> int:
    """The latest figure of every pair, sources down and targets across."""
    from netprobe.archives import open_archive
    from netprobe.fleet.matrix import build, groups_of

    fleet = _load(args.file) if args.file else None
    with open_archive(archive_url(args, fleet), create=False) as archive:
        latest = archive.latest()
    from netprobe.cli.common import warning

    for line in getattr(archive, "warnings", []):  # rows skipped, each named
        warning(line)
    groups = [args.group] if args.group else groups_of(latest)
    matrices = [build(latest, g) for g in groups]
    if args.json:
        write_stdout(json.dumps([matrix_json(m) for m in matrices], indent=2) + "\n")
        return ExitCode.OK
    from netprobe.cli.render import print_note, stdout_console

    if not latest:
        print_note(f"no results in {archive.url} yet")
    for m in matrices:
        stdout_console().print(matrix_table(m))
    return ExitCode.OK


def matrix_json(m: Matrix) -> dict[str, Any]:
    """A matrix as JSON: its group, hosts and one entry per tested pair."""
    return {"group": m.group, "hosts": list(m.hosts),
            "pairs": [{"source": s, "target": t, "outcome": c.outcome,
                       "receiver_bits_per_second": c.receiver_bits_per_second,
                       "time": c.time, "error": c.error} for (s, t), c in m.cells.items()]}


def matrix_rows(m: Matrix) -> list[tuple[str, list[tuple[str, bool, Optional[Cell]]]]]:
    """Each source and its row: per target the text (the received rate when ok, else what
    went wrong; empty when untested), whether it is ok, and the cell."""
    from netprobe.cli.units import format_rate

    rows = []
    for source in m.hosts:
        row: list[tuple[str, bool, Optional[Cell]]] = []
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
    from rich.table import Table

    from netprobe.cli.render import plain

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
    import html

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
