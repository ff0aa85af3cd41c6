"""``report``'s statistics table at 80 columns: group names are never cut (the numbers
give way first)."""
from __future__ import annotations

import io

from rich.console import Console

from netprobe.cli.report import print_stats
from netprobe.results.analysis import group_results, group_stats
from tests.test_report import GBIT, result


def test_group_names_are_never_cut_at_80_columns() -> None:
    names = ["nuttcp-8.2.2-with-a-long-name", "iperf3-3.21-built-from-source"]
    results = [result(name, bps * GBIT) for name in names for bps in (8.0, 9.0, 9.5)]
    stats = group_stats(group_results(results, ["tool"]))
    buffer = io.StringIO()
    print_stats(Console(file=buffer, width=80, color_system=None), stats, "Tool")
    text = buffer.getvalue()
    for name in names:
        assert name in text, text
    assert all(len(line) <= 80 for line in text.splitlines())
