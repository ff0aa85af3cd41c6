"""``netprobe tools [HOST]``: the tool plugins and whether they can run (here, or on HOST)."""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from netprobe.cli import args as opts
from netprobe.cli.common import RegistryLoader, one_line
from netprobe.cli.exitcodes import ExitCode

if TYPE_CHECKING:
    from netprobe.plugin import Registry, Tool


def add_parser(commands: Any, summary: str, epilog: str) -> None:
    """The ``tools`` command's options."""
    parser = opts.subparser(commands, "tools", summary, epilog, "%(prog)s [HOST] [--json]")
    parser.set_defaults(handler=handle)
    parser.add_argument("host", nargs="?", metavar="HOST",
                        help="ask the netprobe agent on HOST instead of this machine")
    opts.add_agent_port(parser)
    parser.add_argument("--secret-file", metavar="FILE",
                        help="shared secret for an agent that requires one")
    parser.add_argument("--json", action="store_true", help="a JSON list instead of a table")


def handle(args: argparse.Namespace, load: RegistryLoader) -> int:
    """Print the tools as a table, or as JSON."""
    rows = _remote_tool_rows(args) if args.host else tool_rows(load())
    if args.json:
        import json

        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return ExitCode.OK
    from netprobe.cli.render import print_note, stdout_console, tools_table

    if rows:
        stdout_console().print(tools_table(rows))
    else:
        print_note("no tool plugins are installed (entry-point group netprobe.tools)")
    return ExitCode.OK


def _remote_tool_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    from netprobe.agent.client import remote_tools
    from netprobe.engine.auth import load_secret
    from netprobe.engine.protocol import DEFAULT_PORT

    rows = remote_tools(args.host, load_secret(args.secret_file), args.agent_port or DEFAULT_PORT)
    return [_row(str(r.get("name")), "available" if r.get("available") else "unavailable",
                 version=r.get("version"), reasons=list(r.get("reasons") or []),
                 details=list(r.get("details") or [])) for r in rows]


def tool_rows(registry: Registry) -> list[dict[str, Any]]:
    """One dict per tool (loaded or failed), as ``netprobe tools --json`` prints them.

    Keys: name, status (available/unavailable/failed), version, path, details, reasons,
    description, aliases, measures (``Tool.measures``: throughput, latency), error (load
    or probe failure), target (entry point).
    """
    rows = [_tool_row(name, cls) for name, cls in sorted(registry.tools.items())]
    for failure in registry.failures:
        rows.append(_row(failure.name, "failed", error=failure.error, target=failure.target))
    return rows


def _tool_row(name: str, cls: type[Tool]) -> dict[str, Any]:
    described = {"description": cls.description, "aliases": list(cls.aliases),
                 "measures": sorted(getattr(cls, "measures", ())),
                 "target": f"{cls.__module__}:{cls.__qualname__}"}
    try:
        found = cls().probe()
    except Exception as exc:  # a plugin bug shows in the list instead of breaking it
        return _row(name, "unavailable", error=f"probe failed: {one_line(exc)}", **described)
    return _row(name, "available" if found.available else "unavailable",
                version=found.version, path=found.path, details=list(found.details),
                reasons=list(found.reasons), **described)


def _row(name: str, status: str, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"name": name, "status": status, "version": None, "path": None,
                           "details": [], "reasons": [], "description": "", "aliases": [],
                           "measures": [],
                           "error": None, "target": None}
    row.update(fields)
    return row
