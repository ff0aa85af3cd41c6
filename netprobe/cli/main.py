"""netprobe's command line: argparse, dispatch, and the mapping of errors to exit codes.

Commands: ``run`` (a test; ``--repeat N`` for N trials and their statistics), ``server``
(the native engine's far end), ``tools`` (installed tool plugins and why they can or cannot
run), ``parse`` (saved tool output to a result), ``compare`` (one test through several
tools, interleaved, side by side) and ``report`` (saved results as tables or an HTML page);
the last two and ``--repeat`` live in :mod:`netprobe.cli.trialcmds`.

Exit codes (``EXIT_CODES``; every error is one line on stderr, ``netprobe: error: ...``):

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

This module stays cheap to import: rich, the schema and the plugins load only when a
command needs them, so ``netprobe --version`` answers quickly even on a small router.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from netprobe import __version__
from netprobe.cli.units import parse_bitrate, parse_bytes, parse_dscp, parse_seconds
from netprobe.errors import (
    NetprobeError,
    ParseError,
    SpecError,
    TestFailed,
    TestInterrupted,
    ToolNotFound,
    ToolUnavailable,
)

if TYPE_CHECKING:
    from netprobe.cli.formats import Output
    from netprobe.plugin import Registry, Reporter, Tool
    from netprobe.schema import Result, TestSpec

T = TypeVar("T")

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_TOOL_NOT_FOUND = 3
EXIT_TOOL_UNAVAILABLE = 4
EXIT_TEST_FAILED = 5
EXIT_OUTPUT = 6
EXIT_INTERRUPTED = 130

EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_INTERNAL: "internal error (NETPROBE_DEBUG=1 shows the traceback) or a system error",
    EXIT_USAGE: "bad arguments, spec refused by the tool, or unreadable input file",
    EXIT_TOOL_NOT_FOUND: "unknown tool (not installed, or failed to load)",
    EXIT_TOOL_UNAVAILABLE: "tool cannot run here (see `netprobe tools`)",
    EXIT_TEST_FAILED: "test failed (partial result still printed/saved)",
    EXIT_OUTPUT: "cannot write the result (output file, or stdout closed)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C; partial result still printed/saved)",
}
"""Every exit code of the CLI and what it means (shown in ``netprobe --help``)."""

DEFAULT_DURATION_S = 10.0
"""Test length when neither ``--time`` nor ``--bytes`` is given."""

RegistryLoader = Callable[[], "Registry"]


class UsageError(NetprobeError):
    """A command-line argument cannot be used (exit code 2)."""


# --- entry point -------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, *,
         registry_loader: RegistryLoader | None = None) -> int:
    """Run the netprobe command line; return the exit code (the console script exits with it).

    ``registry_loader`` replaces :func:`netprobe.plugin.load_registry` (for tests that
    bring their own plugins).
    """
    if argv is None:
        _terminate_as_interrupt()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed usage/help/version already
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else
                                                           EXIT_USAGE)
    try:
        code: int = args.handler(args, registry_loader or _load_registry)
        return code
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_OUTPUT
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


def exit_code_for(exc: BaseException) -> int:
    """The exit code for an error that ended a command."""
    from_types: list[tuple[type[BaseException], int]] = [
        (TestInterrupted, EXIT_INTERRUPTED),
        (TestFailed, EXIT_TEST_FAILED),
        (SpecError, EXIT_USAGE),
        (UsageError, EXIT_USAGE),
        (ParseError, EXIT_USAGE),
        (ToolNotFound, EXIT_TOOL_NOT_FOUND),
        (ToolUnavailable, EXIT_TOOL_UNAVAILABLE),
    ]
    formats = sys.modules.get("netprobe.cli.formats")  # loaded if it could have raised
    if formats is not None:
        from_types.append((formats.OutputError, EXIT_OUTPUT))
    for kind, code in from_types:
        if isinstance(exc, kind):
            return code
    return EXIT_INTERNAL


def _report(exc: Exception) -> int:
    code = exit_code_for(exc)
    expected = code != EXIT_INTERNAL or isinstance(exc, (NetprobeError, OSError))
    if os.environ.get("NETPROBE_DEBUG") == "1":
        traceback.print_exc()
    if expected:
        _error(str(exc) or type(exc).__name__)
    else:
        _error(f"internal error: {_one_line(exc)} (NETPROBE_DEBUG=1 shows the traceback)")
    return code


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _error(message: str) -> None:
    try:
        from netprobe.cli.render import print_error
    except Exception:  # rich missing or broken: the error must still reach the user
        sys.stderr.write(f"netprobe: error: {' '.join(message.split())}\n")
        return
    print_error(message)


def _silence_stdout() -> None:
    # The reader went away (`netprobe tools | head -1`): point stdout at /dev/null so the
    # interpreter's final flush does not complain with a traceback of its own.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _load_registry(only: str | None = None) -> Registry:
    from netprobe.plugin import load_registry

    return load_registry(only=only)


def _registry_for(load: RegistryLoader, name: str) -> Registry:
    # The default loader can import just the one tool a command needs; a loader a test
    # passes in builds its whole registry.
    return _load_registry(only=name) if load is _load_registry else load()


def version_text() -> str:
    """``netprobe X.Y.Z (data path: c|python|unknown, Python X.Y.Z)``."""
    try:
        from netprobe.core import DATA_PATH

        data_path = str(DATA_PATH)
    except Exception:  # no core module (or a broken build): still answer --version
        data_path = "unknown"
    return f"netprobe {__version__} (data path: {data_path}, Python {platform.python_version()})"


# --- argument types ----------------------------------------------------------------------


def _checked(parse: Callable[[str], T], test: Callable[[T], bool], need: str
             ) -> Callable[[str], T]:
    """An argparse type: ``parse`` then ``test``; failures become one-line usage errors."""

    def convert(text: str) -> T:
        try:
            value = parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"{need}, got {text!r}")
        return value

    return convert


def _whole_number(text: str) -> int:
    try:
        return int(text.strip(), 10)
    except ValueError:
        raise ValueError(f"not a whole number: {text!r}") from None


_SECONDS = _checked(parse_seconds, lambda v: v > 0, "must be more than 0 seconds")
_SECONDS_OR_ZERO = _checked(parse_seconds, lambda v: v >= 0, "must be 0 or more seconds")
_BYTES = _checked(parse_bytes, lambda v: v > 0, "must be at least 1 byte")
_RATE = _checked(parse_bitrate, lambda v: v >= 0, "must be 0 (unlimited) or more")
_COUNT = _checked(_whole_number, lambda v: v >= 1, "must be a whole number of 1 or more")
_PORT = _checked(_whole_number, lambda v: 1 <= v <= 65535, "must be a port number 1-65535")
_LISTEN_PORT = _checked(_whole_number, lambda v: 0 <= v <= 65535,
                        "must be a port number 0-65535 (0: any free port)")
_DSCP = _checked(parse_dscp, lambda v: True, "")


# --- the parser --------------------------------------------------------------------------


_LAZY_DEFAULT = re.compile(r"\{server:(\w+)\}")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Plain argparse help that keeps the epilog's layout and fills in the server's
    defaults (``{server:port}``) only when help is shown, so parsing never imports the
    engine."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = super()._get_help_string(action)
        return _LAZY_DEFAULT.sub(lambda m: _server_default(m.group(1)), text) if text else text


def _server_default(name: str) -> str:
    try:
        import attrs

        from netprobe.engine.server import ServerConfig

        return str(attrs.fields_dict(ServerConfig)[name].default)
    except Exception:  # engine not installed: help must still work
        return "see the native engine"


class _Parser(argparse.ArgumentParser):
    """argparse, with help printed through rich (highlighted on a terminal)."""

    def print_help(self, file: Any = None) -> None:
        from netprobe.cli.render import print_help

        print_help(self.format_help(), file)


class _VersionAction(argparse.Action):
    """``--version``: print :func:`version_text` and exit 0 (no rich, no plugins)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        sys.stdout.write(version_text() + "\n")
        parser.exit(EXIT_OK)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (all commands)."""
    epilog = "exit codes:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in
                                         EXIT_CODES.items())
    parser = _Parser(
        prog="netprobe", formatter_class=_HelpFormatter, epilog=epilog, allow_abbrev=False,
        description="Measure what a network path can carry, with netprobe's own engine or "
                    "with iperf3, iperf2, nuttcp and NTttcp, all reporting in one result "
                    "schema.")
    parser.add_argument("--version", action=_VersionAction, nargs=0,
                        help="show the version and the native data path, then exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_run(commands, epilog)
    _add_server(commands, epilog)
    _add_tools(commands, epilog)
    _add_parse(commands, epilog)
    _add_compare(commands, epilog)
    _add_report(commands, epilog)
    _add_path(commands, epilog)
    return parser


def _subparser(commands: Any, name: str, summary: str, epilog: str, usage: str
               ) -> argparse.ArgumentParser:
    # A short usage line: argparse's own lists every option, which buries a one-line error.
    parser: argparse.ArgumentParser = commands.add_parser(
        name, help=summary, description=summary, epilog=epilog, usage=usage,
        # No abbreviations: "--secret x" must never be taken for --secret-file.
        formatter_class=_HelpFormatter, allow_abbrev=False)
    return parser


def _add_run(commands: Any, epilog: str) -> None:
    parser = _subparser(commands, "run", "run a throughput test", epilog,
                        "%(prog)s [HOST] [--tool NAME] [options]")
    parser.set_defaults(handler=_cmd_run)
    parser.add_argument("host", nargs="?", metavar="HOST",
                        help="the far end (a `netprobe server`, or the tool's own server); "
                             "omit it to run both ends on this machine over loopback")
    parser.add_argument("-c", "--client", metavar="HOST", help="same as HOST (iperf3 habit)")
    parser.add_argument("--tool", default="native", metavar="NAME",
                        help="tool plugin that runs the test (default: native; see "
                             "`netprobe tools`)")
    _add_test_options(parser)
    _add_socket_options(parser)
    _add_agent_options(parser)
    _add_output_options(parser)
    _add_trial_options(parser, ("--repeat",), None,
                       "run the test N times and summarise the trials (mean, median, sd, "
                       "min, max, 95%% confidence interval of the mean)")


def _add_test_options(parser: argparse.ArgumentParser,
                      bytes_flags: tuple[str, ...] = ("-n", "--bytes")) -> None:
    group = parser.add_argument_group("test")
    group.add_argument("-t", "--time", type=_SECONDS, metavar="SECONDS",
                       help=f"seconds to send (default: {DEFAULT_DURATION_S:g}, or until "
                            "--bytes are sent when that is given)")
    group.add_argument(*bytes_flags, dest="bytes", type=_BYTES, metavar="BYTES",
                       help="bytes to send per stream instead of a duration; k/m/g suffixes "
                            "are 1024-based like iperf3 (64k = 65,536)")
    group.add_argument("-P", "--parallel", type=_COUNT, default=1, metavar="N",
                       help="parallel streams, per direction (default: 1)")
    group.add_argument("-u", "--udp", action="store_true", help="UDP instead of TCP")
    group.add_argument("-b", "--bitrate", type=_RATE, metavar="RATE",
                       help="rate limit per stream in bits per second; k/m/g suffixes are SI "
                            "(1M = 1,000,000 bit/s); 0 means unlimited. UDP defaults to 1M, as "
                            "in iperf3 and nuttcp, so that a forgotten -b floods no link")
    way = group.add_mutually_exclusive_group()
    way.add_argument("-R", "--reverse", dest="direction", action="store_const",
                     const="reverse", default="normal", help="the server sends")
    way.add_argument("--bidir", dest="direction", action="store_const", const="bidir",
                     help="both ends send at once")
    group.add_argument("-i", "--interval", type=_SECONDS_OR_ZERO, default=1.0,
                       metavar="SECONDS",
                       help="seconds between interval reports (default: 1; 0 disables them)")
    group.add_argument("-O", "--omit", type=_SECONDS_OR_ZERO, default=0.0, metavar="SECONDS",
                       help="leave the first SECONDS out of the summary (warm-up)")


def _add_socket_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sockets")
    group.add_argument("-l", "--length", type=_BYTES, metavar="BYTES",
                       help="buffer (TCP) or datagram payload (UDP) length; k/m suffixes are "
                            "1024-based")
    group.add_argument("-w", "--window", type=_BYTES, metavar="BYTES",
                       help="socket buffer size to ask for; k/m suffixes are 1024-based")
    group.add_argument("-M", "--mss", type=_BYTES, metavar="BYTES", help="TCP maximum segment size")
    group.add_argument("-N", "--nodelay", action="store_true", help="disable Nagle (TCP_NODELAY)")
    group.add_argument("--dscp", type=_DSCP, metavar="VALUE",
                       help="DSCP for the traffic: 0-63, or a name (EF, AF11-AF43, CS0-CS7, "
                            "VA, LE, DF)")
    group.add_argument("-C", "--congestion", metavar="ALGO",
                       help="TCP congestion control algorithm (e.g. cubic, bbr)")
    family = group.add_mutually_exclusive_group()
    family.add_argument("-4", dest="ip_version", action="store_const", const=4,
                        help="IPv4 only")
    family.add_argument("-6", dest="ip_version", action="store_const", const=6,
                        help="IPv6 only")
    group.add_argument("-p", "--port", type=_PORT, metavar="PORT",
                       help="server port (default: the tool's own)")
    group.add_argument("-B", "--bind", metavar="ADDRESS", help="local address to bind to")
    group.add_argument("-Z", "--zerocopy", action="store_true",
                       help="zero-copy send (sendfile), like iperf3 -Z")
    group.add_argument("--secret-file", metavar="FILE",
                       help="shared secret for a netprobe server that requires one (or set "
                            "$NETPROBE_SECRET)")
    group.add_argument("--skip-rx-copy", action="store_true",
                       help="discard received data in the kernel (MSG_TRUNC)")


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("output")
    group.add_argument("--format", choices=("human", "json", "jsonl", "csv"), default="human",
                       help="result format (default: human). json: one document; jsonl: one "
                            "line per result; csv: a header and one row per direction")
    group.add_argument("--json", dest="format", action="store_const", const="json",
                       help="same as --format json")
    group.add_argument("-o", "--output", metavar="FILE",
                       help="also write the result, in the chosen format, to FILE (replaced "
                            "atomically; jsonl appends a line)")
    group.add_argument("-q", "--quiet", action="store_true",
                       help="nothing on stdout (use with -o); errors still go to stderr")
    group.add_argument("--per-stream", action="store_true",
                       help="with -P, show every stream, not only the sums")


def _add_server(commands: Any, epilog: str) -> None:
    parser = _subparser(commands, "server", "run the native engine's far end", epilog,
                        "%(prog)s [-p PORT] [-B ADDRESS] [--max-tests N] [-1]")
    parser.set_defaults(handler=_cmd_server)
    parser.add_argument("-p", "--port", type=_LISTEN_PORT, metavar="PORT",
                        help="TCP and UDP port to listen on; 0 picks a free one, shown when "
                             "ready (default: {server:port})")
    parser.add_argument("-B", "--bind", metavar="ADDRESS",
                        help="address to listen on (default: all)")
    parser.add_argument("--max-tests", type=_COUNT, metavar="N",
                        help="most tests served at once (default: {server:max_tests})")
    parser.add_argument("-1", "--one-off", action="store_true",
                        help="serve one test, then exit")
    _add_server_limits(parser)


def _add_server_limits(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("access and limits")
    group.add_argument("--allow-third-party", action="store_true",
                       help="run tests that clients ask this agent to send to another host "
                            "(off by default: it would make the agent a traffic amplifier)")
    group.add_argument("--allow", action="append", metavar="CIDR",
                       help="client network allowed to connect (repeatable; default: any); "
                            "checked before anything else")
    group.add_argument("--secret-file", metavar="FILE",
                       help="require clients to prove they know the shared secret in FILE "
                            "(HMAC challenge); or set $NETPROBE_SECRET. Never on the command "
                            "line, where others could read it")
    group.add_argument("--max-duration", type=_SECONDS, metavar="SECONDS",
                       help="longest test accepted (default: {server:max_duration_s})")
    group.add_argument("--max-streams", type=_COUNT, metavar="N",
                       help="most parallel streams per test (default: {server:max_streams})")
    group.add_argument("--max-rate", type=_RATE, metavar="RATE",
                       help="highest rate per stream accepted; unlimited tests are then "
                            "refused (default: no limit)")
    group.add_argument("--max-connections-per-address", type=_COUNT, metavar="N",
                       help="control connections and handshakes at once from one address "
                            "(default: {server:max_connections_per_address})")
    group.add_argument("--max-message-bytes", type=_COUNT, metavar="N",
                       help="largest control message accepted "
                            "(default: {server:max_message_bytes})")
    group.add_argument("--handshake-timeout", type=_SECONDS, metavar="SECONDS",
                       help="time a new connection has to say hello "
                            "(default: {server:handshake_timeout_s})")
    group.add_argument("--idle-timeout", type=_SECONDS, metavar="SECONDS",
                       help="time a control connection may stay silent before asking for a "
                            "test (default: {server:idle_timeout_s})")


def _add_agent_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("agents (netprobe server on the far hosts)")
    group.add_argument("--from", dest="from_host", metavar="HOST",
                       help="third-party test: the agent on HOST runs the test against "
                            "--to (that agent must allow it: --allow-third-party)")
    group.add_argument("--to", dest="to_host", metavar="HOST",
                       help="the target of a third-party test (same as HOST)")
    group.add_argument("--no-agent", action="store_true",
                       help="do not ask an agent on HOST to start the tool's server: use "
                            "one already running there")
    group.add_argument("--agent-port", type=_PORT, metavar="PORT",
                       help="port of the agents (default: 5301)")


def _add_tools(commands: Any, epilog: str) -> None:
    parser = _subparser(commands, "tools", "list tool plugins and whether they can run here",
                        epilog, "%(prog)s [HOST] [--json]")
    parser.set_defaults(handler=_cmd_tools)
    parser.add_argument("host", nargs="?", metavar="HOST",
                        help="ask the netprobe agent on HOST instead of this machine")
    parser.add_argument("--agent-port", type=_PORT, metavar="PORT",
                        help="port of the agent (default: 5301)")
    parser.add_argument("--secret-file", metavar="FILE",
                        help="shared secret for an agent that requires one")
    parser.add_argument("--json", action="store_true", help="a JSON list instead of a table")


def _add_parse(commands: Any, epilog: str) -> None:
    parser = _subparser(commands, "parse", "turn a tool's saved output into a netprobe result",
                        epilog, "%(prog)s --tool NAME [options] FILE...")
    parser.set_defaults(handler=_cmd_parse)
    parser.add_argument("--tool", required=True, metavar="NAME",
                        help="the tool that wrote the files")
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="saved output (client and server logs, as the tool needs; "
                             "- reads stdin)")
    _add_output_options(parser)


def _add_trial_options(parser: argparse.ArgumentParser, flags: tuple[str, ...],
                       default: int | None, help_text: str) -> None:
    group = parser.add_argument_group("trials")
    group.add_argument(*flags, dest="repeat" if flags[0] == "--repeat" else "trials",
                       type=_COUNT, default=default, metavar="N", help=help_text)
    group.add_argument("--pause", type=_SECONDS_OR_ZERO, metavar="SECONDS",
                       help="seconds to wait between trials (default: 0)")


DEFAULT_TRIALS = 5
"""Trials per tool of ``netprobe compare`` without ``-n``."""


def _add_compare(commands: Any, epilog: str) -> None:
    parser = _subparser(commands, "compare",
                        "run one test through several tools, interleaved, side by side",
                        epilog, "%(prog)s [HOST] [--tools A,B,...] [-n TRIALS] [options]")
    parser.set_defaults(handler=_cmd_compare, tool="native")
    parser.add_argument("host", nargs="?", metavar="HOST",
                        help="the far end, where each tool's server runs; omit it to run "
                             "both ends on this machine over loopback")
    parser.add_argument("-c", "--client", metavar="HOST", help="same as HOST")
    parser.add_argument("--tools", metavar="A,B,...",
                        help="tools to compare; the first is the reference for the ratios "
                             "(default: every installed tool, native first). A tool that "
                             "cannot honour the options, or cannot run here, is left out and "
                             "listed with the reason")
    _add_trial_options(parser, ("-n", "--trials"), DEFAULT_TRIALS,
                       f"trials per tool (default: {DEFAULT_TRIALS}), run A B C A B C ... "
                       "so that drift hits every tool alike. Here -n counts trials: the "
                       "byte count is --bytes")
    _add_test_options(parser, bytes_flags=("--bytes",))
    _add_socket_options(parser)
    _add_output_options(parser)


def _add_report(commands: Any, epilog: str) -> None:
    parser = _subparser(commands, "report",
                        "summarise saved results: tables, sparklines, an HTML page", epilog,
                        "%(prog)s FILE... [--group-by KEYS] [--html OUT.html]")
    parser.set_defaults(handler=_cmd_report)
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="saved results: JSON documents (--json, `netprobe parse "
                             "--json`), JSON lines (-o results.jsonl), or both; - reads stdin")
    parser.add_argument("--group-by", default="tool", metavar="KEYS",
                        help="comma-separated: tool, hosts (client and server), run (run id) "
                             "or any spec field, e.g. protocol, streams, direction "
                             "(default: tool). The first group is the reference for ratios")
    parser.add_argument("--format", choices=("human", "json", "csv"), default="human",
                        help="human: a line per result and the statistics table; json, csv: "
                             "the statistics as records (unscaled: bit/s, us, percent)")
    parser.add_argument("--json", dest="format", action="store_const", const="json",
                        help="same as --format json")
    parser.add_argument("--summary-only", action="store_true",
                        help="only the statistics table, no line per result")
    parser.add_argument("--html", metavar="OUT.html",
                        help="also write a self-contained page with the table and charts "
                             "(needs matplotlib: pip install 'netprobe[charts]')")
    parser.add_argument("-q", "--quiet", action="store_true", help="nothing on stdout")


def _add_path(commands: Any, epilog: str) -> None:
    parser = _subparser(commands, "path",
                        "test each segment of a path and the whole path; name the bottleneck",
                        epilog, "%(prog)s HOP1 HOP2 [HOP...] [--tool NAME] [options]")
    parser.set_defaults(handler=_cmd_path, host=None, client=None)
    parser.add_argument("hops", nargs="+", metavar="HOP",
                        help="hosts along the path, in order; each runs `netprobe server` and "
                             "all but the last allow third-party tests (--allow-third-party)")
    parser.add_argument("--tool", default="native", metavar="NAME",
                        help="tool for every segment (default: native)")
    _add_test_options(parser)
    _add_socket_options(parser)
    group = parser.add_argument_group("agents")
    group.add_argument("--agent-port", type=_PORT, metavar="PORT",
                       help="port of the agents (default: 5301)")
    _add_output_options(parser)


def _cmd_path(args: argparse.Namespace, _load: RegistryLoader) -> int:
    from netprobe.cli.pathcmd import cmd_path
    from netprobe.engine.auth import load_secret

    spec = spec_from_args(args)
    return cmd_path(args, spec, load_secret(args.secret_file))


def _cmd_compare(args: argparse.Namespace, load: RegistryLoader) -> int:
    from netprobe.cli.trialcmds import cmd_compare

    options = {"secret_file": args.secret_file} if args.secret_file else None
    return cmd_compare(args, spec_from_args(args), load(),
                       lambda registry, name: _make_tool(registry, name, options))


def _cmd_report(args: argparse.Namespace, _load: RegistryLoader) -> int:
    from netprobe.cli.trialcmds import cmd_report

    return cmd_report(args, _read)


# --- run ---------------------------------------------------------------------------------


def _cmd_run(args: argparse.Namespace, load: RegistryLoader) -> int:
    spec = spec_from_args(args)
    if args.pause is not None and args.repeat is None:
        raise UsageError("--pause needs --repeat")
    options = {"secret_file": args.secret_file} if args.secret_file else None
    tool = _make_tool(_registry_for(load, spec.tool), spec.tool, options)
    tool.check(spec)
    _require_available(tool)
    if args.repeat is not None:
        from netprobe.cli.trialcmds import cmd_repeat

        return cmd_repeat(args, spec, tool)
    output = _output(args)
    reporter = output.reporter(spec)
    try:
        result = _run_tool(tool, spec, reporter, args)
    except TestFailed as exc:
        _emit_partial(output, exc.partial, reporter)
        raise
    output.emit(result, intervals_shown=_lines_shown(reporter))
    return _status_code(result)


def spec_from_args(args: argparse.Namespace) -> TestSpec:
    """The TestSpec for ``netprobe run`` arguments (SpecError if the values do not fit)."""
    from netprobe.schema import TestSpec

    return TestSpec(
        tool=args.tool, host=_host(args), protocol="udp" if args.udp else "tcp",
        direction=args.direction, streams=args.parallel, duration_s=_duration(args),
        bytes_total=args.bytes, interval_s=args.interval or None, omit_s=args.omit,
        length_bytes=args.length, window_bytes=args.window,
        rate_bits_per_second=_rate(args), mss_bytes=args.mss, nodelay=args.nodelay,
        dscp=args.dscp, congestion=args.congestion, ip_version=args.ip_version,
        port=args.port, bind_address=args.bind, zerocopy=args.zerocopy,
        skip_rx_copy=args.skip_rx_copy,
    )


UDP_DEFAULT_RATE = 1_000_000


def _rate(args: argparse.Namespace) -> float | None:
    """The spec's rate: -b as given (0 is unlimited, None in the spec); UDP defaults to 1M."""
    if args.bitrate is None:
        return UDP_DEFAULT_RATE if args.udp else None
    return args.bitrate or None


def _host(args: argparse.Namespace) -> str | None:
    given = {h for h in (args.host, args.client, getattr(args, "to_host", None)) if h}
    if len(given) > 1:
        raise UsageError(f"two hosts given: {' and '.join(sorted(given))}")
    if getattr(args, "from_host", None) and not given:
        raise UsageError("--from needs the target host: --to HOST")
    return given.pop() if given else None


def _duration(args: argparse.Namespace) -> float | None:
    # A byte count bounds the test by itself (as in iperf3 -n) unless -t is also given.
    if args.time is not None:
        return float(args.time)
    return None if args.bytes is not None else DEFAULT_DURATION_S


def _make_tool(registry: Registry, name: str, options: dict[str, Any] | None = None) -> Tool:
    cls = registry.get(name)
    try:
        return cls(options) if options else cls()
    except Exception as exc:  # a plugin's own bug: say which plugin, do not crash
        raise ToolUnavailable(f"tool {name!r} failed to start: {_one_line(exc)}") from exc


def _require_available(tool: Tool) -> None:
    try:
        availability = tool.probe()
    except Exception as exc:  # probe() must not raise; a plugin that does is unavailable
        raise ToolUnavailable(f"{tool.name}: probe failed: {_one_line(exc)}") from exc
    if not availability.available:
        reasons = "; ".join(availability.reasons) or "no reason given"
        raise ToolUnavailable(f"{tool.name} cannot run here: {reasons}")


def _run_tool(tool: Tool, spec: TestSpec, reporter: Reporter,
              args: argparse.Namespace | None = None) -> Result:
    try:
        return _run_with_agents(tool, spec, reporter, args)
    except (TestFailed, SpecError, ToolUnavailable, BrokenPipeError):
        raise  # a closed stdout is not the test's failure: exit 6 (see main)
    except (NetprobeError, OSError) as exc:  # the test did not complete: exit 5, not 1
        raise TestFailed(f"{tool.name}: {exc}") from exc


def _run_with_agents(tool: Tool, spec: TestSpec, reporter: Reporter,
                     args: argparse.Namespace | None) -> Result:
    """Through the agents: a third-party test (--from), or with the far host's agent
    starting the tool's server; plain tool.run when there is no agent to ask."""
    from netprobe.agent import client
    from netprobe.engine.auth import load_secret

    secret = load_secret(getattr(args, "secret_file", None))
    if getattr(args, "from_host", None):
        assert args is not None
        port = args.agent_port or client.protocol.DEFAULT_PORT
        return client.third_party(args.from_host, spec, reporter, secret, port)
    use_agent = not getattr(args, "no_agent", False)
    return client.run(tool, spec, reporter, secret, use_agent=use_agent)


def _emit_partial(output: Output, partial: Any, reporter: Reporter) -> None:
    # Nothing measured is lost: the partial result goes out as a full one would. The test
    # failure stays the error that decides the exit code.
    from netprobe.cli.formats import OutputError
    from netprobe.schema import Result

    if not isinstance(partial, Result):
        return
    try:
        output.emit(partial, intervals_shown=_lines_shown(reporter))
    except OutputError as exc:
        _error(str(exc))


def _lines_shown(reporter: Reporter) -> bool:
    return getattr(reporter, "lines", 0) > 0


def _status_code(result: Result) -> int:
    if result.status == "ok":
        return EXIT_OK
    _error(result.errors[0] if result.errors else f"test {result.status}")
    return EXIT_INTERRUPTED if result.status == "interrupted" else EXIT_TEST_FAILED


def _output(args: argparse.Namespace) -> Output:
    from netprobe.cli.formats import Output

    return Output(args.format, args.output, quiet=args.quiet, per_stream=args.per_stream)


# --- parse -------------------------------------------------------------------------------


def _cmd_parse(args: argparse.Namespace, load: RegistryLoader) -> int:
    tool = _make_tool(_registry_for(load, args.tool), args.tool)
    sources = [(path, _read(path)) for path in args.files]
    result = tool.parse(sources)
    _output(args).emit(result)
    return _status_code(result)


def _read(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None


# --- tools -------------------------------------------------------------------------------


def _cmd_tools(args: argparse.Namespace, load: RegistryLoader) -> int:
    rows = _remote_tool_rows(args) if args.host else tool_rows(load())
    if args.json:
        import json

        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return EXIT_OK
    from netprobe.cli.render import print_note, stdout_console, tools_table

    if rows:
        stdout_console().print(tools_table(rows))
    else:
        print_note("no tool plugins are installed (entry-point group netprobe.tools)")
    return EXIT_OK


def _remote_tool_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    from netprobe.agent.client import remote_tools
    from netprobe.engine.auth import load_secret
    from netprobe.engine.protocol import DEFAULT_PORT

    rows = remote_tools(args.host, load_secret(args.secret_file), args.agent_port or DEFAULT_PORT)
    return [_row(str(r.get("name")), "available" if r.get("available") else "unavailable",
                 version=r.get("version"), reasons=list(r.get("reasons") or []),
                 details=list(r.get("details") or [])) for r in rows]


def tool_rows(registry: Registry) -> list[dict[str, Any]]:
    """One dict per tool (loaded or failed), as ``netprobe tools --json`` prints them.

    Keys: name, status (available/unavailable/failed), version, path, details, reasons,
    description, aliases, error (load or probe failure), target (entry point).
    """
    rows = [_tool_row(name, cls) for name, cls in sorted(registry.tools.items())]
    for failure in registry.failures:
        rows.append(_row(failure.name, "failed", error=failure.error, target=failure.target))
    return rows


def _tool_row(name: str, cls: type[Tool]) -> dict[str, Any]:
    described = {"description": cls.description, "aliases": list(cls.aliases),
                 "target": f"{cls.__module__}:{cls.__qualname__}"}
    try:
        found = cls().probe()
    except Exception as exc:  # a plugin bug shows in the list instead of breaking it
        return _row(name, "unavailable", error=f"probe failed: {_one_line(exc)}", **described)
    return _row(name, "available" if found.available else "unavailable",
                version=found.version, path=found.path, details=list(found.details),
                reasons=list(found.reasons), **described)


def _row(name: str, status: str, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"name": name, "status": status, "version": None, "path": None,
                           "details": [], "reasons": [], "description": "", "aliases": [],
                           "error": None, "target": None}
    row.update(fields)
    return row


# --- server ------------------------------------------------------------------------------


_SERVER_FIELDS = {
    "port": "port", "max_tests": "max_tests", "max_duration": "max_duration_s",
    "max_streams": "max_streams", "max_rate": "max_rate_bps",
    "max_connections_per_address": "max_connections_per_address",
    "max_message_bytes": "max_message_bytes", "handshake_timeout": "handshake_timeout_s",
    "idle_timeout": "idle_timeout_s",
}


def _server_options(args: argparse.Namespace) -> dict[str, Any]:
    """ServerConfig keywords from the command line (only what was given)."""
    from netprobe.engine.auth import load_secret

    options: dict[str, Any] = {"bind_address": args.bind, "one_off": args.one_off,
                               "allow_third_party": args.allow_third_party,
                               "allow": tuple(args.allow or ()),
                               "secret": load_secret(args.secret_file)}
    for name, field in _SERVER_FIELDS.items():
        if getattr(args, name) is not None:
            options[field] = getattr(args, name)
    return options


def _cmd_server(args: argparse.Namespace, _load: RegistryLoader) -> int:
    try:
        from netprobe.engine.server import ServerConfig, serve
    except ImportError as exc:
        raise ToolUnavailable(f"the native server is not in this install: {exc}") from None
    from netprobe.cli.render import print_line, print_note

    config = ServerConfig(**_server_options(args))
    where = args.bind or "all addresses"

    def log(line: str) -> None:
        # Called from the server's threads: a closed log pipe must not stop the serving.
        with contextlib.suppress(OSError):
            print_line(line)

    from netprobe.agent.service import handlers

    try:
        serve(config, log=log, handlers=handlers(),
              ready=lambda port: log(f"netprobe server listening on {where} port {port}"))
    except KeyboardInterrupt:
        print_note("netprobe server: stopped")
    return EXIT_OK
