"""Third-party plugins as the CLI really meets them: test-only distributions, made in a
temporary directory (a ``*.dist-info`` with ``entry_points.txt`` plus modules), put on the
PYTHONPATH of a real ``python -m netprobe`` process.

A plugin that fails to import, one that is not a Tool, and one written for a newer plugin
API are listed by ``netprobe tools`` with the reason, and every other command still works.
None of this ever goes into netprobe's own metadata.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from netprobe.testing import validate_document
from tests.test_cli import (
    assert_one_error_line,
    child_env,
    has_module,
    installed_tool_names,
    netprobe_cmd,
)

BROKEN = "raise ImportError('brokenmod needs libfrobnicate, which is not installed')\n"

ODD = textwrap.dedent('''
    """Plugins that import fine but cannot be used."""
    from netprobe.plugin import API_VERSION, Availability, Tool


    class NotATool:
        """Published under the tools group, but not a Tool subclass."""


    class TooNew(Tool):
        """Written for a plugin API this netprobe does not have yet."""

        name = "toonew"
        api_version = API_VERSION + 1

        def probe(self):
            return Availability(True)

        def run(self, spec, reporter):
            raise AssertionError("never run")
''')

GOOD = textwrap.dedent('''
    """Working third-party plugins: one that completes, one that fails half-way."""
    from netprobe.errors import TestFailed
    from netprobe.plugin import Availability, Capabilities, Tool, bits_per_second, utc_now_iso
    from netprobe.schema import (Endpoint, FlowSummary, Interval, Result, SideSummary,
                                 ToolInfo)


    class Echo(Tool):
        """Reports one second at 8 Mbit/s without touching the network."""

        name = "echo"
        description = "a test plugin that measures nothing"
        capabilities = Capabilities(min_interval_s=0.1)

        def probe(self):
            return Availability(True, version="9.9", details=("test plugin",))

        def run(self, spec, reporter):
            sample = Interval(direction="client_to_server", role="receiver", stream_id=1,
                              start_s=0.0, end_s=1.0, bytes=1_000_000,
                              bits_per_second=bits_per_second(1_000_000, 1.0))
            reporter.interval(sample)
            side = SideSummary(role="receiver", start_s=0.0, end_s=1.0, bytes=1_000_000,
                               bits_per_second=8e6)
            return Result(tool=ToolInfo(self.name, "9.9"), spec=spec,
                          start_time=utc_now_iso(), local=Endpoint(role="client"),
                          remote=Endpoint(role="server"), duration_s=1.0,
                          summaries=(FlowSummary("client_to_server", receiver=side),),
                          intervals=(sample,))


    class HalfWay(Echo):
        """Fails after the first second, with what it measured."""

        name = "halfway"

        def run(self, spec, reporter):
            import attrs
            partial = attrs.evolve(super().run(spec, reporter), status="failed",
                                   errors=("peer went away",))
            raise TestFailed("halfway: peer went away", partial=partial)
''')


def _distribution(root: Path, name: str, entry_points: dict[str, str],
                  modules: dict[str, str]) -> None:
    info = root / f"{name}-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0\n")
    lines = [f"{key} = {value}" for key, value in entry_points.items()]
    (info / "entry_points.txt").write_text("[netprobe.tools]\n" + "\n".join(lines) + "\n")
    for module, source in modules.items():
        (root / f"{module}.py").write_text(source)


@pytest.fixture()
def plugins(tmp_path: Path) -> dict[str, str]:
    """The environment of a netprobe process that sees the test-only plugins."""
    _distribution(tmp_path, "brokenplugin", {"broken": "brokenmod:Broken"},
                  {"brokenmod": BROKEN})
    _distribution(tmp_path, "oddplugins", {"notatool": "oddmod:NotATool",
                                           "toonew": "oddmod:TooNew"}, {"oddmod": ODD})
    good = {"echo": "goodmod:Echo", "halfway": "goodmod:HalfWay"}
    if "native" not in installed_tool_names():
        # netprobe itself is not installed: let a test distribution publish the built-in
        # native tool, so a real run happens next to the broken plugins all the same.
        good["native"] = "netprobe.tools.native:NativeTool"
    _distribution(tmp_path, "goodplugins", good, {"goodmod": GOOD})
    return child_env(PYTHONPATH=str(tmp_path))


def test_tools_lists_broken_and_incompatible_plugins(plugins: dict[str, str]) -> None:
    done = netprobe_cmd("tools", env=plugins)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert "ImportError" in rows["broken"] and "libfrobnicate" in done.stdout
    assert "failed" in rows["notatool"] and "failed" in rows["toonew"]
    assert "available" in rows["echo"]


def test_tools_json_gives_each_failure_its_error(plugins: dict[str, str]) -> None:
    done = netprobe_cmd("tools", "--json", env=plugins)
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    assert rows["broken"]["status"] == "failed"
    assert rows["broken"]["error"].startswith("ImportError: brokenmod needs libfrobnicate")
    assert rows["broken"]["target"] == "brokenmod:Broken"
    assert "not a netprobe Tool subclass" in rows["notatool"]["error"]
    assert "incompatible" in rows["toonew"]["error"]
    assert rows["echo"]["status"] == "available" and rows["echo"]["version"] == "9.9"


def test_unknown_tool_still_exit_3(plugins: dict[str, str]) -> None:
    done = netprobe_cmd("run", "--tool", "nosuchtool", env=plugins)
    assert done.returncode == 3
    assert_one_error_line(done.stderr)


def test_broken_tool_asked_for_by_name_says_why(plugins: dict[str, str]) -> None:
    done = netprobe_cmd("run", "--tool", "broken", env=plugins)
    assert done.returncode == 3
    assert_one_error_line(done.stderr)
    assert "failed to load" in done.stderr and "libfrobnicate" in done.stderr


def test_working_plugin_runs_next_to_broken_ones(plugins: dict[str, str]) -> None:
    done = netprobe_cmd("run", "--tool", "echo", "--json", env=plugins)
    assert done.returncode == 0, done.stderr
    validate_document(json.loads(done.stdout))
    human = netprobe_cmd("run", "--tool", "echo", env=plugins)
    assert human.returncode == 0, human.stderr
    assert "8.00 Mbit/s" in human.stdout and human.stdout.splitlines()[-1] == "status: ok"


def test_plugin_failing_half_way_keeps_its_partial_result(plugins: dict[str, str]) -> None:
    done = netprobe_cmd("run", "--tool", "halfway", "--json", env=plugins)
    assert done.returncode == 5
    assert json.loads(done.stdout)["status"] == "failed"
    assert_one_error_line(done.stderr)
    assert "peer went away" in done.stderr


@pytest.mark.skipif(not has_module("netprobe.tools.native"),
                    reason="netprobe.tools.native is not written yet")
def test_real_native_run_with_broken_plugins_present(plugins: dict[str, str]) -> None:
    done = netprobe_cmd("run", "--tool", "native", "-t", "1", "--json", env=plugins)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    validate_document(data)
    assert data["tool"]["name"] == "native" and data["status"] == "ok"


SHADOW = textwrap.dedent('''
    """A third-party plugin that takes the name of a built-in tool."""
    from netprobe.plugin import Availability, Tool


    class Shadow(Tool):
        """Says it is iperf3."""

        name = "iperf3"

        def probe(self):
            return Availability(True, version="6.6.6")

        def run(self, spec, reporter):
            raise AssertionError("a shadowing plugin must never run")
''')


def test_a_plugin_with_a_built_in_tools_name_is_listed_as_not_used(tmp_path: Path) -> None:
    # Before, `netprobe tools` showed whichever of the two entry points loaded last (here
    # the shadow, version 6.6.6), while `netprobe run --tool iperf3` used the built-in:
    # the list and the run disagreed about which tool the name meant.
    if "iperf3" not in installed_tool_names():
        pytest.skip("netprobe's own entry points are not installed")
    _distribution(tmp_path, "shadowplugin", {"iperf3": "shadowmod:Shadow"},
                  {"shadowmod": SHADOW})
    done = netprobe_cmd("tools", "--json", env=child_env(PYTHONPATH=str(tmp_path)))
    assert done.returncode == 0, done.stderr
    rows = [row for row in json.loads(done.stdout) if row["name"] == "iperf3"]
    used = [row for row in rows if row["status"] != "failed"]
    assert len(used) == 1 and used[0]["target"] == "netprobe.tools.iperf3.tool:Iperf3Tool"
    assert used[0]["version"] != "6.6.6"
    (shadowed,) = [row for row in rows if row["status"] == "failed"]
    assert shadowed["target"] == "shadowmod:Shadow"
    assert "built-in" in shadowed["error"] and "not used" in shadowed["error"]
    human = netprobe_cmd("tools", env=child_env(PYTHONPATH=str(tmp_path)))
    assert human.returncode == 0 and "not used" in human.stdout
