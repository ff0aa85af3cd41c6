"""The exit codes of the command line, and which error ends with which code.

Kept apart from the parser and the commands (the httpie habit) so that any command module
can return a code without importing :mod:`netprobe.cli.main`.
"""
from __future__ import annotations

import enum
import sys

from netprobe.errors import (
    NetprobeError,
    ParseError,
    SpecError,
    TestFailed,
    TestInterrupted,
    ToolNotFound,
    ToolUnavailable,
)


class UsageError(NetprobeError):
    """A command-line argument cannot be used (exit code 2)."""


class ExitCode(enum.IntEnum):
    """Every exit code of ``netprobe`` (the console script exits with one of these)."""

    OK = 0
    INTERNAL = 1
    USAGE = 2
    TOOL_NOT_FOUND = 3
    TOOL_UNAVAILABLE = 4
    TEST_FAILED = 5
    OUTPUT = 6
    INTERRUPTED = 130


EXIT_CODES = {
    ExitCode.OK: "success",
    ExitCode.INTERNAL: "internal error (NETPROBE_DEBUG=1 shows the traceback) or a system "
                       "error",
    ExitCode.USAGE: "bad arguments, spec refused by the tool, or unreadable input file",
    ExitCode.TOOL_NOT_FOUND: "unknown tool (not installed, or failed to load)",
    ExitCode.TOOL_UNAVAILABLE: "tool cannot run here (see `netprobe tools`)",
    ExitCode.TEST_FAILED: "test failed (partial result still printed/saved)",
    ExitCode.OUTPUT: "cannot write the result (output file, or stdout closed)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C; partial result still printed/saved)",
}
"""Every exit code of the CLI and what it means (shown in ``netprobe --help``)."""


def exit_code_for(exc: BaseException) -> ExitCode:
    """The exit code for an error that ended a command."""
    from_types: list[tuple[type[BaseException], ExitCode]] = [
        (TestInterrupted, ExitCode.INTERRUPTED),
        (TestFailed, ExitCode.TEST_FAILED),
        (SpecError, ExitCode.USAGE),
        (UsageError, ExitCode.USAGE),
        (ParseError, ExitCode.USAGE),
        (ToolNotFound, ExitCode.TOOL_NOT_FOUND),
        (ToolUnavailable, ExitCode.TOOL_UNAVAILABLE),
    ]
    outfile = sys.modules.get("netprobe.cli.outfile")  # loaded if it could have raised
    if outfile is not None:
        from_types.append((outfile.OutputError, ExitCode.OUTPUT))
    for kind, code in from_types:
        if isinstance(exc, kind):
            return code
    return ExitCode.INTERNAL


__all__ = ["EXIT_CODES", "ExitCode", "UsageError", "exit_code_for"]
