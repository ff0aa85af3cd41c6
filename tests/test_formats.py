"""Result formatters and file output (netprobe.cli.formats) on hand-built schema records."""
from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import pytest

from netprobe.cli import outfile
from netprobe.cli.formats import CSV_COLUMNS, Output, OutputError, format_result
from netprobe.convert import from_json
from netprobe.plugin import NullReporter
from netprobe.schema import (
    Cpu,
    CpuUsage,
    Endpoint,
    FlowSummary,
    Interval,
    Result,
    SideSummary,
    StreamResult,
    TestSpec,
    ToolInfo,
)
from netprobe.testing import validate_document

GBIT = 1_000_000_000


def _side(role: str, nbytes: int, udp: bool, host_scope: bool = False) -> SideSummary:
    seconds = 2.0
    sender = role == "sender"
    return SideSummary(
        role=role, start_s=0.0, end_s=seconds, bytes=nbytes,
        bits_per_second=nbytes * 8 / seconds,
        retransmits=(7 if sender and not udp else None),
        retransmits_scope=("host" if host_scope else "connection") if sender and not udp
        else None,
        rtt_us=52 if sender and not udp else None,
        min_rtt_us=31 if sender and not udp else None,
        packets=1000 if udp else None,
        lost_packets=3 if udp and not sender else None,
        lost_percent=0.3 if udp and not sender else None,
        jitter_ms=0.012 if udp and not sender else None,
        out_of_order_packets=1 if udp and not sender else None,
        cpu=Cpu(process=CpuUsage(total_percent=41.5 if sender else 63.25),
                host=CpuUsage(total_percent=20.0)),
    )


def _intervals(direction: str, streams: int) -> list[Interval]:
    samples = []
    for second in (0, 1):
        for role in ("sender", "receiver"):
            ids = [*range(1, streams + 1), None] if streams > 1 else [1]
            for stream_id in ids:
                share = 1 if stream_id is not None else streams
                samples.append(Interval(
                    direction=direction, role=role, stream_id=stream_id,
                    start_s=float(second), end_s=second + 1.0, bytes=GBIT // 8 * share,
                    bits_per_second=float(GBIT * share), omitted=False,
                    retransmits=0 if role == "sender" else None,
                    rtt_us=50 if role == "sender" else None))
    return samples


def sample_result(protocol: str = "tcp", direction: str = "normal", streams: int = 1,
                  status: str = "ok", host_scope: bool = False) -> Result:
    """A complete Result as a tool would return it (real schema records throughout)."""
    spec = TestSpec(tool="native", host="192.0.2.7", protocol=protocol, direction=direction,
                    streams=streams, duration_s=2.0)
    udp = protocol == "udp"
    summaries, stream_results, intervals = [], [], []
    for flow in spec.flow_directions():
        total = 250_000_000 * streams
        summaries.append(FlowSummary(direction=flow,
                                     sender=_side("sender", total, udp, host_scope),
                                     receiver=_side("receiver", total - 1000, udp)))
        for stream_id in range(1, streams + 1):
            stream_results.append(StreamResult(
                stream_id=stream_id, direction=flow,
                sender=attrs.evolve(_side("sender", 250_000_000, udp), cpu=None),
                receiver=attrs.evolve(_side("receiver", 250_000_000, udp), cpu=None)))
        intervals.extend(_intervals(flow, streams))
    return Result(
        tool=ToolInfo(name="native", version="0.1.0", data_path="c", mode="copy"),
        spec=spec, start_time="2024-05-01T12:00:00.000+00:00",
        local=Endpoint(role="client", host=None, address="192.0.2.1"),
        remote=Endpoint(role="server", host="192.0.2.7", address="192.0.2.7", port=5301),
        status=status, duration_s=2.0, summaries=tuple(summaries),
        streams=tuple(stream_results), intervals=tuple(intervals),
        warnings=("window clamped to 425984 bytes",),
        errors=("connection reset by peer",) if status != "ok" else (),
    )


# --- json / jsonl ------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [{}, {"protocol": "udp", "direction": "bidir"},
                                    {"streams": 3, "direction": "reverse"}])
def test_json_round_trip(kwargs: dict) -> None:
    result = sample_result(**kwargs)
    text = format_result(result, "json")
    assert text.endswith("\n")
    validate_document(json.loads(text))
    assert from_json(text) == result


def test_jsonl_is_one_line_per_result() -> None:
    text = format_result(sample_result(), "jsonl")
    assert text.count("\n") == 1 and text.endswith("\n")
    assert from_json(text) == sample_result()


def test_jsonl_output_appends_one_line_per_result(tmp_path: Path) -> None:
    target = tmp_path / "log.jsonl"
    first, second = sample_result(), sample_result(protocol="udp", status="failed")
    Output("jsonl", str(target)).emit(first)
    Output("jsonl", str(target)).emit(second)
    lines = target.read_text().splitlines()
    assert len(lines) == 2
    assert [from_json(line) for line in lines] == [first, second]


# --- csv ---------------------------------------------------------------------------------


def _csv(result: Result) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(format_result(result, "csv"))))


def test_csv_header_and_one_row_per_direction() -> None:
    text = format_result(sample_result(direction="bidir"), "csv")
    header = text.splitlines()[0].split(",")
    assert tuple(header) == CSV_COLUMNS
    rows = _csv(sample_result(direction="bidir"))
    assert [row["direction"] for row in rows] == ["client_to_server", "server_to_client"]


def test_csv_values_tcp() -> None:
    (row,) = _csv(sample_result(host_scope=True))
    assert row["tool"] == "native" and row["status"] == "ok" and row["protocol"] == "tcp"
    assert row["host"] == "192.0.2.7" and row["streams"] == "1"
    assert int(row["sender_bytes"]) == 250_000_000
    assert float(row["sender_bits_per_second"]) == 1e9
    assert int(row["receiver_bytes"]) == 250_000_000 - 1000
    assert row["retransmits"] == "7" and row["retransmits_scope"] == "host"
    assert row["rtt_us"] == "52" and row["min_rtt_us"] == "31"
    assert float(row["sender_cpu_percent"]) == 41.5
    assert float(row["receiver_cpu_percent"]) == 63.25
    assert float(row["sender_host_cpu_percent"]) == 20.0
    # Unknown is an empty cell, never 0.
    assert row["lost_packets"] == "" and row["jitter_ms"] == ""


def test_csv_values_udp() -> None:
    (row,) = _csv(sample_result(protocol="udp"))
    assert row["lost_packets"] == "3" and float(row["lost_percent"]) == 0.3
    assert float(row["jitter_ms"]) == 0.012 and row["out_of_order_packets"] == "1"
    assert row["retransmits"] == ""


def test_csv_row_even_without_figures() -> None:
    result = attrs.evolve(sample_result(status="failed"), summaries=(), streams=())
    (row,) = _csv(result)
    assert row["status"] == "failed" and row["sender_bytes"] == ""


# --- human -------------------------------------------------------------------------------


def test_human_text_shows_table_warnings_and_status() -> None:
    text = format_result(sample_result(host_scope=True), "human")
    assert "\x1b[" not in text  # plain text in files
    assert "Gbit/s" in text and "MBytes" in text
    assert "7 (host-wide)" in text
    assert "41.5% (host 20.0%)" in text
    assert "warning: window clamped" in text
    assert text.rstrip().endswith("status: ok")


def test_human_text_shows_each_ends_call_length() -> None:
    result = sample_result()
    flow = result.summaries[0]
    assert flow.sender is not None and flow.receiver is not None
    with_lengths = attrs.evolve(result, summaries=(attrs.evolve(
        flow, sender=attrs.evolve(flow.sender, call_length_bytes=1024 * 1024),
        receiver=attrs.evolve(flow.receiver, call_length_bytes=131072 + 100)),))
    text = format_result(with_lengths, "human")
    assert "Call len" in text
    rows = {line.split()[1]: line for line in text.splitlines()
            if line.split()[1:2] in (["sender"], ["receiver"])}
    assert " 1M " in rows["sender"] and " 131172 B " in rows["receiver"]
    assert "Call len" not in format_result(result, "human")  # nobody said: no column


def test_human_text_udp_columns() -> None:
    text = format_result(sample_result(protocol="udp", status="failed"), "human")
    assert "3 (0.30%)" in text and "0.012 ms" in text
    assert "Retr" not in text  # a column nobody measured is left out
    assert "error: connection reset by peer" in text and "status: failed" in text


def test_human_text_several_streams_shows_sums_only() -> None:
    text = format_result(sample_result(streams=3), "human")
    assert "[SUM]" in text and "[  1]" not in text
    per_stream = format_result(sample_result(streams=3), "human", per_stream=True)
    assert "[  1]" in per_stream and "c->s #3" in per_stream


# --- atomic writes -----------------------------------------------------------------------


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "result.json"
    target.write_text("old")
    Output("json", str(target)).emit(sample_result())
    assert from_json(target.read_text()) == sample_result()
    assert os.listdir(tmp_path) == ["result.json"]


def test_atomic_write_keeps_the_mode_of_the_file_it_replaces(tmp_path: Path) -> None:
    target = tmp_path / "result.csv"
    target.write_text("old")
    target.chmod(0o640)
    outfile.write_text(str(target), "new\n")
    assert target.read_text() == "new\n"
    assert target.stat().st_mode & 0o777 == 0o640


def test_serialization_error_leaves_previous_file(tmp_path: Path) -> None:
    target = tmp_path / "result.json"
    target.write_text("previous")
    broken = attrs.evolve(sample_result(), duration_s=float("nan"))  # JSON has no NaN
    with pytest.raises(ValueError):
        Output("json", str(target)).emit(broken)
    assert target.read_text() == "previous"
    assert os.listdir(tmp_path) == ["result.json"]


def test_missing_directory_is_an_output_error(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match=r"cannot write .*nodir"):
        outfile.write_text(str(tmp_path / "nodir" / "x.json"), "{}")
    with pytest.raises(OutputError):
        outfile.append_text(str(tmp_path / "nodir" / "x.jsonl"), "{}\n")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_unwritable_directory_leaves_previous_file(tmp_path: Path) -> None:
    target = tmp_path / "result.json"
    target.write_text("previous")
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(OutputError):
            outfile.write_text(str(target), "new")
    finally:
        tmp_path.chmod(0o700)
    assert target.read_text() == "previous"
    assert os.listdir(tmp_path) == ["result.json"]


_FULL_DISK = textwrap.dedent("""
    import resource, signal, sys
    from netprobe.cli import outfile as formats
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
    try:
        getattr(formats, sys.argv[1])(sys.argv[2], "x" * 5000 + "\\n")
    except formats.OutputError as exc:
        print(exc)
        sys.exit(6)
""")


@pytest.mark.parametrize("writer", ["write_text", "append_text"])
def test_failing_write_midway_leaves_previous_file(tmp_path: Path, writer: str) -> None:
    # A real short write: the file-size limit stands in for a full disk, in a child
    # process so that the limit does not touch the test run.
    target = tmp_path / "out.txt"
    target.write_text("previous line\n")
    done = subprocess.run([sys.executable, "-c", _FULL_DISK, writer, str(target)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 6, done.stderr
    assert "cannot write" in done.stdout
    assert target.read_text() == "previous line\n"
    assert os.listdir(tmp_path) == ["out.txt"]


def test_output_to_stdout_machine_format_is_alone(capsys: pytest.CaptureFixture[str]) -> None:
    output = Output("json")
    assert not output.live and isinstance(output.reporter(TestSpec()), NullReporter)
    output.emit(sample_result())
    out, err = capsys.readouterr()
    assert from_json(out) == sample_result()
    assert err == ""


def test_output_to_file_and_stdout_unless_quiet(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "r.csv"
    Output("csv", str(target)).emit(sample_result())
    out, _ = capsys.readouterr()
    assert out == target.read_text() == format_result(sample_result(), "csv")
    target.unlink()
    Output("csv", str(target), quiet=True).emit(sample_result())
    out, _ = capsys.readouterr()
    assert out == "" and target.read_text().startswith("start_time,")


def test_failed_file_write_still_prints_the_result(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(OutputError):
        Output("json", str(tmp_path / "missing" / "r.json")).emit(sample_result())
    out, _ = capsys.readouterr()
    assert from_json(out) == sample_result()
