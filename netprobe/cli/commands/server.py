"""``netprobe server``: the native engine's far end and the agent."""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, Callable

from netprobe.cli import args as opts
from netprobe.cli.common import RegistryLoader
from netprobe.cli.exitcodes import ExitCode, UsageError
from netprobe.errors import ToolUnavailable


def add_parser(commands: Any, summary: str, epilog: str) -> None:
    """The ``server`` command's options."""
    parser = opts.subparser(commands, "server", summary, epilog,
                            "%(prog)s [-p PORT] [-B ADDRESS] [--max-tests N] [-1]")
    parser.set_defaults(handler=handle)
    parser.add_argument("-p", "--port", type=opts.LISTEN_PORT, metavar="PORT",
                        help="TCP and UDP port to listen on; 0 picks a free one, shown when "
                             "ready (default: {server:port})")
    parser.add_argument("-B", "--bind", metavar="ADDRESS",
                        help="address to listen on (default: all)")
    parser.add_argument("--max-tests", type=opts.COUNT, metavar="N",
                        help="most tests served at once (default: {server:max_tests})")
    parser.add_argument("-1", "--one-off", action="store_true",
                        help="serve one test, then exit")
    _add_service_options(parser)
    _add_server_limits(parser)


def _add_service_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("running as a service (see docs/service.md)")
    group.add_argument("--logfile", metavar="FILE",
                       help="append the event log to FILE instead of stdout (as iperf3 "
                            "--logfile); one line per event with a UTC timestamp")
    group.add_argument("--log-format", choices=("text", "json"), default="text",
                       help="text: TIME EVENT MESSAGE; json: one object per line for log "
                            "shippers (default: text)")
    group.add_argument("--pidfile", metavar="FILE",
                       help="write the server's process id to FILE once it listens, and "
                            "remove it on exit (refused if FILE names a running process)")


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
    for flag, field, kind, metavar, text in _LIMITS:
        group.add_argument(flag, type=kind, metavar=metavar, dest=field, help=text)


# The numeric limits: flag, the ServerConfig field it sets (its dest), type, metavar, help.
# One table makes the options and turns them into ServerConfig keywords.
_LIMITS = (
    ("--max-duration", "max_duration_s", opts.LIMIT_SECONDS, "SECONDS",
     "longest test accepted (default: {server:max_duration_s})"),
    ("--max-streams", "max_streams", opts.COUNT, "N",
     "most parallel streams per test (default: {server:max_streams})"),
    ("--max-rate", "max_rate_bps", opts.RATE, "RATE",
     "highest rate per stream accepted; unlimited tests are then refused (default: no limit)"),
    ("--max-connections-per-address", "max_connections_per_address", opts.COUNT, "N",
     "control connections and handshakes at once from one address "
     "(default: {server:max_connections_per_address})"),
    ("--max-message-bytes", "max_message_bytes", opts.COUNT, "N",
     "largest control message accepted (default: {server:max_message_bytes})"),
    ("--max-memory", "max_memory_bytes", opts.BYTES, "BYTES",
     "buffer memory all running tests may take together, e.g. 256M "
     "(default: a quarter of this host's memory)"),
    ("--handshake-timeout", "handshake_timeout_s", opts.LIMIT_SECONDS, "SECONDS",
     "time a new connection has to say hello (default: {server:handshake_timeout_s})"),
    ("--idle-timeout", "idle_timeout_s", opts.LIMIT_SECONDS, "SECONDS",
     "time a control connection may stay silent before asking for a test "
     "(default: {server:idle_timeout_s})"),
)
# ServerConfig fields set from the option of the same dest when it is given.
_CONFIG_FIELDS = ("port", "max_tests", *(field for _, field, *_rest in _LIMITS))


def _server_options(args: argparse.Namespace) -> dict[str, Any]:
    """ServerConfig keywords from the command line (only what was given)."""
    from netprobe.engine.auth import load_secret

    options: dict[str, Any] = {"bind_address": args.bind, "one_off": args.one_off,
                               "allow_third_party": args.allow_third_party,
                               "allow": tuple(args.allow or ()),
                               "secret": load_secret(args.secret_file)}
    for field in _CONFIG_FIELDS:
        if getattr(args, field) is not None:
            options[field] = getattr(args, field)
    return options


def handle(args: argparse.Namespace, _load: RegistryLoader) -> int:
    """Serve until Ctrl-C/SIGTERM (or one test with ``-1``)."""
    try:
        from netprobe.engine.server import ServerConfig, serve
    except ImportError as exc:
        raise ToolUnavailable(f"the native server is not in this install: {exc}") from None
    from netprobe.agent.service import handlers, limits_note
    from netprobe.engine.log import EventLog

    config = ServerConfig(**_server_options(args))
    where = args.bind or "all addresses"
    pidfile = _PidFile(args.pidfile) if args.pidfile else None
    with _log_sink(args.logfile) as write:
        log = EventLog(write, args.log_format)

        def ready(port: int) -> None:
            if pidfile is not None:
                pidfile.write()
            log(f"netprobe server listening on {where} port {port}", event="listening",
                address=args.bind, port=port)
            log(f"netprobe server: {limits_note()}", event="limits")

        try:
            serve(config, log=log, handlers=handlers(), ready=ready)
        except KeyboardInterrupt:
            if args.logfile:
                log("netprobe server: stopped", event="stopped")
            else:  # a person at a terminal: the note beside the prompt, as before
                from netprobe.cli.render import print_note

                print_note("netprobe server: stopped")
        finally:
            if pidfile is not None:
                pidfile.remove()
    return ExitCode.OK


@contextlib.contextmanager
def _log_sink(path: str | None) -> Iterator[Callable[[str], None]]:
    """Where log lines go: stdout, or appended to ``path`` (OutputError if it cannot be)."""
    if path is None:
        def to_stdout(line: str) -> None:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

        yield to_stdout
        return
    from netprobe.cli.outfile import OutputError

    try:
        handle = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (held open)
    except OSError as exc:
        raise OutputError(f"cannot write the log {path}: {exc.strerror or exc}") from None
    with handle:
        def to_file(line: str) -> None:
            handle.write(line + "\n")

        yield to_file


class _PidFile:
    """``--pidfile``: this process's id, written once listening and removed at exit."""

    def __init__(self, path: str) -> None:
        self.path = path
        other = _running_pid(path)
        if other is not None and other != os.getpid():
            raise UsageError(f"--pidfile {path}: another netprobe server runs (pid {other})")
        from netprobe.cli.outfile import check_target

        check_target(path)

    def write(self) -> None:
        """Write the pid (atomically: a reader sees the old file or the whole new one)."""
        from netprobe.cli.outfile import write_text

        write_text(self.path, f"{os.getpid()}\n")

    def remove(self) -> None:
        """Remove the file if it still holds this process's id."""
        if _running_pid(self.path) == os.getpid():
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def _running_pid(path: str) -> int | None:
    """The pid in ``path`` if that process is alive, else None."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            pid = int(handle.read(64).strip() or "0")  # a pid, whatever else is there
    except (OSError, ValueError):
        return None
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid  # alive, owned by someone else
    return pid
