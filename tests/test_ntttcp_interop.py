"""ntttcp against peers started by someone else (issue 14 item 7): Windows interop is
``ntttcp.exe -s ... -ns`` to Linux ``ntttcp -r ... -N``. Live, a Linux ntttcp plays the
Windows side with the same flags (-N), on loopback: netprobe as the receive-only end
(``--receive --no-sync``) and as the no-sync sender against an outside receiver. Windows
NTttcp's own console and XML are read from fixtures written from its published format
(tests/data/ntttcp/README.md)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from netprobe.driven import is_listening
from netprobe.tools.ntttcp import NtttcpTool
from netprobe.tools.ntttcp.command import free_base_port
from tests.peers import PEER_FIXTURES, PeerBinary, peer_params
from tests.test_cli import assert_one_error_line, child_env, netprobe_cmd

DATA = Path(__file__).parent / "data" / "ntttcp"
MIB = 1 << 20

needs_ntttcp = pytest.mark.parametrize("peer", peer_params("ntttcp"), indirect=True)


def _wait_listening(ports: list[int], seconds: float = 15.0) -> None:
    end = time.monotonic() + seconds
    while not all(is_listening(port, socket.AF_INET, False) for port in ports):
        assert time.monotonic() < end, f"nothing listens on {ports}"
        time.sleep(0.05)


def _stop(process: subprocess.Popen, grace: float = 15.0) -> str:
    """Wait for ``process`` (a hung ntttcp is stopped by its PID); its output."""
    try:
        out, _ = process.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()  # the Popen's own PID
        out, _ = process.communicate(timeout=5)
    return out or ""


def _popen(argv: list[str], **kwargs: object) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            **kwargs)  # type: ignore[call-overload]


def _printed_total_bytes(console: str) -> int:
    found = re.search(r"total bytes\s*:(\d+)", console)
    assert found, console
    return int(found.group(1))


# --- live: a Linux ntttcp plays the Windows side ------------------------------------------


@needs_ntttcp
@pytest.mark.peers
def test_receive_only_reports_what_an_outside_no_sync_sender_sent(peer: PeerBinary) -> None:
    base = free_base_port(2, socket.AF_INET)
    receiver = _popen([*_netprobe(), "run", "--tool", "ntttcp", "--receive", "--no-sync",
                       "-p", str(base), "-P", "2", "-t", "2", "--json", "127.0.0.1"],
                      env=child_env())
    try:
        _wait_listening([base, base + 1])
        sender = _popen([peer.path, "-s", "-N", "-m", "2,*,127.0.0.1", "-p", str(base),
                         "-t", "2"])
        sender_text = _stop(sender)
    finally:
        out = _stop(receiver, 30.0)
    assert receiver.returncode == 0, out
    result = json.loads(out)
    flow = result["summaries"][0]
    assert flow["sender"] is None
    got = flow["receiver"]["bytes"]
    sent = _printed_total_bytes(sender_text)
    # the receiver counts from the first connection for its own -t: close to what was sent
    assert 0.5 * sent < got <= sent * 1.02
    assert result["local"]["role"] == "server" and result["local"]["port"] == base
    assert result["remote"]["address"] == "127.0.0.1"
    assert [s["stream_id"] for s in result["streams"]] == [0, 1]
    command = next(r["command"] for r in result["raw"] if r["name"] == "receiver")
    assert "-r" in command and "-N" in command


@needs_ntttcp
@pytest.mark.peers
def test_no_sync_sender_against_an_outside_no_sync_receiver(peer: PeerBinary) -> None:
    base = free_base_port(1, socket.AF_INET)
    outside = _popen([peer.path, "-r", "-N", "-m", "1,*,127.0.0.1", "-p", str(base),
                      "-t", "2"])
    try:
        _wait_listening([base])
        done = netprobe_cmd("run", "--tool", "ntttcp", "--no-sync", "--no-agent", "-p",
                            str(base), "-t", "2", "--json", "127.0.0.1", timeout=60)
    finally:
        received = _stop(outside)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    flow = result["summaries"][0]
    assert flow["receiver"] is None and flow["sender"]["bytes"] > 0
    assert _printed_total_bytes(received) > 0
    command = next(r["command"] for r in result["raw"] if r["name"] == "sender")
    assert "-N" in command and [r["name"] for r in result["raw"]].count("receiver") == 0


def test_a_mode_a_tool_lacks_is_refused_before_anything_runs() -> None:
    done = netprobe_cmd("run", "--receive", "-t", "1")
    assert done.returncode == 2
    assert_one_error_line(done.stderr)
    assert "--receive" in done.stderr and "native" in done.stderr
    nosync = netprobe_cmd("run", "--tool", "iperf3", "--no-sync", "-t", "1")
    assert nosync.returncode == 2 and "--no-sync" in nosync.stderr and "iperf3" in nosync.stderr


def test_receive_only_refuses_what_the_outside_sender_decides() -> None:
    from netprobe.errors import SpecError
    from netprobe.schema import TestSpec

    tool = NtttcpTool({"receive": True})
    with pytest.raises(SpecError, match="--nodelay"):
        tool.check(TestSpec(tool="ntttcp", nodelay=True))
    tool.check(TestSpec(tool="ntttcp", protocol="udp", rate_bits_per_second=1e6))


def _netprobe() -> list[str]:
    import sys

    return [sys.executable, "-m", "netprobe"]


# --- Windows NTttcp's own output (fixtures from its published format) --------------------


def _windows_figures() -> dict[str, float]:
    text = (DATA / "ntttcp-windows-5.33-ns-sender.txt").read_text()
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if "Bytes(MEG)" in line)
    values = lines[header + 2].split()
    return {"megabytes": float(values[0]), "seconds": float(values[1]),
            "mb_per_s": float(values[3]), "cycles": float(values[5]),
            "retransmits": float(values[13]), "cpu": float(values[15])}


def test_windows_console_is_read_in_its_units() -> None:
    name = "ntttcp-windows-5.33-ns-sender.txt"
    result = NtttcpTool().parse([(name, (DATA / name).read_text())])
    want = _windows_figures()
    sender = result.summaries[0].sender
    assert sender is not None and sender.cpu is not None and sender.cpu.host is not None
    assert sender.bytes == round(want["megabytes"] * MIB)  # its MB is 2**20 bytes
    assert sender.bits_per_second == pytest.approx(want["mb_per_s"] * MIB * 8)
    assert sender.end_s - sender.start_s == want["seconds"]
    assert sender.cpu.host.cycles_per_byte == want["cycles"]
    assert sender.cpu.host.total_percent == want["cpu"]
    assert sender.retransmits == want["retransmits"] and sender.retransmits_scope == "host"
    assert result.tool.version == "5.33"
    rates = [s.sender.bits_per_second for s in result.streams if s.sender]
    assert len(rates) == 4 and sum(rates) == pytest.approx(sender.bits_per_second, rel=1e-5)


def test_windows_xml_and_console_agree_and_pair_with_a_linux_receiver() -> None:
    names = ["ntttcp-windows-5.33-ns-sender.xml", "ntttcp-windows-5.33-ns-sender.txt"]
    sources = [(n, (DATA / n).read_text()) for n in names]
    linux = PEER_FIXTURES / "ntttcp-1.4.3-tcp-nosync-receiver.txt"
    if linux.exists():
        sources.append((linux.name, linux.read_text()))
    result = NtttcpTool().parse(sources)
    sender = result.summaries[0].sender
    assert sender is not None and sender.bytes == round(_windows_figures()["megabytes"] * MIB)
    assert not any("console says" in w for w in result.warnings)
    alone = NtttcpTool().parse(sources[:1]).summaries[0].sender
    assert alone is not None and abs(alone.bytes - sender.bytes) < 1e-6 * MIB
    if linux.exists():
        receiver = result.summaries[0].receiver
        assert receiver is not None and receiver.bytes == _printed_total_bytes(sources[2][1])


# --- receive-only on an agent (--from) ---------------------------------------------------


@needs_ntttcp
@pytest.mark.peers
def test_receive_only_on_an_agent_reports_what_the_outside_sender_sent(
        peer: PeerBinary) -> None:
    from tests.servers import netprobe_server

    base = free_base_port(1, socket.AF_INET)
    with netprobe_server("--allow-third-party") as agent:
        client = _popen([*_netprobe(), "run", "--tool", "ntttcp", "--receive", "--no-sync",
                         "--from", "127.0.0.1", "--agent-port", str(agent.port), "-p",
                         str(base), "-t", "2", "--json"], env=child_env())
        try:
            _wait_listening([base])
            sender = _popen([peer.path, "-s", "-N", "-m", "1,*,127.0.0.1", "-p", str(base),
                             "-t", "2"])
            sent = _printed_total_bytes(_stop(sender))
        finally:
            out = _stop(client, 30.0)
        log = agent.log()
    assert client.returncode == 0, out
    result = json.loads(out)
    got = result["summaries"][0]["receiver"]["bytes"]
    assert 0.5 * sent < got <= sent * 1.02
    assert result["local"]["role"] == "server" and result["local"]["address"] == "0.0.0.0"
    assert "third-party ntttcp receive-only" in log


def test_an_agent_refuses_a_mode_the_tool_lacks() -> None:
    from netprobe.errors import TestFailed
    from netprobe.farend import third_party
    from netprobe.plugin import NullReporter
    from netprobe.schema import TestSpec
    from tests.servers import netprobe_server

    with netprobe_server("--allow-third-party") as agent, pytest.raises(
            TestFailed, match="native has no mode receive"):
        third_party("127.0.0.1", TestSpec(tool="native", duration_s=1.0), NullReporter(),
                    port=agent.port, modes={"receive": True})


# --- the plans and the interval arithmetic (no binary needed) ------------------------------


def test_no_sync_and_receive_only_plans() -> None:
    from netprobe.schema import TestSpec
    from netprobe.tools.ntttcp.command import make_plan

    spec = TestSpec(tool="ntttcp", host="127.0.0.1", streams=2, duration_s=3.0)
    both = make_plan(spec, "ntttcp", {"no_sync": True}, "/tmp/w", "-j ")
    assert both.server_argv is not None and "-N" in both.server_argv and "-N" in both.client_argv
    assert "-x/tmp/w/sender.xml" in both.client_argv  # attached: 1.4.0 reads it only so
    alone = make_plan(TestSpec(tool="ntttcp", duration_s=3.0), "ntttcp", {"receive": True},
                      "/tmp/w")
    assert alone.receive_only and alone.client_argv == () and alone.server_argv is not None
    assert alone.base_port == 5001 and "1,*,0.0.0.0" in alone.server_argv
    assert "-N" not in alone.server_argv  # sync unless asked: a Linux sender may use it


def test_interval_schedule_and_reconcile() -> None:
    from netprobe.schema import Interval
    from netprobe.tools.ntttcp.intervals import reconcile, schedule

    assert schedule(0.5, 0.0, 2.0) == [0.5, 1.0, 1.5, 2.0]
    assert schedule(1.0, 1.0, 2.5) == [1.0, 2.0, 3.0, 3.5]  # a boundary where warm-up ends
    items = tuple(Interval(direction="client_to_server", role="receiver", stream_id=None,
                           start_s=k, end_s=k + 1.0, bytes=100, bits_per_second=800.0)
                  for k in (0.0, 1.0, 2.0))
    fixed = reconcile(items, 350, "receiver")
    assert [i.bytes for i in fixed] == [100, 100, 150] and fixed[-1].bits_per_second == 1200
    assert reconcile(items, 150, "receiver") == items  # never below 0: left as measured
