"""The qperf plugin against the real qperf binary on loopback (skipped where qperf is not
installed), its refusals, its registration, and the public-API-only rule."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from netprobe.driven import DrivenProcess, free_port, is_listening
from netprobe.errors import SpecError, ToolUnavailable
from netprobe.plugin import ENTRY_POINT_GROUP
from netprobe.registry import load_registry
from netprobe.schema import TestSpec
from netprobe.testing import RecordingReporter, validate_result

from netprobe_qperf import QperfTool

needs_qperf = pytest.mark.skipif(shutil.which("qperf") is None, reason="qperf is not installed")
SOURCE = Path(__file__).resolve().parents[1] / "src" / "netprobe_qperf"
PUBLIC_API = {"netprobe.plugin", "netprobe.schema", "netprobe.errors", "netprobe.driven"}


def _spec(**changes: Any) -> TestSpec:
    fields: dict[str, Any] = {"tool": "qperf", "duration_s": 1.0, "interval_s": None}
    fields.update(changes)
    return TestSpec(**fields)


def _figures(text: str) -> dict[str, float]:
    return {k: float(v) for k, v in re.findall(r"^\s+(\w+)\s+=\s+([\d.]+)", text, re.M)}


@needs_qperf
def test_tcp_run_maps_qperf_s_own_figures() -> None:
    reporter = RecordingReporter()
    result = QperfTool().run(_spec(), reporter)
    assert result.status == "ok" and validate_result(result, _spec()) == []
    bw_raw = next(r for r in result.raw if r.name == "tcp_bw")
    printed = _figures(bw_raw.text)
    flow = result.summary()
    assert flow is not None and flow.sender is not None and flow.receiver is not None
    assert flow.sender.bytes == printed["send_bytes"] > 0
    assert flow.receiver.bytes == printed["recv_bytes"] > 0
    assert flow.receiver.bits_per_second == pytest.approx(printed["bw"] * 8, rel=1e-6)
    assert flow.sender.cpu is not None and flow.sender.cpu.host is not None  # this machine
    assert result.remote.port is not None and result.remote.address == "127.0.0.1"
    assert any("server started" in note for note in reporter.notes)


@needs_qperf
def test_latency_follows_the_throughput_test() -> None:
    result = QperfTool().run(_spec(), RecordingReporter())
    lat_raw = next(r for r in result.raw if r.name == "tcp_lat")
    printed = _figures(lat_raw.text)
    assert result.latency is not None
    assert result.latency.count == printed["loc_recv_msgs"] > 0
    assert result.latency.mean_us == pytest.approx(2 * printed["latency"] / 1000)
    assert result.latency.p99_us is None  # qperf gives one mean, never a distribution


@needs_qperf
def test_udp_run_counts_datagrams_and_loss() -> None:
    spec = _spec(protocol="udp", length_bytes=1200)
    result = QperfTool({"latency_s": 0}).run(spec, RecordingReporter())
    assert validate_result(result, spec) == []
    flow = result.summary()
    assert flow is not None and flow.sender is not None and flow.receiver is not None
    assert flow.sender.packets is not None and flow.receiver.packets is not None
    assert flow.receiver.lost_packets == flow.sender.packets - flow.receiver.packets
    assert result.latency is None  # latency_s 0: no latency test
    assert [r.name for r in result.raw] == ["udp_bw", "server"]
    assert "-m" in (result.raw[0].command or ()) and "1200" in (result.raw[0].command or ())


@needs_qperf
def test_tcp_intervals_are_the_processes_io_counters_and_add_up() -> None:
    spec = _spec(duration_s=2.0, interval_s=0.5)
    reporter = RecordingReporter()
    result = QperfTool({"latency_s": 0}).run(spec, reporter)
    assert validate_result(result, spec) == []
    sent = [i for i in result.intervals if i.role == "sender"]
    assert len(sent) >= 4 and list(reporter.intervals) == list(result.intervals)
    assert [i.start_s for i in sent[1:]] == [i.end_s for i in sent[:-1]]  # back to back
    flow = result.summary()
    assert flow is not None and flow.sender is not None
    # wchar also counts qperf's control messages and its report: a few KB more at most
    assert 0 <= sum(i.bytes for i in sent) - flow.sender.bytes < 1 << 20
    assert any(i.role == "receiver" for i in result.intervals)
    assert any("/proc/PID/io" in w for w in result.warnings)


@needs_qperf
def test_udp_intervals_have_no_made_up_receiver() -> None:
    spec = _spec(protocol="udp", duration_s=1.0, interval_s=0.5)
    result = QperfTool({"latency_s": 0}).run(spec, RecordingReporter())
    assert result.intervals and {i.role for i in result.intervals} == {"sender"}


@needs_qperf
def test_client_against_a_server_it_did_not_start_as_the_agent_starts_it() -> None:
    port = free_port()
    argv = QperfTool().far_end_argv(_spec(), "127.0.0.1", port)
    assert argv is not None and argv[1:] == ["--listen_port", str(port)]
    with DrivenProcess(argv, name="far end") as far_end:
        deadline = time.monotonic() + 5
        while not (is_listening(port, socket.AF_INET6) or is_listening(port)):
            assert time.monotonic() < deadline and far_end.returncode is None
            time.sleep(0.02)
        spec = _spec(host="127.0.0.1", port=port)
        result = QperfTool({"start_server": False}).run(spec, RecordingReporter())
    assert result.status == "ok" and validate_result(result, spec) == []
    assert [r.name for r in result.raw] == ["tcp_bw", "tcp_lat"]  # no server of its own
    flow = result.summary()
    assert flow is not None and flow.receiver is not None
    assert flow.receiver.cpu is None  # the far end's host: not this machine's CPU figure
    assert result.remote.port == port and result.latency is not None


@needs_qperf
def test_ipv6_loopback() -> None:
    result = QperfTool({"latency_s": 0}).run(_spec(ip_version=6), RecordingReporter())
    assert result.remote.address == "::1" and result.status == "ok"


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"direction": "reverse"}, "--reverse"),
        ({"streams": 2}, "--parallel 2"),
        ({"duration_s": 1.5}, "--time 1.5"),
        ({"interval_s": 0.05}, "--interval 0.05"),
        ({"protocol": "udp", "rate_bits_per_second": 1e6}, "--bitrate"),
        ({"bytes_total": 1 << 20, "duration_s": None}, "--bytes"),
        ({"nodelay": True}, "--nodelay"),
    ],
)
def test_options_qperf_cannot_honour_are_refused_before_running(
    changes: dict[str, Any], flag: str
) -> None:
    with pytest.raises(SpecError, match=re.escape(flag)):
        QperfTool({"path": "/nonexistent/qperf"}).run(_spec(**changes), RecordingReporter())


def test_missing_binary_is_unavailable_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("NETPROBE_QPERF", raising=False)
    found = QperfTool().probe()
    assert not found.available and "qperf not found on PATH" in found.reasons[0]
    with pytest.raises(ToolUnavailable, match="qperf not found"):
        QperfTool().run(_spec(), RecordingReporter())
    assert "option path" in QperfTool({"path": "/no/qperf"}).probe().reasons[0]


def test_plugin_imports_only_the_public_plugin_api() -> None:
    for path in sorted(SOURCE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                if name.split(".")[0] == "netprobe":
                    assert name in PUBLIC_API, f"{path.name} imports {name}"


def _installed() -> bool:
    try:
        dist = importlib.metadata.distribution("netprobe-qperf")
    except importlib.metadata.PackageNotFoundError:
        return False
    return any(ep.group == ENTRY_POINT_GROUP and ep.name == "qperf" for ep in dist.entry_points)


@pytest.mark.skipif(not _installed(), reason="netprobe-qperf is not installed (pip install .)")
def test_registered_through_the_entry_point_group() -> None:
    registry = load_registry(only="qperf")
    assert registry.get("qperf") is QperfTool
    assert not [f for f in registry.failures if f.name == "qperf"]
