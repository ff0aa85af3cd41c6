"""The Python API beyond one test (docs/api.md): latency under load, bufferbloat and rrul
from ``import netprobe``, ``run_trials`` by tool name, and ``TestFailed.partial`` holding the
Result the command line writes for the same failure. Against a real ``netprobe server`` on
loopback started here, compared with what the CLI prints for the same request."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import netprobe
from netprobe.convert import to_json
from netprobe.errors import SpecError, TestFailed, ToolNotFound
from netprobe.latency.probing import ProbeOptions
from netprobe.schema import Interval, Result, TestSpec

from .servers import netprobe_server
from .test_cli import REPO, child_env, run_code

CLI = [sys.executable, "-m", "netprobe"]
BOUND_S = 60.0


def cli_json(*argv: str) -> tuple[int, dict[str, Any]]:
    """``netprobe ARGV --json``: its exit code and the one document it printed."""
    done = subprocess.run([*CLI, *argv, "--json"], capture_output=True, text=True,
                          timeout=BOUND_S, env=child_env())
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout.strip(), f"no JSON record (exit {done.returncode}): {done.stderr}"
    return done.returncode, json.loads(done.stdout)


def as_json(result: Any) -> dict[str, Any]:
    assert isinstance(result, Result), f"not a Result: {result!r}"
    loaded: dict[str, Any] = json.loads(to_json(result))
    return loaded


def keys(document: dict[str, Any], *path: str) -> set[str]:
    for name in path:
        document = document[name]
    return set(document)


def phase_names(document: dict[str, Any]) -> list[str]:
    return [phase["name"] for phase in document["latency"]["phases"]]


# --- latency under load, bufferbloat, rrul ----------------------------------------------


def test_latency_under_load_from_python_is_what_run_latency_writes() -> None:
    with netprobe_server() as server:
        result = netprobe.run("127.0.0.1", port=server.port, duration_s=1.0, interval_s=0.5,
                              latency=ProbeOptions(idle_s=0.5))
        code, printed = cli_json("run", "127.0.0.1", "-p", str(server.port), "-t", "1",
                                 "-i", "0.5", "--latency", "--latency-idle", "0.5")
    mine = as_json(result)
    assert code == 0 and mine["status"] == printed["status"] == "ok"
    assert mine["spec"] == printed["spec"]
    assert phase_names(mine) == phase_names(printed) == ["idle", "loaded"]
    assert keys(mine) == keys(printed) and keys(mine, "latency") == keys(printed, "latency")
    assert mine["latency"]["count"] > 0 and mine["latency"]["measured_by"] == \
        printed["latency"]["measured_by"]
    assert any(i["latency_p50_us"] is not None for i in mine["intervals"])


def test_latency_true_uses_the_default_probes_and_refuses_a_third_party_test() -> None:
    with pytest.raises(SpecError, match="latency cannot be combined with from_host"):
        netprobe.run("127.0.0.1", from_host="127.0.0.1", latency=True, duration_s=1.0)
    with pytest.raises(SpecError, match="latency must be True, False or a ProbeOptions"):
        netprobe.run(latency="yes", duration_s=1.0)


@pytest.mark.parametrize(("function", "command", "phases"), [
    ("run_bufferbloat", "bufferbloat", ["idle", "download", "upload", "both", "idle_tail"]),
    ("run_rrul", "rrul", ["idle", "rrul", "idle_tail"]),
])
def test_phased_tests_from_python_are_what_the_commands_write(
        function: str, command: str, phases: list[str]) -> None:
    with netprobe_server() as server:
        result = getattr(netprobe, function)("127.0.0.1", port=server.port, duration_s=1.0,
                                             idle_s=0.5, streams=1)
        code, printed = cli_json(command, "127.0.0.1", "-p", str(server.port), "-t", "1",
                                 "--idle", "0.5", "-P", "1")
    mine = as_json(result)
    assert code == 0 and mine["status"] == printed["status"] == "ok"
    assert mine["spec"] == printed["spec"]
    assert phase_names(mine) == phase_names(printed) == phases
    assert keys(mine) == keys(printed) and keys(mine, "latency") == keys(printed, "latency")
    assert mine["latency"]["grade"] is not None and mine["latency"]["verdict"] is not None
    directions = {flow["direction"] for flow in mine["summaries"]}
    assert directions == {"client_to_server", "server_to_client"}


def test_phased_tests_refuse_what_they_set_themselves() -> None:
    with pytest.raises(SpecError, match="bufferbloat sets direction itself"):
        netprobe.run_bufferbloat(direction="reverse", duration_s=1.0)
    with pytest.raises(SpecError, match="not a test spec field: colour"):
        netprobe.run_rrul(colour="blue")
    with pytest.raises(ToolNotFound, match="no tool named 'nosuch'"):
        netprobe.run_rrul(tool="nosuch")
    with pytest.raises(SpecError, match="idle_s must be seconds"):
        netprobe.run_bufferbloat(idle_s=-1)


# --- run_trials by tool name ------------------------------------------------------------


def test_run_trials_takes_tool_names() -> None:
    spec = TestSpec(tool="native", duration_s=0.5, interval_s=0.5)
    run = netprobe.run_trials(spec, ["native"], 2)
    assert [r.status for r in run.results] == ["ok", "ok"] and run.failed == 0
    assert [r.trial for r in run.results] == [1, 2]
    assert {r.tool.name for r in run.results} == {"native"}
    with pytest.raises(ToolNotFound, match="no tool named 'nosuch'"):
        netprobe.run_trials(spec, ["native", "nosuch"], 1)


# --- TestFailed.partial is what the CLI writes ------------------------------------------


def without_start(document: dict[str, Any]) -> dict[str, Any]:
    # The one field that differs between two runs of the same failure.
    assert re.match(r"\d{4}-\d\d-\d\dT", document["start_time"] or "")
    return {name: value for name, value in document.items() if name != "start_time"}


def refused(call: Any) -> Result:
    with pytest.raises(TestFailed) as caught:
        call()
    assert caught.value.partial is not None, "TestFailed.partial is None"
    return caught.value.partial


def closed_port() -> int:
    from .servers import free_port

    return free_port()


def test_a_refused_connection_leaves_the_record_run_json_writes() -> None:
    port = closed_port()
    partial = refused(lambda: netprobe.run("127.0.0.1", port=port, duration_s=1.0))
    code, printed = cli_json("run", "127.0.0.1", "-p", str(port), "-t", "1")
    assert code == 5
    assert without_start(as_json(partial)) == without_start(printed)
    assert partial.status == "failed" and "Connection refused" in partial.errors[0]


@pytest.mark.parametrize(("function", "command"), [("run_bufferbloat", "bufferbloat"),
                                                   ("run_rrul", "rrul")])
def test_a_phased_test_without_a_server_leaves_the_record_its_command_writes(
        function: str, command: str) -> None:
    port = closed_port()
    partial = refused(lambda: getattr(netprobe, function)("127.0.0.1", port=port,
                                                          duration_s=1.0, idle_s=0.5))
    code, printed = cli_json(command, "127.0.0.1", "-p", str(port), "-t", "1",
                             "--idle", "0.5")
    assert code == 5
    assert without_start(as_json(partial)) == without_start(printed)
    assert partial.status == "failed" and "no netprobe server answers" in partial.errors[0]


class KillOnFirstInterval:
    """A reporter that kills the server (by PID) once the test has measured something."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen = 0

    def interval(self, sample: Interval) -> None:
        self.seen += 1
        if self.seen == 1:
            import os
            import signal

            os.kill(self.pid, signal.SIGKILL)

    def note(self, message: str) -> None:
        pass


def wait_for_log(server: Any, needle: str, bound_s: float = 20.0) -> None:
    end = time.monotonic() + bound_s
    while needle not in server.log() and time.monotonic() < end:
        time.sleep(0.05)
    assert needle in server.log(), server.log()


def test_a_server_killed_mid_test_leaves_the_partial_result_run_json_writes() -> None:
    with netprobe_server() as server:
        killer = KillOnFirstInterval(server.pid)
        partial = refused(lambda: netprobe.run("127.0.0.1", port=server.port, duration_s=8.0,
                                               interval_s=0.5, reporter=killer))
    mine = as_json(partial)
    with netprobe_server() as server:
        child = subprocess.Popen([*CLI, "run", "127.0.0.1", "-p", str(server.port), "-t", "8",
                                  "-i", "0.5", "--json"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=child_env())
        try:
            wait_for_log(server, "native test tcp")
            time.sleep(1.5)  # let it measure an interval or two (no assertion on time)
            server.proc.kill()
            out, err = child.communicate(timeout=BOUND_S)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(5)
    printed = json.loads(out)
    assert child.returncode == 5 and "Traceback" not in err
    assert mine["status"] == printed["status"] == "failed"
    assert mine["spec"]["duration_s"] == printed["spec"]["duration_s"] == 8.0
    assert keys(mine) == keys(printed)
    assert mine["intervals"] and printed["intervals"], "nothing measured kept"
    lost = "control connection lost"
    assert any(lost in e for e in mine["errors"]) and any(lost in e for e in printed["errors"])


# --- docs/api.md: every example runs --------------------------------------------------------

DOC = Path(REPO) / "docs" / "api.md"


def doc_examples() -> list[str]:
    # None where docs/ is not beside the package (the wheels' suites test an installed
    # wheel, with tests/ copied alone): the two tests below skip there.
    if not DOC.is_file():
        return []
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


needs_docs = pytest.mark.skipif(not DOC.is_file(), reason=f"no source checkout: {DOC} absent")


@needs_docs
def test_docs_api_has_an_example_of_each_call() -> None:
    text = "\n".join(doc_examples())
    for call in ("netprobe.run(", "latency=", "netprobe.run_bufferbloat(", "netprobe.run_rrul(",
                 "netprobe.run_trials(", "exc.partial"):
        assert call in text, f"docs/api.md has no example with {call}"


@needs_docs
@pytest.mark.parametrize("index", range(len(doc_examples()) or 1))
def test_docs_api_examples_run(index: int) -> None:
    code = doc_examples()[index]
    done = run_code(code)
    assert done.stdout.strip(), f"example {index} printed nothing"
