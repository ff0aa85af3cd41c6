"""``netprobe parse --tool NAME FILE...``: a tool's saved output as a netprobe result."""
from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterator
from typing import Any

from netprobe.cli import args as opts
from netprobe.cli.common import (
    RegistryLoader,
    make_tool,
    output,
    read_lines,
    registry_for,
    status_code,
)
from netprobe.cli.exitcodes import ExitCode, UsageError
from netprobe.errors import NetprobeError, ParseError, one_line
from netprobe.plugin import Tool
from netprobe.schema import Result


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
    """Parse the files with the tool's parser and write one result per test they hold."""
    tool = make_tool(registry_for(load, args.tool), args.tool)
    out = output(args)
    out.check()
    tests = _results(tool, args.files)
    first = next(tests, None)
    if first is None:
        raise ParseError(f"no {tool.name} test in {', '.join(args.files)}")
    second = next(tests, None)
    if second is None:
        out.emit(first)
        return status_code(first)
    # Several tests: JSON goes out as one line per test (a stream of documents a reader
    # can take one at a time), written as each test is read, never all held at once.
    if out.fmt == "json":
        out.fmt = "jsonl"
    code = ExitCode.OK
    for result in itertools.chain((first, second), tests):
        out.emit(result)
        code = code or status_code(result)
    return code


def _results(tool: Tool, paths: list[str]) -> Iterator[Result]:
    """One Result per test (see :func:`_tests`). A figure in the tool's output that its
    parser cannot take (a number too long to be one, a text where a number belongs) is the
    input's fault: a ParseError naming the files, not an internal error."""
    try:
        yield from _tests(tool, paths)
    except (ArithmeticError, ValueError, TypeError) as exc:
        if isinstance(exc, NetprobeError):
            raise
        raise ParseError(f"{tool.name} output {', '.join(paths)}: a figure netprobe cannot "
                         f"read ({one_line(exc)})") from exc


def _tests(tool: Tool, paths: list[str]) -> Iterator[Result]:
    """One Result per test, its figures made finite: each file split into its tests by the
    tool; with several files (a client's and a server's log), their k-th tests make the
    k-th result."""
    from netprobe.convert import finite_figures

    splits = [tool.split_tests(read_lines(path)) for path in paths]
    for number, texts in enumerate(itertools.zip_longest(*splits), start=1):
        if any(text is None for text in texts):
            short = ", ".join(path for path, text in zip(paths, texts) if text is None)
            raise UsageError(f"the files hold different numbers of tests: {short} has "
                             f"no test {number}")
        parsed = tool.parse(list(zip(paths, texts)))
        try:
            yield finite_figures(parsed)
        except ParseError as exc:
            raise ParseError(exc.detail, ", ".join(paths)) from None
