"""What ``netprobe run`` loads before its first byte: only what the run needs.

On a 100 Mbit/s router link a Python start-up of a few tenths of a CPU second is most of
what the sending end costs, so the start-up is checked by mechanism here (which modules a
run imports, what the registry reads) and measured in bench/engine.py, never timed here.
"""
from __future__ import annotations

import datetime
import importlib
import json
import re
import socket
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import attrs
import pytest

from netprobe import convert
from netprobe.engine.sockets import resolve
from netprobe.errors import SpecError
from netprobe.plugin import ENTRY_POINT_GROUP, utc_now_iso
from netprobe.record import Record
from netprobe.registry import load_registry, own_entry_points
from tests.servers import netprobe_server
from tests.test_cli import TIMEOUT, child_env, run_code
from tests.test_formats import sample_result

# Modules a `netprobe run --json` with a built-in tool has no use for: rich draws only
# the human output; stevedore and importlib.metadata read every installed distribution's
# entry points, which a built-in tool named on the command line does not need; the driven
# tools' process and session glue (the native client needs netprobe.driven's
# is_local_host only, and only for a driven tool whose far end an agent may start: not
# at all for the native engine); tempfile for -o FILE; hashlib for a shared secret;
# statistics (with fractions and decimal) for one mean; csv for --format csv; datetime
# for the start time; the idna codec (with stringprep) for an ASCII host name.
NOT_FOR_A_JSON_RUN = ("rich", "stevedore", "importlib.metadata", "cattrs", "netprobe.driven",
                      "netprobe.driven.process", "netprobe.driven.session", "tempfile",
                      "hashlib", "statistics", "csv", "datetime", "encodings.idna")


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
    code = ("import sys\nfrom netprobe.registry import load_registry\n"
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
    info = tmp_path / "netprobe_meter-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: netprobe-meter\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nnative = gone:Tool\n")
    code = (f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
            "from netprobe.registry import load_registry, own_entry_points\n"
            "load_registry(only='native')\n"
            "print(own_entry_points(), 'stevedore' in sys.modules)")
    done = run_code(code)
    assert done.stdout.splitlines()[-1] == "{} True"


def test_a_built_in_tool_that_fails_to_import_is_a_load_failure() -> None:
    def factory(on_failure, names=None):  # type: ignore[no-untyped-def]
        from netprobe.registry import _load_own

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


# --- the records' methods: written once (netprobe.record), not compiled per class ---------

# Every attrs class a `netprobe run` builds at import, in the modules that make them: each
# frozen one takes repr, == and hash from Record (attrs compiles none of the three for it).
RECORD_MODULES = ("netprobe.schema", "netprobe.plugin", "netprobe.core.records",
                  "netprobe.session", "netprobe.engine.protocol", "netprobe.cli.outfile",
                  "netprobe.engine.summary")


def _attrs_classes(module_name: str) -> list[type]:
    module = importlib.import_module(module_name)
    return [value for value in vars(module).values()
            if isinstance(value, type) and attrs.has(value) and value.__module__ == module_name]


@pytest.mark.parametrize("module_name", RECORD_MODULES)
def test_the_frozen_records_of_a_run_leave_repr_eq_and_hash_to_record(module_name: str) -> None:
    frozen = [cls for cls in _attrs_classes(module_name)
              if cls.__setattr__ is not object.__setattr__]  # frozen: attrs' refusing setattr
    assert frozen
    generated = {cls.__name__: sorted({"__repr__", "__eq__", "__hash__"} & set(vars(cls)))
                 for cls in frozen if not issubclass(cls, Record)
                 or {"__repr__", "__eq__", "__hash__"} & set(vars(cls))}
    assert generated == {}


def _twins() -> tuple[type, type]:
    # One class twice: as attrs writes it, and as a Record. Fields of every kind Record
    # reads: repr=False, a repr callable, eq=False, an eq key, a default.
    body = {
        "name": attrs.field(),
        "secret": attrs.field(default=None, repr=False),
        "rate": attrs.field(default=1.5, repr=lambda value: f"<{value}>"),
        "note": attrs.field(default="", eq=False),
        "tag": attrs.field(default="A", eq=str.lower),
        "items": attrs.field(default=()),
    }
    plain = attrs.make_class("Twin", dict(body), frozen=True)
    record = attrs.make_class("Twin", dict(body), bases=(Record,), frozen=True, repr=False,
                              eq=False)
    return plain, record


def test_a_record_compares_shows_and_hashes_as_the_attrs_class_would() -> None:
    plain, record = _twins()
    cases = [dict(name="x"), dict(name="x", secret=b"k", rate=2.0, items=(1, 2)),
             dict(name="x", note="other"), dict(name="x", tag="a"), dict(name="y"),
             dict(name=float("nan"))]
    for left in cases:
        assert repr(record(**left)) == repr(plain(**left))
        for right in cases:
            assert (record(**left) == record(**right)) == (plain(**left) == plain(**right))
            assert (record(**left) != record(**right)) == (plain(**left) != plain(**right))
            if plain(**left) == plain(**right):
                assert hash(record(**left)) == hash(record(**right))
    assert record(name="x") != plain(name="x")  # another class: never equal, as in attrs
    assert record(name="x").__eq__("x") is NotImplemented
    assert {record(name="x"), record(name="x", note="n")} == {record(name="x")}


def test_a_record_inside_itself_is_shown_as_dots() -> None:
    _, record = _twins()
    box: list = []
    outer = record(name="outer", items=box)  # a list may hold its own record, as in attrs
    box.append(outer)
    assert repr(outer) == "Twin(name='outer', rate=<1.5>, note='', tag='A', items=[...])"


def test_a_whole_result_round_trips_equal_with_equal_hashes() -> None:
    result = sample_result(streams=2, direction="bidir")
    again = convert.from_json(convert.to_json(result))
    assert again == result and hash(again) == hash(result)
    assert attrs.evolve(again, duration_s=3.0) != result
    assert repr(result).startswith("Result(tool=ToolInfo(name='native'")
    assert "Interval(direction='client_to_server', role='sender'" in repr(result)


def test_the_json_converter_reads_the_types_get_type_hints_would() -> None:
    # convert evaluates each annotation string once per module instead of calling
    # typing.get_type_hints (a compile() per field per class): the same types must come out.
    for module_name in RECORD_MODULES:
        for cls in _attrs_classes(module_name):
            assert convert._hints(cls) == typing.get_type_hints(cls), cls


def test_the_start_time_is_written_as_datetime_would() -> None:
    before = datetime.datetime.now(datetime.timezone.utc)
    stamp = utc_now_iso()
    after = datetime.datetime.now(datetime.timezone.utc)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", stamp)
    moment = datetime.datetime.fromisoformat(stamp)
    assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= moment <= after


@pytest.mark.parametrize("host", ["a..b.invalid", "b\u00fccher.invalid", "x" * 64 + ".invalid"])
def test_a_host_that_cannot_be_resolved_is_a_spec_error_naming_it(host: str) -> None:
    # ASCII names reach getaddrinfo as bytes (no idna codec); a malformed one is still refused.
    with pytest.raises(SpecError, match="cannot resolve host"):
        resolve(host, 5201, 0, socket.SOCK_STREAM)
