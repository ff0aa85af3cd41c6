"""The Tool side of a plugin that drives an installed binary: finding it, once.

:class:`DrivenTool` is a :class:`~netprobe.plugin.Tool` whose ``probe()`` looks for the
binary once per instance and never raises; a subclass declares where to look
(``program``, ``env_var``, ``install_hint``) and says how to read the version
(:meth:`DrivenTool.identify`, usually one call of :func:`read_version`). ``run`` and
``far_end_argv`` take the path from :meth:`DrivenTool.binary`, which raises
ToolUnavailable with the probe's reasons. :func:`readable_sources` is the first step of
``parse`` for saved outputs::

    class FooTool(DrivenTool):
        name = "foo"
        program, env_var, install_hint = "foo", "NETPROBE_FOO", "apt install foo"

        def identify(self, path):
            return read_version(path, ["-V"], r"foo (\\d+\\.\\d+)", "foo")[0]

        def run(self, spec, reporter):
            self.check(spec)
            return FooSession(spec, make_plan(spec, self.binary()), reporter).run()
"""

from __future__ import annotations

import abc
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from netprobe.driven.process import find_binary, not_found, run_once
from netprobe.errors import ParseError, ToolUnavailable
from netprobe.plugin import Availability, Tool


class DrivenTool(Tool):
    """A tool plugin that runs an installed binary.

    Class attributes to set: ``program`` (the binary's name on PATH), ``env_var`` (the
    environment variable that names another binary) and ``install_hint`` (what the user
    should do when it is missing). The option ``path`` overrides both.
    """

    program: ClassVar[str]
    """The binary's name on PATH."""
    env_var: ClassVar[str | None] = None
    """The environment variable that names the binary to use instead (e.g. NETPROBE_FOO)."""
    install_hint: ClassVar[str] = ""
    """How to get the binary, for the reason shown when it is missing."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self._availability: Availability | None = None

    def probe(self) -> Availability:
        """Find the binary and read its version, the first time only. Never raises: an
        unexpected error becomes the reason the tool is unavailable."""
        if self._availability is None:
            try:
                self._availability = self.locate()
            except Exception as exc:  # probe() must never raise
                why = f"{self.name} probe failed: {type(exc).__name__}: {exc}"
                self._availability = Availability(False, reasons=(why,))
        return self._availability

    def locate(self) -> Availability:
        """Look for the binary (option ``path``, then ``env_var``, then PATH) and, when it
        is there, :meth:`identify` it."""
        override = self.options.get("path")
        path = find_binary(self.program, override, self.env_var)
        if path is None:
            why = not_found(self.program, override, self.env_var, self.install_hint)
            return Availability(False, reasons=(why,))
        return self.identify(path)

    @abc.abstractmethod
    def identify(self, path: str) -> Availability:
        """Say whether the binary at ``path`` is a version this plugin drives (and which)."""

    def binary(self) -> str:
        """The path of the binary to run; ToolUnavailable with the probe's reasons if it
        cannot be run here."""
        available = self.probe()
        if not available.available or available.path is None:
            raise ToolUnavailable("; ".join(available.reasons) or f"{self.name} is not available")
        return available.path


def read_version(
    path: str,
    args: Sequence[str],
    pattern: str,
    what: str,
    *,
    exit_codes: Sequence[int] | None = None,
    timeout_s: float = 5.0,
) -> tuple[Availability, str]:
    """Run ``path args`` once and read the version from what it printed (stdout and
    stderr): the first group of ``pattern``. ``what`` names the program in the reason
    given when the version is not there (or, with ``exit_codes``, when it exited
    otherwise). Returns the Availability and the text printed (e.g. a help text that
    tells which options this build has)."""
    try:
        code, text = run_once([path, *args], timeout=timeout_s)
    except ToolUnavailable as exc:
        return Availability(False, reasons=(str(exc),), path=path), ""
    found = re.search(pattern, text)
    if found is None or (exit_codes is not None and code not in exit_codes):
        first = text.strip().splitlines()[0] if text.strip() else "nothing"
        command = " ".join([path, *args])
        why = f"{command} printed no {what} version (exit code {code}): {first}"
        return Availability(False, reasons=(why,), path=path), text
    return Availability(True, version=found.group(1), path=path), text


def readable_sources(
    sources: Sequence[tuple[str, str]], tool: str, empty: str = "the input is empty"
) -> list[tuple[str, str]]:
    """The saved outputs ``[(name, text), ...]`` that hold anything but blanks; a
    ParseError naming the first source (``no TOOL output: EMPTY``) when none does."""
    readable = [(name, text) for name, text in sources if text.strip()]
    if not readable:
        where = sources[0][0] if sources else None
        raise ParseError(f"no {tool} output: {empty}", where)
    return readable


__all__ = ["DrivenTool", "read_version", "readable_sources"]
