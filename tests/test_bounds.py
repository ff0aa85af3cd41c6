"""Issue 33 item 11: every field a peer or a caller gives is type-checked strictly in one
place, what a far end can make the client hold is bounded by what the test asked, address
options name themselves in errors, and ``parse`` reads big saved files in bounded memory."""

from __future__ import annotations

import typing
from typing import Any

import attrs
import pytest

import netprobe
from netprobe import convert
from netprobe.errors import ParseError, SpecError
from netprobe.schema import Interval, TestSpec

from .test_hardening_round2 import ask, engine_server, request

# --- (c) every TestSpec field, every wrong type: SpecError naming the field ------------------

_WRONG = {
    int: [None, True, "2", 1.9, 2.0, [], {}, float("nan")],
    float: [None, True, "1.5", [], {}, float("nan"), float("inf")],
    str: [None, 5, 1.5, True, [], {}, b"bytes"],
    bool: [None, 1, 0, "true", 1.0, []],
}


def _cases() -> list[tuple[str, Any]]:
    hints = typing.get_type_hints(TestSpec)
    cases = []
    for a in attrs.fields(TestSpec):
        declared = hints[a.name]
        args = typing.get_args(declared)
        optional = type(None) in args
        kind = next(t for t in args if t is not type(None)) if optional else declared
        for value in _WRONG[kind]:
            if value is None and optional:
                continue
            cases.append((a.name, value))
    return cases


@pytest.mark.parametrize(("name", "value"), _cases())
def test_every_spec_field_refuses_a_wrong_type_naming_the_field(name: str, value: Any) -> None:
    base: dict[str, Any] = {"duration_s": 1.0}
    if name == "duration_s":
        base = {"bytes_total": 1000} if value is not None else {}
    with pytest.raises(SpecError, match=name):
        TestSpec(**{**base, name: value})


@pytest.mark.parametrize(("field", "value"), [
    ("protocol", "sctp"), ("direction", "sideways"), ("streams", None), ("dscp", "ef"),
    ("congestion", "c" * 65_000), ("congestion", "c" * 16), ("host", "h" * 70_000),
    ("bind_address", 4), ("ip_version", "6"), ("nodelay", "yes"),
])
def test_api_misuse_is_a_spec_error_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(SpecError, match=field):
        netprobe.run(**{field: value, "duration_s": 0.2})


@pytest.mark.parametrize("wrong", [
    {"from_host": 5}, {"tool_options": "path=/bin/x"}, {"reporter": "live"},
    {"tool": None}, {"tool": 3}, {"agent": "secret"},
])
def test_api_call_arguments_are_checked_too(wrong: dict[str, Any]) -> None:
    with pytest.raises(SpecError, match=next(iter(wrong))):
        netprobe.run(duration_s=0.2, **wrong)


def test_a_congestion_name_the_kernel_keeps_is_taken() -> None:
    assert TestSpec(congestion="c" * 15).congestion == "c" * 15


# --- (a) the one structurer is strict: what a peer sends is refused, never coerced ------------


@pytest.mark.parametrize(("spec", "word"), [
    ({"streams": "2"}, "streams"), ({"streams": 1.9}, "streams"), ({"streams": True}, "streams"),
    ({"nodelay": 1}, "nodelay"), ({"duration_s": "5"}, "duration_s"),
    ({"protocol": 6}, "protocol"), ({"congestion": "c" * 65_000}, "congestion"),
    ({"port": 5301.0}, "port"), ({"omit_s": None}, "omit_s"),
])
def test_the_server_refuses_wrong_json_types_with_the_reason(spec: dict, word: str) -> None:
    with engine_server() as server:
        reply = ask(server.port, request({"duration_s": 0.2, **spec}))
    assert reply["type"] == "error", reply
    assert word in reply["message"], reply


@pytest.mark.parametrize("sample", [
    {"bytes": "10"}, {"bytes": 1.5}, {"bytes": True}, {"stream_id": "0"},
    {"omitted": 1}, {"start_s": "0"}, {"direction": 1},
])
def test_an_interval_from_a_peer_is_checked_strictly(sample: dict) -> None:
    good = {"direction": "client_to_server", "role": "sender", "stream_id": 0,
            "start_s": 0.0, "end_s": 1, "bytes": 10, "bits_per_second": 80.0}
    assert convert.structure(good, Interval).end_s == 1.0  # an integer is a number
    with pytest.raises(ParseError, match=next(iter(sample))):
        convert.structure({**good, **sample}, Interval)
