"""Trials shown as they finish, for ``run --repeat N`` and ``compare``.

Both run trials (netprobe.results.trials) and hand each result, as it comes, to a
:class:`TrialSink`: a line per trial on stdout (human) or the result itself (jsonl, csv),
and with ``-o`` a JSON line appended to the file straight away, so that a run stopped
half-way keeps every finished trial. At the end: the statistics table (human), or one JSON
document listing the results (json). ``report`` (netprobe.cli.commands.report) prints the
same tables from saved results.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Collection, Sequence
from typing import Any

from netprobe.cli.common import agent_access, error, warning
from netprobe.cli.exitcodes import ExitCode
from netprobe.cli.formats import format_csv
from netprobe.cli.outfile import append_text, check_target, choose_formats, write_stdout, write_text
from netprobe.convert import to_json, unstructure
from netprobe.plugin import Reporter, Tool
from netprobe.reporting import NullReporter
from netprobe.results.analysis import GroupStats, group_results, group_stats
from netprobe.results.trials import (
    Skipped,
    Trial,
    TrialRun,
    call_lengths,
    run_trials,
    spec_for,
)
from netprobe.schema import Result, TestSpec

# --- run --repeat and compare ------------------------------------------------------------


def run_trials_shown(args: argparse.Namespace, spec: TestSpec, tools: Sequence[Tool],
                     rounds: int, skipped: list[Skipped]) -> int:
    """Run the trials, each result shown and saved as it comes; the exit code at the end.

    Every trial goes where a single run would: from ``--from``'s agent, with the target's
    agent starting the far end (:func:`netprobe.session.run_spec`)."""
    chosen = choose_formats(args.format, args.output)
    if chosen.warning:
        warning(chosen.warning)
    sink = TrialSink(chosen.stdout, args.output, quiet=args.quiet, file_fmt=chosen.file)
    # The native engine's iperf3 mode (run/compare --iperf3) writes iperf3's UDP header
    # from Python, one datagram a call: not the engine's batched sends.
    sink.batched = frozenset(tool.name for tool in tools
                             if tool.udp_batched_send and not tool.options.get("iperf3"))
    sink.begin(_plan_note(spec, tools, rounds, args.pause), skipped)
    reporter = sink.progress(spec)
    try:
        run = run_trials(spec, tools, rounds, reporter, events=sink,
                         pause_s=args.pause or 0.0, from_host=getattr(args, "from_host", None),
                         agent=agent_access(args))
    except BaseException:  # still show and save the trials that finished
        sink.close(None)
        raise
    sink.close(run)
    if run.interrupted:
        error(f"interrupted after {len(run.results)} of {run.planned} trials")
        return ExitCode.INTERRUPTED
    if run.failed:
        error(f"{run.failed} of {run.planned} trials failed")
        return ExitCode.TEST_FAILED
    return ExitCode.OK


RUN_OVERHEAD_S = 0.5
"""Seconds a run of trials takes besides its trials: reaching the first trial, then the
statistics and tables (0.4-0.6 s on loopback here)."""


def _plan_note(spec: TestSpec, tools: Sequence[Tool], rounds: int,
               pause: float | None) -> str:
    names = ", ".join(tool.name for tool in tools)
    trials = len(tools) * rounds
    text = (f"{trials} trials: {names} interleaved, {rounds} rounds" if len(tools) > 1
            else f"{trials} trials of {names}")
    seconds = expected_run_s(spec, tools, rounds, pause or 0.0)
    if seconds is not None:
        text += f", about {_duration_words(seconds)}"
    return text


def expected_run_s(spec: TestSpec, tools: Sequence[Tool], rounds: int,
                   pause_s: float) -> float | None:
    """How long ``rounds`` rounds of ``spec`` through ``tools`` take: each trial as its tool
    runs it (its planned time and what the tool adds: :meth:`Tool.expected_s`), the pauses
    between trials, and the run's own start and tables; None when a trial's time is
    unknown (a byte count ends it)."""
    each = [tool.expected_s(spec_for(spec, tool)) for tool in tools]
    if not each or any(seconds is None for seconds in each):
        return None
    trials = len(tools) * rounds
    return (rounds * sum(s for s in each if s is not None) + (trials - 1) * pause_s
            + RUN_OVERHEAD_S)


def _duration_words(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


class TrialSink:
    """Where the trials' results go as they come (the TrialEvents of a CLI run)."""

    def __init__(self, fmt: str, path: str | None, quiet: bool = False,
                 file_fmt: str | None = None) -> None:
        self.fmt = fmt
        self.path = path
        self.file_fmt = file_fmt or choose_formats(None, path).file or fmt
        self.quiet = quiet
        self.results: list[Result] = []
        """Every trial's result so far, in the order run."""
        self.skipped: list[Skipped] = []
        self._planned: int | None = None
        self._progress: Any = None  # the TrialProgress on a terminal
        self._csv_started = False
        self.batched: frozenset[str] = frozenset()
        """The tools whose UDP sender sends many datagrams per call (the call table)."""

    @property
    def _human(self) -> bool:
        return self.fmt == "human" and not self.quiet

    def begin(self, plan: str, skipped: list[Skipped]) -> None:
        """Before the first trial (OutputError first if ``-o`` cannot be written): the
        tools left out (stdout) and the plan (stderr)."""
        if self.path is not None:
            check_target(self.path)
        self.skipped = skipped
        if not self._human:
            return
        from netprobe.cli.render import print_note, stdout_console
        from netprobe.cli.report import skipped_text

        if skipped:
            stdout_console().print(skipped_text(skipped), soft_wrap=True)
        print_note(plan)

    def progress(self, spec: TestSpec) -> Reporter:
        """The trials' Reporter: a progress bar per trial on a terminal (human output)."""
        if not self._human or not sys.stderr.isatty():
            return NullReporter()
        from netprobe.cli.progress import TrialProgress

        self._progress = TrialProgress(spec.planned_s())
        return self._progress

    def started(self, trial: Trial, total: int) -> None:
        """A trial begins: its progress bar, or a note on stderr off a terminal."""
        self._planned = total
        label = f"trial {trial.index}/{total}: {trial.tool}"
        if self._progress is not None:
            self._progress.start(label)
        elif self._human:
            from netprobe.cli.render import print_note

            print_note(label)

    def finished(self, trial: Trial, result: Result) -> None:
        """A trial's result: appended to a JSON-lines file now, shown on stdout now."""
        if self._progress is not None:
            self._progress.stop()  # its bar ends before the trial's line is printed
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
            write_stdout(to_json(result, indent=None) + "\n")
        elif self.fmt == "csv":
            write_stdout(format_csv([result], header=not self._csv_started))
            self._csv_started = True

    def failed(self, trial: Trial, message: str) -> None:
        """A trial that measured nothing: said on stderr, counted at the end."""
        if self._progress is not None:
            self._progress.stop()
        if not self.quiet:
            from netprobe.cli.render import print_note

            print_note(f"trial {trial.index} ({trial.tool}) failed: {message}")

    def close(self, run: TrialRun | None) -> None:
        """After the last trial (or a stop): the file, then stdout's closing part."""
        if self._progress is not None:
            self._progress.stop()
        try:
            self._write_file(run)
        finally:
            if not self.quiet:
                self._close_stdout(run)

    def _write_file(self, run: TrialRun | None) -> None:
        if self.path is None or self.file_fmt == "jsonl":
            return
        write_text(self.path, self._text(self.file_fmt, run))

    def _close_stdout(self, run: TrialRun | None) -> None:
        if self.fmt == "json":
            write_stdout(self._text("json", run))
        elif self.fmt == "human":
            from netprobe.cli.render import stdout_console

            _print_closing(stdout_console(), self.results, run, self.path, self.batched)

    def _text(self, fmt: str, run: TrialRun | None) -> str:
        if fmt == "json":
            return json.dumps([unstructure(r) for r in self.results], indent=2,
                              allow_nan=False) + "\n"
        if fmt == "csv":
            return format_csv(self.results)
        return report_text(self.results, self.skipped, run, self.batched)


def trial_stats(results: Sequence[Result]) -> list[GroupStats]:
    """The statistics of a run's trials, per tool in the order the tools ran."""
    return group_stats(group_results(results, ["tool"]))


def _print_closing(console: Any, results: Sequence[Result], run: TrialRun | None,
                   path: str | None, batched: Collection[str] = ()) -> None:
    from rich.text import Text

    from netprobe.cli.report import call_length_table, print_stats

    console.print()
    lengths = call_lengths(results, batched)
    if len(lengths) > 1:  # a comparison: say what each tool's calls were, before its rates
        console.print(call_length_table(lengths))
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
                run: TrialRun | None, batched: Collection[str] = ()) -> str:
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
    _print_closing(console, results, run, None, batched)
    return buffer.getvalue()


__all__ = ["TrialSink", "report_text", "run_trials_shown", "trial_stats"]
