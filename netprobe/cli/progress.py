"""Progress of ``run --repeat`` and ``compare`` on stderr: a rich progress bar per trial
that moves with the trial's interval reports (seconds done of the seconds planned, and
the last receiver rate), so that a long series is never minutes of silence.

The trials' logic gets :class:`TrialProgress` as its Reporter; only this module knows it
draws with rich.progress.
"""
from __future__ import annotations

import threading

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from netprobe.cli.units import format_rate
from netprobe.schema import Interval


class TrialProgress:
    """A Reporter (see netprobe.plugin) drawing one progress bar per trial."""

    def __init__(self, planned_s: float | None, console: Console | None = None) -> None:
        self._planned = planned_s
        if console is None:  # the CLI's stderr console: markup off, every text escaped
            from netprobe.cli.render import stderr_console

            console = stderr_console()
        self._console = console
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._lock = threading.Lock()

    def start(self, label: str) -> None:
        """A trial begins: a new bar named ``label`` (the last one stays on the screen)."""
        self.stop()
        with self._lock:
            self._progress = Progress(TextColumn("{task.description}", markup=False),
                                      BarColumn(),
                                      TextColumn("{task.fields[rate]}", markup=False),
                                      TimeElapsedColumn(),
                                      console=self._console, redirect_stdout=False,
                                      redirect_stderr=False)
            self._progress.start()
            self._task = self._progress.add_task(label, total=self._planned, rate="")

    def interval(self, sample: Interval) -> None:
        """Move the bar to the sample's end; show the last receiver rate."""
        with self._lock:
            if self._progress is None or self._task is None:
                return
            task = self._progress.tasks[-1]
            rate = format_rate(sample.bits_per_second) if sample.role == "receiver" \
                else task.fields["rate"]
            self._progress.update(self._task, completed=max(task.completed, sample.end_s),
                                  rate=rate)

    def note(self, message: str) -> None:
        """Notes of the tools stay out of the bar."""

    def stop(self) -> None:
        """The trial is over (or the series stopped): the bar stays as it ended."""
        with self._lock:
            if self._progress is not None:
                self._progress.stop()
                self._progress = None
                self._task = None


__all__ = ["TrialProgress"]
