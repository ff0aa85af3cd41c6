"""``netprobe run --latency`` from the command line: loopback runs (the probes get a
server of their own when there is no host), human and JSON output, bad options."""

from __future__ import annotations

import json

import pytest

from tests.test_cli import assert_one_error_line, netprobe_cmd


def test_run_with_latency_json_has_phases_and_interval_latency() -> None:
    proc = netprobe_cmd("run", "-t", "1", "-i", "0.5", "--latency", "--latency-idle", "0.5",
                        "--json")
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    latency = document["latency"]
    assert latency["measured_by"] == "netprobe-udp"
    assert [p["name"] for p in latency["phases"]] == ["idle", "loaded"]
    assert latency["grade"] in ("A+", "A", "B", "C", "D", "F")
    assert latency["phases"][0]["rtt"]["count"] >= 5
    assert any(i["latency_p50_us"] is not None for i in document["intervals"])


def test_run_with_latency_human_output_shows_table_verdict_and_chart() -> None:
    proc = netprobe_cmd("run", "-t", "1", "--latency", "--latency-idle", "0.5",
                        "--latency-transport", "tcp")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Latency: probe round trip" in out and "latency under load:" in out
    assert "grade" in out and "netprobe-tcp" in out
    assert "|idle" in out and "|loaded" in out  # the chart's phase ruler
    assert "latency " in out.split("Bitrate", 1)[1]  # live interval lines carry it


@pytest.mark.parametrize(("args", "words"), [
    (("--latency-rate", "0"), "--latency-rate"),
    (("--latency-rate", "500"), "--latency-rate"),
    (("--latency-idle", "-1"), "--latency-idle"),
    (("--latency-transport", "icmp"), "--latency-transport"),
    (("--latency", "--repeat", "2"), "--latency cannot be combined"),
])
def test_bad_latency_options_are_one_line_errors(args: tuple[str, ...], words: str) -> None:
    proc = netprobe_cmd("run", "-t", "1", *args)
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr)
    assert words in proc.stderr


def test_latency_without_a_far_server_fails_cleanly() -> None:
    from netprobe.driven import free_port

    proc = netprobe_cmd("run", "127.0.0.1", "-p", str(free_port()), "-t", "1", "--latency")
    assert proc.returncode == 5, proc.stderr
    assert_one_error_line(proc.stderr)
    assert "no netprobe server answers" in proc.stderr
