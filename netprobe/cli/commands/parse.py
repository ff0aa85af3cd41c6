"""``netprobe parse --tool NAME FILE...``: a tool's saved output as a netprobe result."""
from __future__ import annotations

import argparse
from typing import Any

from netprobe.cli import args as opts
from netprobe.cli.common import (
    RegistryLoader,
    make_tool,
    output,
    read_input,
    registry_for,
    status_code,
)


def add_parser(commands: Any, summary: str, epilog: str) -> None:
    """The ``parse`` command's options."""
    parser = opts.subparser(commands, "parse", summary, epilog,
                            "%(prog)s --tool NAME [options] FILE...")
    parser.set_defaults(handler=handle)
    parser.add_argument("--tool", required=True, metavar="NAME",
                        help="the tool that wrote the files")
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="saved output (client and server logs, as the tool needs; "
                             "- reads stdin)")
    opts.add_output_options(parser)


def handle(args: argparse.Namespace, load: RegistryLoader) -> int:
    """Parse the files with the tool's parser and write the result."""
    tool = make_tool(registry_for(load, args.tool), args.tool)
    out = output(args)
    out.check()
    sources = [(path, read_input(path)) for path in args.files]
    result = tool.parse(sources)
    out.emit(result)
    return status_code(result)
