"""What several commands share once their arguments are parsed: the one-line error, the
registry, making a tool, reaching the agents, and writing a result (running a test is
:func:`netprobe.session.run_spec`).

Cheap to import: the plugins, the schema and rich load inside the functions that need them.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable

from netprobe.cli.exitcodes import ExitCode, UsageError
from netprobe.limits import SAVED_RESULTS_MAX_BYTES, InputTooLarge, read_at_most

if TYPE_CHECKING:
    from netprobe.cli.formats import Output
    from netprobe.errors import TestFailed
    from netprobe.plugin import Reporter, Tool
    from netprobe.registry import Registry
    from netprobe.schema import Result, TestSpec
    from netprobe.session import AgentAccess

RegistryLoader = Callable[[], "Registry"]
"""What a command is handed to get the installed tools (tests pass their own)."""


def error(message: str) -> None:
    """``netprobe: error: MESSAGE`` on stderr, on one line (even without rich)."""
    try:
        from netprobe.cli.render import print_error
    except Exception:  # rich missing or broken: the error must still reach the user
        _plain_line("netprobe: error: ", message)
        return
    print_error(message)


def _plain_line(prefix: str, message: str) -> None:
    """``PREFIX MESSAGE`` on stderr without rich: the server and the OpenWrt package run
    without it (it is a client-side dependency), and must still say what they say."""
    from netprobe.cli.textsafe import for_terminal

    sys.stderr.write(f"{prefix}{for_terminal(' '.join(message.split()))}\n")
    sys.stderr.flush()


def load_registry(only: str | None = None) -> Registry:
    """The installed tool plugins (just ``only`` when it is given)."""
    from netprobe.registry import load_registry as load

    return load(only=only)


def registry_for(load: RegistryLoader, name: str) -> Registry:
    """The registry a command that needs one tool gets."""
    # The default loader can import just the one tool a command needs; a loader a test
    # passes in builds its whole registry.
    return load_registry(only=name) if load is load_registry else load()


def make_tool(registry: Registry, name: str, options: dict[str, Any] | None = None) -> Tool:
    """An instance of the tool ``name`` from ``registry`` (:func:`netprobe.registry.make_tool`)."""
    from netprobe.registry import make_tool as make

    return make(name, options, registry=registry)


def secret_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """The tool options the command line gives (None without any): ``--secret-file``, and
    ``start_server`` off for ``--no-agent -p PORT``, where the user's own server listens
    (on this machine too: a second one on its port would fail)."""
    options: dict[str, Any] = {"secret_file": args.secret_file} if args.secret_file else {}
    if getattr(args, "no_agent", False) and getattr(args, "port", None) is not None:
        options["start_server"] = False
    return options or None


def agent_access(args: argparse.Namespace) -> AgentAccess:
    """How this command reaches the agents: ``--secret-file``, ``--agent-port``,
    ``--no-agent``."""
    from netprobe.engine.auth import load_secret
    from netprobe.session import AgentAccess

    return AgentAccess(secret=load_secret(getattr(args, "secret_file", None)),
                       port=getattr(args, "agent_port", None),
                       far_end=not getattr(args, "no_agent", False))


def output(args: argparse.Namespace) -> Output:
    """Where the command's result goes (``--format``, ``-o``, ``-q``, ``--per-stream``)."""
    from netprobe.cli.formats import Output
    from netprobe.cli.outfile import choose_formats

    chosen = choose_formats(args.format, args.output)
    if chosen.warning:
        warning(chosen.warning)
    per_stream = args.per_stream or getattr(args, "verbose", False)
    return Output(chosen.stdout, args.output, quiet=args.quiet, per_stream=per_stream,
                  file_fmt=chosen.file, units=getattr(args, "units", None),
                  wide=getattr(args, "verbose", False))


def warning(message: str) -> None:
    """``warning: MESSAGE`` on stderr, on one line (even without rich)."""
    try:
        from netprobe.cli.render import print_warning
    except ImportError:
        _plain_line("warning: ", message)
        return
    print_warning(message)


def note(message: str) -> None:
    """A status line on stderr (dimmed where rich draws it; plain text without rich)."""
    try:
        from netprobe.cli.render import print_note
    except ImportError:
        _plain_line("", message)
        return
    print_note(message)


def emit_partial(out: Output, partial: Any, reporter: Reporter) -> None:
    """Write what a failed test measured, as a full result would be written."""
    # Nothing measured is lost. The test failure stays the error that decides the exit code.
    from netprobe.cli.outfile import OutputError
    from netprobe.schema import Result

    if not isinstance(partial, Result):
        return
    try:
        out.emit(partial, intervals_shown=lines_shown(reporter))
    except OutputError as exc:
        error(str(exc))


def machine_record(out: Output, tool_name: str, spec: TestSpec, exc: TestFailed
                   ) -> Result | None:
    """What a test that failed before any figure came back writes: for a machine format
    its one record, the Result the Python API puts in ``TestFailed.partial`` for the same
    failure (:func:`netprobe.session.failed_result`); for a person nothing but the error
    line (no empty table)."""
    from netprobe.errors import TestInterrupted
    from netprobe.session import failed_result

    if out.fmt == "human":
        return None
    status = "interrupted" if isinstance(exc, TestInterrupted) else "failed"
    return failed_result(tool_name, spec, str(exc), status)


def lines_shown(reporter: Reporter) -> bool:
    """Whether the reporter drew interval lines (the table then leaves them out); a live
    reporter first draws the lines it held back."""
    finish = getattr(reporter, "finish", None)
    if finish is not None:  # a live reporter holds back lines until an interval is whole
        finish()
    return getattr(reporter, "lines", 0) > 0


def status_code(result: Result) -> ExitCode:
    """The exit code a finished result stands for (its first error said on stderr)."""
    if result.status == "ok":
        return ExitCode.OK
    error(result.errors[0] if result.errors else f"test {result.status}")
    return ExitCode.INTERRUPTED if result.status == "interrupted" else ExitCode.TEST_FAILED


MAX_LINE = 1 << 20
"""Longer lines are not a tool's output: refused rather than held in memory."""


def read_lines(path: str) -> Iterator[str]:
    """A file's lines, newlines kept, read as they are needed (``-`` is stdin), so that
    memory does not grow with the file; UsageError when it cannot be read or holds a line
    longer than MAX_LINE."""
    try:
        handle = (sys.stdin if path == "-"
                  else open(path, encoding="utf-8", errors="replace"))  # noqa: SIM115
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    with handle:
        for number in itertools.count(1):
            try:
                line = handle.readline(MAX_LINE + 1)
            except OSError as exc:
                raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
            if not line:
                return
            if len(line) > MAX_LINE:
                raise UsageError(f"{path}:{number}: a line longer than {MAX_LINE >> 20} MiB "
                                 "is not a tool's output")
            yield line


def read_input(path: str) -> str:
    """A file's text (``-`` is stdin); UsageError when it cannot be read."""
    try:
        if path == "-":
            return str(read_at_most(sys.stdin, SAVED_RESULTS_MAX_BYTES))
        with open(path, encoding="utf-8", errors="replace") as handle:
            return str(read_at_most(handle, SAVED_RESULTS_MAX_BYTES))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except InputTooLarge:
        raise UsageError(f"{path}: more than {SAVED_RESULTS_MAX_BYTES >> 20} MiB of saved "
                         "results; keep long histories in an archive (--archive)") from None
