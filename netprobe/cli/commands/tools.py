"""``netprobe tools [HOST]``: the tool plugins and whether they can run (here, or on HOST)."""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from netprobe.cli import args as opts
from netprobe.cli.common import RegistryLoader
from netprobe.cli.exitcodes import ExitCode
from netprobe.registry import row, tool_rows

if TYPE_CHECKING:
    pass


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
    from netprobe.engine.auth import load_secret
    from netprobe.engine.protocol import DEFAULT_PORT
    from netprobe.farend import remote_tools

    rows = remote_tools(args.host, load_secret(args.secret_file), args.agent_port or DEFAULT_PORT)
    return [_remote_row(r) for r in rows]


def _remote_row(found: dict[str, Any]) -> dict[str, Any]:
    # An agent sends registry.tool_rows' shape; one from before it sent only name,
    # available, version, reasons and details. Only the known keys, as text, are kept: the
    # row is the far end's data.
    status = found.get("status")
    if status not in ("available", "unavailable", "failed"):
        status = "available" if found.get("available") is True else "unavailable"
    texts = {key: str(found[key]) for key in ("version", "path", "description", "error",
                                              "target") if found.get(key) is not None}
    lists = {key: [str(x) for x in found[key]] for key in ("details", "reasons", "aliases",
                                                             "measures")
             if isinstance(found.get(key), list)}
    return row(str(found.get("name")), status, **texts, **lists)
