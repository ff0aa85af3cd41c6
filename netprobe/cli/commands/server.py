"""``netprobe server``: the native engine's far end and the agent."""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import stat
import sys
import threading
from collections.abc import Iterator
from typing import Any, Callable

from netprobe.cli import args as opts
from netprobe.cli.common import RegistryLoader, note
from netprobe.cli.exitcodes import ExitCode, UsageError
from netprobe.errors import ToolUnavailable


def add_parser(commands: Any, summary: str, epilog: str) -> None:
    """The ``server`` command's options."""
    parser = opts.subparser(commands, "server", summary, epilog,
                            "%(prog)s [-p PORT] [-B ADDRESS] [--max-tests N] [-1]")
    # The server's own actions, for --uci (the list argparse keeps adding to below).
    parser.set_defaults(handler=handle, uci_actions=parser._actions)
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
    group = parser.add_argument_group("iperf3 clients (see docs/iperf3.md)")
    group.add_argument("--iperf3", action="store_true",
                       help="also serve stock iperf3 clients (TCP and UDP tests, 3.9 to "
                            "3.21), several at once within --max-tests and the same limits "
                            "(off by default)")
    group.add_argument("--iperf3-port", type=opts.LISTEN_PORT, metavar="PORT", default=5201,
                       help="TCP port for iperf3 clients (default: %(default)s)")
    group.add_argument("--iperf3-results", metavar="FILE",
                       help="append the server's result of each iperf3 test to FILE, one "
                            "JSON line each (read back by netprobe's saved-result readers)")
    group.add_argument("--save-dir", metavar="DIR",
                       help="save the server's result of each iperf3 test in DIR, one JSON "
                            "file each (`netprobe report DIR/*.json` reads them); the oldest "
                            "removed past --save-keep")
    group.add_argument("--save-keep", type=opts.COUNT, metavar="N", default=1000,
                       help="most results kept in --save-dir (default: %(default)s)")
    group.add_argument("--archive", metavar="URL",
                       help="add each iperf3 test to a fleet archive (sqlite:///PATH or "
                            "postgresql://...): group iperf3-clients, the client's address "
                            "as its source; `netprobe report --archive URL` reads it")
    group.add_argument("--rsa-private-key-path", metavar="FILE",
                       help="iperf3's RSA authentication: this server's private key (PEM, "
                            "no passphrase); with --authorized-users-path, only clients "
                            "that give a listed user and password are served (needs the "
                            "cryptography package: the iperf3-auth extra)")
    group.add_argument("--authorized-users-path", metavar="FILE",
                       help="iperf3's authorized users file: lines of USER,SHA256HEX, the "
                            "hash of {USER}PASSWORD; read again at every test")
    group.add_argument("--use-pkcs1-padding", action="store_true",
                       help="the clients' tokens use PKCS#1 v1.5 padding (iperf3 before "
                            "3.17, or 3.17.x given --use-pkcs1-padding; a 3.21 client "
                            "always pads OAEP) instead of OAEP")
    group.add_argument("--time-skew-threshold", type=opts.COUNT, metavar="SECONDS",
                       help="how far a client's clock may be from this one's (default: 10)")


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
                            "remove it on exit (refused if FILE names a running process "
                            "or is a symbolic link; a stale FILE is replaced)")
    group.add_argument("--uci", metavar="FILE",
                       help="take the options of the `config server` section of FILE, an "
                            "OpenWrt UCI file (option max_duration '60', list allow "
                            "'192.168.0.0/16': each option's name with _ for -), checked as "
                            "here; options given here win; option enabled '0' refuses to "
                            "start (see docs/openwrt.md)")


def _add_server_limits(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("access and limits")
    group.add_argument("--allow-third-party", action="store_true",
                       help="run tests that clients ask this agent to send to another host "
                            "(off by default: it would make the agent a traffic amplifier)")
    group.add_argument("--allow", action="append", metavar="CIDR",
                       help="client network allowed to connect (repeatable; default: any); "
                            "checked before anything else")
    group.add_argument("--allow-other-data-addresses", action="store_true",
                       help="take a test's data connections and UDP streams from addresses "
                            "other than its control connection's (off by default: a client "
                            "could point a reverse test at a third host); UDP streams still "
                            "must prove they receive at their address")
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
     "most parallel streams (per direction) of one test and of all running tests together; "
     "a test that does not fit beside the others is told the server is busy "
     "(default: {server:max_streams})"),
    ("--max-rate", "max_rate_bps", opts.RATE, "RATE",
     "highest total rate of one test (every stream and direction together) and of all "
     "running tests together: a test asking more alone is refused, one that does not fit "
     "beside the others is told the server is busy, and unlimited (-b 0) tests are refused; "
     "so -P 4 at --max-rate 50M may ask -b 12.5M (default: no limit)"),
    ("--max-stream-rate", "max_stream_rate_bps", opts.RATE, "RATE",
     "highest rate of one stream, besides --max-rate; unlimited tests are then refused "
     "(default: no limit)"),
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
                               "allow_other_data_addresses": args.allow_other_data_addresses,
                               "allow": tuple(args.allow or ()),
                               "secret": load_secret(args.secret_file)}
    for field in _CONFIG_FIELDS:
        if getattr(args, field) is not None:
            options[field] = getattr(args, field)
    return options


def handle(args: argparse.Namespace, _load: RegistryLoader) -> int:
    """Serve until Ctrl-C/SIGTERM (or one test with ``-1``)."""
    try:
        from netprobe.engine.server import ServerConfig
    except ImportError as exc:
        raise ToolUnavailable(f"the native server is not in this install: {exc}") from None
    from netprobe.engine.log import EventLog

    if args.uci:
        from netprobe.cli.uciargs import apply_uci

        apply_uci(args, args.uci_actions, _check_options)
    if not args.iperf3 and (args.rsa_private_key_path or args.authorized_users_path):
        raise UsageError("--rsa-private-key-path and --authorized-users-path are for "
                         "iperf3 clients: add --iperf3")
    kept = [flag for flag, value in (("--iperf3-results", args.iperf3_results),
                                     ("--save-dir", args.save_dir),
                                     ("--archive", args.archive)) if value]
    if not args.iperf3 and kept:
        raise UsageError(f"{kept[0]} keeps the results of iperf3 clients' tests: add --iperf3")
    config = ServerConfig(**_server_options(args))
    pidfile = _PidFile(args.pidfile) if args.pidfile else None
    with _log_sink(args.logfile) as write:
        log = EventLog(write, args.log_format)
        with _reopen_on_hangup(write, log):
            _serve_logged(args, config, log, pidfile)
    return ExitCode.OK


def _check_options(args: argparse.Namespace) -> None:
    """What the server would refuse in ``args`` at start (SpecError), found now: the
    address to listen on, ServerConfig's checks and the --allow networks."""
    from netprobe.engine.admission import networks
    from netprobe.engine.server import ServerConfig

    opts.check_addresses(args)
    networks(ServerConfig(**_server_options(args)).allow)


def _to_stdout(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class _LogFile:
    """``--logfile``: lines appended to a file that SIGHUP has reopened by path (what
    logrotate's postrotate sends once it has moved the file away).

    The signal only raises a flag: the next line, written by whichever thread, opens the
    file anew first, so no lock is ever taken inside the signal handler."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._handle = self._open()
        self._reopen = False

    def _open(self) -> Any:
        from netprobe.cli.outfile import OutputError

        try:
            return open(self.path, "a", encoding="utf-8", buffering=1)
        except OSError as exc:
            raise OutputError(f"cannot write the log {self.path}: "
                              f"{exc.strerror or exc}") from None

    def __call__(self, line: str) -> None:
        if self._reopen:
            self._reopen = False
            old, self._handle = self._handle, self._open()
            old.close()
        self._handle.write(line + "\n")

    def reopen_later(self) -> None:
        """Open the file again by its path before the next line (signal-safe)."""
        self._reopen = True

    def close(self) -> None:
        """Close the file."""
        self._handle.close()


def _serve_logged(args: argparse.Namespace, config: Any, log: Any,
                  pidfile: _PidFile | None) -> None:
    """Serve until Ctrl-C, the pidfile written once listening and removed at the end."""
    from netprobe.agent.service import handlers, limits_note
    from netprobe.engine.server import describe, serve

    where = args.bind or "all addresses"

    def ready(port: int) -> None:
        if pidfile is not None:
            pidfile.write()
        # One start line says all this process enforces, the far ends' fence included.
        log(f"netprobe server listening on {where} port {port}: {describe(config)}; "
            f"far ends: {limits_note()}", event="listening", address=args.bind, port=port)
        for service in services:
            log(f"iperf3 clients served on {where} TCP port {service.port}",
                event="listening", address=args.bind, port=service.port, kind="iperf3")

    services = []
    archive = None
    if args.iperf3:
        from netprobe.engine.iperf3.service import Iperf3Service
        from netprobe.results.served import keep_each

        keepers, archive = _result_keepers(args)
        services.append(Iperf3Service(args.iperf3_port, on_result=keep_each(keepers),
                                      auth=_iperf3_auth(args)))
    try:
        serve(config, log=log, handlers=handlers(), ready=ready, services=services)
    except KeyboardInterrupt:
        if args.logfile:
            log("netprobe server: stopped", event="stopped")
        else:  # a person at a terminal (or procd's log): the note beside the prompt
            note("netprobe server: stopped")
    finally:
        if pidfile is not None:
            pidfile.remove()
        if archive is not None:
            with contextlib.suppress(Exception):  # the records are in; only the run's end
                archive.close()


def _iperf3_auth(args: argparse.Namespace) -> Any:
    """The iperf3 clients' authentication if asked (its files read now), else None; only
    then is the cryptography package loaded."""
    if not (args.rsa_private_key_path or args.authorized_users_path):
        if args.use_pkcs1_padding or args.time_skew_threshold:
            raise UsageError("--use-pkcs1-padding and --time-skew-threshold need "
                             "--rsa-private-key-path and --authorized-users-path")
        return None
    if not (args.rsa_private_key_path and args.authorized_users_path):
        raise UsageError("iperf3 authentication needs both --rsa-private-key-path and "
                         "--authorized-users-path")
    try:
        from netprobe.engine.iperf3.auth import AuthError, ServerAuth
    except ImportError:
        raise UsageError("iperf3 authentication needs the cryptography package: pip "
                         "install 'netprobe-meter[iperf3-auth]'") from None
    try:
        return ServerAuth.load(args.rsa_private_key_path, args.authorized_users_path,
                               args.use_pkcs1_padding, args.time_skew_threshold or 10)
    except AuthError as exc:
        raise UsageError(str(exc)) from None


def _result_keepers(args: argparse.Namespace) -> tuple[list[Any], Any]:
    """Where the server's Result of each iperf3 test goes (--iperf3-results, --save-dir,
    --archive), each set up now, so an unwritable one is a one-line error before the server
    starts; and the archive's keeper, closed at the end."""
    from netprobe.cli.outfile import OutputError
    from netprobe.results.served import ArchiveKeeper, JsonLines, KeepError, SaveDir

    keepers: list[Any] = []
    archive = None
    try:
        if args.iperf3_results:
            keepers.append(JsonLines(args.iperf3_results))
        if args.save_dir:
            keepers.append(SaveDir(args.save_dir, args.save_keep))
        if args.archive:
            import socket

            archive = ArchiveKeeper(args.archive, socket.gethostname(),
                                    label=f"netprobe server --iperf3 port {args.iperf3_port}")
            keepers.append(archive)
    except KeepError as exc:
        raise OutputError(str(exc)) from None
    return keepers, archive


@contextlib.contextmanager
def _log_sink(path: str | None) -> Iterator[Callable[[str], None]]:
    """Where log lines go: stdout, or appended to ``path`` (OutputError if it cannot be)."""
    if path is None:
        yield _to_stdout
        return
    sink = _LogFile(path)
    try:
        yield sink
    finally:
        sink.close()


@contextlib.contextmanager
def _reopen_on_hangup(write: Callable[[str], None], log: Any) -> Iterator[None]:
    """SIGHUP reopens the log file and says so in it (it used to end the server silently
    and leave its pidfile behind); on stdout there is nothing to reopen, and it is noted.
    The line is written from a thread of its own: the handler runs between two bytecodes of
    the main thread, which may be inside a write holding the log's lock."""
    if not hasattr(signal, "SIGHUP") or threading.current_thread() is not \
            threading.main_thread():
        yield
        return

    def hangup(_signum: int, _frame: Any) -> None:
        if isinstance(write, _LogFile):
            write.reopen_later()
            said = f"log file {write.path} reopened (SIGHUP)"
        else:
            said = "SIGHUP: the log goes to stdout, nothing to reopen"
        threading.Thread(target=log, args=(said,), kwargs={"event": "reopened"},
                         name="np-hangup", daemon=True).start()

    before = signal.signal(signal.SIGHUP, hangup)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, before)


class _PidFile:
    """``--pidfile``: this process's id, written once listening and removed at exit.

    Made as daemons make theirs: never through a symbolic link and never over another
    file (O_CREAT|O_EXCL|O_NOFOLLOW). A file whose process is gone (stale) is removed
    first; one whose process runs, a link or anything but a regular file is refused. A
    root server with its pidfile in a shared sticky directory (/tmp, /run/lock) once
    overwrote the root-owned file a local user's link there pointed at."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._check()
        directory = os.path.dirname(os.path.abspath(path))
        if not os.access(directory, os.W_OK | os.X_OK):
            raise UsageError(f"--pidfile {path}: cannot write in {directory}")

    def _check(self) -> None:
        """UsageError unless the path is free or holds a stale pid of a regular file."""
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            return
        except OSError as exc:
            raise UsageError(f"--pidfile {self.path}: {exc.strerror or exc}") from None
        if stat.S_ISLNK(mode):
            raise UsageError(f"--pidfile {self.path} is a symbolic link: refused (it "
                             "could make this server write wherever the link points)")
        if not stat.S_ISREG(mode):
            raise UsageError(f"--pidfile {self.path} is not a regular file: refused")
        other = _running_pid(self.path)
        if other is not None and other != os.getpid():
            raise UsageError(f"--pidfile {self.path}: another netprobe server runs "
                             f"(pid {other})")

    def write(self) -> None:
        """Create the file with the pid; a stale file is removed first, a link or a file
        that appeared meanwhile refused (UsageError)."""
        self._check()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # stale (checked just above); O_EXCL catches a race
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o644)
        except FileExistsError:
            raise UsageError(f"--pidfile {self.path}: made by someone else meanwhile: "
                             "refused") from None
        except OSError as exc:
            raise UsageError(f"--pidfile {self.path}: {exc.strerror or exc}") from None
        try:
            os.write(fd, f"{os.getpid()}\n".encode("ascii"))  # one short write: whole
        finally:
            os.close(fd)

    def remove(self) -> None:
        """Remove the file if it is still ours: a regular file holding this process's id."""
        with contextlib.suppress(OSError):
            if (stat.S_ISREG(os.lstat(self.path).st_mode)
                    and _running_pid(self.path) == os.getpid()):
                os.unlink(self.path)


def _running_pid(path: str) -> int | None:
    """The pid in ``path`` if that process is alive, else None (never through a link)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        text = os.read(fd, 64).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        pid = int(text.strip() or "0")  # a pid, whatever else is there
    except ValueError:
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
