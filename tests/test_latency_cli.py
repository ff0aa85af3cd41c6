"""``netprobe run --latency`` from the command line: loopback runs (the probes get a
server of their own when there is no host), human and JSON output, bad options."""

from __future__ import annotations

import json
import shutil

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
    assert "Latency in ms (probe round trip" in out and "latency under load:" in out
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


def test_bufferbloat_on_loopback_writes_one_document_report_reads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    saved = tmp_path / "bloat.json"
    proc = netprobe_cmd("bufferbloat", "-t", "1", "--idle", "0.5", "-P", "2", "-o", str(saved))
    assert proc.returncode == 0, proc.stderr
    assert "latency under load:" in proc.stdout and "|download" in proc.stdout
    document = json.loads(saved.read_text())
    phases = document["latency"]["phases"]
    assert [p["name"] for p in phases] == ["idle", "download", "upload", "both", "idle_tail"]
    assert phases[1]["server_to_client_bits_per_second"] > 0
    assert phases[1]["client_to_server_bits_per_second"] is None
    assert phases[3]["server_to_client_bits_per_second"] > 0
    assert phases[3]["client_to_server_bits_per_second"] > 0
    assert {s["direction"] for s in document["summaries"]} == {"client_to_server",
                                                               "server_to_client"}
    assert document["latency"]["test_start_s"] == 0.0
    # The intervals are on the probes' clock: each phase's lie inside that phase.
    upload = next(p for p in phases if p["name"] == "upload")
    c2s = [i for i in document["intervals"] if i["direction"] == "client_to_server"
           and i["start_s"] < upload["end_s"] and i["end_s"] > upload["start_s"]]
    assert c2s and all(i["start_s"] >= upload["start_s"] - 0.2 for i in c2s)
    report = netprobe_cmd("report", str(saved))
    assert report.returncode == 0, report.stderr
    assert "latency bloat (" in report.stdout and "DSLReports grade" in report.stdout
    pytest.importorskip("matplotlib")
    page = tmp_path / "bloat.html"
    report = netprobe_cmd("report", "--html", str(page), str(saved))
    assert report.returncode == 0, report.stderr
    text = page.read_text()
    assert "Latency under load" in text and 'id="series-lat1-rtt"' in text
    assert all(f'band-lat1-{k}"' in text for k in range(1, 6))  # one band per phase
    assert all(f'id="series-lat1-cdf-{k}"' in text for k in range(1, 6))  # a CDF per phase


def test_rrul_loads_both_directions_at_once_with_probes_around(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``netprobe rrul``: Flent's shape, one loaded phase with -P streams each way at once
    between two idle ones; graded by that phase alone."""
    proc = netprobe_cmd("rrul", "-t", "1", "--idle", "0.3", "-P", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    latency = document["latency"]
    assert [p["name"] for p in latency["phases"]] == ["idle", "rrul", "idle_tail"]
    rrul = latency["phases"][1]
    assert rrul["client_to_server_bits_per_second"] > 0
    assert rrul["server_to_client_bits_per_second"] > 0
    assert latency["grade"] == rrul["grade"] and latency["bloat_us"] == rrul["bloat_us"]
    assert document["spec"]["direction"] == "bidir" and document["spec"]["streams"] == 2
    streams = {(s["direction"], s["stream_id"]) for s in document["streams"]}
    assert len(streams) == 4  # two each way
    # At once: each direction's intervals span the same stretch of the probes' clock.
    spans = {d: [i for i in document["intervals"] if i["direction"] == d]
             for d in ("client_to_server", "server_to_client")}
    assert all(spans.values())
    assert abs(spans["client_to_server"][0]["start_s"]
               - spans["server_to_client"][0]["start_s"]) < 0.5
    helped = netprobe_cmd("bufferbloat", "--help")
    assert "netprobe rrul" in " ".join(helped.stdout.split())


def test_bufferbloat_refuses_what_the_tool_cannot_do() -> None:
    proc = netprobe_cmd("bufferbloat", "--tool", "nosuchtool", "-t", "1")
    assert proc.returncode != 0
    assert_one_error_line(proc.stderr)


@pytest.mark.skipif(not shutil.which("iperf3"), reason="iperf3 is not installed")
def test_driven_tool_with_latency_gets_netprobe_probes_beside_it() -> None:
    proc = netprobe_cmd("run", "--tool", "iperf3", "-t", "1", "--latency",
                        "--latency-idle", "0.5", "--json")
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert document["tool"]["name"] == "iperf3"
    latency = document["latency"]
    assert latency["measured_by"] == "netprobe-udp"  # iperf3 has no latency of its own
    assert [p["name"] for p in latency["phases"]] == ["idle", "loaded"]
    assert latency["phases"][1]["rtt"]["count"] >= 10
