"""netprobe.results.trials: the interleaving order, run ids and indices, failures, pauses, and
which tools a comparison leaves out (with real Tool subclasses, no mocks)."""
from __future__ import annotations

from typing import Any, ClassVar

import attrs
import pytest

from netprobe.errors import TestFailed, TestInterrupted
from netprobe.plugin import Availability, Capabilities, NullReporter, Reporter, Tool
from netprobe.results.trials import Skipped, Trial, interleave, run_trials, screen
from netprobe.schema import Result, TestSpec, ToolInfo
from tests.test_formats import sample_result

ALL = Capabilities(protocols=frozenset({"tcp", "udp"}), rate_limit=frozenset({"tcp", "udp"}),
                   min_interval_s=0.1)


class Recorder(Tool):
    """Returns a sample result and writes down, in one shared log, who ran what."""

    name = "a"
    capabilities = ALL
    log: ClassVar[list[tuple[str, TestSpec]]] = []

    def probe(self) -> Availability:
        return Availability(True, version="1")

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        Recorder.log.append((self.name, spec))
        reporter.note(f"{self.name} running")
        return attrs.evolve(sample_result(), spec=spec, tool=ToolInfo(self.name))


class B(Recorder):
    name = "b"


class C(Recorder):
    name = "c"


class FailsWithPartial(Recorder):
    name = "partial"

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        done = super().run(spec, reporter)
        raise TestFailed("reset", partial=attrs.evolve(done, status="failed", errors=("reset",)))


class FailsBare(Recorder):
    name = "bare"

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        super().run(spec, reporter)
        raise ConnectionRefusedError(111, "Connection refused")


class Interrupted(Recorder):
    name = "interrupted"

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        done = super().run(spec, reporter)
        raise TestInterrupted("interrupted", partial=attrs.evolve(done, status="interrupted"))


class CtrlC(Recorder):
    name = "ctrlc"

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        raise KeyboardInterrupt


class TcpOnly(Recorder):
    name = "tcponly"
    capabilities = Capabilities(min_interval_s=0.1)


class Missing(Recorder):
    name = "missing"

    def probe(self) -> Availability:
        return Availability(False, reasons=("binary not found on PATH",))


class BadProbe(Recorder):
    name = "badprobe"

    def probe(self) -> Availability:
        raise OSError("probe exploded")


class Events:
    """TrialEvents that write down what they were told."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def started(self, trial: Trial, total: int) -> None:
        self.seen.append(("started", trial.index, total))

    def finished(self, trial: Trial, result: Result) -> None:
        self.seen.append(("finished", trial.index, result.status))

    def failed(self, trial: Trial, message: str) -> None:
        self.seen.append(("failed", trial.index, message))


@pytest.fixture(autouse=True)
def _clear_log() -> None:
    Recorder.log.clear()


SPEC = TestSpec(duration_s=1.0)


# --- order -------------------------------------------------------------------------------


def test_interleave_runs_every_tool_once_per_round() -> None:
    plan = interleave(["a", "b", "c"], 3)
    assert [t.tool for t in plan] == ["a", "b", "c"] * 3
    assert [t.index for t in plan] == list(range(1, 10))
    assert [t.round for t in plan] == [1, 1, 1, 2, 2, 2, 3, 3, 3]


def test_interleave_one_tool_is_a_plain_repeat() -> None:
    assert interleave(["a"], 2) == [Trial(1, 1, "a"), Trial(2, 2, "a")]
    with pytest.raises(ValueError):
        interleave(["a"], 0)


def test_run_trials_interleaves_and_stamps_every_result() -> None:
    events = Events()
    run = run_trials(SPEC, [Recorder(), B(), C()], 2, NullReporter(), events=events)
    assert [name for name, _ in Recorder.log] == ["a", "b", "c", "a", "b", "c"]
    assert [spec.tool for _, spec in Recorder.log] == ["a", "b", "c", "a", "b", "c"]
    assert [r.tool.name for r in run.results] == ["a", "b", "c", "a", "b", "c"]
    assert [r.trial for r in run.results] == [1, 2, 3, 4, 5, 6]
    assert {r.run_id for r in run.results} == {run.run_id} and len(run.run_id) == 32
    assert run.planned == 6 and run.failed == 0 and not run.interrupted
    assert events.seen[:2] == [("started", 1, 6), ("finished", 1, "ok")]


def test_run_id_can_be_given() -> None:
    run = run_trials(SPEC, [Recorder()], 1, NullReporter(), run_id="r1")
    assert run.results[0].run_id == "r1" and run.results[0].trial == 1


def test_pause_between_trials_not_after_the_last() -> None:
    slept: list[float] = []
    run_trials(SPEC, [Recorder(), B()], 2, NullReporter(), pause_s=1.5, sleep=slept.append)
    assert slept == [1.5, 1.5, 1.5]


def test_ctrl_c_during_a_pause_stops_the_run() -> None:
    def sleep(_seconds: float) -> None:
        raise KeyboardInterrupt

    run = run_trials(SPEC, [Recorder()], 3, NullReporter(), pause_s=1, sleep=sleep)
    assert run.interrupted and len(run.results) == 1


# --- failures ----------------------------------------------------------------------------


def test_failed_trial_keeps_its_partial_and_the_run_goes_on() -> None:
    events = Events()
    run = run_trials(SPEC, [FailsWithPartial(), Recorder()], 2, NullReporter(), events=events)
    assert [r.status for r in run.results] == ["failed", "ok", "failed", "ok"]
    assert run.results[0].trial == 1 and run.results[0].run_id == run.run_id
    assert run.failed == 2 and not run.interrupted
    assert ("finished", 1, "failed") in events.seen


def test_trial_without_a_result_is_a_failure_and_the_run_goes_on() -> None:
    events = Events()
    run = run_trials(SPEC, [FailsBare(), Recorder()], 2, NullReporter(), events=events)
    assert [r.trial for r in run.results] == [2, 4]
    assert [(t.index, t.tool) for t, _ in run.failures] == [(1, "bare"), (3, "bare")]
    assert "Connection refused" in run.failures[0][1]
    assert ("failed", 1, run.failures[0][1]) in events.seen


@pytest.mark.parametrize("tool", [Interrupted, CtrlC])
def test_interruption_stops_the_run_keeping_what_was_measured(tool: type[Tool]) -> None:
    run = run_trials(SPEC, [Recorder(), tool(), B()], 3, NullReporter())
    assert run.interrupted
    assert run.results[0].tool.name == "a"
    assert len(run.results) == (2 if tool is Interrupted else 1)
    assert all(name != "b" for name, _ in Recorder.log)


# --- which tools take part ---------------------------------------------------------------


def test_screen_leaves_out_tools_with_the_reasons() -> None:
    udp = TestSpec(protocol="udp", rate_bits_per_second=1e6, duration_s=1.0)
    ready, skipped = screen([Recorder(), TcpOnly(), Missing(), BadProbe(), B()], udp)
    assert [t.name for t in ready] == ["a", "b"]
    by_name = {s.tool: s for s in skipped}
    assert list(by_name) == ["tcponly", "missing", "badprobe"]
    assert any("--udp" in r for r in by_name["tcponly"].reasons)
    assert any("--bitrate" in r for r in by_name["tcponly"].reasons)
    assert by_name["missing"].reasons == ("missing cannot run here: binary not found on PATH",)
    assert "probe exploded" in by_name["badprobe"].reasons[0]


def test_screen_checks_options_before_availability() -> None:
    # A tool that cannot honour the spec is refused for that, without probing the machine.
    class Both(TcpOnly, Missing):
        name = "both"

    _, skipped = screen([Both()], TestSpec(protocol="udp", duration_s=1.0))
    assert skipped == [Skipped("both", ("both cannot honour --udp: protocol not supported",))]
