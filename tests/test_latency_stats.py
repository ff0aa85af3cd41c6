"""The schema's per-phase statistics (schema 1.12): a phase's round trip and each direction
are a :class:`LatencyStats` of their own, not a whole run-level ``Latency`` with empty
``phases``, ``samples`` and null ``rpm``/``grade``; results of 1.11 and before, whose phase
records carry those empty fields, still load and render."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from netprobe import convert, schema
from netprobe.cli.render import print_result
from netprobe.errors import ParseError, SpecError
from tests.test_report import run_main
from tests.test_report_latency import _probed

OLD = Path(__file__).parent / "data" / "result-1.11-latency-phases.json"
"""A result written by netprobe 1.11's code (engine.latency.summarize over probes with
one-way delays and a lost probe): every phase's rtt and direction a whole Latency."""
RUN_LEVEL = ("measured_by", "phases", "increase_us", "bloat_us", "rpm", "grade", "samples",
             "test_start_s", "metric", "tail_increase_us", "verdict")


def test_a_new_results_phase_statistics_carry_no_run_level_fields() -> None:
    document = json.loads(convert.to_json(_probed("a", 10)))
    for phase in document["latency"]["phases"]:
        for name in ("rtt", "client_to_server", "server_to_client"):
            record = phase[name]
            if record is not None:
                assert set(record) & set(RUN_LEVEL) == set(), (phase["name"], name)
                assert record["count"] >= 0
    assert document["schema_version"] == schema.SCHEMA_VERSION != "1.11"
    shipped = convert.result_json_schema()["$defs"]
    assert shipped["LatencyPhase"]["properties"]["rtt"]["anyOf"][0] == \
        {"$ref": "#/$defs/LatencyStats"}


def test_a_1_11_result_loads_into_the_statistics_record() -> None:
    result = convert.from_json(OLD.read_text(), source=str(OLD))
    assert result.schema_version == "1.11" and result.latency is not None
    idle, loaded, _ = result.latency.phases
    assert isinstance(loaded.rtt, schema.LatencyStats)
    assert not isinstance(loaded.rtt, schema.Latency)
    assert (loaded.rtt.count, loaded.rtt.lost, loaded.rtt.p50_us) == (10, 1, 41004.5)
    assert loaded.client_to_server is not None and loaded.client_to_server.p50_us == 40004.5
    assert (loaded.grade, loaded.verdict, idle.rtt and idle.rtt.count) == ("B", "C", 10)
    assert result.warnings == tuple(json.loads(OLD.read_text())["warnings"])  # none added
    # What it loaded into is written in the new shape.
    again = json.loads(convert.to_json(result))
    assert "phases" not in again["latency"]["phases"][1]["rtt"]


def test_a_phase_record_with_run_level_figures_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # netprobe never wrote a figure into these fields of a phase: one there is not data
    # this version can place, so the load fails naming where, rather than drop it unseen.
    document = json.loads(OLD.read_text())
    document["latency"]["phases"][1]["rtt"]["rpm"] = 1234.0
    with pytest.raises(ParseError, match=r"latency\.phases\[1\]\.rtt\.rpm"):
        convert.from_json(json.dumps(document))
    document["latency"]["phases"][1]["rtt"]["rpm"] = None
    document["latency"]["phases"][0]["server_to_client"]["samples"] = [{"t_s": 0.0}]
    with pytest.raises(ParseError, match=r"phases\[0\]\.server_to_client\.samples"):
        convert.from_json(json.dumps(document))
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    code, _, err = run_main(capsys, "report", str(path))
    assert code != 0 and "server_to_client.samples" in err and "Traceback" not in err


def test_report_renders_a_1_11_result(capsys: pytest.CaptureFixture[str],
                                      tmp_path: Path) -> None:
    code, out, err = run_main(capsys, "report", str(OLD))
    assert code == 0, err
    assert "Traceback" not in out + err
    assert "verdict C (DSLReports B)" in out and "+40.0 ms" in out
    # The page needs the charts extra, which a wheel's suite lacks.
    if importlib.util.find_spec("matplotlib") is not None:
        page = tmp_path / "page.html"
        code, out, err = run_main(capsys, "report", "--html", str(page), str(OLD))
        assert code == 0, err
        assert "Latency under load" in page.read_text()
    buffer = io.StringIO()
    print_result(Console(file=buffer, width=100, color_system=None),
                 convert.from_json(OLD.read_text()))
    assert "idle_tail" in buffer.getvalue() and "41.0" in buffer.getvalue()


def test_a_phase_built_with_a_whole_latency_keeps_its_distribution_alone() -> None:
    # Code that still hands a phase a Latency gets the statistics record (so the phase
    # writes and compares as it loads), and a filled run-level field is refused.
    phase = schema.LatencyPhase(name="idle", loaded=False, start_s=0.0, end_s=1.0,
                                rtt=schema.Latency(count=3, p50_us=7.0, lost=0))
    assert type(phase.rtt) is schema.LatencyStats and phase.rtt.p50_us == 7.0
    with pytest.raises(SpecError, match="rpm"):
        schema.LatencyPhase(name="idle", loaded=False, start_s=0.0, end_s=1.0,
                            server_to_client=schema.Latency(count=3, rpm=100.0))
