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


def test_every_driven_result_is_assembled_in_one_place() -> None:
    # Sessions and saved-output readers of the driven tools hand their Figures to
    # to_result, which sorts intervals and fills call lengths for every tool alike: no
    # Result is made anywhere else under tools/ or driven/ (nuttcp's and ntttcp's made
    # theirs and came out unsorted).
    makers = sorted(str(path.relative_to(PACKAGE))
                    for root in ("tools", "driven") for path in (PACKAGE / root).rglob("*.py")
                    if "Result" in _calls_and_classes(path)[0])
    assert makers == ["driven/figures.py"]


def test_the_contract_is_apart_from_the_registry() -> None:
    source = (PACKAGE / "plugin.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    defined = {node.name for node in tree.body
               if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    assert {"Tool", "Capabilities", "Availability", "Reporter"} <= defined
    assert not defined & {"Registry", "load_registry", "make_manager", "LoadFailure",
                          "RelayReporter", "KeptIntervals", "fill_missing", "utc_now_iso"}
    assert "stevedore" not in source


def test_a_service_plugs_into_the_servers_port_as_a_handler() -> None:
    # The handler contract (engine/handlers.py): a builder passes a handler for a request
    # type; it gets the control connection, holds a slot through Admission, and refuses the
    # way every handler does. The native test and the latency echo are handlers too.
    import json
    import socket
    import struct

    from netprobe.engine import protocol
    from netprobe.engine.handlers import ControlConnection
    from netprobe.engine.server import Server, ServerConfig

    def greet(control: ControlConnection, request: dict) -> None:
        if request.get("name") == "nobody":
            control.refuse("no greeting for nobody", "spec")
        with control.slot(kind="greeting"):
            busy = control.server.admission.active_tests
            control.channel.send({"type": "greeting", "to": request.get("name"),
                                  "slots_held": busy})

    def ask(port: int, body: dict) -> dict:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(protocol.pack_hello(protocol.KIND_CONTROL))
            channel = protocol.Channel(sock)
            channel.expect("welcome", timeout=5)
            raw = json.dumps(body).encode()
            sock.sendall(struct.pack("!I", len(raw)) + raw)
            return channel.recv(timeout=5)

    server = Server(ServerConfig(bind_address="127.0.0.1", port=0), handlers={"greet": greet})
    port = server.start()
    try:
        assert set(server.handlers) >= {"test", "latency", "greet"}
        assert ask(port, {"type": "greet", "name": "ada"}) == {
            "type": "greeting", "to": "ada", "slots_held": 1}
        refused = ask(port, {"type": "greet", "name": "nobody"})
        assert (refused["type"], refused["code"]) == ("error", "spec")
        unknown = ask(port, {"type": "nothing-here"})
        assert (unknown["type"], unknown["code"]) == ("error", "unknown")
        assert server.admission.active_tests == 0 and server.admission.served == 1
    finally:
        server.close()


def test_the_engines_server_is_split_along_its_handler_contract() -> None:
    engine = PACKAGE / "engine"
    for module in ("handlers.py", "admission.py", "control.py", "nativetest.py", "echo.py",
                   "prober.py"):
        assert (engine / module).is_file(), module
    _, classes = _calls_and_classes(engine / "server.py")
    assert [name for name, _ in classes] == ["Server", "_Hello"]
    _, classes = _calls_and_classes(engine / "probes.py")
    assert not {name for name, _ in classes} & {"Echo", "Prober", "ProbeService"}
