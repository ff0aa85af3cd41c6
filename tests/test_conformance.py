"""The built-in tools through the plugin conformance kit (netprobe.testing), exactly as a
third-party plugin's test suite runs it: every check on every built-in tool. A tool whose
binary is not installed here has its run checks skipped (ntttcp is not packaged: the one
built from shared/peers is used, see tests/conftest.py).

Also the plugin API version: a plugin written for a newer API is listed as incompatible, with
the reason, and nothing ever instantiates, probes or runs it."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from netprobe.cli.commands.tools import tool_rows
from netprobe.errors import TestInterrupted, ToolNotFound
from netprobe.plugin import API_VERSION, Availability, Capabilities, Reporter, Tool, utc_now_iso
from netprobe.registry import Registry, load_registry
from netprobe.schema import Endpoint, FlowSummary, Result, SideSummary, TestSpec, ToolInfo
from netprobe.testing import CHECKS, CheckSkipped, ConformanceError, check_tool, checks, run_check
from netprobe.tools.iperf2 import Iperf2Tool
from netprobe.tools.iperf3 import Iperf3Tool
from netprobe.tools.native import NativeTool
from netprobe.tools.ntttcp import NtttcpTool
from netprobe.tools.nuttcp import NuttcpTool
from tests.test_cli import assert_one_error_line, child_env, netprobe_cmd
from tests.test_plugin_host import ODD, _distribution

# Rates the CPU must hold: the emulated ARM suites take turns here (scripts/arm-suite).
pytestmark = pytest.mark.rate

BUILT_INS: tuple[type[Tool], ...] = (NativeTool, NuttcpTool, Iperf2Tool, Iperf3Tool, NtttcpTool)

KNOWN_FAILURES: dict[tuple[str, str], str] = {}
"""Checks a built-in tool fails today, and why; strict: a fixed tool makes its entry fail."""

KNOWN_FLAKY = {
    ("ntttcp", "honours_capabilities"): (
        "ntttcp's -B limiter paces on average and overshoots when the CPU is busy (UDP at "
        "-B 50M: 55.9 Mbit/s seen once in about 10 runs here, beyond the kit's 10 %); its "
        "intervals, the reason this entry was first made (issue 14 item 8), are now timed "
        "by netprobe and pass"
    ),
    ("nuttcp", "honours_capabilities"): (
        "nuttcp 6.1.2 -N2 was once seen failing with 'connect: Connection refused' under "
        "load (its data connection raced the server's listen); the adapter does not retry. "
        "The other failure seen here (-u -r with 0.5 s reports) is now refused"
    ),
}
"""Checks that fail intermittently because of the tool itself: not strict."""


def _case(tool_cls: type[Tool], check: str) -> Any:
    key = (tool_cls.name, check)
    marks = []
    if key in KNOWN_FAILURES:
        marks.append(pytest.mark.xfail(reason=KNOWN_FAILURES[key], strict=True,
                                       raises=ConformanceError))
    elif key in KNOWN_FLAKY:
        marks.append(pytest.mark.xfail(reason=KNOWN_FLAKY[key], strict=False,
                                       raises=ConformanceError))
    return pytest.param(tool_cls, check, marks=marks, id=f"{tool_cls.name}-{check}")


@pytest.mark.peers
@pytest.mark.parametrize(("tool_cls", "check"),
                         [_case(cls, check) for cls in BUILT_INS for check in CHECKS])
def test_built_in_tool_conforms(tool_cls: type[Tool], check: str) -> None:
    try:
        run_check(tool_cls, check)
    except CheckSkipped as exc:
        pytest.skip(str(exc))


# --- the plugin API version -------------------------------------------------------------


class _Ext:
    """What a stevedore extension offers load_registry: name, plugin, entry_point.value."""

    def __init__(self, name: str, plugin: object) -> None:
        self.name = name
        self.plugin = plugin
        self.entry_point = type("EP", (), {"value": f"testmod:{name}"})()


def _registry_of(**plugins: object) -> Registry:
    extensions = [_Ext(name, plugin) for name, plugin in plugins.items()]
    return load_registry(lambda on_failure, names=None: extensions)


class _Current(Tool):
    """A plugin for this netprobe's API."""

    name = "current"

    def probe(self) -> Availability:
        return Availability(True)

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        raise AssertionError("never run")


class _Future(_Current):
    """Written for the next plugin API: must be listed, never instantiated or probed."""

    name = "future"
    api_version = API_VERSION + 1

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        raise AssertionError("an incompatible plugin must never be instantiated")


class _Odd(_Current):
    name = "odd"
    api_version = "2"  # type: ignore[assignment]  # not an int: cannot be compared


def test_plugin_for_a_newer_api_is_listed_as_incompatible_and_never_used() -> None:
    registry = _registry_of(current=_Current, future=_Future, odd=_Odd)
    assert registry.names() == ["current"]
    errors = {f.name: f.error for f in registry.failures}
    assert errors["future"] == (
        f"incompatible: needs plugin API {API_VERSION + 1}, this netprobe has {API_VERSION}"
    )
    assert errors["odd"].startswith("incompatible: needs plugin API 2")
    rows = {row["name"]: row for row in tool_rows(registry)}  # would crash if it probed
    assert rows["future"]["status"] == "failed" and "incompatible" in rows["future"]["error"]
    assert rows["current"]["status"] == "available"
    with pytest.raises(ToolNotFound, match="failed to load: incompatible"):
        registry.get("future")


def test_older_api_versions_still_load() -> None:
    older = type("Older", (_Current,), {"name": "older", "api_version": API_VERSION - 1})
    assert _registry_of(older=older).names() == ["older"]


def test_kit_names_an_incompatible_plugin() -> None:
    with pytest.raises(ConformanceError, match="needs plugin API"):
        run_check(_Future, "api_version")
    assert run_check(_Current, "api_version").status == "passed"


@pytest.mark.parametrize("command", [("run", "--tool", "toonew"),
                                     ("parse", "--tool", "toonew", "saved.txt")])
def test_cli_refuses_an_incompatible_plugin_with_exit_3_and_the_reason(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    _distribution(tmp_path, "oddplugins", {"toonew": "oddmod:TooNew"}, {"oddmod": ODD})
    done = netprobe_cmd(*command, env=child_env(PYTHONPATH=str(tmp_path)))
    assert done.returncode == 3
    assert_one_error_line(done.stderr)
    assert f"needs plugin API {API_VERSION + 1}, this netprobe has {API_VERSION}" in done.stderr


# --- the kit catches what it is meant to catch ------------------------------------------


class _Toy(Tool):
    """A tool that measures nothing: one second at 8 Mbit/s, made up on the spot."""

    name = "toy"
    capabilities = Capabilities(min_interval_s=None)

    def probe(self) -> Availability:
        return Availability(True, version="1")

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        self.check(spec)
        return self._result(spec, 8e6)

    def _result(self, spec: TestSpec, bps: float, status: str = "ok") -> Result:
        side = SideSummary(role="receiver", start_s=0.0, end_s=1.0, bytes=1_000_000,
                           bits_per_second=bps)
        return Result(tool=ToolInfo(self.name), spec=spec, start_time=utc_now_iso(),
                      local=Endpoint(role="client"), remote=Endpoint(role="server"),
                      status=status, duration_s=spec.duration_s,
                      summaries=(FlowSummary("client_to_server", receiver=side),))


class _KilobitsAsBits(_Toy):
    """Reports kbit/s in a bits_per_second field."""

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        return self._result(spec, 8e3)


class _Lenient(_Toy):
    """Accepts UDP although its capabilities say TCP only (and silently runs TCP)."""

    def refusals(self, spec: TestSpec) -> list[str]:
        return []


class _Leaky(_Toy):
    """Starts a helper process in its own session and forgets it on Ctrl-C."""

    started: ClassVar[list[subprocess.Popen[bytes]]] = []

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        helper = subprocess.Popen(["sleep", "60"], start_new_session=True)
        self.started.append(helper)
        reporter.note(f"helper {helper.pid}")
        try:
            deadline = time.monotonic() + (spec.duration_s or 1)
            while time.monotonic() < deadline:
                time.sleep(0.05)
        except KeyboardInterrupt:
            raise TestInterrupted("interrupted", self._result(spec, 8e6, "interrupted")) from None
        helper.kill()
        helper.wait()
        return self._result(spec, 8e6)


@pytest.fixture()
def leaked() -> Any:
    """Stops, by PID, whatever _Leaky started."""
    yield _Leaky.started
    for helper in _Leaky.started:
        if helper.poll() is None:
            helper.kill()
        helper.wait(5)
    _Leaky.started.clear()


def test_kit_passes_a_well_behaved_tool() -> None:
    outcomes = check_tool(_Toy, checks=("api_version", "probe_without_binary",
                                        "refuses_outside_capabilities", "loopback_run"))
    assert [o.status for o in outcomes] == ["passed"] * 4


def test_kit_catches_wrong_units() -> None:
    with pytest.raises(ConformanceError, match=r"bits_per_second 8000 but bytes \* 8 / seconds"):
        run_check(_KilobitsAsBits, "loopback_run")


def test_kit_catches_an_option_accepted_outside_the_capabilities() -> None:
    with pytest.raises(ConformanceError, match="protocol udp is outside the capabilities but "
                                               "check\\(\\) accepts it"):
        run_check(_Lenient, "refuses_outside_capabilities")


def test_kit_catches_a_process_left_behind_by_ctrl_c(leaked: list[Any]) -> None:
    with pytest.raises(ConformanceError, match=r"Ctrl-C left processes running: pid \d+ \(sleep"):
        run_check(_Leaky, "interrupt", long_duration_s=5.0)
    assert leaked and leaked[0].poll() is None  # found by PID while still running


class _Shadow(_Current):
    """A third-party tool published under a built-in tool's name."""

    name = "native"


@pytest.mark.parametrize("shadow_first", [True, False], ids=["shadow-first", "built-in-first"])
def test_a_built_in_tool_wins_its_name_whatever_the_load_order(shadow_first: bool) -> None:
    from netprobe.tools.native import NativeTool

    both = [_Ext("native", _Shadow), _Ext("native", NativeTool)]
    extensions = both if shadow_first else both[::-1]
    registry = load_registry(lambda on_failure, names=None: extensions)
    assert registry.get("native") is NativeTool
    (failure,) = registry.failures
    assert failure.name == "native" and failure.target == "testmod:native"
    assert "built-in" in failure.error


def test_of_two_third_party_tools_of_one_name_the_first_found_is_used() -> None:
    class _Other(_Current):
        name = "current"

    registry = load_registry(lambda on_failure, names=None: [
        _Ext("current", _Current), _Ext("current", _Other), _Ext("current", _Current)])
    assert registry.get("current") is _Current
    (failure,) = registry.failures  # the same class published twice is no conflict
    assert "found first" in failure.error


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to become another user")
def test_the_kits_congestion_algorithm_is_one_its_user_may_set() -> None:
    """The kit asked for cubic wherever the kernel had it, and an unprivileged process may
    set only the algorithms of tcp_allowed_congestion_control: on a host that lists cubic
    as available but allows bbr and reno, iperf3 -C cubic failed the kit as nobody (the
    musl suites). A child that became nobody must be able to set what the kit picks."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: nobody, then the kit's choice set on a socket
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            name = checks._a_congestion_algorithm()
            with socket.socket() as sock:
                if name is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
            os.write(write, f"ok {name}".encode())
            code = 0
        except OSError as exc:
            os.write(write, f"refused {exc}".encode())
        finally:
            os._exit(code)
    os.close(write)
    said = os.read(read, 200).decode()
    os.close(read)
    _, status = os.waitpid(child, 0)
    assert said.startswith("ok ") and os.waitstatus_to_exitcode(status) == 0, said
