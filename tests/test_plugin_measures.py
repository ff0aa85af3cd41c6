"""A tool declares what it measures (``Tool.measures``: throughput, latency or both; its
``Capabilities.protocols`` may be empty, "neither"), and the conformance kit checks what
it declares and no more, and the invariants of every figure a plugin returns."""
from __future__ import annotations

from typing import Any, ClassVar

import attrs
import pytest

from netprobe.plugin import Capabilities, Reporter, Tool
from netprobe.schema import (
    FlowSummary,
    Interval,
    Latency,
    LatencyPhase,
    Result,
    SideSummary,
    TestSpec,
)
from netprobe.testing import ConformanceError, check_tool, run_check

from .latency_plugin import EchoLatency
from .test_conformance import _Toy

FAST = {"duration_s": 1.0, "long_duration_s": 5.0}


def test_a_latency_only_plugin_passes_the_kit() -> None:
    outcomes = check_tool(EchoLatency, **FAST)
    assert {o.name: o.status for o in outcomes} == {o.name: "passed" for o in outcomes}, \
        outcomes


def test_a_tool_of_neither_protocol_accepts_the_default_and_refuses_udp() -> None:
    tool = EchoLatency()
    assert tool.refusals(TestSpec(tool="echolatency", duration_s=1.0, interval_s=None)) == []
    refused = tool.refusals(TestSpec(tool="echolatency", protocol="udp", duration_s=1.0,
                                     interval_s=None))
    assert refused == ["echolatency cannot honour --udp: protocol not supported (it sends no "
                       "TCP or UDP test traffic of its own)"]


def test_the_latency_plugin_measures_what_it_declares() -> None:
    spec = TestSpec(tool="echolatency", duration_s=0.5, interval_s=None)
    result = EchoLatency().run(spec, _Quiet())
    assert result.status == "ok" and result.summaries == ()
    assert result.latency is not None and result.latency.count > 5
    assert result.latency.min_us <= result.latency.p50_us <= result.latency.max_us


class _Quiet:
    def interval(self, sample: Any) -> None:
        pass

    def note(self, message: str) -> None:
        pass


# --- broken latency plugins: each fails with the invariant it breaks named ---------------


def _broken(label: str, change: Any) -> type[Tool]:
    """EchoLatency whose result goes through ``change`` (Result -> Result)."""

    class Broken(EchoLatency):
        def result(self, spec: TestSpec, started: str, rtts: list[float], sent: int,
                   status: str) -> Result:
            return change(super().result(spec, started, rtts, sent, status))

    Broken.__name__ = Broken.__qualname__ = f"Broken_{label}"
    return Broken


def _latency(**figures: Any) -> Latency:
    return Latency(**{"count": 20, "min_us": 10.0, "mean_us": 20.0, "p50_us": 18.0,
                      "p90_us": 30.0, "p99_us": 40.0, "max_us": 48.0, **figures})


BROKEN = [
    ("p99_above_max", lambda r: attrs.evolve(r, latency=_latency(p99_us=66.7)),
     "latency: p99_us = 66.7 exceeds max_us = 48"),
    ("phase_p99_above_max",
     lambda r: attrs.evolve(r, latency=attrs.evolve(r.latency, phases=(
         LatencyPhase("idle", False, 0.0, 1.0, rtt=_latency(p99_us=66.7)),))),
     "latency phase idle rtt: p99_us = 66.7 exceeds max_us = 48"),
    ("tool_latency_mean_outside",
     lambda r: attrs.evolve(r, tool_latency=_latency(mean_us=50.0)),
     "tool_latency: mean_us = 50 lies outside min_us..max_us (10..48)"),
    ("lost_above_sent", lambda r: attrs.evolve(r, latency=_latency(lost=30, lost_percent=150.0)),
     "latency: lost_percent = 150 is not a percentage"),
    ("figures_of_nothing", lambda r: attrs.evolve(r, latency=_latency(count=0)),
     "latency: figures from a count of 0 samples"),
    ("no_latency", lambda r: attrs.evolve(r, latency=None),
     "declares it measures latency, but the result has no latency"),
    ("phases_out_of_order",
     lambda r: attrs.evolve(r, latency=attrs.evolve(r.latency, phases=(
         LatencyPhase("idle", False, 2.0, 3.0), LatencyPhase("loaded", True, 0.0, 1.0)))),
     "latency phase loaded: starts at 0 s, before the phase before it ended (3 s)"),
]


@pytest.mark.parametrize(("label", "change", "message"), BROKEN, ids=[b[0] for b in BROKEN])
def test_the_kit_names_a_broken_latency_figure(label: str, change: Any, message: str) -> None:
    with pytest.raises(ConformanceError) as caught:
        run_check(_broken(label, change), "loopback_run", **FAST)
    assert message in str(caught.value)


def test_a_declaration_outside_what_netprobe_knows_fails_the_kit() -> None:
    class Speedy(EchoLatency):
        measures: ClassVar[frozenset[str]] = frozenset({"speed"})

    with pytest.raises(ConformanceError, match="measures declares 'speed': not one of "
                                               "latency, throughput"):
        run_check(Speedy, "api_version")

    class Nothing(EchoLatency):
        measures: ClassVar[frozenset[str]] = frozenset()

    with pytest.raises(ConformanceError, match="measures declares nothing"):
        run_check(Nothing, "api_version")


# --- a throughput tool: latency it does not declare is not asked for ---------------------


class _Both(_Toy):
    """The toy throughput tool, declaring latency too, with one interval."""

    name = "toyboth"
    measures: ClassVar[frozenset[str]] = frozenset({"throughput", "latency"})
    capabilities = Capabilities(min_interval_s=None)

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        self.check(spec)
        return attrs.evolve(self._result(spec, 8e6), latency=_latency())


def test_a_tool_of_both_is_checked_for_both() -> None:
    assert run_check(_Both, "loopback_run", **FAST).status == "passed"

    class NoLatency(_Both):
        def run(self, spec: TestSpec, reporter: Reporter) -> Result:
            return attrs.evolve(super().run(spec, reporter), latency=None)

    with pytest.raises(ConformanceError, match="declares it measures latency, but the "
                                               "result has no latency"):
        run_check(NoLatency, "loopback_run", **FAST)

    class NoThroughput(_Both):
        def run(self, spec: TestSpec, reporter: Reporter) -> Result:
            return attrs.evolve(super().run(spec, reporter), summaries=())

    with pytest.raises(ConformanceError, match="no summary for the client_to_server flow"):
        run_check(NoThroughput, "loopback_run", **FAST)


class _BadCounts(_Toy):
    """A throughput tool whose figures break invariants a schema cannot state."""

    name = "toybad"
    change: ClassVar[Any] = None

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        self.check(spec)
        return type(self).change(self._result(spec, 8e6))


THROUGHPUT_BROKEN = [
    ("lost_above_sent", lambda r: attrs.evolve(r, summaries=(FlowSummary(
        "client_to_server",
        sender=SideSummary(role="sender", start_s=0.0, end_s=1.0, bytes=1_000_000,
                           bits_per_second=8e6, packets=10),
        receiver=SideSummary(role="receiver", start_s=0.0, end_s=1.0, bytes=1_000_000,
                             bits_per_second=8e6, packets=10, lost_packets=12)),)),
     "summary client_to_server: the receiver lost 12 datagrams, more than the 10 the "
     "sender sent"),
    ("interval_p50_above_max", lambda r: attrs.evolve(r, intervals=(Interval(
        direction="client_to_server", role="receiver", stream_id=None, start_s=0.0, end_s=1.0,
        bytes=1_000_000, bits_per_second=8e6, latency_p50_us=90.0, latency_max_us=40.0),)),
     "latency_p50_us = 90 exceeds latency_max_us = 40"),
]


@pytest.mark.parametrize(("label", "change", "message"), THROUGHPUT_BROKEN,
                         ids=[b[0] for b in THROUGHPUT_BROKEN])
def test_the_kit_names_a_broken_count(label: str, change: Any, message: str) -> None:
    broken = type(f"BadCounts_{label}", (_BadCounts,), {"change": staticmethod(change)})
    with pytest.raises(ConformanceError) as caught:
        run_check(broken, "loopback_run", **FAST)
    assert message in str(caught.value)


def test_tools_json_says_what_each_tool_measures() -> None:
    from netprobe.registry import Registry, tool_rows
    from netprobe.tools.native import NativeTool

    rows = tool_rows(Registry(tools={"echolatency": EchoLatency, "native": NativeTool}))
    assert {r["name"]: r["measures"] for r in rows} == {"echolatency": ["latency"],
                                                        "native": ["throughput"]}
