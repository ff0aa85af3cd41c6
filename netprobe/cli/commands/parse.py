"""``netprobe parse [--tool NAME] FILE...``: a tool's saved output as a netprobe result.

Without ``--tool`` the tool is told from the files' first lines (netprobe.tools.detect)."""
from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterable, Iterator, Sequence
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
from netprobe.tools.detect import DETECT_LINES, DETECTABLE, detect_tool


def add_parser(commands: Any, summary: str, epilog: str) -> None:
    """The ``parse`` command's options."""
    parser = opts.subparser(commands, "parse", summary, epilog,
                            "%(prog)s [--tool NAME] [options] FILE...")
    parser.set_defaults(handler=handle)
    parser.add_argument("--tool", metavar="NAME",
                        help="the tool that wrote the files (default: told from the files, "
                             f"for {', '.join(DETECTABLE)})")
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="saved output (client and server logs, as the tool needs; "
                             "- reads stdin)")
    opts.add_output_options(parser)


def handle(args: argparse.Namespace, load: RegistryLoader) -> int:
    """Parse the files with the tool's parser (``--tool``, else the one that wrote them)
    and write one result per test they hold."""
    tool = make_tool(registry_for(load, args.tool), args.tool) if args.tool else None
    out = output(args)
    out.check()
    files: list[Iterable[str]] = [read_lines(path) for path in args.files]
    if tool is None:
        # Each file's first lines are read once, to tell the tool, and given back to it.
        heads = [list(itertools.islice(lines, DETECT_LINES)) for lines in files]
        name = _detected(list(zip(args.files, heads)))
        tool = make_tool(registry_for(load, name), name)
        files = [itertools.chain(head, rest) for head, rest in zip(heads, files)]
    tests = _results(tool, args.files, files)
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


def _detected(heads: Sequence[tuple[str, list[str]]]) -> str:
    """The one tool the files' first lines name; UsageError when none does or they name
    different tools."""
    found = {path: detect_tool(head) for path, head in heads}
    named = {tool for tool in found.values() if tool}
    if len(named) > 1:
        which = ", ".join(f"{path}: {tool}" for path, tool in found.items() if tool)
        raise UsageError(f"the files are from different tools ({which}); name one with "
                         "--tool NAME")
    if not named:
        raise UsageError(f"cannot tell which tool wrote {', '.join(found)}: name it with "
                         f"--tool NAME ({', '.join(DETECTABLE)}, or an installed plugin's "
                         "name: netprobe tools)")
    return named.pop()


def _results(tool: Tool, paths: list[str], files: Sequence[Iterable[str]]) -> Iterator[Result]:
    """One Result per test (see :func:`_tests`). A figure in the tool's output that its
    parser cannot take (a number too long to be one, a text where a number belongs) is the
    input's fault: a ParseError naming the files, not an internal error."""
    try:
        yield from _tests(tool, paths, files)
    except (ArithmeticError, ValueError, TypeError) as exc:
        if isinstance(exc, NetprobeError):
            raise
        raise ParseError(f"{tool.name} output {', '.join(paths)}: a figure netprobe cannot "
                         f"read ({one_line(exc)})") from exc


def _tests(tool: Tool, paths: list[str], files: Sequence[Iterable[str]]) -> Iterator[Result]:
    """One Result per test, checked as the road checks every Result (figures made finite,
    the CPU rule: :func:`netprobe.session.checked`): each file split into its tests by the
    tool; with several files (a client's and a server's log), their k-th tests make the
    k-th result."""
    from netprobe.session import checked

    splits = [tool.split_tests(lines) for lines in files]
    for number, texts in enumerate(itertools.zip_longest(*splits), start=1):
        if any(text is None for text in texts):
            short = ", ".join(path for path, text in zip(paths, texts) if text is None)
            raise UsageError(f"the files hold different numbers of tests: {short} has "
                             f"no test {number}")
        parsed = tool.parse(list(zip(paths, texts)))
        try:
            yield checked(parsed)
        except ParseError as exc:
            raise ParseError(exc.detail, ", ".join(paths)) from None
