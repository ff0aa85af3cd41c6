"""``compare`` says how long it will take, and it takes about that (issue 35 item 14: it
said "about 8 s" and took 15). The estimate counts what a comparison does beside the
tests: each tool's far end started and stopped, its handshakes and final reports (each
tool's ``overhead_s``), qperf's latency test, the pauses, the run's own start and tables.

The test runs a short real comparison on loopback and holds the estimate to the time it
measured from the note to the end, within :data:`WITHIN` of it.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from netprobe.tools import iperf2, iperf3, nuttcp
from tests.test_cli import child_env

WITHIN = 0.25
"""The estimate may be off by this fraction of the measured time (the figure is printed
in whole seconds, and the machine is shared)."""


def _driven_tools() -> list[str]:
    tools = (iperf2.Iperf2Tool(), iperf3.Iperf3Tool(), nuttcp.NuttcpTool())
    return [tool.name for tool in tools if tool.probe().available]


@pytest.mark.peers
def test_the_estimate_is_the_time_a_short_compare_takes() -> None:
    driven = _driven_tools()
    if not driven:
        pytest.skip("no driven tool (iperf2, iperf3, nuttcp) here to compare with native")
    proc = subprocess.Popen(
        [sys.executable, "-m", "netprobe", "compare", "-t", "1", "-n", "1", "--tools",
         ",".join(["native", *driven])],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env())
    noted_at, estimate, lines = None, None, []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # ends when the process closes stderr, at its exit
            lines.append(line)
            found = re.search(r"interleaved, 1 rounds, about (\d+) s$", line.rstrip())
            if found and noted_at is None:
                noted_at, estimate = time.monotonic(), float(found.group(1))
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    elapsed = time.monotonic() - noted_at if noted_at is not None else None
    assert code == 0, "".join(lines)
    assert estimate is not None and elapsed is not None, "".join(lines)
    assert f"{1 + len(driven)} trials" in "".join(lines)
    assert abs(estimate - elapsed) <= WITHIN * elapsed, (estimate, elapsed, driven)
