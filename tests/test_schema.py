"""The result schema: validation at construction, the shipped JSON Schema, JSON round trip."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netprobe import convert, schema
from netprobe.errors import ParseError, SpecError
from netprobe.limits import LONGEST_S
from netprobe.schema import (
    Cpu,
    CpuUsage,
    Endpoint,
    FlowSummary,
    Interval,
    Latency,
    RawOutput,
    Result,
    SideSummary,
    SocketInfo,
    StreamResult,
    TestSpec,
    ToolInfo,
)
from netprobe.testing import validate_document
from netprobe.tools.native import NativeTool

from .budget import scaled
from .test_engine import Recorder

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
maybe_float = st.none() | finite
maybe_int = st.none() | st.integers(min_value=-(2**53), max_value=2**63)
text = st.text(max_size=12)

specs = st.builds(
    TestSpec,
    tool=text,
    host=st.none() | text,
    protocol=st.sampled_from(schema.PROTOCOLS),
    direction=st.sampled_from(schema.DIRECTIONS),
    streams=st.integers(1, 128),
    duration_s=st.floats(0.1, LONGEST_S),
    bytes_total=st.none() | st.integers(1, 2**62),
    interval_s=st.none() | st.floats(0.1, 60),
    omit_s=st.floats(0, 60),
    length_bytes=st.none() | st.integers(16, 65507),  # a UDP datagram at most
    window_bytes=st.none() | st.integers(1, 2**30),
    rate_bits_per_second=st.none() | st.floats(1, 1e12),
    mss_bytes=st.none() | st.integers(1, 9000),
    nodelay=st.booleans(),
    dscp=st.none() | st.integers(0, 63),
    congestion=st.none() | text,
    ip_version=st.sampled_from([None, 4, 6]),
    port=st.none() | st.integers(1, 65535),
    bind_address=st.none() | text,
    zerocopy=st.booleans(),
    skip_rx_copy=st.booleans(),
)
usages = st.builds(
    CpuUsage,
    user_percent=maybe_float,
    system_percent=maybe_float,
    total_percent=maybe_float,
    softirq_percent=maybe_float,
    idle_percent=maybe_float,
    cpu_seconds=maybe_float,
)
cpus = st.none() | st.builds(Cpu, process=st.none() | usages, host=st.none() | usages)
sides = st.builds(
    SideSummary,
    role=st.sampled_from(schema.ROLES),
    start_s=finite,
    end_s=finite,
    bytes=st.integers(0, 2**63),
    bits_per_second=finite,
    retransmits=maybe_int,
    retransmits_scope=st.sampled_from([None, *schema.RETRANSMIT_SCOPES]),
    rtt_us=maybe_int,
    min_rtt_us=maybe_int,
    max_rtt_us=maybe_int,
    cwnd_bytes=maybe_int,
    packets=maybe_int,
    lost_packets=maybe_int,
    lost_percent=maybe_float,
    out_of_order_packets=maybe_int,
    duplicate_packets=maybe_int,
    jitter_ms=maybe_float,
    cpu=cpus,
)
directions = st.sampled_from(schema.FLOW_DIRECTIONS)
intervals = st.builds(
    Interval,
    direction=directions,
    role=st.sampled_from(schema.ROLES),
    stream_id=st.none() | st.integers(1, 128),
    start_s=finite,
    end_s=finite,
    bytes=st.integers(0, 2**63),
    bits_per_second=finite,
    omitted=st.booleans(),
    retransmits=maybe_int,
    rtt_us=maybe_int,
    rttvar_us=maybe_int,
    cwnd_bytes=maybe_int,
    packets=maybe_int,
    lost_packets=maybe_int,
    out_of_order_packets=maybe_int,
    jitter_ms=maybe_float,
)
results = st.builds(
    Result,
    tool=st.builds(
        ToolInfo,
        name=text,
        version=st.none() | text,
        data_path=st.none() | text,
        mode=st.none() | text,
    ),
    spec=specs,
    start_time=text,
    local=st.builds(
        Endpoint,
        role=st.just("client"),
        host=st.none() | text,
        port=st.none() | st.integers(1, 65535),
    ),
    remote=st.builds(
        Endpoint, role=st.just("server"), address=st.none() | text, system=st.none() | text
    ),
    status=st.sampled_from(schema.STATUSES),
    duration_s=maybe_float,
    summaries=st.lists(
        st.builds(
            FlowSummary, direction=directions, sender=st.none() | sides, receiver=st.none() | sides
        ),
        max_size=2,
    ).map(tuple),
    streams=st.lists(
        st.builds(
            StreamResult,
            stream_id=st.integers(1, 128),
            direction=directions,
            sender=st.none() | sides,
            receiver=st.none() | sides,
            socket=st.none()
            | st.builds(SocketInfo, mss_bytes=maybe_int, congestion=st.none() | text),
        ),
        max_size=3,
    ).map(tuple),
    intervals=st.lists(intervals, max_size=4).map(tuple),
    latency=st.none() | st.builds(Latency, count=st.integers(0, 10**6), p99_us=maybe_float),
    warnings=st.lists(text, max_size=2).map(tuple),
    errors=st.lists(text, max_size=2).map(tuple),
    raw=st.lists(
        st.builds(
            RawOutput,
            name=text,
            text=st.text(max_size=40),
            command=st.none() | st.lists(text, max_size=3).map(tuple),
            exit_code=st.none() | st.integers(-64, 255),
        ),
        max_size=2,
    ).map(tuple),
)


@settings(max_examples=scaled(150), deadline=None)
@given(results)
def test_json_round_trip(result: Result) -> None:
    assert convert.from_json(convert.to_json(result)) == result


@settings(max_examples=scaled(60), deadline=None)
@given(results)
def test_every_result_validates_against_the_schema(result: Result) -> None:
    validate_document(json.loads(convert.to_json(result)))


def test_shipped_schema_is_current() -> None:
    shipped = resources.files("netprobe").joinpath("result.schema.json").read_text()
    assert shipped == convert.schema_text(), (
        "run: python -m netprobe.convert > netprobe/result.schema.json"
    )
    jsonschema.Draft202012Validator.check_schema(json.loads(shipped))


def test_real_result_validates() -> None:
    result = NativeTool().run(TestSpec(duration_s=1.0, streams=2), Recorder())
    document = json.loads(convert.to_json(result))
    validate_document(document)  # the schema shipped in the package
    assert document["summaries"][0]["receiver"]["bytes"] > 0


def test_schema_rejects_a_wrong_document() -> None:
    bad = {
        "tool": {"name": "x"},
        "spec": {},
        "start_time": "t",
        "local": {"role": "client"},
        "remote": {"role": "nobody"},
    }
    with pytest.raises(jsonschema.ValidationError):
        validate_document(bad)
    with pytest.raises(ParseError):
        convert.structure(bad, Result)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"protocol": "sctp"},
        {"streams": 0},
        {"duration_s": -1.0},
        {"port": 70000},
        {"dscp": 64},
        {"ip_version": 5},
        {"duration_s": None},
        {"direction": "sideways"},
        {"protocol": "udp", "length_bytes": 8},
    ],
)
def test_spec_validation(kwargs: dict) -> None:
    with pytest.raises((SpecError, ValueError)):
        TestSpec(**kwargs)


def test_from_json_names_the_source() -> None:
    with pytest.raises(ParseError, match=r"saved\.json"):
        convert.from_json("{not json", source="saved.json")


def test_every_property_of_the_shipped_schema_is_described() -> None:
    # Every field has a docstring in netprobe/schema.py; the JSON Schema had none of them
    # (0 of 149 properties described), so a reader of the schema alone learnt no units.
    shipped = json.loads(resources.files("netprobe").joinpath("result.schema.json").read_text())
    undescribed = [f"{where}.{name}" for where, body in
                   [("Result", shipped), *shipped["$defs"].items()]
                   for name, prop in body.get("properties", {}).items()
                   if not prop.get("description")]
    assert undescribed == []
    assert "bits per second" in json.dumps(shipped).lower() or "bit/s" in json.dumps(shipped)


def _jsonschema_floor() -> str:
    """The lowest jsonschema netprobe's ``test`` extra allows, from the installed
    distribution's metadata (the wheel suites have no pyproject.toml), else the checkout's."""
    from tests.test_cli import REPO

    try:
        wanted = " ".join(importlib.metadata.requires("netprobe-meter") or [])
    except importlib.metadata.PackageNotFoundError:  # run from a checkout not installed
        wanted = (REPO / "pyproject.toml").read_text()
    floor = re.search(r"jsonschema\s*>=\s*([0-9.]+)", wanted)
    assert floor, f"netprobe's test extra names no jsonschema floor: {wanted[:300]}"
    return floor.group(1)


_UNDER_THE_FLOOR = r"""
import json, sys
import jsonschema
from netprobe import convert
from netprobe.testing import validate_document, validate_result

result = convert.from_json(open(sys.argv[1]).read())
try:
    validate_document({"tool": {"name": "x"}})
    refused = False
except jsonschema.ValidationError:
    refused = True
print(json.dumps({"version": jsonschema.__version__, "problems": validate_result(result),
                  "refused": refused}))
"""


@pytest.mark.slow
def test_the_kit_validates_with_the_oldest_jsonschema_its_extra_allows(
        tmp_path: Path) -> None:
    """The ``test`` extra allows the jsonschema of its floor (4.17: what pip installs where
    4.18's compiled dependency has no wheel, musllinux armv7l), which could not resolve the
    shipped schema's references under its ``urn:`` ``$id`` (RefResolutionError: unknown url
    type: ''): the conformance kit's checks, run under that version itself, failed every
    tool. Installed from the index beside the other one; skipped where pip cannot fetch."""
    from tests.test_cli import child_env

    floor = _jsonschema_floor()
    target = tmp_path / "old"
    fetched = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--target", str(target), f"jsonschema=={floor}.*", "pyrsistent"],
        capture_output=True, text=True, timeout=180)
    if fetched.returncode != 0:
        said = fetched.stderr.strip().splitlines()
        errors = [line for line in said if line.startswith("ERROR")] or said[-1:]
        pytest.skip(f"pip could not install jsonschema {floor}: {errors[:2]}")
    saved = tmp_path / "result.json"
    saved.write_text(convert.to_json(NativeTool().run(TestSpec(duration_s=0.5), Recorder())))
    done = subprocess.run([sys.executable, "-c", _UNDER_THE_FLOOR, str(saved)],
                          capture_output=True, text=True, timeout=120,
                          env=child_env(PYTHONPATH=str(target)))
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout)
    assert seen["version"].startswith(floor), seen  # the old one, not the other
    assert seen["problems"] == [] and seen["refused"], seen
