"""The commands about many results: ``run --repeat N``, ``compare`` and ``report``.

``run --repeat`` and ``compare`` run trials (netprobe.trials) and hand each result, as it
comes, to a :class:`TrialSink`: a line per trial on stdout (human) or the result itself
(jsonl, csv), and with ``-o`` a JSON line appended to the file straight away, so that a
run stopped half-way keeps every finished trial. At the end: the statistics table (human),
or one JSON document listing the results (json). ``report`` reads saved results back and
prints the same tables, or writes them with charts as an HTML page.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, Callable, Optional

from netprobe.analysis import (
    Group,
    GroupStats,
    check_group_keys,
    group_results,
    group_stats,
    mixed_fields,
)
from netprobe.cli.formats import append_text, format_csv, write_atomic
from netprobe.convert import to_json, unstructure
from netprobe.errors import SpecError, ToolUnavailable
from netprobe.plugin import NullReporter, Registry, Tool
from netprobe.schema import Result, TestSpec
from netprobe.trials import Skipped, Trial, TrialRun, run_trials, screen

_FILE_FORMATS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv"}


def file_format(fmt: str, path: Optional[str]) -> str:
    """The format ``-o FILE`` gets: ``--format`` as given, except that with the default
    human format a FILE named ``*.jsonl``, ``*.json`` or ``*.csv`` gets that format (no one
    wants a table in ``results.jsonl``)."""
    if fmt != "human" or path is None:
        return fmt
    return _FILE_FORMATS.get(os.path.splitext(path)[1].lower(), "human")


# --- run --repeat and compare ------------------------------------------------------------


def cmd_repeat(args: argparse.Namespace, spec: TestSpec, tool: Tool) -> int:
    """``run --repeat N``: the one tool, N times."""
    return _run_trials(args, spec, [tool], args.repeat, [])


def cmd_compare(args: argparse.Namespace, spec: TestSpec, registry: Registry,
                make_tool: Callable[[Registry, str], Tool]) -> int:
    """``compare``: the spec through each tool that can honour it, interleaved."""
    names = _tool_names(args.tools, registry)
    tools = [make_tool(registry, name) for name in names]  # an unknown name is exit 3
    ready, skipped = screen(tools, spec)
    skipped += [Skipped(f.name, (f"failed to load: {f.error}",)) for f in registry.failures
                if args.tools is None]
    if not ready:
        reasons = "; ".join(r for s in skipped for r in s.reasons) or "no tools installed"
        refused = any(" cannot honour " in r for s in skipped for r in s.reasons)
        raise (SpecError if refused else ToolUnavailable)(f"no tool can run this test: "
                                                          f"{reasons}")
    return _run_trials(args, spec, ready, args.trials, skipped)


def _tool_names(given: Optional[str], registry: Registry) -> list[str]:
    if given is None:  # every installed tool, the native engine first as the reference
        return sorted(registry.names(), key=lambda name: (name != "native", name))
    names = [name.strip() for name in given.split(",") if name.strip()]
    if not names:
        raise SpecError("--tools needs at least one tool name")
    return list(dict.fromkeys(names))  # a tool named twice runs once per round


def _run_trials(args: argparse.Namespace, spec: TestSpec, tools: Sequence[Tool], rounds: int,
                skipped: list[Skipped]) -> int:
    from netprobe.cli.main import EXIT_INTERRUPTED, EXIT_OK, EXIT_TEST_FAILED, _error

    sink = TrialSink(args.format, args.output, quiet=args.quiet)
    sink.begin(_plan_note(spec, tools, rounds, args.pause), skipped)
    try:
        run = run_trials(spec, tools, rounds, NullReporter(), events=sink,
                         pause_s=args.pause or 0.0)
    except BaseException:  # still show and save the trials that finished
        sink.close(None)
        raise
    sink.close(run)
    if run.interrupted:
        _error(f"interrupted after {len(run.results)} of {run.planned} trials")
        return EXIT_INTERRUPTED
    if run.failed:
        _error(f"{run.failed} of {run.planned} trials failed")
        return EXIT_TEST_FAILED
    return EXIT_OK


def _plan_note(spec: TestSpec, tools: Sequence[Tool], rounds: int,
               pause: Optional[float]) -> str:
    names = ", ".join(tool.name for tool in tools)
    trials = len(tools) * rounds
    text = (f"{trials} trials: {names} interleaved, {rounds} rounds" if len(tools) > 1
            else f"{trials} trials of {names}")
    if spec.duration_s is not None:
        seconds = trials * spec.duration_s + (trials - 1) * (pause or 0.0)
        text += f", about {_duration_words(seconds)}"
    return text


def _duration_words(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


class TrialSink:
    """Where the trials' results go as they come (the TrialEvents of a CLI run)."""

    def __init__(self, fmt: str, path: Optional[str], quiet: bool = False) -> None:
        self.fmt = fmt
        self.path = path
        self.file_fmt = file_format(fmt, path)
        self.quiet = quiet
        self.results: list[Result] = []
        """Every trial's result so far, in the order run."""
        self.skipped: list[Skipped] = []
        self._planned: Optional[int] = None
        self._csv_started = False

    @property
    def _human(self) -> bool:
        return self.fmt == "human" and not self.quiet

    def begin(self, plan: str, skipped: list[Skipped]) -> None:
        """Before the first trial: the tools left out (stdout) and the plan (stderr)."""
        self.skipped = skipped
        if not self._human:
            return
        from netprobe.cli.render import print_note, stdout_console
        from netprobe.cli.report import skipped_text

        if skipped:
            stdout_console().print(skipped_text(skipped), soft_wrap=True)
        print_note(plan)

    def started(self, trial: Trial, total: int) -> None:
        """A trial begins: a progress note on stderr (human output only)."""
        self._planned = total
        if self._human:
            from netprobe.cli.render import print_note

            print_note(f"trial {trial.index}/{total}: {trial.tool}")

    def finished(self, trial: Trial, result: Result) -> None:
        """A trial's result: appended to a JSON-lines file now, shown on stdout now."""
        self.results.append(result)
        if self.path is not None and self.file_fmt == "jsonl":
            append_text(self.path, to_json(result, indent=None) + "\n")
        if self.quiet:
            return
        if self.fmt == "human":
            from netprobe.cli.render import stdout_console
            from netprobe.cli.report import trial_line

            stdout_console().print(trial_line(result, total=self._planned), soft_wrap=True)
        elif self.fmt == "jsonl":
            _write_stdout(to_json(result, indent=None) + "\n")
        elif self.fmt == "csv":
            _write_stdout(format_csv([result], header=not self._csv_started))
            self._csv_started = True

    def failed(self, trial: Trial, message: str) -> None:
        """A trial that measured nothing: said on stderr, counted at the end."""
        if not self.quiet:
            from netprobe.cli.render import print_note

            print_note(f"trial {trial.index} ({trial.tool}) failed: {message}")

    def close(self, run: Optional[TrialRun]) -> None:
        """After the last trial (or a stop): the file, then stdout's closing part."""
        try:
            self._write_file(run)
        finally:
            if not self.quiet:
                self._close_stdout(run)

    def _write_file(self, run: Optional[TrialRun]) -> None:
        if self.path is None or self.file_fmt == "jsonl":
            return
        write_atomic(self.path, self._text(self.file_fmt, run))

    def _close_stdout(self, run: Optional[TrialRun]) -> None:
        if self.fmt == "json":
            _write_stdout(self._text("json", run))
        elif self.fmt == "human":
            from netprobe.cli.render import stdout_console

            _print_closing(stdout_console(), self.results, run, self.path)

    def _text(self, fmt: str, run: Optional[TrialRun]) -> str:
        if fmt == "json":
            return json.dumps([unstructure(r) for r in self.results], indent=2,
                              allow_nan=False) + "\n"
        if fmt == "csv":
            return format_csv(self.results)
        return report_text(self.results, self.skipped, run)


def _write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def trial_stats(results: Sequence[Result]) -> list[GroupStats]:
    """The statistics of a run's trials, per tool in the order the tools ran."""
    return group_stats(group_results(results, ["tool"]))


def _print_closing(console: Any, results: Sequence[Result], run: Optional[TrialRun],
                   path: Optional[str]) -> None:
    from rich.text import Text

    from netprobe.cli.report import print_stats

    console.print()
    print_stats(console, trial_stats(results), "Tool")
    if run is not None:
        ok = sum(r.status == "ok" for r in results)
        words = f"run {run.run_id}: {len(results) + len(run.failures)} of {run.planned} " \
                f"trials, {ok} ok"
        if path:
            words += f"; saved to {path}"
        console.print(Text(words, style="dim"), soft_wrap=True)


def report_text(results: Sequence[Result], skipped: Sequence[Skipped],
                run: Optional[TrialRun]) -> str:
    """The human report of a run as plain text, for ``-o FILE`` in the human format."""
    from rich.console import Console

    from netprobe.cli.render import FILE_WIDTH
    from netprobe.cli.report import print_trial_lines, skipped_text

    buffer = io.StringIO()
    console = Console(file=buffer, width=FILE_WIDTH, color_system=None, highlight=False,
                      force_terminal=False)
    if skipped:
        console.print(skipped_text(skipped), soft_wrap=True)
    print_trial_lines(console, results)
    _print_closing(console, results, run, None)
    return buffer.getvalue()


# --- report ------------------------------------------------------------------------------


def group_keys(text: str) -> list[str]:
    """``--group-by tool,streams`` as a checked list of keys."""
    keys = [key.strip() for key in text.split(",") if key.strip()]
    check_group_keys(keys)
    return keys


def cmd_report(args: argparse.Namespace, read: Callable[[str], str]) -> int:
    """``report FILE...``: saved results as trial lines and statistics, or an HTML page."""
    from netprobe.saved import load_texts

    keys = group_keys(args.group_by)
    if args.html:
        _require_charts()
    loaded = load_texts([(path, read(path)) for path in args.files])
    _warn(loaded.warnings)
    if not loaded.results:
        raise SpecError(f"no results in {', '.join(args.files)}")
    groups = group_results(loaded.results, keys)
    _warn(_mixed_warnings(groups, keys))
    stats = group_stats(groups)
    if args.html:
        from netprobe.cli.html import write_page

        write_page(args.html, loaded.results, groups, stats, sources=args.files, keys=keys)
    if not args.quiet:
        _print_report(args.format, loaded.results, stats, keys, args.summary_only)
    return 0


def _require_charts() -> None:
    from netprobe.cli.html import charts_missing

    problem = charts_missing()
    if problem:
        raise ToolUnavailable(problem)


def _mixed_warnings(groups: Sequence[Group], keys: Sequence[str]) -> list[str]:
    warnings = []
    for group in groups:
        mixed = mixed_fields(group.results, ignore=keys)
        if mixed:
            warnings.append(f"group {group.label!r} mixes tests with different "
                            f"{', '.join(mixed)}: --group-by {','.join([*keys, *mixed])} "
                            "keeps them apart")
    return warnings


def _warn(lines: Sequence[str]) -> None:
    if not lines:
        return
    from rich.text import Text

    from netprobe.cli.render import stderr_console

    for line in lines:
        stderr_console().print(Text.assemble(("warning: ", "bold yellow"), line),
                               soft_wrap=True)


def _print_report(fmt: str, results: Sequence[Result], stats: Sequence[GroupStats],
                  keys: Sequence[str], summary_only: bool) -> None:
    from netprobe.cli.tabulate import RECORD_STATS, stats_records

    if fmt == "json":
        _write_stdout(json.dumps(stats_records(stats), indent=2) + "\n")
        return
    if fmt == "csv":
        _write_stdout(_records_csv(stats_records(stats), RECORD_STATS))
        return
    from netprobe.cli.render import stdout_console
    from netprobe.cli.report import print_stats, print_trial_lines

    console = stdout_console()
    if not summary_only:
        print_trial_lines(console, results)
        console.print()
    title = "Tool" if list(keys) == ["tool"] else "Group"
    print_stats(console, stats, title)


def _records_csv(records: list[dict[str, Any]], stats_names: Sequence[str]) -> str:
    import csv

    columns = ["group", "results", "ok", "direction", "figure", *stats_names, "ratio"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, lineterminator="\n")
    writer.writeheader()
    for record in records:
        writer.writerow({k: "" if v is None else v for k, v in record.items()})
    return buffer.getvalue()


__all__ = ["TrialSink", "cmd_compare", "cmd_repeat", "cmd_report", "file_format", "group_keys",
           "report_text", "trial_stats"]
