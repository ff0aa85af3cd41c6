"""``netprobe fleet plan|run|status|matrix``: tests among many agents on a conflict-free
schedule, archived as each ends (netprobe.fleet, netprobe.archives). What is drawn is
cli/fleetview.py's; this module reads the arguments and decides what to show."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import threading
from typing import TYPE_CHECKING, Any

from netprobe.cli import args as opts
from netprobe.cli.common import RegistryLoader, warning
from netprobe.cli.exitcodes import ExitCode, UsageError
from netprobe.cli.outfile import write_stdout

if TYPE_CHECKING:
    from netprobe.archives import PairRecord
    from netprobe.fleet.config import Fleet
    from netprobe.fleet.matrix import Matrix


def add_parser(commands: Any, summary: str, epilog: str) -> None:
    """The ``fleet`` command and its actions."""
    parser = opts.subparser(commands, "fleet", summary, epilog,
                            "%(prog)s {plan,run,status,matrix} ...")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    plan = _action(actions, "plan", "print the rounds of a fleet file without running them",
                   epilog)
    plan.set_defaults(handler=handle_plan)
    plan.add_argument("--run", type=int, metavar="N",
                      help="plan run number N (what a random group's peers depend on; "
                           "default: the run each group's schedule is in now)")
    run = _action(actions, "run", "run every round once (or keep the schedule: --forever)",
                  epilog)
    run.set_defaults(handler=handle_run)
    run.add_argument("--forever", action="store_true",
                     help="keep each group's schedule (every, slip) until Ctrl-C or SIGTERM")
    run.add_argument("--group", action="append", metavar="NAME",
                     help="run only this group (repeatable)")
    run.add_argument("--shared", action="store_true",
                     help="share the run with the other `fleet run --shared` of the same file "
                          "on the same PostgreSQL archive: the database keeps each host in "
                          "one test at a time, and a runner that dies leaves its pairs to the "
                          "others when their leases end; with --forever, runners started "
                          "apart join the same runs of the schedule")
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


def _load(path: str, secret_file: str | None = None) -> Fleet:
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


def archive_url(args: argparse.Namespace, fleet: Fleet | None) -> str:
    """--archive, else the fleet file's, else ``<fleet file>.db`` beside it."""
    if args.archive:
        return str(args.archive)
    if fleet is not None and fleet.archive:
        return fleet.archive
    if fleet is None:
        raise UsageError("name the archive: --archive URL, or a fleet FILE")
    return os.path.splitext(fleet.path)[0] + ".db"


# --- plan ---------------------------------------------------------------------------------


def handle_plan(args: argparse.Namespace, _load_registry: RegistryLoader) -> int:
    """Print the rounds, group by group (or, for a large plan, each group's sums)."""
    from netprobe.fleet.schedule import plan

    fleet = _load(args.file)
    rounds = plan(fleet, run=args.run)
    if args.json:  # one round at a time: never the whole plan in memory
        write_stdout("[")
        for n, r in enumerate(rounds):
            write_stdout(("," if n else "") + "\n" + json.dumps(
                {"group": r.group, "round": r.index, "of": r.of,
                 "pairs": [list(p) for p in r.pairs]}))
        write_stdout("\n]\n")
        return ExitCode.OK
    from netprobe.cli.fleetview import print_plan

    print_plan(fleet, rounds)
    return ExitCode.OK


# --- run ----------------------------------------------------------------------------------


def handle_run(args: argparse.Namespace, _load_registry: RegistryLoader) -> int:
    """Run the fleet once, or keep its schedule; each record goes to the archive as it ends."""
    from netprobe.archives import open_archive
    from netprobe.cli.fleetview import FleetBar
    from netprobe.fleet.runner import FleetRunner, QuietProgress, one_runner

    fleet = _load(args.file, args.secret_file)
    known = {g.name for g in fleet.groups}
    unknown = sorted(set(args.group or ()) - known)
    if unknown:
        raise UsageError(f"no such group in {fleet.path}: {', '.join(unknown)}")
    with open_archive(archive_url(args, fleet)) as archive:
        quiet = args.quiet or args.json
        bar = None if quiet else FleetBar()
        runner = FleetRunner(fleet, archive, bar or QuietProgress())
        try:
            with contextlib.ExitStack() as held:
                if not args.shared:
                    held.enter_context(one_runner(archive))
                summary = _run(args, runner)
            if summary is None:
                return ExitCode.OK
        finally:
            if bar is not None:
                bar.stop()
        records = list(summary.records)
        left_out = summary.total - len(records)  # past RECORDS_KEPT: in the archive only
        if args.json:
            write_stdout(json.dumps({"run_id": summary.run_id, "status": summary.status,
                                     "archive": archive.url, "counts": dict(summary.counts),
                                     "records_left_out": left_out,
                                     "records": [_record_json(r) for r in records]},
                                    indent=2) + "\n")
        elif not args.quiet:
            from netprobe.cli.fleetview import print_run

            print_run(records)
            if left_out:
                from netprobe.cli.render import print_note

                print_note(f"{left_out:,} more records are in the archive only (of "
                           f"{summary.total:,}: " + ", ".join(
                               f"{n:,} {o}" for o, n in sorted(summary.counts.items())) + ")")
    return ExitCode.OK if summary.count("ok") == summary.total else ExitCode.TEST_FAILED


def _run(args: argparse.Namespace, runner: Any) -> Any:
    """The run (or the schedule) ``args`` ask for; its summary, None for --forever (it
    ends with Ctrl-C or SIGTERM)."""
    if args.forever and args.shared:
        from netprobe.fleet.shared import run_shared_forever

        run_shared_forever(runner, threading.Event())
        return None
    if args.forever:
        runner.run_forever(threading.Event())
        return None
    if args.shared:
        from netprobe.fleet.shared import run_shared

        return run_shared(runner, args.group)
    return runner.run_once(args.group)


def _record_json(record: PairRecord) -> dict[str, Any]:
    from netprobe.archives import figures

    return {"group": record.group, "round": record.round, "source": record.source,
            "target": record.target, "time": record.time, "outcome": record.outcome,
            "error": record.error, **{k: v for k, v in figures(record.result).items()}}


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
        from netprobe.cli.fleetview import print_status

        print_status(rows)
    return ExitCode.OK if all(r["state"] != "unreachable" for r in rows) else \
        ExitCode.TEST_FAILED


def _status_row(name: str, fleet: Fleet, answer: Any) -> dict[str, Any]:
    agent = fleet.agents[name]
    row: dict[str, Any] = {"agent": name, "address": agent.address,
                           "port": agent.iperf3_port or agent.port}  # a stock iperf3's own
    if isinstance(answer, str):
        return {**row, "state": "unreachable", "error": answer, "running": []}
    return {**row, "state": answer["state"], "running": answer["running"],
            "slots": answer.get("slots"), "served": answer.get("served"), "error": None}


# --- matrix -------------------------------------------------------------------------------


def handle_matrix(args: argparse.Namespace, _load_registry: RegistryLoader) -> int:
    """The latest figure of every pair, sources down and targets across."""
    from netprobe.archives import open_archive
    from netprobe.fleet.matrix import build, groups_of

    fleet = _load(args.file) if args.file else None
    with open_archive(archive_url(args, fleet), create=False) as archive:
        latest = archive.latest()
    for line in getattr(archive, "warnings", []):  # rows skipped, each named
        warning(line)
    groups = [args.group] if args.group else groups_of(latest)
    matrices = [build(latest, g) for g in groups]
    if args.json:
        write_stdout(json.dumps([matrix_json(m) for m in matrices], indent=2) + "\n")
        return ExitCode.OK
    from netprobe.cli.fleetview import print_matrices

    print_matrices(matrices, None if latest else f"no results in {archive.url} yet")
    return ExitCode.OK


def matrix_json(m: Matrix) -> dict[str, Any]:
    """A matrix as JSON: its group, hosts and one entry per tested pair."""
    return {"group": m.group, "hosts": list(m.hosts),
            "pairs": [{"source": s, "target": t, "outcome": c.outcome,
                       "receiver_bits_per_second": c.receiver_bits_per_second,
                       "time": c.time, "error": c.error} for (s, t), c in m.cells.items()]}


