"""Schema compatibility: a result written by schema 1.0 (before run_id, trial and latency)
still loads, and a 1.1 result with a latency distribution round-trips through JSON and
validates against the JSON Schema shipped in the package."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import attrs
import jsonschema
import pytest

from netprobe import convert, schema
from netprobe.errors import ParseError
from netprobe.schema import Endpoint, Latency, Result, TestSpec, ToolInfo

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
    jsonschema.validate(json.loads(SCHEMA_1_0_DOCUMENT), _shipped_schema())


def test_schema_1_0_document_is_rewritten_with_the_new_fields_as_null() -> None:
    again = json.loads(convert.to_json(convert.from_json(SCHEMA_1_0_DOCUMENT)))
    assert again["latency"] is None and again["run_id"] is None and again["trial"] is None
    assert again["schema_version"] == "1.0"
    jsonschema.validate(again, _shipped_schema())


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
    assert result.schema_version == schema.SCHEMA_VERSION == "1.1"


def test_result_with_latency_validates_against_the_shipped_schema() -> None:
    jsonschema.validate(json.loads(convert.to_json(_latency_result())), _shipped_schema())


def test_partial_latency_keeps_unknown_percentiles_null() -> None:
    only_mean = Latency(count=1000, mean_us=24.0)
    result = attrs.evolve(_latency_result(), latency=only_mean)
    document = json.loads(convert.to_json(result))
    jsonschema.validate(document, _shipped_schema())
    assert document["latency"] == {
        "count": 1000, "min_us": None, "mean_us": 24.0, "p50_us": None, "p90_us": None,
        "p99_us": None, "max_us": None,
    }


def test_latency_without_count_is_rejected() -> None:
    document = json.loads(convert.to_json(_latency_result()))
    del document["latency"]["count"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, _shipped_schema())
    with pytest.raises(ParseError):
        convert.structure(document, Result)

