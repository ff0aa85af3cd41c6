"""Where code lives (issue 36, "one house"): every built-in tool package has the same
files, one class owns a driven tool's lifecycle, and the plugin contract is apart from the
registry. Structural checks a reader can run; behaviour is the other tests' business."""
from __future__ import annotations

import ast
from pathlib import Path

import netprobe

PACKAGE = Path(netprobe.__file__).resolve().parent
TOOL_FILES = {"__init__.py", "tool.py", "command.py", "session.py", "parse_output.py",
              "parse_saved.py"}


def _tool_packages() -> list[Path]:
    return sorted(p for p in (PACKAGE / "tools").iterdir()
                  if p.is_dir() and (p / "__init__.py").exists())


def test_every_tool_package_has_the_same_files() -> None:
    packages = _tool_packages()
    assert {p.name for p in packages} >= {"iperf2", "iperf3", "nuttcp", "ntttcp"}
    missing = {p.name: sorted(TOOL_FILES - {f.name for f in p.glob("*.py")}) for p in packages}
    assert {name: files for name, files in missing.items() if files} == {}


def _calls_and_classes(path: Path) -> tuple[set[str], list[tuple[str, list[str]]]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    calls = {node.func.id for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    classes = [(node.name, [ast.unparse(base) for base in node.bases])
               for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    return calls, classes


def test_one_class_owns_a_driven_tools_lifecycle() -> None:
    # A DrivenRun (the processes of one run) is made by DrivenSession alone; every tool's
    # run is a DrivenSession subclass in its package's session.py.
    makers = []
    for path in PACKAGE.rglob("*.py"):
        calls, _ = _calls_and_classes(path)
        if "DrivenRun" in calls:
            makers.append(str(path.relative_to(PACKAGE)))
    assert makers == ["driven/session.py"]
    for package in _tool_packages():
        _, classes = _calls_and_classes(package / "session.py")
        assert any(bases and bases[0] in ("DrivenSession", "IperfSession")
                   for _, bases in classes), f"{package.name}/session.py has no session class"


def test_the_contract_is_apart_from_the_registry() -> None:
    source = (PACKAGE / "plugin.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    defined = {node.name for node in tree.body
               if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    assert {"Tool", "Capabilities", "Availability", "Reporter"} <= defined
    assert not defined & {"Registry", "load_registry", "make_manager", "LoadFailure",
                          "RelayReporter", "KeptIntervals", "fill_missing", "utc_now_iso"}
    assert "stevedore" not in source
