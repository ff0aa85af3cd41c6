"""Every available tool, through netprobe, on the same real 100 Mbit/s bottleneck as the
native engine: they must agree on 94.1 +/- 1 Mbit/s of TCP goodput (a miss is measured
once more, on a new pair, and reported).

The far end runs the tool's own server, started by the test in namespace b, exactly as a
user would start it on another host; netprobe runs the client side in namespace a.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .netlab import B_ADDR, Lab, measured_within, shaped_pair, wait_listening
from .peers import PeerBinary, tool_version_params

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.peers]
why_not = Lab.available()
if why_not:
    pytestmark.append(pytest.mark.skip(reason=why_not))

NETPROBE = [sys.executable, "-m", "netprobe"]
SECONDS = "8"  # long enough that slow start and tbf's burst do not move the average

# tool -> (server command with {bin} for the binary, port the client uses, extra options)
SERVERS = {
    "native": ([*NETPROBE, "server", "-1", "-B", B_ADDR], 5301, ["-O", "1"]),
    "iperf3": (["{bin}", "-s", "-1", "-B", B_ADDR, "-p", "5201"], 5201, ["-O", "1"]),
    "iperf2": (["{bin}", "-s", "-B", B_ADDR, "-p", "5001"], 5001, []),
    "nuttcp": (["{bin}", "-1", "--nofork", "-P", "5000", "-p", "5001"], 5000, []),
    # ntttcp's sync port is the data port minus one; its warm-up flag plays -O's part
    "ntttcp": (["{bin}", "-r", "-m", f"1,*,{B_ADDR}", "-p", "5001", "-t", SECONDS,
                "-W", "1"], 5001, ["-O", "1"]),
}


WIRE_MBIT = 94.1  # 100 x 1448/1538: TCP payload of a 100 Mbit/s Ethernet


def _bottleneck_mbit(tool: str, server_argv: list[str], port: int,
                     extra: list[str]) -> tuple[float, str]:
    """One run of ``tool`` through netprobe over a fresh 100 Mbit/s pair: the figure netprobe
    reports (Mbit/s) and what the run and the link's qdiscs said, for a message."""
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
        mbit = side["bits_per_second"] / 1e6
        retransmits = (flow["sender"] or {}).get("retransmits")
        return mbit, f"{mbit:.2f} Mbit/s, retransmits {retransmits}; {lab.qdisc_report()}"


@pytest.mark.host_timing
@pytest.mark.parametrize(("tool", "peer"), tool_version_params(tuple(sorted(SERVERS))))
def test_every_tool_sees_the_same_bottleneck(
    tool: str, peer: PeerBinary | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    server_argv, port, extra = SERVERS[tool]
    if peer is not None:
        for name, value in peer.env.items():
            monkeypatch.setenv(name, value)
        server_argv = [peer.path if arg == "{bin}" else arg for arg in server_argv]
    # A miss is measured once more, on a new pair (netlab.measured_within). Two CI runs
    # each saw one tool of the seven read low once (iperf 2.1.8's sender 84.2, iperf3
    # 3.12's receiver 92.6): the peer's own figure, where netprobe only reads the number.
    measured_within(lambda: _bottleneck_mbit(tool, server_argv, port, extra),
                    lambda got: [] if got[0] == pytest.approx(WIRE_MBIT, abs=1.0)
                    else [got[1]], f"{tool} off {WIRE_MBIT} +/- 1 Mbit/s")
