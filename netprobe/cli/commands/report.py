"""``netprobe report FILE...``: saved results as trial lines and statistics, or an HTML page."""
from __future__ import annotations

import argparse
import io
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable

from netprobe.cli import args as opts
from netprobe.cli.common import RegistryLoader, read_input, warning
from netprobe.cli.exitcodes import ExitCode, UsageError
from netprobe.errors import SpecError, ToolUnavailable
from netprobe.redact import redact

if TYPE_CHECKING:
    from netprobe.results.analysis import Group, GroupStats
    from netprobe.schema import Result


def add_parser(commands: Any, summary: str, epilog: str) -> None:
    """The ``report`` command's options."""
    parser = opts.subparser(commands, "report", summary, epilog,
                            "%(prog)s [FILE...] [--archive URL] [--group-by KEYS] "
                            "[--html OUT.html]")
    parser.set_defaults(handler=handle)
    parser.add_argument("files", nargs="*", metavar="FILE",
                        help="saved results: JSON documents (--json, `netprobe parse "
                             "--json`), JSON lines (-o results.jsonl), or both; - reads stdin")
    parser.add_argument("--archive", action="append", metavar="URL",
                        help="also read every result of a fleet archive (sqlite:///x.db or a "
                             "path, postgresql://...); repeatable. The HTML page then shows "
                             "the latest pair-by-pair matrix too")
    parser.add_argument("--group-by", metavar="KEYS",
                        help="comma-separated: tool, hosts (client and server; an archive's "
                             "source and target agents), run (run id) or any spec field, e.g. "
                             "protocol, streams, direction (default: tool; with --archive: "
                             "hosts,protocol,direction). The first group is the reference "
                             "for ratios")
    parser.add_argument("--format", choices=("human", "json", "csv"), default="human",
                        help="human: a line per result and the statistics table; json, csv: "
                             "the statistics as records (unscaled: bit/s, us, percent)")
    parser.add_argument("--json", dest="format", action="store_const", const="json",
                        help="same as --format json")
    parser.add_argument("--summary-only", action="store_true",
                        help="only the statistics table, no line per result")
    parser.add_argument("--html", metavar="OUT.html",
                        help="also write a self-contained page with the table and charts "
                             "(needs matplotlib: pip install 'netprobe-meter[charts]')")
    parser.add_argument("-q", "--quiet", action="store_true", help="nothing on stdout")


def group_keys(text: str) -> list[str]:
    """``--group-by tool,streams`` as a checked list of keys."""
    from netprobe.results.analysis import check_group_keys

    keys = [key.strip() for key in text.split(",") if key.strip()]
    check_group_keys(keys)
    return keys


def handle(args: argparse.Namespace, _load: RegistryLoader) -> int:
    """Read the saved results, group them, print the tables (and write the page)."""
    from netprobe.results.analysis import ARCHIVE_GROUP_KEYS, group_results, group_stats
    from netprobe.results.saved import load_texts

    # A fleet archive holds many pairs' TCP and UDP tests: one mean over them all by tool
    # would average unlike links, so by default an archive is grouped by pair and test.
    default = ",".join(ARCHIVE_GROUP_KEYS) if args.archive else "tool"
    keys = group_keys(args.group_by or default)
    if args.html:
        _require_charts()
        from netprobe.cli.outfile import check_target

        check_target(args.html)
    if not args.files and not args.archive:
        raise UsageError("name saved results (FILE...) or a fleet archive (--archive URL)")
    loaded = load_texts([(path, read_input(path)) for path in args.files])
    _warn(loaded.warnings)
    archived, sections = _archived(args.archive or [])
    results = [*loaded.results, *(result for result, _ in archived)]
    sources = [*args.files, *(redact(url) for url in args.archive or [])]
    if not results:
        raise SpecError(f"no results in {', '.join(sources)}")
    groups = group_results(results, keys, _archived_pairs(archived))
    _warn(_mixed_warnings(groups, keys))
    stats = group_stats(groups)
    if args.html:
        from netprobe.cli.html import write_page

        write_page(args.html, results, groups, stats, sources=sources, keys=keys,
                   sections=sections)
    if not args.quiet:
        _print_report(args.format, results, stats, keys, args.summary_only,
                      _batched(results, _load))
    return ExitCode.OK


def _batched(results: Sequence[Result], load: RegistryLoader) -> list[str]:
    # Which tools send many UDP datagrams per call is the tool's, not the saved result's:
    # the registry is loaded only for a UDP result.
    if not any(result.spec.protocol == "udp" for result in results):
        return []
    return [name for name, tool in load().tools.items() if tool.udp_batched_send]


def _archived(urls: Sequence[str]) -> tuple[list[tuple[Result, str]], list[tuple[str, str]]]:
    """Every result in the archives with its pair of agents (``source -> target``), and an
    HTML matrix section per archive and group."""
    if not urls:
        return [], []
    from netprobe.archives import open_archive
    from netprobe.cli.fleetview import matrix_html
    from netprobe.fleet.matrix import build, groups_of

    results: list[tuple[Result, str]] = []
    sections = []
    for url in urls:
        with open_archive(url, create=False) as archive:
            results += [(r.result, f"{r.source} -> {r.target}") for r in archive.records()
                        if r.result is not None]
            latest = archive.latest()
            _warn(list(dict.fromkeys(getattr(archive, "warnings", []))))  # rows skipped
        sections += [(f"Latest matrix: group {g} ({archive.url})", matrix_html(build(latest, g)))
                     for g in groups_of(latest)]
    return results, sections


def _archived_pairs(archived: Sequence[tuple[Result, str]]) -> Callable[[Result], str]:
    """The ``hosts`` of a result: its archive's agent names (on one host, or behind NAT,
    every agent's address may be the same), else the addresses it names."""
    from netprobe.results.analysis import host_pair

    names = {id(result): pair for result, pair in archived}
    return lambda result: names.get(id(result)) or host_pair(result)


def _require_charts() -> None:
    from netprobe.cli.html import charts_missing

    problem = charts_missing()
    if problem:
        raise ToolUnavailable(problem)


def _mixed_warnings(groups: Sequence[Group], keys: Sequence[str]) -> list[str]:
    from netprobe.results.analysis import mixed_fields

    warnings = []
    for group in groups:
        mixed = mixed_fields(group.results, ignore=keys)
        if mixed:
            warnings.append(f"group {group.label!r} mixes tests with different "
                            f"{', '.join(mixed)}: --group-by {','.join([*keys, *mixed])} "
                            "keeps them apart")
    return warnings


def _warn(lines: Sequence[str]) -> None:
    for line in lines:
        warning(line)


def _print_report(fmt: str, results: Sequence[Result], stats: Sequence[GroupStats],
                  keys: Sequence[str], summary_only: bool, batched: Sequence[str] = ()) -> None:
    from netprobe.cli.outfile import write_stdout
    from netprobe.cli.tabulate import RECORD_STATS, stats_records

    if fmt == "json":
        write_stdout(json.dumps(stats_records(stats), indent=2) + "\n")
        return
    if fmt == "csv":
        write_stdout(_records_csv(stats_records(stats), RECORD_STATS))
        return
    from netprobe.cli.render import stdout_console
    from netprobe.cli.report import print_stats, print_trial_lines

    console = stdout_console()
    if not summary_only:
        print_trial_lines(console, results)
        console.print()
    title = "Tool" if list(keys) == ["tool"] else "Group"
    if title == "Tool":  # a comparison: each tool's call length before its rates
        _print_call_lengths(console, results, batched)
    print_stats(console, stats, title)


def _print_call_lengths(console: Any, results: Sequence[Result], batched: Sequence[str]) -> None:
    from netprobe.cli.report import call_length_table
    from netprobe.results.trials import call_lengths

    lengths = call_lengths(results, batched)
    if len(lengths) > 1:
        console.print(call_length_table(lengths))
        console.print()


def _records_csv(records: list[dict[str, Any]], stats_names: Sequence[str]) -> str:
    import csv

    from netprobe.cli.textsafe import for_csv

    columns = ["group", "results", "ok", "direction", "figure", *stats_names, "ratio"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, lineterminator="\n")
    writer.writeheader()
    for record in records:
        writer.writerow({k: "" if v is None else for_csv(v) for k, v in record.items()})
    return buffer.getvalue()
