"""Capabilities.all_but: a tool's table names only what it lacks, and a name that is not a
capability fails at once instead of granting one."""
from __future__ import annotations

import attrs
import pytest

from netprobe.plugin import SWITCHES, Capabilities
from netprobe.schema import TestSpec

EVERYTHING = Capabilities.all_but(max_streams=None, min_interval_s=0.1)


@pytest.mark.parametrize("switch", SWITCHES, ids=lambda s: s.capability)
def test_nothing_missing_honours_every_switch(switch) -> None:
    spec = attrs.evolve(TestSpec(), **switch.example)
    assert EVERYTHING.refusals(spec, "t") == []


@pytest.mark.parametrize("switch", SWITCHES, ids=lambda s: s.capability)
def test_a_missing_switch_is_refused_by_its_flag(switch) -> None:
    lacking = Capabilities.all_but(switch.capability, max_streams=None, min_interval_s=0.1)
    spec = attrs.evolve(TestSpec(), **switch.example)
    assert lacking.refusals(spec, "t") == [f"t cannot honour {switch.flag}: option not supported"]
    others = {s.capability for s in SWITCHES} - {switch.capability}
    assert all(getattr(lacking, name) for name in others)


def test_every_protocol_and_direction_unless_narrowed() -> None:
    for protocol in ("tcp", "udp"):
        for direction in ("normal", "reverse", "bidir"):
            spec = TestSpec(protocol=protocol, direction=direction, streams=64,
                            bytes_total=10**6, duration_s=None,
                            rate_bits_per_second=1e6)
            assert EVERYTHING.refusals(spec, "t") == []
    narrow = Capabilities.all_but(directions=frozenset({"normal"}), max_streams=4,
                                  min_interval_s=None)
    found = narrow.refusals(TestSpec(direction="reverse", streams=8, interval_s=1.0), "t")
    assert found == ["t cannot honour --reverse: direction not supported",
                     "t cannot honour --parallel 8: at most 4 stream(s)",
                     "t cannot honour --interval: no interval reports"]


def test_missing_rate_limit_refuses_a_bitrate() -> None:
    caps = Capabilities.all_but("rate_limit", max_streams=1, min_interval_s=1.0)
    assert caps.rate_limit == frozenset()
    found = caps.refusals(TestSpec(protocol="udp", rate_bits_per_second=1e6), "t")
    assert found == ["t cannot honour --bitrate: no rate limit for udp"]


@pytest.mark.parametrize(("missing", "narrower"), [
    (("zero_copy",), {}),  # a typo
    (("protocols",), {}),  # a set is given, not left out
    ((), {"length": frozenset({"tcp"})}),
    ((), {"omit": frozenset()}),
])
def test_a_name_that_is_not_a_capability_fails(missing, narrower) -> None:
    with pytest.raises(ValueError, match="is not a"):
        Capabilities.all_but(*missing, max_streams=1, min_interval_s=1.0, **narrower)


def test_the_plain_constructor_still_starts_from_nothing() -> None:
    # Third-party plugins (plugins/netprobe-qperf) build their table field by field.
    caps = Capabilities(protocols=frozenset({"tcp", "udp"}), length=True)
    assert caps.directions == frozenset({"normal"}) and caps.max_streams == 1
    assert not caps.window and caps.port
