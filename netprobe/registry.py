"""The registry of tool plugins: found through the ``netprobe.tools`` entry-point group
(stevedore; netprobe's own tools read from its own metadata without a scan), loaded one by
name or all, kept as :class:`LoadFailure` when they cannot be used, made into a tool
(:func:`make_tool`) and listed (:func:`tool_rows`, the one row shape the agent sends and the
CLI draws).

Above the contract (:mod:`netprobe.plugin`), which a plugin author reads alone.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any, Callable

import attrs
from attrs import frozen

from netprobe.errors import ToolNotFound, ToolUnavailable, one_line
from netprobe.plugin import API_VERSION, ENTRY_POINT_GROUP, Availability, Tool
from netprobe.record import Record
from netprobe.version import __version__


@frozen(repr=False, eq=False)
class LoadFailure(Record):
    """A plugin that could not be used, and why."""

    name: str
    """Entry-point name."""
    error: str
    """One line saying what went wrong."""
    target: str | None = None
    """What the entry point points at (module:attr)."""


@attrs.define
class Registry:
    """The tools found through entry points, and the ones that failed to load."""

    tools: dict[str, type[Tool]] = attrs.Factory(dict)
    failures: list[LoadFailure] = attrs.Factory(list)

    def names(self) -> list[str]:
        """Loaded tool names, sorted."""
        return sorted(self.tools)

    def get(self, name: str) -> type[Tool]:
        """The tool class for ``name`` or one of its aliases; ToolNotFound otherwise."""
        if name in self.tools:
            return self.tools[name]
        for cls in self.tools.values():
            if name in cls.aliases:
                return cls
        for failure in self.failures:
            if failure.name == name:
                raise ToolNotFound(
                    f"tool {name!r} is installed but failed to load: {failure.error}"
                )
        known = ", ".join(self.names()) or "none"
        raise ToolNotFound(f"no tool named {name!r} (installed: {known})")


def make_manager(
    on_failure: Callable[[Any, Any, BaseException], None], names: Sequence[str] | None = None
) -> Any:
    """Build the manager of the tool group's extensions (the one place tests can substitute).

    With ``names``, only those entry points are imported: a run needs one tool, and
    importing every plugin costs start-up time that matters on a router. Names that
    netprobe's own distribution publishes (the built-in tools) are read from its own
    metadata (:func:`own_entry_points`) without scanning the others; any other name goes
    through stevedore, which reads every installed distribution's entry points, so a
    third-party plugin is found exactly as before.
    """
    if names is not None:
        own = own_entry_points()
        if own and all(name in own for name in names):
            loaded = (_load_own(name, own[name], on_failure) for name in names)
            return [ext for ext in loaded if ext is not None]
    from stevedore import ExtensionManager, NamedExtensionManager  # imported late: start-up

    if names is not None:
        return NamedExtensionManager(
            namespace=ENTRY_POINT_GROUP, names=list(names), invoke_on_load=False,
            on_load_failure_callback=on_failure,
        )
    return ExtensionManager(
        namespace=ENTRY_POINT_GROUP,
        invoke_on_load=False,
        on_load_failure_callback=on_failure,
    )


@frozen(repr=False, eq=False)
class EntryPoint(Record):
    """One entry point of netprobe's own distribution (what ``LoadFailure.target`` names)."""

    name: str
    """Its name in the group (the tool's name)."""
    value: str
    """``module:attribute``, what it points at."""


@frozen(repr=False, eq=False)
class _OwnExtension(Record):
    # What load_registry reads of a stevedore Extension: name, plugin, entry_point.value.
    name: str
    entry_point: EntryPoint
    plugin: Any


DISTRIBUTION = "netprobe-meter"
"""netprobe's name on the package index (``pip install netprobe-meter``); the command and
the import package are ``netprobe``. The plain name there is an unrelated project."""
_METADATA_NAME = DISTRIBUTION.replace("-", "_")  # how wheels and egg-info spell it on disk


def own_entry_points(group: str = ENTRY_POINT_GROUP) -> dict[str, str]:
    """The entry points netprobe's own distribution publishes in ``group`` (name -> value).

    Read straight from its ``entry_points.txt``: the first netprobe metadata directory on
    ``sys.path`` (the one ``importlib.metadata.distribution(DISTRIBUTION)`` would pick), and
    only when its version is this netprobe's, so stale metadata of another copy is never
    trusted. Empty when there is none (a bare source tree): callers then scan with stevedore.
    This skips importing importlib.metadata and stevedore, and stevedore's read of every
    distribution's entry points, for the one tool a ``netprobe run`` names.
    """
    found = _own_metadata_dir()
    if found is None:
        return {}
    try:
        with open(os.path.join(found, "entry_points.txt"), encoding="utf-8") as handle:
            return _entry_points_in(handle.read(), group)
    except OSError:
        return {}


def _own_metadata_dir() -> str | None:
    version = __version__
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip file, a missing directory: not where metadata is read from
            continue
        for name in names:
            low = name.lower()
            if low.endswith((".dist-info", ".egg-info")) and low.split("-")[0].split(".")[0] \
                    == _METADATA_NAME:
                path = os.path.join(entry or ".", name)
                return path if _metadata_version(path) == version else None
    return None


def _metadata_version(path: str) -> str | None:
    for filename in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(path, filename), encoding="utf-8") as handle:
                for line in handle:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
                    if not line.strip():  # the headers end at the first blank line
                        break
        except OSError:
            continue
    return None


def _entry_points_in(text: str, group: str) -> dict[str, str]:
    # The entry_points.txt format: INI sections named after groups, "name = value" lines.
    found: dict[str, str] = {}
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section == group and "=" in line:
            name, value = (part.strip() for part in line.split("=", 1))
            found[name] = value
    return found


def _load_own(name: str, value: str,
              on_failure: Callable[[Any, Any, BaseException], None]) -> _OwnExtension | None:
    entry_point = EntryPoint(name, value)
    try:
        module, _, attr = value.split("[", 1)[0].strip().partition(":")
        plugin: Any = importlib.import_module(module.strip())
        for part in attr.strip().split(".") if attr else ():
            plugin = getattr(plugin, part)
    except Exception as exc:  # as stevedore does: a broken plugin is a failure, not a crash
        on_failure(None, entry_point, exc)
        return None
    return _OwnExtension(name, entry_point, plugin)


def load_registry(
    manager_factory: Callable[..., Any] = make_manager, only: str | None = None
) -> Registry:
    """Load every tool plugin (or just the one named ``only``); collect failures, never raise.

    When ``only`` matches no entry point (an alias, or a typo), everything is loaded so that
    aliases resolve and the error can list what is installed.
    """
    registry = Registry()

    def on_failure(_manager: Any, entry_point: Any, exc: BaseException) -> None:
        registry.failures.append(
            LoadFailure(entry_point.name, one_line(exc), getattr(entry_point, "value", None))
        )

    manager = manager_factory(on_failure, [only]) if only else manager_factory(on_failure)
    targets: dict[str, str] = {}  # the entry point each loaded name came from
    for ext in manager:
        problem = _incompatibility(ext.plugin)
        if problem:
            registry.failures.append(LoadFailure(ext.name, problem, ext.entry_point.value))
        else:
            _take(registry, targets, ext.name, ext.plugin, ext.entry_point.value)
    if only and not registry.tools and not registry.failures:
        return load_registry(manager_factory)
    return registry


def _take(registry: Registry, targets: dict[str, str], name: str, plugin: type[Tool],
          target: str) -> None:
    # Two entry points of one name: netprobe's own tool keeps it, else the first found (as
    # an import would), whatever order the distributions were read in; the other is listed
    # as not used. Before, the last one loaded took the name, so `netprobe tools` could show
    # a third-party plugin while `netprobe run` (which loads netprobe's own directly) ran
    # the built-in one.
    held = registry.tools.get(name)
    if held is None or held is plugin:
        registry.tools[name], targets[name] = plugin, targets.get(name, target)
        return
    if _is_built_in(plugin) and not _is_built_in(held):
        registry.tools[name] = plugin
        targets[name], target = target, targets[name]
    why = "netprobe's built-in tool" if _is_built_in(registry.tools[name]) else \
        "another plugin of this name, found first"
    registry.failures.append(LoadFailure(
        name, f"not used: the name is taken by {why} ({targets[name]})", target))


def _is_built_in(plugin: type[Tool]) -> bool:
    return plugin.__module__.startswith("netprobe.tools.")


def _incompatibility(plugin: Any) -> str | None:
    if not (isinstance(plugin, type) and issubclass(plugin, Tool)):
        return f"not a netprobe Tool subclass: {plugin!r}"
    wanted = getattr(plugin, "api_version", None)
    if not isinstance(wanted, int) or wanted > API_VERSION:
        return f"incompatible: needs plugin API {wanted}, this netprobe has {API_VERSION}"
    return None



def make_tool(name: str, options: dict[str, Any] | None = None,
              registry: Registry | None = None) -> Tool:
    """An instance of the tool ``name`` (or an alias), from ``registry`` or, without one,
    loading only that tool. ToolNotFound when there is none; ToolUnavailable when the
    plugin's own constructor fails (named, never a traceback)."""
    found = registry if registry is not None else load_registry(only=name)
    cls = found.get(name)
    try:
        return cls(options) if options else cls()
    except Exception as exc:  # a plugin's own bug: say which plugin, do not crash
        raise ToolUnavailable(f"tool {name!r} failed to start: {one_line(exc)}") from exc


def availability(tool: Tool) -> Availability:
    """What ``tool.probe()`` says; a probe that raises (a plugin's bug) is "unavailable",
    saying so, never a traceback. The one guard around a plugin's probe."""
    try:
        return tool.probe()
    except Exception as exc:  # probe() must not raise; a plugin that does cannot run
        return Availability(False, reasons=(f"probe failed: {one_line(exc)}",))


def tool_rows(registry: Registry) -> list[dict[str, Any]]:
    """One dict per tool (loaded or failed): what ``netprobe tools --json`` prints and what an
    agent sends for ``netprobe tools HOST``.

    Keys: name, status (available/unavailable/failed), available (bool, the key agents
    before this shape sent), version, path, details, reasons, description, aliases, measures
    (``Tool.measures``: throughput, latency), error (load or probe failure), target (entry
    point).
    """
    rows = [_tool_row(name, cls) for name, cls in sorted(registry.tools.items())]
    for failure in registry.failures:
        rows.append(row(failure.name, "failed", error=failure.error, target=failure.target))
    return rows


def _tool_row(name: str, cls: type[Tool]) -> dict[str, Any]:
    described = {"description": cls.description, "aliases": list(cls.aliases),
                 "measures": sorted(getattr(cls, "measures", ())),
                 "target": f"{cls.__module__}:{cls.__qualname__}"}
    try:
        tool = cls()
    except Exception as exc:  # a plugin bug shows in the list instead of breaking it
        return row(name, "unavailable", error=f"failed to start: {one_line(exc)}", **described)
    found = availability(tool)
    return row(name, "available" if found.available else "unavailable",
                version=found.version, path=found.path, details=list(found.details),
                reasons=list(found.reasons), **described)


def row(name: str, status: str, **fields: Any) -> dict[str, Any]:
    """A tool row (see :func:`tool_rows`) with ``fields`` over the defaults."""
    row: dict[str, Any] = {"name": name, "status": status, "available": status == "available",
                           "version": None, "path": None, "details": [], "reasons": [],
                           "description": "", "aliases": [], "measures": [], "error": None,
                           "target": None}
    row.update(fields)
    return row


__all__ = [
    "DISTRIBUTION",
    "EntryPoint",
    "LoadFailure",
    "Registry",
    "availability",
    "load_registry",
    "make_manager",
    "make_tool",
    "own_entry_points",
    "row",
    "tool_rows",
]
