"""Every available tool, through netprobe, on the same real 100 Mbit/s bottleneck as the
native engine: they must agree on 94.1 +/- 1 Mbit/s of TCP goodput.

The far end runs the tool's own server, started by the test in namespace b, exactly as a
user would start it on another host; netprobe runs the client side in namespace a.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from .netlab import B_ADDR, Lab, shaped_pair, wait_listening

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.peers]
why_not = Lab.available()
if why_not:
    pytestmark.append(pytest.mark.skip(reason=why_not))

NETPROBE = [sys.executable, "-m", "netprobe"]
SECONDS = "8"  # long enough that slow start and tbf's burst do not move the average

# tool -> (binary, server command, port the client uses, extra client options)
SERVERS = {
    "native": (None, [*NETPROBE, "server", "-1", "-B", B_ADDR], 5301, ["-O", "1"]),
    "iperf3": ("iperf3", ["iperf3", "-s", "-1", "-B", B_ADDR, "-p", "5201"], 5201, ["-O", "1"]),
    "iperf2": ("iperf", ["iperf", "-s", "-B", B_ADDR, "-p", "5001"], 5001, []),
    "nuttcp": ("nuttcp", ["nuttcp", "-1", "--nofork", "-P", "5000", "-p", "5001"], 5000, []),
}


@pytest.mark.parametrize("tool", sorted(SERVERS))
def test_every_tool_sees_the_same_bottleneck(tool: str) -> None:
    binary, server_argv, port, extra = SERVERS[tool]
    if binary and not shutil.which(binary):
        pytest.skip(f"{binary} is not installed")
    with shaped_pair(100) as (lab, a, b):
        lab.start(b, server_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_listening(lab, b, port)
        argv = [*NETPROBE, "run", B_ADDR, "--tool", tool, "-p", str(port), "-t", SECONDS,
                "--json", *extra]
        proc = lab.run(a, argv, timeout=60)
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        flow = result["summaries"][0]
        assert result["tool"]["name"] == tool
        # iperf 2's client prints only its own (sender) side over TCP; the server's
        # half stays on the server, so its receiver figure is None, as it should be.
        side = flow["receiver"] or flow["sender"]
        assert side["bits_per_second"] / 1e6 == pytest.approx(94.1, abs=1.0)
