"""netprobe's command line: argparse, dispatch, and the mapping of errors to exit codes.

Commands: ``run`` (a test; ``--repeat N`` for N trials and their statistics), ``server``
(the native engine's far end), ``tools`` (installed tool plugins and why they can or cannot
run), ``parse`` (saved tool output to a result), ``compare`` (one test through several
tools, interleaved, side by side) and ``report`` (saved results as tables or an HTML page);
each command is a module of :mod:`netprobe.cli.commands` (``add_parser`` and ``handle``).

Exit codes (``EXIT_CODES``, :class:`netprobe.cli.exitcodes.ExitCode`; every error is one
line on stderr, ``netprobe: error: ...``):

====  =====================================================================================
 0    success
 1    internal error (no traceback unless NETPROBE_DEBUG=1), or the system refused
      something outside a test (e.g. the server cannot listen on its port)
 2    bad arguments, a spec the tool refuses, or an unreadable/unparsable input file
 3    unknown tool (not installed, or installed but failed to load)
 4    tool unavailable here (binary missing, too old, ...)
 5    test failed (what was measured is still printed/saved, status ``failed``)
 6    the result could not be written (output file, or stdout closed)
130   interrupted (Ctrl-C; what was measured is still printed/saved)
====  =====================================================================================

This module stays cheap to import: a command's module is imported only once that command
is chosen, and rich, the schema and the plugins only when the command needs them, so
``netprobe --version`` answers quickly even on a small router.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from netprobe.cli.args import HelpFormatter, spec_from_args
from netprobe.cli.common import RegistryLoader, error, load_registry
from netprobe.cli.exitcodes import EXIT_CODES, ExitCode, UsageError, exit_code_for
from netprobe.errors import NetprobeError, one_line
from netprobe.version import __version__

COMMANDS = {
    "run": "run a throughput test",
    "server": "run the native engine's far end",
    "tools": "list tool plugins and whether they can run here",
    "parse": "turn a tool's saved output into a netprobe result",
    "compare": "run one test through several tools, interleaved, side by side",
    "report": "summarise saved results: tables, sparklines, an HTML page",
    "path": "test each segment of a path and the whole path; name the bottleneck",
    "fleet": "tests among many agents on a conflict-free schedule, archived",
    "bufferbloat": "latency under load: idle, download, upload, both; grade and culprit",
    "rrul": "latency under load as Flent's RRUL: 4 streams each way at once, 60 s",
    "exporter": "serve netprobe's figures to Prometheus (/probe, /status, /metrics)",
}
"""Each command and its summary; its module is ``netprobe.cli.commands.<name>``."""


# --- entry point -------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, *,
         registry_loader: RegistryLoader | None = None) -> int:
    """Run the netprobe command line; return the exit code (the console script exits with it).

    ``registry_loader`` replaces :func:`netprobe.registry.load_registry` (for tests that
    bring their own plugins).
    """
    if argv is None:
        _terminate_as_interrupt()
    words = iperf3_words(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser(only=_chosen(words) or "")
    parser.words = words  # type: ignore[attr-defined]  # for the nearest-flag hint
    try:
        args = parser.parse_args(words)
    except SystemExit as exc:  # argparse has printed usage/help/version already
        return exc.code if isinstance(exc.code, int) else (ExitCode.OK if exc.code is None
                                                           else ExitCode.USAGE)
    try:
        with _logfile(getattr(args, "logfile", None) if args.command != "server" else None):
            code: int = args.handler(args, registry_loader or load_registry)
            _flush_stdout()
        return code
    except KeyboardInterrupt:
        error("interrupted")
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return ExitCode.OUTPUT
    except Exception as exc:
        return _report(exc)


def _terminate_as_interrupt() -> None:
    # SIGTERM (timeout(1), service managers, kill) ends a test the way Ctrl-C does: the
    # tools' own clean-up stops what they started, and what was measured is still printed.
    import signal
    import threading

    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


def _report(exc: Exception) -> int:
    missing = _missing_package(exc)
    if missing:
        error(missing)
        return ExitCode.INTERNAL
    code = exit_code_for(exc)
    expected = code != ExitCode.INTERNAL or isinstance(exc, (NetprobeError, OSError))
    if os.environ.get("NETPROBE_DEBUG") == "1":
        import traceback  # only here: every import is start-up time on a router

        traceback.print_exc()
    if expected:
        error(str(exc) or type(exc).__name__)
    else:
        error(f"internal error: {one_line(exc)} (NETPROBE_DEBUG=1 shows the traceback)")
    return code


def _missing_package(exc: BaseException) -> str | None:
    """What to say when a command needs a package this install lacks (rich and stevedore
    are the client's: OpenWrt's package and a server-only install leave them out), or
    None when ``exc`` is something else."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.split(".")[0]
    if top == "netprobe" or top in sys.stdlib_module_names:
        return None
    return (f"this command needs the Python module {top!r}, which is not installed here "
            "(a server-only install, such as OpenWrt's package, leaves out what only the "
            "client commands use; pip install netprobe-meter brings it)")


def iperf3_words(words: list[str]) -> list[str]:
    """iperf3's first words as netprobe commands: ``-c HOST ...`` is ``run -c HOST ...`` and
    ``-s ...`` is ``server ...`` (when no netprobe command is named)."""
    if not words or not words[0].startswith("-") or words[0] in ("-h", "--help", "--version"):
        return words
    if "-s" in words or "--server" in words:
        return ["server", *(w for w in words if w not in ("-s", "--server"))]
    if "-c" in words or "--client" in words:
        return ["run", *words]
    return words


@contextlib.contextmanager
def _logfile(path: str | None) -> Iterator[None]:
    # --logfile (iperf3's): what stdout would show goes to the end of FILE instead.
    if path is None:
        yield
        return
    from netprobe.cli.outfile import OutputError

    try:
        handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 (held for the command)
    except OSError as exc:
        raise OutputError(f"cannot write the log {path}: {exc.strerror or exc}") from None
    log = _LogFile(handle, path)
    try:
        with contextlib.redirect_stdout(log):
            yield
            log.flush()
    finally:
        # a write that failed said so already (close flushes the same bytes again)
        with contextlib.suppress(OSError):
            handle.close()


class _LogFile:
    """The --logfile as stdout: a failed write (a full disk, /dev/full) is the exit code for
    output that cannot be written, naming the file, not a bare system error."""

    def __init__(self, handle: Any, path: str) -> None:
        self.handle, self.path = handle, path

    def write(self, text: str) -> int:
        return int(self._do(self.handle.write, text))

    def flush(self) -> None:
        self._do(self.handle.flush)

    def _do(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except OSError as exc:
            from netprobe.cli.outfile import OutputError

            raise OutputError(f"cannot write the log {self.path}: "
                              f"{exc.strerror or exc}") from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)  # encoding, isatty, fileno, ... as the file's


def _flush_stdout() -> None:
    # What is still buffered must reach stdout now, while a failure (`--json > /dev/full`)
    # can still be an exit code: at the interpreter's exit it would only be a warning.
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        _silence_stdout()
        from netprobe.cli.outfile import OutputError

        raise OutputError(f"cannot write stdout: {exc.strerror or exc}") from None


def _silence_stdout() -> None:
    # The reader went away (`netprobe tools | head -1`): point stdout at /dev/null so the
    # interpreter's final flush does not complain with a traceback of its own.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def version_text() -> str:
    """``netprobe X.Y.Z (data path: c|python|unknown, Python X.Y.Z)``."""
    import platform

    try:
        from netprobe.core import DATA_PATH

        data_path = str(DATA_PATH)
    except Exception:  # no core module (or a broken build): still answer --version
        data_path = "unknown"
    return f"netprobe {__version__} (data path: {data_path}, Python {platform.python_version()})"


# --- the parser --------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, with help printed through rich (highlighted on a terminal), and an
    unknown option answered with the nearest known one."""

    def error(self, message: str) -> NoReturn:
        """Usage and the one-line error, with ``did you mean --time?`` when one is near (or
        what an iperf3 or nuttcp option is called here). An unknown option of a command is
        reported under that command's usage, not the top level's."""
        message += _nearest_hint(self, message)
        command = _subparser(self) if message.startswith("unrecognized arguments:") else None
        if command is None:
            super().error(message)
        command.print_usage(sys.stderr)
        command.exit(ExitCode.USAGE, f"{command.prog}: error: {message}\n")

    def print_help(self, file: Any = None) -> None:
        try:
            from netprobe.cli.render import print_help
        except ImportError:  # without rich (a server-only install): argparse's plain text
            super().print_help(file)
            return
        print_help(self.format_help(), file)


class _VersionAction(argparse.Action):
    """``--version``: print :func:`version_text` and exit 0 (no rich, no plugins)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        sys.stdout.write(version_text() + "\n")
        parser.exit(ExitCode.OK)


def _nearest_hint(parser: argparse.ArgumentParser, message: str) -> str:
    if not message.startswith("unrecognized arguments:"):
        return ""
    unknown = [w.split("=", 1)[0] for w in message.split(":", 1)[1].split()
               if w.startswith("-")]
    from netprobe.cli.habits import hint_for

    known = _option_strings(parser)
    hints = [f"{word}: {hint}" for word in unknown
             if (hint := hint_for(word, known)) is not None]
    return f" ({'; '.join(hints)})" if hints else ""


def _subparser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser | None:
    """The parser of the command the words name, if the words name one."""
    chosen = _chosen(getattr(parser, "words", []))
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and chosen in action.choices:
            return action.choices[chosen]
    return None


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """The options of the command the words name (the top level's without one)."""
    command = _subparser(parser)
    return [*parser._option_string_actions,
            *(command._option_string_actions if command is not None else ())]


def _chosen(words: Sequence[str]) -> str | None:
    """The command the words name (the first word that is not an option), if any."""
    return next((word for word in words if not word.startswith("-")), None)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser: every command in full, or with ``only`` given just that command
    in full and the others as their one-line summary (their modules are not imported)."""
    epilog = "exit codes:\n" + "\n".join(f"  {int(code):>3}  {text}" for code, text in
                                         EXIT_CODES.items())
    parser = _Parser(
        prog="netprobe", formatter_class=HelpFormatter, epilog=epilog, allow_abbrev=False,
        description="Measure what a network path can carry, with netprobe's own engine or "
                    "with iperf3, iperf2, nuttcp and NTttcp, all reporting in one result "
                    "schema.")
    parser.add_argument("--version", action=_VersionAction, nargs=0,
                        help="show the version and the native data path, then exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, summary in COMMANDS.items():
        if only is None or name == only:
            module = importlib.import_module(f"netprobe.cli.commands.{name}")
            module.add_parser(commands, summary, epilog)
        else:
            commands.add_parser(name, help=summary, add_help=False)
    return parser


__all__ = ["COMMANDS", "EXIT_CODES", "ExitCode", "UsageError", "build_parser", "exit_code_for",
           "main", "spec_from_args", "version_text"]
