"""What ``netprobe run`` loads before its first byte: only what the run needs.

On a 100 Mbit/s router link a Python start-up of a few tenths of a CPU second is most of
what the sending end costs, so the start-up is checked by mechanism here (which modules a
run imports, what the registry reads) and measured in bench/engine.py, never timed here.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from netprobe.plugin import ENTRY_POINT_GROUP, load_registry, own_entry_points
from tests.servers import netprobe_server
from tests.test_cli import TIMEOUT, child_env, run_code

# Modules a `netprobe run --json` with a built-in tool has no use for: rich draws only
# the human output; stevedore and importlib.metadata read every installed distribution's
# entry points, which a built-in tool named on the command line does not need; the driven
# tools' process and session glue (the native client needs netprobe.driven's
# is_local_host only); tempfile for -o FILE; hashlib for a shared secret; statistics
# (with fractions and decimal) for one mean.
NOT_FOR_A_JSON_RUN = ("rich", "stevedore", "importlib.metadata", "cattrs",
                      "netprobe.driven.process", "netprobe.driven.session", "tempfile",
                      "hashlib", "statistics")


def _loaded_after(argv: list[str]) -> tuple[int, list[str], str]:
    code = textwrap.dedent(f"""\
        import contextlib, io, json, sys
        from netprobe.cli.main import main
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main({argv!r})
        heavy = sorted(set(sys.modules) & set({NOT_FOR_A_JSON_RUN!r}))
        print(json.dumps([code, heavy, out.getvalue()]))
        """)
    done = run_code(code)
    code_, heavy, out = json.loads(done.stdout.splitlines()[-1])
    return code_, heavy, out


def test_a_json_run_of_a_built_in_tool_loads_no_renderer_and_scans_no_distributions() -> None:
    with netprobe_server("-1") as server:
        code, heavy, out = _loaded_after(
            ["run", "127.0.0.1", "-p", str(server.port), "-t", "0.3", "-i", "0", "--json"])
    assert code == 0
    assert json.loads(out)["tool"]["name"] == "native"
    assert heavy == []


def test_the_built_in_tools_come_from_netprobes_own_metadata() -> None:
    own = own_entry_points()
    assert own["native"] == "netprobe.tools.native:NativeTool"
    assert {"native", "iperf3", "iperf2", "nuttcp", "ntttcp"} <= set(own)
    assert own_entry_points("no.such.group") == {}


def test_a_third_party_plugin_named_on_the_command_line_is_still_found(tmp_path: Path) -> None:
    # A real distribution on sys.path (metadata and module), found the way pip installs it.
    (tmp_path / "npthird.py").write_text(textwrap.dedent("""\
        from netprobe.tools.native import NativeTool

        class ThirdTool(NativeTool):
            name = "thirdparty"
        """))
    info = tmp_path / "npthird-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: npthird\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\nthirdparty = npthird:ThirdTool\n")
    code = ("import sys\nfrom netprobe.plugin import load_registry\n"
            "r = load_registry(only='thirdparty')\n"
            "print(r.names(), [f.name for f in r.failures])")
    env = child_env(PYTHONPATH=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=TIMEOUT, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "['thirdparty'] []"


def test_metadata_of_another_netprobe_version_is_not_trusted(tmp_path: Path) -> None:
    # Stale metadata of another version first on sys.path: not read as this netprobe's own;
    # the registry falls back to stevedore's scan (which decides as importlib.metadata does).
    info = tmp_path / "netprobe-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: netprobe\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nnative = gone:Tool\n")
    code = (f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
            "from netprobe.plugin import load_registry, own_entry_points\n"
            "load_registry(only='native')\n"
            "print(own_entry_points(), 'stevedore' in sys.modules)")
    done = run_code(code)
    assert done.stdout.splitlines()[-1] == "{} True"


def test_a_built_in_tool_that_fails_to_import_is_a_load_failure() -> None:
    def factory(on_failure, names=None):  # type: ignore[no-untyped-def]
        from netprobe.plugin import _load_own

        ext = _load_own("broken", "netprobe.tools.no_such_module:Tool", on_failure)
        return [ext] if ext is not None else []

    registry = load_registry(factory, only="broken")
    assert registry.tools == {}
    assert [f.name for f in registry.failures] == ["broken"]
    assert registry.failures[0].target == "netprobe.tools.no_such_module:Tool"
    assert "ModuleNotFoundError" in registry.failures[0].error


def test_the_lazy_driven_package_serves_every_public_name() -> None:
    # netprobe.driven imports each name's module on first use: every name of __all__ must
    # come from there, as the same object its module has, and nothing else may appear.
    code = textwrap.dedent("""\
        import importlib, sys
        import netprobe.driven as driven
        assert "netprobe.driven.process" not in sys.modules
        wrong = []
        for name in driven.__all__:
            value = getattr(driven, name)
            module = importlib.import_module(f"netprobe.driven.{driven._WHERE[name]}")
            if value is not getattr(module, name):
                wrong.append(name)
        print(sorted(driven._WHERE) == sorted(driven.__all__), wrong, hasattr(driven, "nope"))
        """)
    assert run_code(code).stdout.splitlines()[-1] == "True [] False"
