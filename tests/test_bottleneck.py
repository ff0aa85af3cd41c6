"""Was the tester the bottleneck? The one rule (netprobe.bottleneck) on hand-made CPU
figures, on real peer outputs through the adapters, and on real native runs."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from netprobe import core
from netprobe.bottleneck import (
    BUSY_PERCENT,
    IDLE_PERCENT,
    RATE_REACHED,
    cpu_warnings,
    pacing_notes,
    side_warning,
    with_cpu_warnings,
)
from netprobe.plugin import Availability, NullReporter, Reporter, Tool
from netprobe.schema import (
    Cpu,
    CpuUsage,
    Endpoint,
    FlowSummary,
    Result,
    SideSummary,
    TestSpec,
    ToolInfo,
)
from netprobe.session import checked, run_spec
from netprobe.tools.iperf3 import Iperf3Tool
from netprobe.tools.native import NativeTool
from netprobe.tools.nuttcp import NuttcpTool

from .budget import FRACTION


def _cpu(thread: float | None = None, total: float | None = None,
         idle: float | None = None) -> Cpu:
    return Cpu(process=CpuUsage(total_percent=total, max_thread_percent=thread),
               host=None if idle is None else CpuUsage(idle_percent=idle))


@pytest.mark.parametrize(("cpu", "bound"), [
    (_cpu(thread=BUSY_PERCENT, total=BUSY_PERCENT + 5), True),
    (_cpu(thread=60.0, total=150.0), False),  # -P 4: busy process, no thread at its limit
    (_cpu(total=97.0), True),  # only the process is known: it bounds its threads
    (_cpu(total=40.0, idle=IDLE_PERCENT - 1), True),  # no idle left on the host
    (_cpu(thread=30.0, total=31.0, idle=60.0), False),
    (None, False),
])
def test_the_rule(cpu: Cpu | None, bound: bool) -> None:
    warning = side_warning(cpu, "receiver", "client_to_server, server")
    assert (warning is not None) == bound
    if warning:
        assert warning.startswith("receiver (client_to_server, server) CPU-bound")


def _bound_sides(result: Result) -> set[str]:
    return {w.split(" CPU-bound")[0] for w in cpu_warnings(result)}


def test_nuttcp_at_98_percent_tx_warns_its_sender(peer_fixtures: Path) -> None:
    name = "nuttcp6-6.1.2-T5-client.txt"  # 98 %TX 40 %RX, unpaced
    # As `netprobe parse` reads it: the road applies the CPU rule (session.checked).
    result = checked(NuttcpTool().parse([(name, (peer_fixtures / name).read_text())]))
    assert _bound_sides(result) == {"sender (client_to_server, client)"}
    assert set(cpu_warnings(result)) <= set(result.warnings)


def test_a_flow_that_reached_the_asked_rate_is_not_cpu_bound(peer_fixtures: Path) -> None:
    # nuttcp spins to pace: a busy sender at exactly the rate asked was held by the rate.
    name = "nuttcp6-6.1.2-T5-client.txt"
    result = NuttcpTool().parse([(name, (peer_fixtures / name).read_text())])
    receiver = result.summaries[0].receiver
    assert receiver is not None
    paced = attrs.evolve(result, spec=attrs.evolve(
        result.spec, rate_bits_per_second=receiver.bits_per_second))
    assert cpu_warnings(paced) == []
    short = attrs.evolve(result, spec=attrs.evolve(
        result.spec, rate_bits_per_second=2 * receiver.bits_per_second))
    assert _bound_sides(short) == {"sender (client_to_server, client)"}


def test_iperf3_at_half_a_core_is_not_cpu_bound(peer_fixtures: Path) -> None:
    name = "iperf3-3.12-tcp-J-client.txt"  # host_total 49 %, remote_total 44 %
    result = Iperf3Tool().parse([(name, (peer_fixtures / name).read_text())])
    assert result.summaries and result.summaries[0].sender and result.summaries[0].sender.cpu
    assert cpu_warnings(result) == []


# A rate test: its sender must reach 90% of a core, which a CPU hog beside it prevents even
# at nice 19 (43% of a core when .ci/run tried the emulated checks beside the suite).
@pytest.mark.rate
@pytest.mark.skipif(FRACTION < 1, reason="a budgeted run (the ARM wheels under qemu-user): "
                    "there an unlimited loopback run can be held back by the emulator's "
                    "system calls, which shows as waiting, not as a thread's CPU (two "
                    "arm-check runs saw neither thread reach 90% of a core)")
def test_a_sender_held_by_its_own_calls_is_flagged() -> None:
    # The compiled core only: on the pure-Python path the two loops of a loopback run share
    # one interpreter lock, and at 4 KiB neither thread reached 90% of a core (69-75% and
    # 57-68%, the process at about 130%), a limit the rule does not see.
    # 4 KiB writes on loopback: each call costs the sender more than the receiver's share
    # (the receiver drains whatever has queued in one read), so the sender runs flat out
    # (97-99% of a core in 15 of 15 runs on an AMD EPYC). The default length is not used
    # here: with 256 KiB or 1 MiB calls the sender can wait on a full socket for a tenth
    # of the run (84% of a core, 2% of it waiting for a CPU, with 30% of the host idle, in
    # about 1 run of 9 there and in one CI run), which the rule rightly does not call
    # CPU-bound.
    # One more run when the first found the host busy and its sender short of a core: a
    # CI run saw the sender at 36% of a core with the host under 5% idle (flagged rightly,
    # by the host rule), the machine's time taken by something outside the test.
    if core.DATA_PATH != "c":
        pytest.skip("the compiled core is not built here")
    for _ in range(2):
        result = run_spec(NativeTool(), TestSpec(duration_s=1.0, interval_s=None,
                                                 length_bytes=4096), NullReporter())
        if not _host_busy_and_sender_short(result):
            break
    assert result.status == "ok"
    assert "sender (client_to_server, client)" in _bound_sides(result)
    assert any("CPU-bound" in w for w in result.warnings)
    sender = result.summaries[0].sender
    assert sender and sender.cpu and sender.cpu.process
    thread = sender.cpu.process.max_thread_percent
    assert thread is not None and thread >= BUSY_PERCENT


@pytest.mark.rate
def test_paced_run_is_not_flagged(data_path: str) -> None:
    result = run_spec(NativeTool(), TestSpec(duration_s=1.0, interval_s=None,
                                             rate_bits_per_second=100e6), NullReporter())
    flow = result.summaries[0]
    assert flow.sender and flow.sender.cpu and flow.sender.cpu.process
    thread = flow.sender.cpu.process.max_thread_percent
    assert thread is not None and thread < BUSY_PERCENT
    assert cpu_warnings(result) == []
    assert not any("CPU-bound" in w for w in result.warnings)


def _host_busy_and_sender_short(result: Result) -> bool:
    sender = result.summaries[0].sender if result.summaries else None
    cpu = sender.cpu if sender else None
    if cpu is None or cpu.host is None or cpu.process is None:
        return False
    idle, thread = cpu.host.idle_percent, cpu.process.max_thread_percent
    return (idle is not None and idle < IDLE_PERCENT
            and thread is not None and thread < BUSY_PERCENT)


def test_nuttcp_busy_wait_pacing_is_named_not_called_the_limit(peer_fixtures: Path) -> None:
    # nuttcp spins between writes at any set rate: a sender at 98% of a core asked for
    # 10 Mbit/s that got 9 is held by its pacing loop (or the path), not out of CPU.
    name = "nuttcp6-6.1.2-T5-client.txt"  # 98 %TX
    result = NuttcpTool().parse([(name, (peer_fixtures / name).read_text())])
    flow = result.summaries[0]
    assert flow.receiver is not None and flow.sender is not None
    short = attrs.evolve(
        result, spec=attrs.evolve(result.spec, rate_bits_per_second=10e6),
        summaries=(attrs.evolve(flow, receiver=attrs.evolve(flow.receiver,
                                                            bits_per_second=9e6)),))
    found = cpu_warnings(short)
    assert len(found) == 1 and "nuttcp paces by busy-waiting" in found[0]
    assert "CPU-bound" not in found[0]


def _paced(result: Result, rate: float | None, got: float) -> Result:
    flow = result.summaries[0]
    assert flow.receiver is not None
    return attrs.evolve(
        result, spec=attrs.evolve(result.spec, rate_bits_per_second=rate),
        summaries=(attrs.evolve(flow, receiver=attrs.evolve(flow.receiver,
                                                            bits_per_second=got)),))


@pytest.mark.parametrize("got", [9.99e6, 9e6])
def test_nuttcp_busy_wait_pacing_is_said_whether_or_not_the_rate_was_reached(
        peer_fixtures: Path, got: float) -> None:
    # 98 %TX at a set 10 Mbit/s: the figure is the pacing loop, said once, reached or not.
    name = "nuttcp6-6.1.2-T5-client.txt"
    result = _paced(NuttcpTool().parse([(name, (peer_fixtures / name).read_text())]),
                    10e6, got)
    notes = pacing_notes(result)
    assert len(notes) == 1
    assert notes[0].startswith("sender (client_to_server, client): nuttcp paces by busy-waiting")
    assert "its 98% of a core is its pacing loop" in notes[0]
    warnings = with_cpu_warnings(result).warnings
    assert notes[0] in warnings
    assert not [w for w in warnings if "CPU-bound" in w or "CPU-starved" in w
                or ("busy-waiting" in w and w != notes[0])]
    # Unpaced, or at a rate a core is short of, the same CPU is no pacing loop.
    assert pacing_notes(_paced(result, None, got)) == []
    assert pacing_notes(_paced(result, 30e9, got)) == []


def test_a_paced_nuttcp_senders_wait_is_not_called_starvation(peer_fixtures: Path) -> None:
    # A spinning pacer wants a core the whole test: on a shared core it waits, whatever
    # it sent. Its quota throttling, and its receiver's wait, still count.
    name = "nuttcp6-6.1.2-T5-client.txt"
    result = _paced(NuttcpTool().parse([(name, (peer_fixtures / name).read_text())]),
                    10e6, 9e6)
    waited = "nuttcp client CPU-starved: a data thread waited for a CPU 59% of the time"
    throttled = "nuttcp client CPU-starved: throttled by its cgroup's CPU quota for 70%"
    receiver = "nuttcp server CPU-starved: a data thread waited for a CPU 40% of the time"
    warnings = with_cpu_warnings(
        attrs.evolve(result, warnings=(waited, throttled, receiver))).warnings
    assert waited not in warnings
    assert throttled in warnings and receiver in warnings
    unpaced = _paced(result, None, 9e6)
    assert waited in with_cpu_warnings(attrs.evolve(unpaced, warnings=(waited,))).warnings


def test_a_starved_tester_that_reached_the_asked_rate_is_not_warned(data_path: str) -> None:
    # A flow held at the rate asked was not short of CPU, however long its threads
    # waited for one (a busy-waiting pacer wants a core the whole test).
    result = NativeTool().run(
        TestSpec(duration_s=1.0, interval_s=None, rate_bits_per_second=20e6), NullReporter())
    receiver = result.summaries[0].receiver
    assert receiver is not None
    starved = attrs.evolve(result, warnings=(
        *result.warnings, "tester CPU-starved: a data thread waited for a CPU 59% of the time"))
    kept = with_cpu_warnings(starved).warnings
    if receiver.bits_per_second >= RATE_REACHED * 20e6:
        assert not any("CPU-starved" in w for w in kept)
    else:  # the rate was not reached on this (loaded) host: the warning stays
        assert any("CPU-starved" in w for w in kept)


class _BusyPlugin(Tool):
    """A plugin that reports its sender at a whole core and never applies the CPU rule
    itself: the road must (session.checked), as for every tool."""

    name = "busy-plugin"

    def probe(self) -> Availability:
        return Availability(True, "1")

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        busy = Cpu(process=CpuUsage(total_percent=99.0, max_thread_percent=99.0))
        sender = SideSummary(role="sender", start_s=0.0, end_s=1.0, bytes=125_000_000,
                             bits_per_second=1e9, cpu=busy)
        receiver = SideSummary(role="receiver", start_s=0.0, end_s=1.0, bytes=125_000_000,
                               bits_per_second=1e9)
        return Result(tool=ToolInfo(self.name), spec=spec, start_time="2026-12-05T00:00:00+00:00",
                      local=Endpoint(role="client"), remote=Endpoint(role="server"),
                      summaries=(FlowSummary("client_to_server", sender, receiver),))


def test_the_road_applies_the_cpu_rule_to_a_plugins_result() -> None:
    result = run_spec(_BusyPlugin(), TestSpec(tool="busy-plugin", duration_s=1.0, interval_s=None),
                      NullReporter())
    assert any("CPU-bound" in w for w in result.warnings), result.warnings
