"""``netprobe path HOP1 HOP2 ... HOPn``: each segment and the whole path, and its bottleneck."""
from __future__ import annotations

import argparse
import json
from typing import Any

from netprobe import convert
from netprobe.cli import args as opts
from netprobe.cli.common import (
    RegistryLoader,
    agent_access,
    make_tool,
    registry_for,
    secret_options,
)
from netprobe.cli.exitcodes import ExitCode
from netprobe.cli.formats import format_csv
from netprobe.cli.outfile import append_text, check_target, choose_formats, write_stdout, write_text
from netprobe.cli.units import format_rate
from netprobe.plugin import Reporter
from netprobe.reporting import NullReporter
from netprobe.results.path import PathReport, Segment, run_path
from netprobe.schema import Result, TestSpec


def add_parser(commands: Any, summary: str, epilog: str) -> None:
    """The ``path`` command's options."""
    parser = opts.subparser(commands, "path", summary, epilog,
                            "%(prog)s HOP1 HOP2 [HOP...] [--tool NAME] [options]")
    parser.set_defaults(handler=handle, host=None, client=None)
    parser.add_argument("hops", nargs="+", metavar="HOP",
                        help="hosts along the path, in order; each runs `netprobe server` and "
                             "all but the last allow third-party tests (--allow-third-party)")
    parser.add_argument("--tool", default="native", metavar="NAME",
                        help="tool for every segment (default: native)")
    opts.add_test_options(parser)
    opts.add_socket_options(parser)
    group = parser.add_argument_group("agents")
    opts.add_agent_port(group)
    opts.add_output_options(parser)


def handle(args: argparse.Namespace, load: RegistryLoader) -> int:
    """Run the segments through the hops' agents, then print and save the report."""
    from netprobe.session import prepare, run_spec

    spec = opts.spec_from_args(args)
    opts.check_addresses(args)  # a bad -B or HOST named by its option, before any run
    tool = make_tool(registry_for(load, spec.tool), spec.tool, secret_options(args))
    prepare(tool, spec, from_host=args.hops[0])  # refused: exit 2 before any segment
    access = agent_access(args)
    formats = choose_formats(args.format, args.output)
    if args.output:
        check_target(args.output)
    shown = formats.stdout == "human" and not args.quiet
    reporter: Reporter = _Notes() if shown else NullReporter()

    def ask(source: str, segment_spec: TestSpec, rep: Reporter) -> Result:
        return run_spec(tool, segment_spec, rep, from_host=source, agent=access)

    report = run_path(args.hops, spec, reporter, ask)
    _save(args.output, formats.file, report)
    if not args.quiet:
        _show(formats.stdout, report)
    return ExitCode.TEST_FAILED if any(s.error for s in report.segments) else ExitCode.OK


class _Notes:
    """Progress on stderr: which segment is being tested."""

    def interval(self, sample: Any) -> None:
        """Interval lines are left out: the report shows each segment's figures."""

    def note(self, message: str) -> None:
        """Show the progress note."""
        from netprobe.cli.render import print_note

        if message.startswith("segment "):
            print_note(message)


def as_document(report: PathReport) -> dict[str, Any]:
    """The report as one JSON-ready document: the segments' results and the bottleneck."""
    return {
        "segments": [
            {"source": s.source, "target": s.target, "end_to_end": s.end_to_end,
             "receiver_bits_per_second": s.receiver_bits_per_second, "error": s.error,
             "result": convert.unstructure(s.result) if s.result else None}
            for s in report.segments
        ],
        "bottleneck": report.bottleneck,
    }


def _save(path: str | None, fmt: str | None, report: PathReport) -> None:
    # jsonl and csv get the segments' results (what `report` reads back); json (and
    # human, which has no file form of its own here) the whole path document.
    if not path:
        return
    results = [s.result for s in report.segments if s.result]
    if fmt == "jsonl":
        append_text(path, "".join(convert.to_json(r, indent=None) + "\n" for r in results))
    elif fmt == "csv":
        write_text(path, format_csv(results))
    else:
        write_text(path, json.dumps(as_document(report), indent=2) + "\n")


def _show(fmt: str, report: PathReport) -> None:
    if fmt in ("json", "jsonl"):
        write_stdout(json.dumps(as_document(report), indent=2 if fmt == "json" else None)
                     + "\n")
        return
    from rich.table import Table

    from netprobe.cli.render import plain, stdout_console

    table = Table("segment", "receiver", "sender", "retr", "RTT", "", box=None)
    for index, segment in enumerate(report.segments):  # hosts and errors: data, no markup
        table.add_row(*(plain(cell) for cell in _row(segment, index == report.bottleneck)))
    console = stdout_console()
    console.print(table)
    console.print(plain(_verdict(report)))


def _row(segment: Segment, slowest: bool) -> list[str]:
    name = f"{segment.source} -> {segment.target}" + (" (end to end)" if segment.end_to_end else "")
    flow = segment.result.summaries[0] if segment.result and segment.result.summaries else None
    sender = flow.sender if flow else None
    retr = sender.retransmits if sender and sender.retransmits is not None else None
    rtt = f"{sender.rtt_us / 1000:.2f} ms" if sender and sender.rtt_us is not None else "-"
    mark = "bottleneck" if slowest else (f"failed: {segment.error}" if segment.error else "")
    return [name, format_rate(segment.receiver_bits_per_second),
            format_rate(sender.bits_per_second if sender else None),
            "-" if retr is None else str(retr), rtt, mark]


def _verdict(report: PathReport) -> str:
    if report.bottleneck is None:
        return "bottleneck: unknown (no segment was measured)"
    slow = report.segments[report.bottleneck]
    text = (f"bottleneck: {slow.source} -> {slow.target} at "
            f"{format_rate(slow.receiver_bits_per_second)}")
    whole = report.end_to_end
    if whole is not None:
        text += f"; end to end {format_rate(whole.receiver_bits_per_second)}"
    return text
