"""No import cycle among netprobe's modules, function-local imports included (DESIGN.md,
"Layers"): every ``import`` in every module's syntax tree is an edge, except those under
``if TYPE_CHECKING:``, which never run."""
from __future__ import annotations

import ast
from pathlib import Path

import netprobe

# The package as imported: the source tree in a checkout, site-packages for a wheel's test.
PACKAGE = Path(netprobe.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


class _Imports(ast.NodeVisitor):
    """The netprobe modules one module imports, wherever the import statement stands."""

    def __init__(self, name: str, is_package: bool, known: set[str]) -> None:
        self.package = name if is_package else name.rpartition(".")[0]
        self.known = known
        self.found: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            anchor = self.package.split(".")[: len(self.package.split(".")) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            name = f"{base}.{alias.name}"
            self._add(name if name in self.known else base)

    def _add(self, name: str) -> None:
        if name in self.known:
            self.found.add(name)


def import_graph(visitor_class: type[_Imports] = _Imports) -> dict[str, set[str]]:
    """Module -> the netprobe modules it imports (as ``visitor_class`` sees imports)."""
    modules = _modules()
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        visitor = visitor_class(name, path.name == "__init__.py", known)
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        graph[name] = visitor.found - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_check_sees_function_local_imports() -> None:
    graph = import_graph()
    # netprobe/__init__.py imports the API (netprobe/api.py) only inside __getattr__.
    assert "netprobe.api" in graph["netprobe"]
    # A cycle made by hand is found.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_reaches_up_to_the_package_face() -> None:
    # The face (netprobe/__init__.py) lazily imports the run road for ``netprobe.run``;
    # a module that imported the face for ``__version__`` would import upward through it.
    # The version lives on the ground floor (netprobe/version.py) for that reason.
    graph = import_graph()
    reaching = sorted(name for name, targets in graph.items() if "netprobe" in targets)
    assert reaching == [], f"modules importing the package face: {reaching}"
    assert graph["netprobe.version"] == set()


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        for target in graph.get(name, ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_run_road_imports_nothing_above_it() -> None:
    # The road (session.run_spec) sits below the views, the daemon side of the agent, the
    # fleet, the exporter and the latency features: everything it reaches, function-local
    # imports included, must be at its level or under it (docs/architecture.md).
    above = ("netprobe.cli", "netprobe.agent", "netprobe.fleet", "netprobe.exporter",
             "netprobe.latency.probing", "netprobe.latency.phases", "netprobe.latency.beside",
             "netprobe.latency.bufferbloat", "netprobe.archives")
    reached = _reach(import_graph(), "netprobe.session")
    upward = sorted(name for name in reached if name.startswith(above))
    assert upward == [], f"the run road reaches up to: {upward}"


class _EveryImport(_Imports):
    """Imports under ``if TYPE_CHECKING:`` too: a circle there is one in the design."""

    def visit_If(self, node: ast.If) -> None:
        self.generic_visit(node)


def test_no_import_cycle_even_for_type_checking() -> None:
    found = cycles(import_graph(_EveryImport))
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def _top_level_modules(tree: ast.Module) -> set[str]:
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_function_imports_what_its_module_imports_at_the_top() -> None:
    # A function-local import buys start-up time only when the module does not load it
    # anyway; one of a module its file already imports at the top (or of sys) is noise
    # that reads like a reason (nine were found, in the CLI, the engine's client, the road,
    # the exporter and the conformance kit).
    found = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = _top_level_modules(tree) | {"sys"}
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                modules = ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                           else [a.name for a in node.names] if isinstance(node, ast.Import)
                           else [])
                found += [f"{name}:{node.lineno}: {m}" for m in modules if m in top]
    assert not found, found
