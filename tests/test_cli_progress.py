"""Progress of ``run --repeat`` and ``compare``: a bar per trial that moves with its
interval reports, drawn by the CLI (rich.progress) from what the trials report."""
from __future__ import annotations

import io

from rich.console import Console

from netprobe.cli.progress import TrialProgress
from netprobe.schema import Interval


def _sample(role: str, end: float, bps: float) -> Interval:
    return Interval(direction="client_to_server", role=role, stream_id=None, start_s=end - 1,
                    end_s=end, bytes=int(bps / 8), bits_per_second=bps)


def test_bar_follows_the_trial() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=100, force_terminal=True, color_system=None)
    progress = TrialProgress(4.0, console=console)
    progress.start("trial 1/2: native")
    progress.interval(_sample("sender", 1.0, 9.9e9))
    progress.interval(_sample("receiver", 2.0, 9.41e9))
    assert progress._progress is not None
    task = progress._progress.tasks[-1]
    assert task.completed == 2.0 and task.total == 4.0
    assert task.fields["rate"] == "9.41 Gbit/s"
    progress.start("trial 2/2: iperf3")
    progress.stop()
    text = buffer.getvalue()
    assert "trial 1/2: native" in text and "trial 2/2: iperf3" in text
