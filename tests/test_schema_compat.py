"""Schema compatibility: a result written by schema 1.0 (before run_id, trial and latency)
still loads, a 1.1 latency record (before the phases of 1.2) still loads, and a current
result with a latency distribution and its phases round-trips through JSON and validates
against the JSON Schema shipped in the package."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import attrs
import jsonschema
import pytest

from netprobe import convert, schema
from netprobe.errors import ParseError
from netprobe.schema import Endpoint, Interval, Latency, LatencyPhase, Result, TestSpec, ToolInfo
from netprobe.testing import validate_document

# Written by hand the way netprobe 1.0 wrote results: no run_id, no trial, no latency.
SCHEMA_1_0_DOCUMENT = """
{
  "tool": {"name": "iperf3", "version": "3.12", "data_path": null, "mode": "copy"},
  "spec": {
    "tool": "iperf3", "host": "192.0.2.7", "protocol": "tcp", "direction": "normal",
    "streams": 1, "duration_s": 2.0, "bytes_total": null, "interval_s": 1.0, "omit_s": 0.0,
    "length_bytes": null, "window_bytes": null, "rate_bits_per_second": null,
    "mss_bytes": null, "nodelay": false, "dscp": null, "congestion": null,
    "ip_version": null, "port": null, "bind_address": null, "zerocopy": false,
    "skip_rx_copy": false
  },
  "start_time": "2026-01-05T10:00:00.000+00:00",
  "local": {"role": "client", "host": null, "address": null, "port": null, "system": null},
  "remote": {"role": "server", "host": "192.0.2.7", "address": "192.0.2.7", "port": 5201,
             "system": null},
  "status": "ok",
  "duration_s": 2.0,
  "summaries": [
    {"direction": "client_to_server",
     "sender": {"role": "sender", "start_s": 0.0, "end_s": 2.0, "bytes": 250000000,
                "bits_per_second": 1000000000.0, "retransmits": 3,
                "retransmits_scope": "connection"},
     "receiver": {"role": "receiver", "start_s": 0.0, "end_s": 2.0, "bytes": 249000000,
                  "bits_per_second": 996000000.0}}
  ],
  "streams": [],
  "intervals": [
    {"direction": "client_to_server", "role": "sender", "stream_id": null,
     "start_s": 0.0, "end_s": 1.0, "bytes": 125000000, "bits_per_second": 1000000000.0},
    {"direction": "client_to_server", "role": "sender", "stream_id": null,
     "start_s": 1.0, "end_s": 2.0, "bytes": 125000000, "bits_per_second": 1000000000.0}
  ],
  "warnings": [],
  "errors": [],
  "raw": [],
  "schema_version": "1.0"
}
"""


def _shipped_schema() -> dict[str, Any]:
    text = resources.files("netprobe").joinpath("result.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def test_schema_1_0_document_still_loads() -> None:
    result = convert.from_json(SCHEMA_1_0_DOCUMENT, source="old.json")
    assert result.schema_version == "1.0"  # the version it was written with is kept
    assert result.run_id is None and result.trial is None and result.latency is None
    flow = result.summary()
    assert flow is not None and flow.sender is not None and flow.receiver is not None
    assert flow.sender.retransmits == 3
    assert flow.receiver.bits_per_second == 996_000_000.0
    assert [i.end_s for i in result.intervals] == [1.0, 2.0]


def test_schema_1_0_document_validates_against_the_shipped_schema() -> None:
    validate_document(json.loads(SCHEMA_1_0_DOCUMENT))


def test_schema_1_0_document_is_rewritten_with_the_new_fields_as_null() -> None:
    again = json.loads(convert.to_json(convert.from_json(SCHEMA_1_0_DOCUMENT)))
    assert again["latency"] is None and again["run_id"] is None and again["trial"] is None
    assert again["schema_version"] == "1.0"
    validate_document(again)


def _latency_result() -> Result:
    return Result(
        tool=ToolInfo(name="qperf", version="0.4.11"),
        spec=TestSpec(tool="qperf", duration_s=2.0, interval_s=None),
        start_time="2026-01-05T10:00:00.000+00:00",
        local=Endpoint(role="client"),
        remote=Endpoint(role="server", host="127.0.0.1", port=19765),
        duration_s=2.0,
        latency=Latency(
            count=41_000, min_us=17.5, mean_us=24.25, p50_us=23.0, p90_us=29.5,
            p99_us=41.0, max_us=88.0,
        ),
        run_id="r-1",
        trial=1,
    )


def test_result_with_latency_round_trips() -> None:
    result = _latency_result()
    text = convert.to_json(result)
    assert convert.from_json(text) == result
    assert json.loads(text)["latency"]["p99_us"] == 41.0
    assert result.schema_version == schema.SCHEMA_VERSION == "1.12"


def test_result_with_latency_validates_against_the_shipped_schema() -> None:
    validate_document(json.loads(convert.to_json(_latency_result())))


def test_partial_latency_keeps_unknown_percentiles_null() -> None:
    only_mean = Latency(count=1000, mean_us=24.0)
    result = attrs.evolve(_latency_result(), latency=only_mean)
    document = json.loads(convert.to_json(result))
    validate_document(document)
    assert document["latency"] == {
        "count": 1000, "min_us": None, "mean_us": 24.0, "p50_us": None, "p90_us": None,
        "p99_us": None, "max_us": None, "lost": None, "lost_percent": None,
        "jitter_us": None, "measured_by": None, "phases": [], "increase_us": None,
        "bloat_us": None, "rpm": None, "grade": None, "samples": [], "test_start_s": None,
        "metric": None, "tail_increase_us": None, "verdict": None,
    }


def test_latency_without_count_is_rejected() -> None:
    document = json.loads(convert.to_json(_latency_result()))
    del document["latency"]["count"]
    with pytest.raises(jsonschema.ValidationError):
        validate_document(document)
    with pytest.raises(ParseError):
        convert.structure(document, Result)



def test_schema_1_1_latency_record_still_loads() -> None:
    document = json.loads(convert.to_json(_latency_result()))
    document["schema_version"] = "1.1"
    document["latency"] = {"count": 41_000, "min_us": 17.5, "mean_us": 24.25, "p50_us": 23.0,
                           "p90_us": 29.5, "p99_us": 41.0, "max_us": 88.0}
    validate_document(document)
    result = convert.structure(document, Result)
    assert result.latency is not None and result.latency.phases == ()
    assert result.latency.grade is None and result.latency.measured_by is None


def _phased_result() -> Result:
    idle = Latency(count=40, min_us=80.0, mean_us=95.0, p50_us=90.0, p90_us=110.0,
                   p99_us=130.0, max_us=140.0, lost=0, lost_percent=0.0, jitter_us=6.0)
    loaded = Latency(count=200, min_us=900.0, mean_us=150_000.0, p50_us=160_000.0,
                     p90_us=190_000.0, p99_us=199_000.0, max_us=201_000.0, lost=3,
                     lost_percent=1.5, jitter_us=900.0)
    one_way = Latency(count=200, min_us=0.0, mean_us=149_000.0, p50_us=159_000.0,
                      p90_us=189_000.0, p99_us=198_000.0, max_us=200_000.0, lost=1)
    phases = (
        LatencyPhase(name="idle", loaded=False, start_s=0.0, end_s=2.0, rtt=idle),
        LatencyPhase(name="loaded", loaded=True, start_s=2.0, end_s=12.0, rtt=loaded,
                     client_to_server=one_way, server_to_client=Latency(count=200, max_us=50.0),
                     increase_us=159_910.0, rpm=400.0, grade="C",
                     client_to_server_bits_per_second=19.1e6),
    )
    top = attrs.evolve(loaded, measured_by="netprobe-udp", phases=phases,
                       increase_us=159_910.0, rpm=400.0, grade="C")
    sample = Interval(direction="client_to_server", role="sender", stream_id=None, start_s=0.0,
                      end_s=1.0, bytes=1000, bits_per_second=8000.0,
                      latency_p50_us=150_000.0, latency_max_us=170_000.0)
    return attrs.evolve(_latency_result(), latency=top, intervals=(sample,))


def test_latency_phases_round_trip_and_validate() -> None:
    result = _phased_result()
    text = convert.to_json(result)
    assert convert.from_json(text) == result
    document = json.loads(text)
    validate_document(document)
    assert document["latency"]["phases"][1]["client_to_server"]["p99_us"] == 198_000.0
    assert document["intervals"][0]["latency_p50_us"] == 150_000.0


def test_unknown_grade_is_rejected() -> None:
    document = json.loads(convert.to_json(_phased_result()))
    document["latency"]["grade"] = "E"
    with pytest.raises(jsonschema.ValidationError):
        validate_document(document)
    with pytest.raises(ParseError):
        convert.structure(document, Result)
