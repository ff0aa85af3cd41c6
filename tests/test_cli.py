"""The command line, in-process (``main([...])``) and as a real ``python -m netprobe`` process.

Runs against the real tools when they are there (native engine, iperf3 adapter) and,
for the paths that a real tool cannot be made to take on demand (unavailable, failing
half-way, crashing), against small Tool plugins defined here: real subclasses of the
plugin contract, handed to ``main`` through its ``registry_loader``.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import attrs
import pytest
from rich.console import Console

import netprobe
from netprobe.cli import main as cli
from netprobe.cli.main import build_parser, main, spec_from_args
from netprobe.cli.render import LiveReporter
from netprobe.convert import from_json
from netprobe.driven import free_port, wait_port
from netprobe.errors import TestFailed, TestInterrupted
from netprobe.plugin import ENTRY_POINT_GROUP, Availability, Capabilities, Reporter, Tool
from netprobe.registry import Registry, load_registry
from netprobe.schema import Result, TestSpec, ToolInfo
from netprobe.testing import validate_document
from tests.test_formats import sample_result

REPO = Path(netprobe.__file__).resolve().parent.parent
TIMEOUT = 60


# --- helpers -----------------------------------------------------------------------------


def netprobe_cmd(*args: str, timeout: float = TIMEOUT, env: dict | None = None,
                 **kwargs: Any) -> subprocess.CompletedProcess:
    """Run ``python -m netprobe ARGS`` on the netprobe these tests import."""
    return subprocess.run([sys.executable, "-m", "netprobe", *args], capture_output=True,
                          text=True, timeout=timeout, env=env or child_env(), **kwargs)


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child: the caller's ``PYTHONPATH`` first, then this netprobe,
    then the inherited path; no colours.

    The caller's entries lead because they are what its test put there on purpose (an older
    jsonschema, a plugin's distribution). ``REPO`` is the directory holding the netprobe
    these tests import: the checkout, or, where the suite runs against an installed wheel,
    site-packages itself, whose packages would otherwise shadow the caller's."""
    env = dict(os.environ)
    paths = [extra.pop("PYTHONPATH", ""), str(REPO), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    env.pop("NETPROBE_DEBUG", None)
    env.update(extra)
    return env


def run_code(code: str) -> subprocess.CompletedProcess[str]:
    """``python -c CODE`` with this netprobe; its output, checked to have exited 0."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=TIMEOUT, env=child_env())
    assert done.returncode == 0, done.stderr
    return done


def assert_one_error_line(stderr: str) -> None:
    """Exactly one ``error:`` line, and no traceback."""
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, stderr
    assert errors[0].startswith("netprobe"), stderr


def installed_tool_names() -> set[str]:
    """Names under the netprobe.tools entry-point group in the installed metadata."""
    found = importlib.metadata.entry_points()
    group = (found.select(group=ENTRY_POINT_GROUP) if hasattr(found, "select")
             else found.get(ENTRY_POINT_GROUP, []))  # Python 3.9
    return {ep.name for ep in group}


def declared_entry_points() -> list[importlib.metadata.EntryPoint]:
    """Built-in tools as pyproject.toml declares them (the source tree), else as installed."""
    pyproject = REPO / "pyproject.toml"
    if pyproject.exists():
        text = pyproject.read_text()
        section = re.search(r'^\[project\.entry-points\."netprobe\.tools"\]\n(.*?)(?=^\[|\Z)',
                            text, re.M | re.S)
        assert section, "pyproject.toml declares no netprobe.tools entry points"
        pairs = re.findall(r'^(\w+)\s*=\s*"([^"]+)"', section.group(1), re.M)
        return [importlib.metadata.EntryPoint(n, v, ENTRY_POINT_GROUP) for n, v in pairs]
    found = importlib.metadata.entry_points()
    return list(found.select(group=ENTRY_POINT_GROUP) if hasattr(found, "select")
                else found.get(ENTRY_POINT_GROUP, []))


def builtin_registry() -> Registry:
    """The built-in tools loaded in-process through load_registry (entry points need not be
    installed yet): same compatibility checks, same failure collection."""

    def manager(on_failure: Any) -> list[SimpleNamespace]:
        loaded = []
        for entry_point in declared_entry_points():
            try:
                plugin = entry_point.load()
            except Exception as exc:
                on_failure(None, entry_point, exc)
                continue
            loaded.append(SimpleNamespace(name=entry_point.name, plugin=plugin,
                                          entry_point=entry_point))
        return loaded

    return load_registry(manager)


def has_module(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


needs_native = pytest.mark.skipif(not has_module("netprobe.tools.native"),
                                  reason="netprobe.tools.native is not written yet")
needs_native_installed = pytest.mark.skipif(
    "native" not in installed_tool_names() or not has_module("netprobe.tools.native"),
    reason="native tool entry point not installed (pip install -e . --no-build-isolation)")
needs_iperf3 = pytest.mark.skipif(not has_module("netprobe.tools.iperf3"),
                                  reason="netprobe.tools.iperf3 is not written yet")
needs_server = pytest.mark.skipif(not has_module("netprobe.engine.server"),
                                  reason="netprobe.engine.server is not written yet")


def only_json_document(stdout: str) -> Any:
    """Parse stdout as exactly one JSON document (json.loads refuses trailing data)."""
    return json.loads(stdout)


def test_a_childs_own_path_comes_before_the_netprobe_under_test(tmp_path: Path) -> None:
    """A test's ``PYTHONPATH`` leads the child's path: against an installed wheel ``REPO`` is
    site-packages, and put first it shadowed the older jsonschema the schema test installed
    (the ARM wheels' suites imported 4.26.0 where 4.17.3 was asked for)."""
    code = "import json, sys; print(json.dumps(sys.path))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=TIMEOUT, env=child_env(PYTHONPATH=str(tmp_path)))
    assert done.returncode == 0, done.stderr
    path = json.loads(done.stdout)
    assert path.index(str(tmp_path)) < path.index(str(REPO)), path


# --- test plugins ------------------------------------------------------------------------

EVERYTHING = Capabilities(
    protocols=frozenset({"tcp", "udp"}), directions=frozenset({"normal", "reverse", "bidir"}),
    max_streams=None, byte_count=True, min_interval_s=0.1, omit=True,
    rate_limit=frozenset({"tcp", "udp"}), length=True, window=True, mss=True, nodelay=True,
    dscp=True, congestion=True, ipv6=True, bind=True, port=True, zerocopy=True,
    skip_rx_copy=True)


class ReplayTool(Tool):
    """Replays a recorded result for the spec it is given, intervals first."""

    name = "replay"
    capabilities = EVERYTHING
    description = "replays a recorded result"
    specs: ClassVar[list[TestSpec]] = []

    def probe(self) -> Availability:
        return Availability(True, version="1.0", path="/usr/bin/replay",
                            details=("recorded",))

    def result(self, spec: TestSpec) -> Result:
        recorded = sample_result(protocol=spec.protocol, direction=spec.direction,
                                 streams=spec.streams)
        return attrs.evolve(recorded, spec=spec, tool=ToolInfo(self.name, "1.0"))

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        type(self).specs.append(spec)
        result = self.result(spec)
        reporter.note("replaying")
        for sample in result.intervals:
            reporter.interval(sample)
        return result

    def parse(self, sources: Any) -> Result:
        spec = TestSpec(tool=self.name, host=sources[0][1].strip() or None)
        return self.result(spec)


class FailingTool(ReplayTool):
    name = "failing"

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        partial = attrs.evolve(super().run(spec, reporter), status="failed",
                               errors=("connection reset by peer",))
        raise TestFailed("replay: connection reset by peer", partial=partial)


class InterruptedTool(ReplayTool):
    name = "interrupted"

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        partial = attrs.evolve(super().run(spec, reporter), status="interrupted")
        raise TestInterrupted("interrupted", partial=partial)


class UnavailableTool(ReplayTool):
    name = "unavailable"

    def probe(self) -> Availability:
        return Availability(False, reasons=("replay binary not found on PATH",))


class TcpOnlyTool(ReplayTool):
    name = "tcponly"
    capabilities = Capabilities()


class CrashingTool(ReplayTool):
    name = "crashing"

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        raise RuntimeError("plugin bug\nsecond line")


class RefusedTool(ReplayTool):
    name = "refused"

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        raise ConnectionRefusedError(111, "Connection refused")


class CtrlCTool(ReplayTool):
    name = "ctrlc"

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        raise KeyboardInterrupt


class BadProbeTool(ReplayTool):
    name = "badprobe"

    def probe(self) -> Availability:
        raise OSError("probe exploded")


TEST_TOOLS = [ReplayTool, FailingTool, InterruptedTool, UnavailableTool, TcpOnlyTool,
              CrashingTool, RefusedTool, CtrlCTool, BadProbeTool]


def plugin_registry() -> Registry:
    """A registry of the test plugins."""
    return Registry(tools={cls.name: cls for cls in TEST_TOOLS})


def run_main(capsys: pytest.CaptureFixture[str], *args: str,
             registry: Registry | None = None) -> tuple[int, str, str]:
    """``main(args)`` in-process with the test plugins; (exit code, stdout, stderr)."""
    registry = registry or plugin_registry()
    code = main(list(args), registry_loader=lambda: registry)
    out, err = capsys.readouterr()
    return code, out, err


# --- version and help --------------------------------------------------------------------


def test_version_subprocess() -> None:
    done = netprobe_cmd("--version")
    assert done.returncode == 0
    assert done.stdout.startswith(f"netprobe {netprobe.__version__} ")
    assert re.search(r"data path: (c|python|unknown)", done.stdout)
    assert done.stderr == ""


def test_version_loads_neither_rich_nor_plugins() -> None:
    code = ("import sys\nfrom netprobe.cli.main import main\nassert main(['--version']) == 0\n"
            "heavy = [m for m in sys.modules if m.split('.')[0] in ('rich', 'stevedore') "
            "or m in ('netprobe.plugin', 'netprobe.cli.render')]\nprint(heavy)")
    done = run_code(code)
    assert done.stdout.splitlines()[-1] == "[]"


def test_only_the_chosen_command_module_is_imported() -> None:
    code = ("import sys\nfrom netprobe.cli.main import main\n"
            "assert main(['--version']) == 0\n"
            "print(sorted(m for m in sys.modules if m.startswith('netprobe.cli.commands.')))\n"
            "main(['parse', '--tool', 'nosuchtool', '/nonexistent'])\n"
            "print(sorted(m for m in sys.modules if m.startswith('netprobe.cli.commands.')))")
    done = run_code(code)
    assert done.stdout.splitlines()[-2:] == ["[]", "['netprobe.cli.commands.parse']"]


def test_version_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "--version")
    assert code == 0 and out.startswith("netprobe ")


def test_help_lists_commands_and_exit_codes() -> None:
    done = netprobe_cmd("--help")
    assert done.returncode == 0
    for word in ("run", "server", "tools", "parse", "exit codes", "130"):
        assert word in done.stdout


def test_run_help_documents_units(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "run", "--help")
    assert code == 0
    assert "1024-based" in out and "SI (1M = 1,000,000" in out
    for option in ("--time", "--bytes", "--parallel", "--udp", "--bitrate", "--length",
                   "--window", "--mss", "--nodelay", "--dscp", "--congestion", "--reverse",
                   "--bidir", "--interval", "--omit", "-4", "-6", "--port", "--bind",
                   "--zerocopy", "--skip-rx-copy", "--json", "--format", "--output"):
        assert option in out


def test_no_command_is_a_usage_error() -> None:
    done = netprobe_cmd()
    assert done.returncode == 2
    assert_one_error_line(done.stderr)


# --- bad arguments -----------------------------------------------------------------------

BAD_ARGUMENTS = [
    ["run", "--no-such-option"],
    ["run", "-t", "-5"],
    ["run", "-t=-5"],
    ["run", "-t", "0", "-n", "1k", "-k", "3"],  # -t 0 is iperf3's "forever"; -n and -k clash
    ["run", "-t", "soon"],
    ["run", "-t", "nan"],
    ["run", "-b", "fast"],
    ["run", "-b", "10x"],
    ["run", "-n", "12q"],
    ["run", "-n", "0"],
    ["run", "-l", "-1"],
    ["run", "-w", "1.5.5k"],
    ["run", "-p", "70000"],
    ["run", "-p", "0"],
    ["run", "-p", "http"],
    ["run", "-P", "0"],
    ["run", "-P", "two"],
    ["run", "-i", "-1"],
    ["run", "--dscp", "64"],
    ["run", "--dscp", "AF99"],
    ["run", "-R", "--bidir"],
    ["run", "-4", "-6"],
    ["run", "--format", "xml"],
    ["run", "-u", "-l", "8"],  # refused by TestSpec: UDP payload below 16 bytes
    ["run", "hosta", "-c", "hostb"],
    ["server", "-p", "99999"],
    ["server", "--max-tests", "0"],
    ["parse", "--tool", "replay"],
    ["tools", "--bogus"],
]


@pytest.mark.parametrize("args", BAD_ARGUMENTS, ids=" ".join)
def test_bad_arguments_in_process(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    code, out, err = run_main(capsys, *args)
    assert code == 2
    assert_one_error_line(err)
    assert out == ""


@pytest.mark.parametrize("args", [["run", "-b", "fast"], ["run", "-t", "-5"],
                                  ["run", "-p", "70000"], ["run", "--bogus"]], ids=" ".join)
def test_bad_arguments_subprocess(args: list[str]) -> None:
    done = netprobe_cmd(*args)
    assert done.returncode == 2
    assert_one_error_line(done.stderr)
    assert done.stdout == ""


# --- spec mapping ------------------------------------------------------------------------


def _spec(*args: str) -> TestSpec:
    return spec_from_args(build_parser().parse_args(["run", *args]))


def test_defaults_make_the_default_spec() -> None:
    assert _spec() == TestSpec()


def test_every_option_reaches_the_spec() -> None:
    spec = _spec("192.0.2.9", "--tool", "iperf3", "-t", "5", "-n", "1M", "-P", "4", "-u",
                 "-b", "100M", "-l", "1.5k", "-w", "4m", "-M", "1400", "-N", "--dscp", "AF41",
                 "-C", "bbr", "-R", "-i", "0.5", "-O", "2", "-6", "-p", "5999", "-B", "::1",
                 "-Z", "--skip-rx-copy")
    assert spec == TestSpec(
        tool="iperf3", host="192.0.2.9", protocol="udp", direction="reverse", streams=4,
        duration_s=5.0, bytes_total=1024 * 1024, interval_s=0.5, omit_s=2.0,
        length_bytes=1536, window_bytes=4 * 1024 * 1024, rate_bits_per_second=100e6,
        mss_bytes=1400, nodelay=True, dscp=34, congestion="bbr", ip_version=6, port=5999,
        bind_address="::1", zerocopy=True, skip_rx_copy=True)


def test_byte_count_replaces_the_default_duration() -> None:
    spec = _spec("-n", "64k")
    assert spec.bytes_total == 65536 and spec.duration_s is None


def test_zero_interval_and_zero_rate_mean_none() -> None:
    spec = _spec("-i", "0", "-b", "0", "-c", "example.net", "--bidir", "-4")
    assert spec.interval_s is None and spec.rate_bits_per_second is None
    assert spec.host == "example.net" and spec.direction == "bidir" and spec.ip_version == 4


# --- run with test plugins ---------------------------------------------------------------


def test_run_json_is_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "run", "--tool", "replay", "-t", "2", "--json")
    assert code == 0, err
    data = only_json_document(out)
    validate_document(data)
    assert data["status"] == "ok" and data["spec"]["duration_s"] == 2.0
    assert err == ""  # NullReporter: the note did not leak either


def test_run_human_prints_intervals_then_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "run", "--tool", "replay", "-t", "2", "--bidir")
    assert code == 0, err
    lines = out.splitlines()
    interval_lines = [line for line in lines if re.search(r"\d+\.\d\d-\d+\.\d\d\s+s", line)]
    assert len(interval_lines) == 8  # 2 s x 2 directions x sender/receiver
    assert any("s->c" in line for line in interval_lines)
    assert lines.index(interval_lines[-1]) < next(
        i for i, line in enumerate(lines) if "Bitrate" in line and "Role" in line
        and i > lines.index(interval_lines[-1]))
    assert lines[-1] == "status: ok"
    assert "replaying" in err  # notes go to stderr


def test_run_several_streams_shows_sums_unless_per_stream(
        capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_main(capsys, "run", "--tool", "replay", "-P", "3")
    assert "[SUM]" in out and "[  2]" not in out
    _, out, _ = run_main(capsys, "run", "--tool", "replay", "-P", "3", "--per-stream")
    assert "[SUM]" in out and "[  2]" in out


def test_run_csv_and_jsonl(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "run", "--tool", "replay", "--format", "csv", "--bidir")
    assert code == 0
    assert len(out.splitlines()) == 3 and out.startswith("start_time,")
    code, out, _ = run_main(capsys, "run", "--tool", "replay", "--format", "jsonl")
    assert code == 0 and len(out.splitlines()) == 1
    assert from_json(out).status == "ok"


def test_run_output_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "log.jsonl"
    for _ in range(2):
        code, out, _ = run_main(capsys, "run", "--tool", "replay", "--format", "jsonl",
                                "-o", str(target))
        assert code == 0 and from_json(out).status == "ok"  # stdout gets it as well
    assert len(target.read_text().splitlines()) == 2
    code, out, _ = run_main(capsys, "run", "--tool", "replay", "--json", "-q",
                            "-o", str(tmp_path / "r.json"))
    assert code == 0 and out == ""
    assert from_json((tmp_path / "r.json").read_text()).status == "ok"


def test_unwritable_output_is_exit_6(capsys: pytest.CaptureFixture[str],
                                     tmp_path: Path) -> None:
    code, out, err = run_main(capsys, "run", "--tool", "replay", "--json",
                              "-o", str(tmp_path / "missing" / "r.json"))
    assert code == 6
    assert_one_error_line(err)
    assert "missing" in err
    assert out == ""  # checked before the test: nothing was measured, nothing is lost


def test_unknown_tool_is_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "run", "--tool", "nosuchtool")
    assert code == 3 and out == ""
    assert_one_error_line(err)
    assert "nosuchtool" in err and "replay" in err  # says what is installed


def test_unknown_tool_subprocess() -> None:
    done = netprobe_cmd("run", "--tool", "nosuchtool", "-t", "1")
    assert done.returncode == 3
    assert_one_error_line(done.stderr)


def test_unavailable_tool_is_exit_4(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "run", "--tool", "unavailable")
    assert code == 4
    assert_one_error_line(err)
    assert "replay binary not found" in err


def test_probe_that_raises_is_exit_4(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "run", "--tool", "badprobe")
    assert code == 4 and "probe exploded" in err


def test_refused_option_is_exit_2_naming_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "run", "--tool", "tcponly", "-u", "-R")
    assert code == 2
    assert_one_error_line(err)
    assert "--udp" in err and "--reverse" in err


@pytest.mark.parametrize("fmt", ["json", "human", "csv"])
def test_failed_test_prints_partial_then_error(capsys: pytest.CaptureFixture[str],
                                               fmt: str) -> None:
    code, out, err = run_main(capsys, "run", "--tool", "failing", "--format", fmt)
    assert code == 5
    assert_one_error_line(err)
    assert "connection reset by peer" in err
    if fmt == "json":
        assert only_json_document(out)["status"] == "failed"
    elif fmt == "human":
        assert out.splitlines()[-1] == "status: failed"
    else:
        assert ",failed," in out


def test_failed_test_saves_partial_to_file(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    code, _, _ = run_main(capsys, "run", "--tool", "failing", "--json", "-o", str(target))
    assert code == 5
    assert from_json(target.read_text()).status == "failed"


def test_interrupted_test_is_130_with_partial(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "run", "--tool", "interrupted", "--json")
    assert code == 130
    assert only_json_document(out)["status"] == "interrupted"
    assert_one_error_line(err)


def test_ctrl_c_outside_a_tool_is_130(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "run", "--tool", "ctrlc")
    assert code == 130 and out == ""
    assert_one_error_line(err)
    assert "interrupted" in err


def test_system_error_during_a_test_is_a_failed_test(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "run", "--tool", "refused")
    assert code == 5
    assert_one_error_line(err)
    assert "Connection refused" in err


def test_plugin_crash_is_exit_1_one_line(capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NETPROBE_DEBUG", raising=False)
    code, _, err = run_main(capsys, "run", "--tool", "crashing")
    assert code == 1
    assert_one_error_line(err)
    assert "internal error: RuntimeError: plugin bug second line" in err


def test_netprobe_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETPROBE_DEBUG", "1")
    code, _, err = run_main(capsys, "run", "--tool", "crashing")
    assert code == 1
    assert "Traceback" in err and "RuntimeError" in err


def test_live_reporter_prints_each_interval_once_both_sides_sent_it() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, color_system=None)
    reporter = LiveReporter(TestSpec(streams=1), console=console, notes=console)
    samples = sample_result().intervals
    reporter.interval(samples[1])  # the receiver's line of 0-1 s came first: held back
    assert reporter.lines == 0
    reporter.interval(samples[0])
    assert "0.00-1.00" in buffer.getvalue() and reporter.lines == 2
    assert buffer.getvalue().index(" sender ") < buffer.getvalue().index(" receiver ")
    reporter.interval(samples[0])  # the same span again (a sum equal to the stream)
    assert reporter.lines == 2
    reporter.interval(samples[2])
    reporter.finish()  # the test is over: what is held back is drawn
    assert reporter.lines == 3


# --- tools -------------------------------------------------------------------------------


def test_tools_table_lists_every_tool_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "tools")
    assert code == 0
    for cls in TEST_TOOLS:
        assert cls.name in out
    assert "replay binary not found" in out and "probe exploded" in out


def test_tools_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "tools", "--json")
    assert code == 0
    rows = {row["name"]: row for row in json.loads(out)}
    assert rows["replay"]["status"] == "available" and rows["replay"]["version"] == "1.0"
    assert rows["replay"]["path"] == "/usr/bin/replay"
    assert rows["unavailable"]["status"] == "unavailable"
    assert rows["unavailable"]["reasons"] == ["replay binary not found on PATH"]


def test_tools_lists_the_builtin_tools(capsys: pytest.CaptureFixture[str]) -> None:
    registry = builtin_registry()
    code, out, _ = run_main(capsys, "tools", "--json", registry=registry)
    assert code == 0
    listed = {row["name"]: row for row in json.loads(out)}
    declared = {ep.name for ep in declared_entry_points()}
    assert declared >= {"native", "iperf3", "iperf2", "nuttcp", "ntttcp"}
    assert set(listed) == declared  # each loaded or listed with its load error
    for name, row in listed.items():
        assert row["status"] in ("available", "unavailable", "failed"), name
        if row["status"] == "failed":
            assert row["error"], name


@pytest.mark.skipif(not installed_tool_names(),
                    reason="entry points not installed (pip install -e . --no-build-isolation)")
def test_tools_subprocess_lists_installed_tools() -> None:
    done = netprobe_cmd("tools", "--json")
    assert done.returncode == 0, done.stderr
    assert {row["name"] for row in json.loads(done.stdout)} >= installed_tool_names()
    table = netprobe_cmd("tools")
    assert table.returncode == 0
    for name in installed_tool_names():
        assert name in table.stdout


# --- parse -------------------------------------------------------------------------------


def test_parse_prints_the_result(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = tmp_path / "client.txt"
    source.write_text("192.0.2.44\n")
    code, out, _ = run_main(capsys, "parse", "--tool", "replay", str(source), "--json")
    assert code == 0
    assert only_json_document(out)["spec"]["host"] == "192.0.2.44"
    code, out, _ = run_main(capsys, "parse", "--tool", "replay", str(source))
    assert code == 0 and "0.00-1.00" in out and out.splitlines()[-1] == "status: ok"


def test_parse_unreadable_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    code, out, err = run_main(capsys, "parse", "--tool", "replay", str(missing))
    assert code == 2 and out == ""
    assert_one_error_line(err)
    assert "nope.txt" in err


@needs_iperf3
def test_parse_real_iperf3_output(capsys: pytest.CaptureFixture[str],
                                  peer_fixtures: Path) -> None:
    client = peer_fixtures / "iperf3-3.12-tcp-J-client.txt"
    code, out, err = run_main(capsys, "parse", "--tool", "iperf3", str(client), "--json",
                              registry=builtin_registry())
    assert code == 0, err
    data = only_json_document(out)
    validate_document(data)
    assert data["tool"]["name"] == "iperf3"


# --- real tools --------------------------------------------------------------------------


def _check_result_document(stdout: str, tool: str) -> dict:
    data = only_json_document(stdout)
    validate_document(data)
    assert data["tool"]["name"] == tool and data["status"] == "ok"
    flow = from_json(stdout).summary("client_to_server")
    assert flow is not None and flow.receiver is not None and flow.receiver.bytes > 0
    return data


@needs_native
def test_run_native_json_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "run", "--tool", "native", "-t", "2", "--json",
                              registry=builtin_registry())
    assert code == 0, err
    _check_result_document(out, "native")


@needs_native_installed
def test_run_native_json_subprocess() -> None:
    done = netprobe_cmd("run", "--tool", "native", "-t", "2", "--json")
    assert done.returncode == 0, done.stderr
    _check_result_document(done.stdout, "native")


@needs_native_installed
def test_run_native_human_lines_arrive_live() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "netprobe", "run", "--tool", "native",
                             "-t", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env())
    try:
        assert proc.stdout is not None
        first = ""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not re.search(r"\d-\s*\d", first):
            first = proc.stdout.readline()
            if not first:
                break
        assert proc.poll() is None, "no interval line before the test ended"
        rest, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert rest.splitlines()[-1] == "status: ok"


@needs_native_installed
def test_closed_stdout_is_exit_6_without_traceback() -> None:
    # `netprobe run | head -1`: the reader goes away while interval lines are printed.
    proc = subprocess.Popen([sys.executable, "-m", "netprobe", "run", "--tool", "native",
                             "-t", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env())
    try:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read()
        proc.wait(TIMEOUT)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 6, err
    assert "Traceback" not in err and "Exception" not in err


@needs_native_installed
def test_ctrl_c_during_a_native_run() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "netprobe", "run", "--tool", "native",
                             "-t", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env())
    try:
        assert proc.stdout is not None
        line = ""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "sender" not in line and "receiver" not in line:
            line = proc.stdout.readline()
            if not line:
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err
    assert_one_error_line(err)
    assert "status: interrupted" in out  # the partial result is shown


@needs_iperf3
@pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 binary not on PATH")
def test_run_iperf3_against_its_server(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    server = subprocess.Popen(["iperf3", "-s", "-1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_port("127.0.0.1", port, 10), "iperf3 server did not start"
        code, out, err = run_main(capsys, "run", "127.0.0.1", "--tool", "iperf3", "-p",
                                  str(port), "-t", "2", "--json", registry=builtin_registry())
        assert code == 0, err
        _check_result_document(out, "iperf3")
    finally:
        server.terminate()
        server.wait(10)


# --- server ------------------------------------------------------------------------------


def _start_server(*args: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-m", "netprobe", "server", "-B", "127.0.0.1",
                             "-p", "0", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env())
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"listening on .* port (\d+)", line)
    if not match:
        proc.kill()
        out, err = proc.communicate(timeout=TIMEOUT)
        raise AssertionError(f"server did not start: {line}{out}{err}")
    return proc, int(match.group(1))


@needs_server
def test_server_stops_quietly_on_ctrl_c() -> None:
    proc, _ = _start_server()
    try:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0
    assert "Traceback" not in err and "stopped" in err


@needs_server
@needs_native_installed
def test_server_one_off_serves_a_run() -> None:
    proc, port = _start_server("-1")
    try:
        done = netprobe_cmd("run", "127.0.0.1", "-p", str(port), "-t", "1", "--json")
        assert done.returncode == 0, done.stderr
        _check_result_document(done.stdout, "native")
        proc.wait(TIMEOUT)  # one-off: it exits by itself after the test
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 0


def test_server_port_in_use_is_one_line(tmp_path: Path) -> None:
    if not has_module("netprobe.engine.server"):
        pytest.skip("netprobe.engine.server is not written yet")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = netprobe_cmd("server", "-B", "127.0.0.1", "-p", str(port), "-1", timeout=30)
    assert done.returncode not in (0, 2)
    assert_one_error_line(done.stderr)


def test_exit_codes_are_documented() -> None:
    doc = cli.__doc__ or ""
    for code in cli.EXIT_CODES:
        assert re.search(rf"^\s*{code}\s", doc, re.M), code


def test_server_options_reach_the_server_config() -> None:
    # Every limit flag sets its ServerConfig field (one table makes both the options and
    # the keywords); what is not given stays at the config's default.
    from netprobe.cli.commands.server import _server_options
    from netprobe.engine.server import ServerConfig

    args = build_parser("server").parse_args([
        "server", "-p", "5999", "--max-tests", "3", "--max-duration", "60",
        "--max-streams", "8", "--max-rate", "10M", "--max-connections-per-address", "4",
        "--max-message-bytes", "4096", "--max-memory", "64M", "--handshake-timeout", "2",
        "--idle-timeout", "7"])
    config = ServerConfig(**_server_options(args))
    assert (config.port, config.max_tests, config.max_duration_s, config.max_streams) == \
        (5999, 3, 60.0, 8)
    assert (config.max_rate_bps, config.max_connections_per_address) == (10e6, 4)
    assert (config.max_message_bytes, config.max_memory_bytes) == (4096, 64 * 2**20)
    assert (config.handshake_timeout_s, config.idle_timeout_s) == (2.0, 7.0)
    plain = ServerConfig(**_server_options(build_parser("server").parse_args(["server"])))
    assert plain == attrs.evolve(ServerConfig(), secret=plain.secret)
