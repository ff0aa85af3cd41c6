"""A driven tool's broken run is never ok (issue 34 item 5).

iperf 2 exits 0 when its data connection is reset, with a summary of the second it ran:
netprobe took that for an ok test at an impossible rate. Here the far end of every driven
tool dies mid-test (its receiving process killed by PID, so the kernel resets the
connection it had unread data on), and over a 100 Mbit/s namespace link an nftables rule
resets the data connection: each run must fail, say why, and keep what it measured.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from netprobe.driven.verdict import broken_connection, run_faults, shortfall
from netprobe.errors import TestFailed
from netprobe.schema import Endpoint, FlowSummary, Result, SideSummary, TestSpec, ToolInfo
from tests.netlab import Lab, wait_listening
from tests.peers import PeerBinary, peer_params

KILL_AFTER_S = 1.0
"""How long after the client starts the far end is killed: the test asks for 3 s."""

# The process that receives the client's data, and the one that sends it, by role, per
# tool (ntttcp's local ends are its "receiver" and "sender").
FAR_END = {"iperf2": "server", "iperf3": "server", "nuttcp": "server", "ntttcp": "receiver"}
NEAR_END = {"iperf2": "client", "iperf3": "client", "nuttcp": "client", "ntttcp": "sender"}


class KillingReporter:
    """A reporter that kills the far end (by the PID netprobe's note gives)
    ``KILL_AFTER_S`` after the client started, and records the intervals."""

    def __init__(self, tool: str) -> None:
        self.far = re.compile(rf"{tool} {FAR_END[tool]} started \(pid (\d+)\)")
        self.near = f"{tool} {NEAR_END[tool]} started"
        self.far_pid: int | None = None
        self.intervals: list[Any] = []
        self.killed: list[int] = []
        self.timers: list[threading.Timer] = []

    def interval(self, sample: Any) -> None:
        self.intervals.append(sample)

    def note(self, message: str) -> None:
        found = self.far.search(message)
        if found:
            self.far_pid = int(found.group(1))
        elif message.startswith(self.near) and self.far_pid is not None:
            timer = threading.Timer(KILL_AFTER_S, self._kill, (self.far_pid,))
            timer.start()
            self.timers.append(timer)

    def _kill(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)  # a process this test's run started, by its PID
            self.killed.append(pid)
        except ProcessLookupError:
            pass


def _tool(name: str) -> Any:
    from tests.peers import _tool_class
    return _tool_class(name)()


def _all_peers() -> list[Any]:
    params = []
    for tool in FAR_END:
        for one in peer_params(tool):
            params.append(pytest.param(tool, *one.values, id=one.id, marks=one.marks))
    return params


@pytest.mark.peers
@pytest.mark.parametrize(("tool", "peer"), _all_peers(), indirect=["peer"])
def test_far_end_killed_mid_run_fails_with_the_reason_and_the_figures(
        tool: str, peer: PeerBinary) -> None:
    spec = TestSpec(tool=tool, duration_s=3.0, interval_s=0.5)
    reporter = KillingReporter(tool)
    try:
        with pytest.raises(TestFailed) as caught:
            _tool(tool).run(spec, reporter)
    finally:
        for timer in reporter.timers:
            timer.cancel()
    assert reporter.killed, "the far end was not killed: the test tested nothing"
    partial = caught.value.partial
    assert partial is not None and partial.status == "failed"
    assert partial.errors, "a failed run says why"
    # what was measured before the break is kept
    assert partial.intervals or any(f.sender or f.receiver for f in partial.summaries)
    assert partial.raw and any(r.text for r in partial.raw)


# --- the rule itself, on Results as the adapters build them ---------------------------------


def _result(spec: TestSpec, span: float, sent: int, raw_text: str = "") -> Result:
    from netprobe.schema import RawOutput
    side = SideSummary(role="sender", start_s=0.0, end_s=span, bytes=sent,
                       bits_per_second=sent * 8 / span)
    return Result(tool=ToolInfo(name=spec.tool), spec=spec, status="ok", start_time=None,
                  local=Endpoint(role="client"), remote=Endpoint(role="server"),
                  summaries=(FlowSummary(direction="client_to_server", sender=side),),
                  raw=(RawOutput(name="client", text=raw_text),))


def test_a_run_well_under_its_time_is_short_and_a_whole_one_is_not() -> None:
    spec = TestSpec(tool="iperf2", duration_s=3.0)
    short = shortfall(_result(spec, 0.0003, 1_613_824))
    assert short is not None and "0.3 ms of the 3 s asked" in short
    assert shortfall(_result(spec, 3.02, 10**9)) is None


def test_a_byte_count_run_short_of_its_bytes_is_short() -> None:
    spec = TestSpec(tool="iperf3", duration_s=None, bytes_total=10_000_000)
    assert shortfall(_result(spec, 0.5, 4_000_000)) is not None
    assert shortfall(_result(spec, 0.5, 10_000_000)) is None


def test_a_reset_or_broken_pipe_in_any_output_is_a_fault() -> None:
    spec = TestSpec(tool="iperf2", duration_s=3.0)
    reset = _result(spec, 3.0, 10**9,
                    "[  1] local ...\ntcp write failed: Connection reset by peer\n")
    assert broken_connection([("client", "write: Broken pipe")]) == "client: write: Broken pipe"
    assert any("Connection reset by peer" in f for f in run_faults(reset))
    assert run_faults(_result(spec, 3.0, 10**9, "[  1] 0.0-3.0 sec  1 GBytes\n")) == []


# --- over a real 100 Mbit/s link: the data connection reset by an nftables rule ------------

A, B = "10.77.34.1", "10.77.34.2"
PORT = 5734


def _nft(lab: Lab, ns: str, *words: str) -> None:
    lab.run(ns, ["nft", *words], timeout=10).check_returncode()


def _far_end(tool: str, path: str) -> list[str]:
    return {
        "iperf2": [path, "-s", "-B", B, "-p", str(PORT), "-e", "-f", "b"],
        "iperf3": [path, "-s", "-B", B, "-p", str(PORT), "-1"],
        "nuttcp": [path, "-S", "--nofork", f"-P{PORT}"],
    }[tool]


RESET_AFTER_S = 1.2
"""How long after the data begins to flow the connection is reset (the test asks for 4 s)."""


def _wait_for_data(lab: Lab, ns: str, packets: int = 200, timeout_s: float = 30.0) -> None:
    """Wait until the data port's counter in ``ns`` has seen ``packets``: the client (a new
    Python process, slow to start on a busy machine) is sending."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        listed = lab.run(ns, ["nft", "list", "chain", "inet", "ndreset", "in"]).stdout
        found = re.findall(r"counter packets (\d+)", listed)
        if found and int(found[0]) >= packets:
            return
        time.sleep(0.05)
    raise AssertionError(f"no data reached {ns} in {timeout_s} s")


@pytest.mark.root
@pytest.mark.peers
@pytest.mark.parametrize("tool", ["iperf2", "iperf3", "nuttcp"])
def test_a_reset_data_connection_over_a_link_fails_the_run_with_exit_code(tool: str) -> None:
    why_not = Lab.available()
    if why_not:
        pytest.skip(why_not)
    from tests.peers import default_peer
    peer = default_peer(tool)
    if peer is None:
        pytest.skip(f"no {tool} binary")
    with Lab(prefix="nd") as lab:
        a, b = lab.host("a"), lab.host("b")
        dev_a, dev_b = lab.link(a, f"{A}/24", b, f"{B}/24")
        lab.shape(a, dev_a, 100)
        lab.shape(b, dev_b, 100)
        server = lab.start(b, _far_end(tool, peer.path), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        wait_listening(lab, b, PORT)
        _nft(lab, b, "add", "table", "inet", "ndreset")
        _nft(lab, b, "add", "chain", "inet", "ndreset", "in",
             "{ type filter hook input priority 0; policy accept; }")
        # nuttcp's data connection is on the port after its control port
        data_port = PORT + 1 if tool == "nuttcp" else PORT
        env = {**os.environ, **peer.env}
        client = lab.start(a, [sys.executable, "-m", "netprobe", "run", B, "--tool", tool,
                               "--port", str(PORT), "--time", "4", "--json", "--no-agent"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        _nft(lab, b, "add", "rule", "inet", "ndreset", "in", "tcp", "dport", str(data_port),
             "counter")
        _wait_for_data(lab, b)
        time.sleep(RESET_AFTER_S)  # a second of data measured, then the reset
        _nft(lab, b, "add", "rule", "inet", "ndreset", "in", "tcp", "dport", str(data_port),
             "counter", "reject", "with", "tcp", "reset")
        out, err = client.communicate(timeout=60)
        counted = lab.run(b, ["nft", "list", "chain", "inet", "ndreset", "in"]).stdout
        lab.stop(server)
    packets = int(re.findall(r"counter packets (\d+)", counted)[-1])  # the reject rule's
    assert packets > 0, f"the reset rule met no packet: {counted}"
    doc = json.loads(out)
    result = doc["results"][0] if "results" in doc else doc
    print(tool, client.returncode, result["status"], result["errors"], _rates(result))
    assert client.returncode != 0, f"exit 0 from a reset run: {out[-2000:]} {err[-2000:]}"
    assert result["status"] == "failed" and result["errors"], result.get("errors")
    assert result["summaries"] or result["intervals"], "what was measured is kept"


def _rates(result: dict) -> list[tuple[str, object, object]]:
    """Each direction's sender and receiver rate (for the log of a run)."""
    return [(flow["direction"], (flow.get("sender") or {}).get("bits_per_second"),
             (flow.get("receiver") or {}).get("bits_per_second"))
            for flow in result["summaries"]]
