"""Repeat, compare and report: grouping and statistics of results, reading saved results
back, the tables' text, and the commands (in-process with test plugins, and as real
processes running the native engine and the peer tools on loopback)."""
from __future__ import annotations

import csv
import io
import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from netprobe.cli.exitcodes import ExitCode
from netprobe.cli.outfile import append_text, choose_formats
from netprobe.cli.tabulate import number, scale, sparkline, stats_header, stats_rows
from netprobe.convert import from_json, to_json
from netprobe.errors import ParseError, SpecError
from netprobe.registry import Registry
from netprobe.results.analysis import (
    FIGURES,
    check_group_keys,
    group_results,
    group_stats,
    mean_series,
    mixed_fields,
    retransmit_series,
    rtt_series,
    shown_figures,
    stream_series,
    throughput_series,
)
from netprobe.results.saved import load_texts, read_results
from netprobe.schema import Endpoint, Result, ToolInfo
from tests.test_cli import (
    ReplayTool,
    assert_one_error_line,
    child_env,
    installed_tool_names,
    needs_native_installed,
    netprobe_cmd,
    plugin_registry,
)
from tests.test_cli import run_main as _run_main
from tests.test_formats import sample_result

GBIT = 1e9


class OtherReplay(ReplayTool):
    """A second tool that can run anything (the replay tool under another name)."""

    name = "other"


def registry() -> Registry:
    """test_cli's test plugins plus ``other``."""
    found = plugin_registry()
    found.tools["other"] = OtherReplay
    return found


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``main(args)`` in-process with the test plugins; (exit code, stdout, stderr)."""
    return _run_main(capsys, *args, registry=registry())


def result(tool: str = "a", receiver_bps: float = 9 * GBIT, status: str = "ok",
           **spec: object) -> Result:
    """A sample result from ``tool`` whose receiver saw ``receiver_bps``."""
    base = sample_result(streams=int(spec.pop("streams", 1)))  # type: ignore[call-overload]
    flow = base.summaries[0]
    assert flow.receiver is not None
    summaries = (attrs.evolve(flow, receiver=attrs.evolve(flow.receiver,
                                                           bits_per_second=receiver_bps)),)
    return attrs.evolve(base, tool=ToolInfo(tool), status=status, summaries=summaries,
                        spec=attrs.evolve(base.spec, tool=tool, **spec))


# --- grouping and statistics -------------------------------------------------------------


def test_group_stats_by_hand() -> None:
    results = [result("a", 9 * GBIT), result("b", 4 * GBIT), result("a", 10 * GBIT),
               result("b", 5 * GBIT), result("a", 11 * GBIT), result("b", 6 * GBIT),
               result("b", 1 * GBIT, status="failed")]
    groups = group_results(results, ["tool"])
    assert [g.label for g in groups] == ["a", "b"]  # order of first appearance
    a, b = group_stats(groups)
    assert (a.total, a.ok, b.total, b.ok) == (3, 3, 4, 3)
    rx_a = a.get("client_to_server", "receiver_bits_per_second")
    rx_b = b.get("client_to_server", "receiver_bits_per_second")
    assert rx_a is not None and rx_a.summary is not None and rx_a.ratio == 1.0
    assert rx_b is not None and rx_b.summary is not None
    assert rx_a.summary.mean == 10 * GBIT and rx_b.summary.mean == 5 * GBIT  # failed left out
    assert rx_b.ratio == pytest.approx(0.5)
    # sd 1 Gbit/s over 3 trials: half width t(0.975, 2) / √3 = 4.302653 / 1.732051 Gbit/s.
    assert rx_a.summary.ci_half_width == pytest.approx(2.484138 * GBIT, rel=1e-6)


def test_group_by_hosts_spec_fields_and_several_keys() -> None:
    results = [result(streams=1), result(streams=4), result("b", streams=4),
               attrs.evolve(result(), remote=Endpoint("server", address="192.0.2.99"))]
    assert [g.label for g in group_results(results, ["streams"])] == ["streams=1", "streams=4"]
    assert [g.label for g in group_results(results, ["tool", "streams"])] == [
        "a streams=1", "a streams=4", "b streams=4"]
    assert [g.label for g in group_results(results, ["hosts"])] == [
        "192.0.2.1 -> 192.0.2.7", "192.0.2.1 -> 192.0.2.99"]
    stamped = [attrs.evolve(r, run_id="r1") for r in results[:2]]
    assert [g.label for g in group_results(stamped, ["run"])] == ["run=r1"]
    assert [len(g.results) for g in group_results(results, [])] == [4]


def test_bad_group_key_names_what_can_be() -> None:
    with pytest.raises(SpecError, match=r"cannot group by 'colour'.*tool, hosts, run.*streams"):
        check_group_keys(["tool", "colour"])


def test_mixed_fields_names_what_differs() -> None:
    results = [result(streams=1), result(streams=4, protocol="tcp"), result("b", streams=1)]
    assert mixed_fields(results) == ["streams"]
    assert mixed_fields(results, ignore=["streams"]) == []


def test_shown_figures_leave_out_what_no_group_measured() -> None:
    keys = [f.key for _, f in shown_figures(group_stats(group_results([result()], ["tool"])))]
    assert "receiver_bits_per_second" in keys and "rtt_us" in keys
    assert "jitter_ms" not in keys and "lost_percent" not in keys
    udp = sample_result(protocol="udp")
    udp_keys = [f.key for _, f in shown_figures(group_stats(group_results([udp], ["tool"])))]
    assert "jitter_ms" in udp_keys and "lost_percent" in udp_keys
    assert {f.key for f in FIGURES} >= {"sender_cpu_percent", "receiver_cpu_percent"}


# --- time series -------------------------------------------------------------------------


def test_series_use_the_sum_and_the_receiver() -> None:
    three = sample_result(streams=3)
    assert throughput_series(three, "client_to_server") == [(1.0, 3 * GBIT), (2.0, 3 * GBIT)]
    assert sorted(stream_series(three, "client_to_server")) == [1, 2, 3]
    assert throughput_series(three, "server_to_client") == []


def test_series_sum_streams_when_the_tool_gives_no_sum() -> None:
    three = sample_result(streams=3)
    only_streams = attrs.evolve(three, intervals=tuple(
        s for s in three.intervals if s.stream_id is not None))
    assert throughput_series(only_streams, "client_to_server") == [(1.0, 3 * GBIT),
                                                                   (2.0, 3 * GBIT)]
    assert retransmit_series(only_streams, "client_to_server") == [(1.0, 0.0), (2.0, 0.0)]
    assert rtt_series(only_streams, "client_to_server") == [(1.0, 50.0), (2.0, 50.0)]


def test_series_leave_out_a_closing_sliver() -> None:
    base = sample_result()
    last = next(s for s in reversed(base.intervals) if s.role == "receiver")
    sliver = attrs.evolve(last, start_s=2.0, end_s=2.05, bytes=10**6, bits_per_second=1.6e8)
    with_sliver = attrs.evolve(base, intervals=(*base.intervals, sliver))
    assert throughput_series(with_sliver, "client_to_server") == [(1.0, GBIT), (2.0, GBIT)]


def test_mean_series_by_bin_of_the_time_grid() -> None:
    # bins, not positions: a trial missing its first second does not shift its others
    assert mean_series([[(1.0, 2.0), (2.0, 4.0)], [(2.0, 6.0)]]) == [(1.0, 2.0), (2.0, 5.0)]
    assert mean_series([]) == []


# --- saved results -----------------------------------------------------------------------


def test_jsonl_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    originals = [attrs.evolve(result("a", rate), run_id="r", trial=i + 1)
                 for i, rate in enumerate((1e9, 2e9, 3e9))]
    for original in originals:
        append_text(str(path), to_json(original, indent=None) + "\n")
    loaded = load_texts([(str(path), path.read_text())])
    assert list(loaded.results) == originals and loaded.warnings == ()


def test_documents_lines_and_lists_mixed_in_one_file() -> None:
    a, b, c, d = (result(tool) for tool in "abcd")
    text = (to_json(a) + "\n" + to_json(b, indent=None) + "\n"
            + json.dumps([json.loads(to_json(c)), json.loads(to_json(d))]) + "\n")
    found, warning = read_results(text, "mixed.json")
    assert [r.tool.name for r in found] == ["a", "b", "c", "d"] and warning is None


def test_a_bad_line_names_file_and_line() -> None:
    good = to_json(result(), indent=None)
    with pytest.raises(ParseError, match=r"^runs\.jsonl:2: not JSON"):
        read_results(f"{good}\n{{bad\n{good}\n", "runs.jsonl")


def test_json_that_is_not_a_result_names_file_and_line() -> None:
    good = to_json(result(), indent=None)
    with pytest.raises(ParseError, match=r"^r\.jsonl:2: not a valid Result"):
        read_results(f"{good}\n{{\"tool\": 1}}\n", "r.jsonl")
    with pytest.raises(ParseError, match=r"^r\.jsonl:1: not a netprobe result but a JSON "
                                         r"number"):
        read_results("42\n", "r.jsonl")


def test_a_file_cut_short_gives_what_it_holds_and_a_warning() -> None:
    good = to_json(result(), indent=None)
    found, warning = read_results(f"{good}\n{good}\n{good[:200]}", "cut.jsonl")
    assert len(found) == 2
    assert warning is not None and warning.startswith("cut.jsonl:3: the last record is "
                                                      "incomplete")
    pretty = to_json(result())
    found, warning = read_results(pretty[: len(pretty) // 2], "cut.json")
    assert found == [] and warning is not None and "cut.json:1:" in warning


def test_empty_file_is_a_warning() -> None:
    loaded = load_texts([("empty.jsonl", "\n")])
    assert loaded.results == () and loaded.warnings == ("empty.jsonl: no results in this file",)


# --- table text and sparklines -----------------------------------------------------------


def test_scale_and_number() -> None:
    assert scale("rate", 9.4e9) == (1e9, "Gbit/s")
    assert scale("rate", 999.7e6) == (1e9, "Gbit/s")
    assert scale("rate", 512) == (1.0, "bit/s")
    assert scale("us", 48) == (1.0, "µs") and scale("us", 25_000) == (1000.0, "ms")
    assert scale("percent", 5) == (1.0, "%") and scale("count", 3) == (1.0, "")
    assert [number(v) for v in (9.4213, 94.213, 942.13, 0.01234, 0, None, 12345.6,
                                0.099999, 9.9996)] == [
        "9.42", "94.2", "942", "0.0123", "0", "-", "12346", "0.100", "10.0"]


def test_sparkline() -> None:
    assert sparkline([0, 1, 2, 4, 8]) == " ▁▂▄█"
    assert sparkline([4, 4], top=8) == "▄▄"
    assert sparkline([]) == "" and sparkline([0, 0]) == "  "
    assert len(sparkline(list(range(300)), width=30)) == 30


def test_stats_rows_one_group_and_several() -> None:
    one = group_stats(group_results([result("a", 9e9), result("a", 11e9)], ["tool"]))
    assert "ratio" not in " ".join(stats_header(one)) and "Group" not in stats_header(one)
    rx = next(block for block in stats_rows(one) if "receiver throughput" in block[0][0])
    assert rx == [["c->s receiver throughput (Gbit/s)", "2", "10.0", "10.0", "1.41", "9.00",
                   "11.0", "±12.7"]]
    two = group_stats(group_results([result("a", 8e9), result("b", 2e9)], ["tool"]))
    assert stats_header(two, "Tool")[1] == "Tool" and stats_header(two)[-1] == "ratio to a"
    rx2 = next(block for block in stats_rows(two) if "receiver throughput" in block[0][0])
    assert [row[1] for row in rx2] == ["a", "b"] and [row[-1] for row in rx2] == ["1.00",
                                                                                   "0.25"]


def test_file_format_follows_the_name_unless_format_is_given() -> None:
    assert choose_formats(None, "r.jsonl").file == "jsonl"
    assert choose_formats(None, "r.JSON").file == "json"
    assert choose_formats(None, "r.txt").file == "human"
    assert choose_formats("csv", "r.jsonl").file == "csv"


# --- run --repeat, compare, report (in-process, test plugins) ----------------------------


def _lines(path: Path) -> list[Result]:
    return [from_json(line) for line in path.read_text().splitlines()]


def test_repeat_saves_each_trial_and_prints_the_summary(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "results.jsonl"
    code, out, err = run_main(capsys, "run", "--tool", "replay", "-t", "2", "--repeat", "3",
                              "-o", str(target))
    assert code == 0, err
    saved = _lines(target)
    assert [r.trial for r in saved] == [1, 2, 3] and len({r.run_id for r in saved}) == 1
    assert all(r.tool.name == "replay" and r.spec.duration_s == 2.0 for r in saved)
    assert [line.split()[0] for line in out.splitlines()[:3]] == ["#1/3", "#2/3", "#3/3"]
    assert "c->s receiver throughput" in out and "±95% CI" in out and "median" in out
    assert f"run {saved[0].run_id}: 3 of 3 trials, 3 ok; saved to {target}" in out
    assert "trial 2/3: replay" in err and "3 trials of replay, about 6 s" in err


def test_repeat_machine_formats(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "run", "--tool", "replay", "--repeat", "2", "--json")
    assert code == 0
    assert [r["trial"] for r in json.loads(out)] == [1, 2]  # one document: a list
    code, out, err = run_main(capsys, "run", "--tool", "replay", "--repeat", "2",
                              "--format", "jsonl")
    assert code == 0 and [from_json(line).trial for line in out.splitlines()] == [1, 2]
    assert err == ""
    code, out, _ = run_main(capsys, "run", "--tool", "replay", "--repeat", "2", "--format",
                            "csv")
    assert code == 0 and len(list(csv.reader(io.StringIO(out)))) == 3


def test_repeat_with_failures_is_exit_5_and_keeps_the_partials(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    code, out, err = run_main(capsys, "run", "--tool", "failing", "--repeat", "2",
                              "-o", str(target), "--json")
    assert code == 5
    assert_one_error_line(err)
    assert "2 of 2 trials failed" in err
    assert [r["status"] for r in json.loads(out)] == ["failed", "failed"]
    assert [r["status"] for r in json.loads(target.read_text())] == ["failed", "failed"]


def test_pause_needs_repeat(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "run", "--tool", "replay", "--pause", "1")
    assert code == 2 and out == ""
    assert_one_error_line(err)


def test_compare_interleaves_the_tools(capsys: pytest.CaptureFixture[str]) -> None:
    ReplayTool.specs.clear()
    # The recording moves 500 MB: a count it keeps to (the overrun watch stops a tool that
    # goes on far past the count; the next test is about that).
    code, out, err = run_main(capsys, "compare", "--tools", "replay,other", "-n", "2",
                              "-t", "1", "--bytes", "500M")
    assert code == 0, err
    assert [s.tool for s in ReplayTool.specs] == ["replay", "other", "replay", "other"]
    assert all(s.bytes_total == 500 * 1024 * 1024 for s in ReplayTool.specs)
    assert "ratio to replay" in out and "Tool" in out
    assert "2 rounds" in err


def test_a_tool_past_its_byte_count_fails_its_trials_not_the_whole_compare(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The replay tool ignores -n (500 MB for 1 MiB asked) and lets the watch's stop
    through bare: each trial fails and says why; it is never read as the user's Ctrl-C."""
    ReplayTool.specs.clear()
    code, _, err = run_main(capsys, "compare", "--tools", "replay,other", "-n", "2",
                            "-t", "1", "--bytes", "1M")
    assert code not in (0, ExitCode.INTERRUPTED), err
    assert len(ReplayTool.specs) == 4, err  # every trial ran
    assert "interrupted" not in err
    assert "went on past the byte count" in err


def test_compare_lists_the_tools_left_out(capsys: pytest.CaptureFixture[str]) -> None:
    ReplayTool.specs.clear()
    code, out, _ = run_main(capsys, "compare", "--tools", "replay,tcponly,unavailable", "-u",
                            "-n", "1", "-t", "1")
    assert code == 0
    assert "left out: tcponly: tcponly cannot honour --udp" in out
    assert "left out: unavailable: unavailable cannot run here: replay binary not found" in out
    assert [s.tool for s in ReplayTool.specs] == ["replay"]


def test_compare_errors(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "compare", "--tools", "replay,nosuchtool", "-n", "1")
    assert code == 3 and "nosuchtool" in err
    code, _, err = run_main(capsys, "compare", "--tools", "tcponly", "-u", "-n", "1")
    assert code == 2 and "no tool can run this test" in err and "--udp" in err
    assert_one_error_line(err)
    code, _, err = run_main(capsys, "compare", "--tools", "unavailable", "-n", "1")
    assert code == 4 and "no tool can run this test" in err


def test_report_reads_back_and_groups(capsys: pytest.CaptureFixture[str],
                                      tmp_path: Path) -> None:
    target = tmp_path / "runs.jsonl"
    for parallel in ("1", "2"):
        code, _, _ = run_main(capsys, "compare", "--tools", "replay,other", "-n", "2", "-P",
                              parallel, "-t", "1", "-o", str(target), "-q")
        assert code == 0
    code, out, err = run_main(capsys, "report", str(target))
    assert code == 0
    assert len([line for line in out.splitlines() if line.startswith("#")]) == 8
    assert "ratio to replay" in out
    assert "mixes tests with different streams" in err  # grouped by tool only
    code, out, err = run_main(capsys, "report", str(target), "--group-by", "tool,streams",
                              "--json")
    assert code == 0 and err == ""
    records = json.loads(out)
    assert {r["group"] for r in records} == {"replay streams=1", "other streams=1",
                                             "replay streams=2", "other streams=2"}
    assert all(r["n"] == 2 for r in records if r["figure"] == "receiver_bits_per_second")
    code, out, _ = run_main(capsys, "report", str(target), "--group-by", "streams",
                            "--format", "csv", "--summary-only")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert {r["group"] for r in rows} == {"streams=1", "streams=2"} and code == 0


def test_report_reads_parse_output(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = tmp_path / "client.txt"
    source.write_text("192.0.2.44\n")
    code, out, _ = run_main(capsys, "parse", "--tool", "replay", str(source), "--json")
    (tmp_path / "parsed.json").write_text(out)
    code, out, _ = run_main(capsys, "report", str(tmp_path / "parsed.json"), "--summary-only")
    assert code == 0 and "receiver throughput" in out and "ratio" not in out


def test_report_bad_input_is_one_line_naming_file_and_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(to_json(result(), indent=None) + "\nnot json\n")
    code, out, err = run_main(capsys, "report", str(bad))
    assert code == 2 and out == ""
    assert_one_error_line(err)
    assert f"{bad}:2: not JSON" in err
    code, _, err = run_main(capsys, "report", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "missing.jsonl" in err
    code, _, err = run_main(capsys, "report", str(bad), "--group-by", "colour")
    assert code == 2 and "cannot group by 'colour'" in err


def test_report_partial_file_warns_and_reports(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    cut = tmp_path / "cut.jsonl"
    line = to_json(result(), indent=None)
    cut.write_text(line + "\n" + line[:100])
    code, out, err = run_main(capsys, "report", str(cut))
    assert code == 0 and "receiver throughput" in out
    assert "warning:" in err and "cut.jsonl:2: the last record is incomplete" in err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, _, err = run_main(capsys, "report", str(empty))
    assert code == 2 and "no results in" in err


def test_help_lists_the_new_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "--help")
    assert code == 0 and "compare" in out and "report" in out
    code, out, _ = run_main(capsys, "compare", "--help")
    assert code == 0 and "--trials" in out and "--bytes" in out and "--tools" in out
    code, out, _ = run_main(capsys, "run", "--help")
    assert code == 0 and "--repeat" in out and "--pause" in out


# --- real tools, real processes ----------------------------------------------------------


@needs_native_installed
def test_native_repeat_and_report_subprocess(tmp_path: Path) -> None:
    target = tmp_path / "native.jsonl"
    done = netprobe_cmd("run", "-t", "1", "--repeat", "2", "-o", str(target))
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()[:2]] == ["#1/2", "#2/2"]
    saved = _lines(target)
    assert [r.trial for r in saved] == [1, 2] and saved[0].run_id == saved[1].run_id
    assert all(r.status == "ok" and r.tool.name == "native" for r in saved)
    report = netprobe_cmd("report", str(target))
    assert report.returncode == 0, report.stderr
    assert "c->s receiver throughput (" in report.stdout and "±95% CI" in report.stdout


def _peer_tools() -> list[str]:
    installed = installed_tool_names()
    return [name for name in ("iperf3", "nuttcp") if name in installed and shutil.which(name)]


@needs_native_installed
def test_compare_native_and_peers_subprocess(tmp_path: Path) -> None:
    tools = ["native", *_peer_tools()]
    target = tmp_path / "compare.jsonl"
    done = netprobe_cmd("compare", "--tools", ",".join(tools), "-n", "2", "-t", "1",
                        "-o", str(target), "--format", "jsonl")
    assert done.returncode == 0, done.stderr
    saved = _lines(target)
    assert [r.tool.name for r in saved] == tools * 2
    assert [r.trial for r in saved] == list(range(1, 2 * len(tools) + 1))
    assert [from_json(line) for line in done.stdout.splitlines()] == saved
    report = netprobe_cmd("report", str(target), "--json")
    assert report.returncode == 0, report.stderr
    receiver = [r for r in json.loads(report.stdout)
                if r["figure"] == "receiver_bits_per_second"]
    assert [r["group"] for r in receiver] == tools
    assert all(r["n"] == 2 and r["mean"] > 0 for r in receiver)


@needs_native_installed
def test_ctrl_c_keeps_the_finished_trials(tmp_path: Path) -> None:
    target = tmp_path / "stopped.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "netprobe", "run", "-t", "1", "--repeat",
                             "20", "-o", str(target)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the first trial's line: it has finished and is saved
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert first.startswith("#1/20"), first + err
    assert proc.returncode == 130, err
    assert_one_error_line(err)
    assert re.search(r"interrupted after \d+ of 20 trials", err)
    assert "receiver throughput" in rest  # the summary of what was measured
    saved = _lines(target)
    assert 1 <= len(saved) < 20 and saved[0].trial == 1


def test_logic_modules_do_not_load_rich() -> None:
    code = ("import sys\nimport netprobe.results.stats, netprobe.results.analysis, "
            "netprobe.results.saved, netprobe.results.trials, netprobe.cli.tabulate, "
            "netprobe.cli.html\n"
            "print([m for m in sys.modules if m.split('.')[0] in ('rich', 'matplotlib')])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=child_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
