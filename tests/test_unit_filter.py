"""The shipped systemd unit's system-call filter, loaded with the real libseccomp into a real
``netprobe server``, survives every kind of test a client may ask for.

The unit's filter used to deny @resources with systemd's default action, SIGSYS: a client's
``-P 3`` on a 2-core router made the server lower its stream threads' priority
(setpriority) and killed the daemon, again after every restart.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import NETPROBE, netprobe_server
from tests.unitfilter import load, unit_filter

UNIT = Path(__file__).resolve().parent.parent / "deploy" / "systemd" / "netprobe-server.service"

pytestmark = [
    pytest.mark.skipif(not UNIT.is_file(), reason=f"no source checkout: {UNIT} absent"),
    pytest.mark.skipif(not shutil.which("systemd-analyze"),
                       reason="systemd-analyze (which expands the unit's @sets) is absent"),
    pytest.mark.skipif(ctypes.util.find_library("seccomp") is None,
                       reason="libseccomp is not installed"),
]

# More streams than this machine has CPUs: the server then nices its stream threads.
MANY = str(max(8, 2 * (os.cpu_count() or 1)))

NATIVE = [
    ["-t", "1"],
    ["-t", "1", "-P", MANY],
    ["-t", "1", "-R", "-P", MANY],
    ["-t", "1", "--bidir"],
    ["-t", "1", "-u", "-b", "50M"],
    ["-t", "1", "-u", "-b", "50M", "-R", "-P", "3"],
    ["-t", "2", "--latency"],
]
FAR_ENDS = [tool for tool in ("iperf3", "iperf2", "nuttcp") if shutil.which(
    {"iperf2": "iperf"}.get(tool, tool))]
if shutil.which("ntttcp") or os.path.isfile(os.environ.get("NETPROBE_NTTTCP", "")):
    FAR_ENDS.append("ntttcp")


def _filtered(unit_text: str):  # type: ignore[no-untyped-def]
    allowed, action = unit_filter(unit_text)
    return lambda: load(allowed, action)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*NETPROBE, "run", "127.0.0.1", *args, "--json"],
                          capture_output=True, text=True, timeout=90)


def test_the_filter_is_really_loaded() -> None:
    # The harness's own witness: a call the unit denies fails in the filtered child.
    unit = UNIT.read_text()
    allowed, _ = unit_filter(unit)
    probe = subprocess.run(
        [sys.executable, "-c", "import os; os.sethostname('x')"], capture_output=True,
        text=True, timeout=30, preexec_fn=_filtered(unit))
    assert "sethostname" not in allowed
    assert probe.returncode != 0


def _without_setpriority() -> str:
    # The shipped unit with nice levels refused: netprobe must take the EPERM and go on.
    text = UNIT.read_text().replace("\nSystemCallFilter=setpriority\n", "\n")
    assert "SystemCallErrorNumber=EPERM" in text
    return text


@pytest.mark.parametrize("unit", [UNIT.read_text, _without_setpriority],
                         ids=["shipped", "setpriority-refused"])
def test_the_server_survives_every_native_test_under_the_units_filter(unit) -> None:  # type: ignore[no-untyped-def]
    with netprobe_server(preexec=_filtered(unit())) as server:
        for args in NATIVE:
            done = _run("-p", str(server.port), *args)
            assert server.proc.poll() is None, (
                f"{args}: the server died ({server.proc.returncode}): {server.log()[-800:]}")
            assert done.returncode == 0, f"{args}: {done.stderr[-800:]}"


@pytest.mark.skipif(not FAR_ENDS, reason="no peer tool installed (iperf3, iperf, nuttcp)")
def test_the_agent_starts_far_ends_under_the_units_filter() -> None:
    with netprobe_server(preexec=_filtered(UNIT.read_text())) as server:
        for tool in FAR_ENDS:
            done = _run("--tool", tool, "--agent-port", str(server.port),
                        "-t", "1")
            assert server.proc.poll() is None, f"{tool}: the server died: {server.log()[-800:]}"
            assert done.returncode == 0, f"{tool}: {done.stderr[-800:]}"


STOCK_IPERF3 = [
    ["-t", "1"],
    ["-t", "1", "-R", "-P", MANY],
    ["-t", "1", "--bidir"],
    ["-t", "1", "-u", "-b", "20M"],
    ["-t", "1", "-u", "-b", "20M", "-R", "-P", "3"],
]


@pytest.mark.skipif(not shutil.which("iperf3"), reason="no stock iperf3 client")
def test_the_iperf3_listener_serves_stock_clients_under_the_units_filter() -> None:
    # `--iperf3` in NETPROBE_SERVER_ARGS (the unit's options): the listener's threads, its
    # second port and its UDP streams run inside the same filter as the native tests.
    from tests.servers import free_port, wait_listening

    iperf3_port = free_port()
    with netprobe_server("--iperf3", "--iperf3-port", str(iperf3_port),
                         preexec=_filtered(UNIT.read_text())) as server:
        wait_listening(iperf3_port)
        for args in STOCK_IPERF3:
            done = subprocess.run([str(shutil.which("iperf3")), "-c", "127.0.0.1", "-p",
                                   str(iperf3_port), *args, "-J"], capture_output=True,
                                  text=True, timeout=60)
            assert server.proc.poll() is None, (
                f"{args}: the server died ({server.proc.returncode}): {server.log()[-800:]}")
            assert done.returncode == 0, f"{args}: {done.stdout[-800:]}"
            assert json.loads(done.stdout)["end"]["sum_received"]["bytes"] > 0, args
