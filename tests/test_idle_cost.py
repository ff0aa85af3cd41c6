"""What a test costs while the link, not the tester, sets the pace: checked by mechanism
(wake-ups counted by the engine, modules imported), never by time. The CPU seconds these
mechanisms save are measured by bench/engine.py's router case (docs/performance.md)."""
from __future__ import annotations

import pytest

from netprobe.engine import conduct
from netprobe.schema import TestSpec
from netprobe.tools.native import NativeTool
from tests.test_engine import Recorder

DURATION_S = 1.5
SLOW_RATE = 20e6  # a slow link's pace: the loops block, the control threads are idle


def _conductors(monkeypatch: pytest.MonkeyPatch) -> list[conduct.Conductor]:
    # Both ends of a self-test run in this process: keep each conductor to read its counts.
    seen: list[conduct.Conductor] = []
    real = conduct.Conductor.run

    def run(self: conduct.Conductor) -> conduct.Outcome:
        seen.append(self)
        return real(self)

    monkeypatch.setattr(conduct.Conductor, "run", run)
    return seen


@pytest.mark.parametrize("direction", ["normal", "reverse"])
def test_neither_end_polls_fast_while_data_flows(monkeypatch: pytest.MonkeyPatch,
                                                 direction: str) -> None:
    # A side with no sending stream says "sent" at once (it has nothing to send). The peer
    # used to take that as "the data is over" and poll every POLL_S for the whole test:
    # 20 wake-ups a second of a Python thread on a router, for nothing to drain.
    seen = _conductors(monkeypatch)
    spec = TestSpec(duration_s=DURATION_S, rate_bits_per_second=SLOW_RATE, interval_s=None,
                    direction=direction)
    result = NativeTool().run(spec, Recorder())
    assert result.status == "ok"
    assert len(seen) == 2
    idle_polls = DURATION_S / conduct.IDLE_POLL_S
    for conductor in seen:
        # Idle polls at IDLE_POLL_S through the test, and the few fast ones of the drain
        # (a TCP receiver sees EOF right after the peer's "sent").
        assert conductor.timed_out_waits <= idle_polls + 4, conductor.timed_out_waits
