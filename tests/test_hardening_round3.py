"""Issue 16, the rest: intervals streamed and bounded (item 20), the server flat over many
tests (the soak's growth), numbers from the command line that end in nonsense (item 18),
the agent's rate guard seeing every send (item 4 of the round)."""

from __future__ import annotations

import gc
import json
import sys
import weakref
from pathlib import Path

import pytest

from netprobe.driven import DrivenRun
from netprobe.engine.side import Side
from netprobe.plugin import NullReporter
from netprobe.schema import Interval

from .test_hardening_round2 import engine_server, run_spec_port

# --- the soak's growth: a finished test's objects are collected --------------------------------


def test_finished_tests_are_collected_not_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test used to gc.freeze() the heap, moving the previous tests' reference cycles
    (Session, Side, Reader, their threads) where the collector never looks: a server grew
    about 40 KiB a test for ever."""
    sides: list[weakref.ref] = []
    real_start = Side.start

    def start(self: Side) -> None:
        sides.append(weakref.ref(self))
        real_start(self)

    monkeypatch.setattr(Side, "start", start)
    with engine_server() as server:
        run_spec_port(server.port)  # the first test may freeze the start-up heap
        frozen = gc.get_freeze_count()
        for kind in ({}, {"protocol": "udp", "rate_bits_per_second": 10e6},
                     {"direction": "bidir"}):
            assert run_spec_port(server.port, **kind).status == "ok"
        assert gc.get_freeze_count() <= frozen  # nothing more out of the collector's sight
    gc.collect()
    alive = [ref() for ref in sides[2:] if ref() is not None]  # past the first test's two
    assert alive == [], f"{len(alive)} finished tests' Side objects still alive"


# --- item 20: every interval streamed as it comes, a bounded number held ------------------------


def _line_sample(n: int) -> Interval:
    return Interval(direction="client_to_server", role="sender", stream_id=None,
                    start_s=n * 0.1, end_s=(n + 1) * 0.1, bytes=1000, bits_per_second=80e3)


def test_a_driven_run_holds_a_bounded_number_of_intervals(monkeypatch: pytest.MonkeyPatch) -> None:
    from netprobe import plugin

    monkeypatch.setattr(plugin, "MAX_INTERVALS_KEPT", 100)
    delivered: list[Interval] = []

    class Counting(NullReporter):
        def interval(self, sample: Interval) -> None:
            delivered.append(sample)

    script = "for i in range(500):\n    print(i)"
    with DrivenRun(Counting(), tool="demo") as run:
        client = run.start("client", [sys.executable, "-c", script],
                           on_line=lambda line: run.emit(_line_sample(int(line))))
        assert run.wait_exit(client, 20.0) == 0
    assert len(delivered) == 500  # every sample still reached the reporter
    assert len(run.intervals) == len(run.collected()) == 100  # ... a bounded number held
    assert [s.start_s for s in run.intervals[:2]] == [0.0, 0.1]  # the first ones
    assert any("100 interval reports kept" in w and "400 more not kept" in w
               for w in run.warnings), run.warnings


def test_json_stream_writes_every_interval_as_it_comes_and_report_reads_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    from netprobe import plugin
    from netprobe.cli.main import main
    from netprobe.results.saved import load_texts

    monkeypatch.setattr(plugin, "MAX_INTERVALS_KEPT", 6)
    path = tmp_path / "run.jsonl"
    code = main(["run", "-t", "1.5", "-i", "0.1", "-P", "2", "--json-stream", "-o", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert out.splitlines() == path.read_text().splitlines()  # stdout: the same stream
    assert [e["event"] for e in (events[0], events[-1])] == ["start", "end"]
    streamed = [e["data"] for e in events if e["event"] == "interval"]
    # 15 intervals x (2 streams + their sum) x sender and receiver: every one went out
    assert len(streamed) >= 80, len(streamed)
    kept = events[-1]["data"]["intervals"]
    assert 0 < len(kept) <= 2 * 6  # the result holds at most the limit of each end
    assert any("more not kept" in w for w in events[-1]["data"]["warnings"])
    flow = events[-1]["data"]["summaries"][0]
    assert flow["receiver"]["bytes"] == sum(  # the summary covers the whole test
        i["bytes"] for i in streamed if i["role"] == "receiver" and i["stream_id"] is None)
    loaded = load_texts([(str(path), path.read_text())])
    assert [r.status for r in loaded.results] == ["ok"] and loaded.warnings == ()
    # A run cut short (no end event) still reads back, as a partial result.
    torn = "\n".join(path.read_text().splitlines()[:-1]) + "\n"
    partial = load_texts([("torn.jsonl", torn)])
    assert [r.status for r in partial.results] == ["interrupted"]
    assert len(partial.results[0].intervals) == 6 and "without its end" in partial.warnings[0]
