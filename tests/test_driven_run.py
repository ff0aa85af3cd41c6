"""DrivenRun, the one lifecycle of a driven tool, on real subprocesses: the thread the
reporter is called from, a failing reporter, readiness, deadlines, Ctrl-C, stopping by PID."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from netprobe.driven import DrivenRun, free_port, listening, printed
from netprobe.errors import ToolNotFound
from netprobe.registry import load_registry
from netprobe.schema import Interval, TestSpec

from .interrupts import ctrl_c_after
from .test_driven import _alive

PY = sys.executable


def _sample(n: int) -> Interval:
    return Interval(direction="client_to_server", role="sender", stream_id=None,
                    start_s=float(n), end_s=n + 1.0, bytes=1000, bits_per_second=8000.0)


class Recorder:
    """Records which thread calls it; raises on the interval call number ``fail_at``."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.threads: list[int] = []
        self.notes: list[str] = []
        self.fail_at = fail_at

    def interval(self, sample: Interval) -> None:
        self.threads.append(threading.get_ident())
        if self.fail_at is not None and len(self.threads) == self.fail_at:
            raise RuntimeError("the screen went away")

    def note(self, message: str) -> None:
        self.notes.append(message)


def _counting_client(run: DrivenRun, lines: int) -> None:
    script = f"import time\nfor i in range({lines}):\n    print(i, flush=True); time.sleep(0.02)"
    client = run.start("client", [PY, "-c", script],
                       on_line=lambda line: run.emit(_sample(int(line))))
    assert run.wait_exit(client, 10.0) == 0


def _own(warnings: list[str]) -> list[str]:
    """The run's warnings but a starvation one: whether the demo client waited for a CPU
    is the host's doing (the emulated ARM suite on a loaded host flags its start-up)."""
    return [w for w in warnings if "CPU-starved" not in w]


def test_intervals_reach_the_reporter_on_the_thread_that_runs() -> None:
    reporter = Recorder()
    with DrivenRun(reporter, tool="demo") as run:
        _counting_client(run, 5)
    assert reporter.threads == [threading.get_ident()] * 5
    assert [s.start_s for s in run.collected()] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert any("demo client started (pid" in note for note in reporter.notes)
    assert _own(run.warnings) == [] and not run.interrupted and not run.timed_out


def test_a_failing_reporter_is_a_warning_and_nothing_is_lost() -> None:
    reporter = Recorder(fail_at=2)
    with DrivenRun(reporter, tool="demo") as run:
        _counting_client(run, 5)
    assert len(reporter.threads) == 2  # not called again after it failed
    assert len(run.collected()) == 5
    warnings = _own(run.warnings)
    assert len(warnings) == 1 and "RuntimeError: the screen went away" in warnings[0]


def test_server_ready_by_port_then_everything_stopped() -> None:
    port = free_port()
    script = (f"import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', {port}))\n"
              "s.listen()\nprint('listening', flush=True)\ntime.sleep(60)")
    with DrivenRun(Recorder(), tool="demo") as run:
        server = run.start("server", [PY, "-c", script])
        assert run.wait_ready(server, listening([(port, False)], 2), 10.0)
        assert run.wait_ready(server, printed(lambda line: line == "listening"), 5.0)
    assert server.returncode is not None and not _alive(server.pid)


def test_a_server_that_exits_is_not_ready() -> None:
    with DrivenRun(Recorder(), tool="demo") as run:
        server = run.start("server", [PY, "-c", "print('bad option')"])
        assert not run.wait_ready(server, printed(lambda line: "listening" in line), 10.0)
    assert server.returncode == 0


def test_deadline_stops_the_client() -> None:
    with DrivenRun(Recorder(), tool="demo") as run:
        client = run.start("client", [PY, "-c", "import time; time.sleep(60)"])
        started = time.monotonic()
        assert run.wait_exit(client, 0.3) is not None
    assert run.timed_out and time.monotonic() - started < 10
    assert not _alive(client.pid)


def test_ctrl_c_sets_interrupted_and_stops_every_process() -> None:
    both = threading.Event()
    with ctrl_c_after(0.5, started=both), DrivenRun(Recorder(), tool="demo") as run:
        server = run.start("server", [PY, "-c", "import time; time.sleep(60)"])
        client = run.start("client", [PY, "-c", "import time; time.sleep(60)"])
        both.set()
        run.wait_exit(client, 30.0)
    assert run.interrupted and not run.timed_out
    assert not _alive(server.pid) and not _alive(client.pid)
    assert [raw.name for raw in run.raw()] == ["server", "client"]


# --- every driven tool keeps the contract -----------------------------------------------

DRIVEN = ["ntttcp", "nuttcp", "iperf2", "iperf3", "qperf"]
"""The tools built on DrivenRun (qperf: the example plugin, when it is installed)."""


@pytest.mark.peers
@pytest.mark.parametrize("name", DRIVEN)
def test_a_failing_reporter_costs_no_result(name: str) -> None:
    # It used to escape ntttcp's and nuttcp's runs as an internal error: exit 1, the
    # partial result lost.
    try:
        tool = load_registry(only=name).get(name)()
    except ToolNotFound as exc:
        pytest.skip(str(exc))
    if not tool.probe().available:
        pytest.skip(f"{name} cannot run here: {'; '.join(tool.probe().reasons)}")
    reporter = Recorder(fail_at=1)
    result = tool.run(TestSpec(tool=name, duration_s=2.0, interval_s=0.5), reporter)
    assert result.status == "ok"
    assert reporter.threads == [threading.get_ident()]
    assert any("the live reporter failed" in warning for warning in result.warnings)
    assert len(result.intervals) >= len(reporter.threads)  # what it saw is in the result
