"""Argument definitions shared by the commands: the argparse types, the option groups
several commands take, and the TestSpec built from them.

Apart from the parser mechanics (:mod:`netprobe.cli.main`) and from what each command does
(:mod:`netprobe.cli.commands`). Cheap to import: nothing here loads rich, the schema or a
plugin until a command runs.
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import sys
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from netprobe.cli.exitcodes import UsageError
from netprobe.errors import SpecError, listen_error
from netprobe.limits import LONGEST_S
from netprobe.units import parse_bitrate, parse_bytes, parse_dscp, parse_seconds

if TYPE_CHECKING:
    from netprobe.schema import TestSpec

T = TypeVar("T")

DEFAULT_DURATION_S = 10.0
"""Test length when neither ``--time`` nor ``--bytes`` is given."""

FOREVER_S = 3600.0
"""What ``-t 0`` (iperf3's "until interrupted") asks for: the longest test a netprobe server
accepts by default (its --max-duration), so that Ctrl-C, not the server, ends it."""

UDP_DEFAULT_RATE = 1_000_000
"""UDP's rate per stream without ``-b`` (bit/s), as in iperf3 and nuttcp."""

DEFAULT_TRIALS = 5
"""Trials per tool of ``netprobe compare`` without ``-n``."""


# --- argument types ----------------------------------------------------------------------


def checked(parse: Callable[[str], T], test: Callable[[T], bool], need: str
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


def whole_number(text: str) -> int:
    """A base-10 integer (ValueError with the text otherwise)."""
    try:
        return int(text.strip(), 10)
    except ValueError:
        raise ValueError(f"not a whole number: {text!r}") from None


SECONDS = checked(parse_seconds, lambda v: 0 < v <= LONGEST_S,
                  f"must be more than 0 and at most {LONGEST_S:g} seconds (a week)")
SECONDS_OR_ZERO = checked(parse_seconds, lambda v: 0 <= v <= LONGEST_S,
                          f"must be 0 to {LONGEST_S:g} seconds (a week)")
LIMIT_SECONDS = checked(parse_seconds, lambda v: v > 0, "must be more than 0 seconds")
"""A server's own time limits: ServerConfig's check bounds each one with a message of its own."""
BYTES = checked(parse_bytes, lambda v: v > 0, "must be at least 1 byte")
RATE = checked(parse_bitrate, lambda v: v >= 0, "must be 0 (unlimited) or more")
COUNT = checked(whole_number, lambda v: v >= 1, "must be a whole number of 1 or more")
PORT = checked(whole_number, lambda v: 1 <= v <= 65535, "must be a port number 1-65535")
LISTEN_PORT = checked(whole_number, lambda v: 0 <= v <= 65535,
                      "must be a port number 0-65535 (0: any free port)")
DSCP = checked(parse_dscp, lambda v: True, "")


# --- sub-parsers -------------------------------------------------------------------------


_LAZY_DEFAULT = re.compile(r"\{server:(\w+)\}")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Plain argparse help that keeps the epilog's layout and fills in the server's
    defaults (``{server:port}``) only when help is shown, so parsing never imports the
    engine."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        # The width as argparse reckons it, without its `import shutil` (and shutil's of bz2
        # and lzma): argparse makes a formatter for every option it adds, help shown or not.
        super().__init__(prog, indent_increment, max_help_position,
                         terminal_columns() - 2 if width is None else width)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = super()._get_help_string(action)
        return _LAZY_DEFAULT.sub(lambda m: _server_default(m.group(1)), text) if text else text


def terminal_columns() -> int:
    """The terminal's width as ``shutil.get_terminal_size`` gives it: ``$COLUMNS`` when set
    to a positive number, else the width of stdout's terminal, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


def _server_default(name: str) -> str:
    try:
        import attrs

        from netprobe.engine.server import ServerConfig

        return str(attrs.fields_dict(ServerConfig)[name].default)
    except Exception:  # engine not installed: help must still work
        return "see the native engine"


def subparser(commands: Any, name: str, summary: str, epilog: str, usage: str
              ) -> argparse.ArgumentParser:
    """One command's parser, with the shared epilog (the exit codes) and a short usage."""
    # A short usage line: argparse's own lists every option, which buries a one-line error.
    parser: argparse.ArgumentParser = commands.add_parser(
        name, help=summary, description=summary, epilog=epilog, usage=usage,
        # No abbreviations: "--secret x" must never be taken for --secret-file.
        formatter_class=HelpFormatter, allow_abbrev=False)
    return parser


# --- option groups -----------------------------------------------------------------------


def add_test_options(parser: argparse.ArgumentParser,
                     bytes_flags: tuple[str, ...] = ("-n", "--bytes")) -> None:
    """What the test is: length, streams, protocol, rate, direction, intervals."""
    group = parser.add_argument_group("test")
    group.add_argument("-t", "--time", type=SECONDS_OR_ZERO, metavar="SECONDS",
                       help=f"seconds to send (default: {DEFAULT_DURATION_S:g}, or until "
                            "--bytes are sent when that is given); 0: until Ctrl-C, as "
                            f"iperf3 -t 0 (at most {FOREVER_S:g} s, a server's default "
                            "--max-duration)")
    group.add_argument("-k", "--blockcount", type=COUNT, metavar="N",
                       help="send N buffers (-l bytes each) per stream instead of a "
                            "duration, as iperf3 -k")
    group.add_argument(*bytes_flags, dest="bytes", type=BYTES, metavar="BYTES",
                       help="bytes to send per stream instead of a duration; k/m/g suffixes "
                            "are 1024-based like iperf3 (64k = 65,536)")
    group.add_argument("-P", "--parallel", type=COUNT, default=1, metavar="N",
                       help="parallel streams, per direction (default: 1)")
    group.add_argument("-u", "--udp", action="store_true", help="UDP instead of TCP")
    group.add_argument("-b", "--bitrate", type=RATE, metavar="RATE",
                       help="rate limit per stream in bits per second; k/m/g suffixes are SI "
                            "(1M = 1,000,000 bit/s); 0 means unlimited. UDP defaults to 1M, as "
                            "in iperf3 and nuttcp, so that a forgotten -b floods no link")
    way = group.add_mutually_exclusive_group()
    way.add_argument("-R", "--reverse", dest="direction", action="store_const",
                     const="reverse", default="normal", help="the server sends")
    way.add_argument("--bidir", dest="direction", action="store_const", const="bidir",
                     help="both ends send at once")
    group.add_argument("-i", "--interval", type=SECONDS_OR_ZERO, default=1.0,
                       metavar="SECONDS",
                       help="seconds between interval reports (default: 1; 0 disables them)")
    group.add_argument("-O", "--omit", type=SECONDS_OR_ZERO, default=0.0, metavar="SECONDS",
                       help="warm up for SECONDS first, left out of the summary; added to -t, "
                            "as in iperf3 (-t 10 -O 2 runs 12 s)")


def add_socket_options(parser: argparse.ArgumentParser) -> None:
    """How the sockets are set up: buffers, MSS, DSCP, congestion, family, port, bind."""
    group = parser.add_argument_group("sockets")
    group.add_argument("-l", "--length", type=BYTES, metavar="BYTES",
                       help="buffer (TCP) or datagram payload (UDP) length; k/m suffixes are "
                            "1024-based (native default: TCP 256k or 1m, whichever the "
                            "first 0.2 s measure faster; UDP 1448)")
    group.add_argument("-w", "--window", type=BYTES, metavar="BYTES",
                       help="socket buffer size to ask for; k/m suffixes are 1024-based")
    group.add_argument("-M", "--mss", type=BYTES, metavar="BYTES", help="TCP maximum segment size")
    group.add_argument("-N", "--nodelay", action="store_true", help="disable Nagle (TCP_NODELAY)")
    group.add_argument("--dscp", type=DSCP, metavar="VALUE",
                       help="DSCP for the traffic: 0-63, or a name (EF, AF11-AF43, CS0-CS7, "
                            "VA, LE, DF)")
    group.add_argument("-C", "--congestion", metavar="ALGO",
                       help="TCP congestion control algorithm (e.g. cubic, bbr)")
    family = group.add_mutually_exclusive_group()
    family.add_argument("-4", dest="ip_version", action="store_const", const=4,
                        help="IPv4 only")
    family.add_argument("-6", dest="ip_version", action="store_const", const=6,
                        help="IPv6 only")
    group.add_argument("-p", "--port", type=PORT, metavar="PORT",
                       help="server port (default: the tool's own)")
    group.add_argument("-B", "--bind", metavar="ADDRESS", help="local address to bind to")
    group.add_argument("-Z", "--zerocopy", action="store_true",
                       help="zero-copy send (sendfile), like iperf3 -Z")
    group.add_argument("--secret-file", metavar="FILE",
                       help="shared secret for a netprobe server that requires one (or set "
                            "$NETPROBE_SECRET)")
    group.add_argument("--skip-rx-copy", action="store_true",
                       help="discard received data in the kernel (MSG_TRUNC)")
    gso = group.add_mutually_exclusive_group()
    gso.add_argument("--gso", dest="udp_gso", action="store_const", const=True,
                     help="UDP: send many datagrams a call for the kernel to cut (GSO); "
                          "over veth they may cross the path uncut (default from -l 512)")
    gso.add_argument("--no-gso", dest="udp_gso", action="store_const", const=False,
                     help="UDP: one datagram a call, so that the packet rate is the path's "
                          "(default below -l 512)")


def add_output_options(parser: argparse.ArgumentParser, stream: bool = False) -> None:
    """Where and how results are written (``stream``: the command runs one test, which
    ``--format json-stream`` writes as it goes)."""
    group = parser.add_argument_group("output")
    choices = ("human", "json", "jsonl", "csv", *(("json-stream",) if stream else ()))
    group.add_argument("--format", choices=choices, default=None,
                       help="result format on stdout and in -o FILE (default: human on "
                            "stdout, and the FILE's extension for FILE). json: one "
                            "document; jsonl: one line per result; csv: a header and one "
                            "row per direction" + ("; json-stream: JSON lines as the test "
                            "runs (start, every interval as it comes, end with the result)"
                            if stream else ""))
    group.add_argument("-J", "--json", dest="format", action="store_const", const="json",
                       help="same as --format json (-J as in iperf3)")
    if stream:
        group.add_argument("--json-stream", dest="format", action="store_const",
                           const="json-stream",
                           help="same as --format json-stream (as iperf3 --json-stream)")
    group.add_argument("-f", "--units", metavar="LETTER", type=_units,
                       help="show rates and byte counts in one unit, as iperf3 -f: k m g t "
                            "for Kbit/s .. Tbit/s, K M G T for KByte/s .. TByte/s (default: "
                            "the unit that fits)")
    group.add_argument("-V", "--verbose", action="store_true",
                       help="every stream's lines and rows, not only the sums")
    group.add_argument("--logfile", metavar="FILE",
                       help="append what would go to stdout to FILE instead (as iperf3 "
                            "--logfile); errors still go to stderr")
    group.add_argument("-o", "--output", metavar="FILE",
                       help="also write the result to FILE, in the format its extension "
                            "names (.json, .jsonl, .csv, .txt; other names get JSON) unless "
                            "--format says; a file is replaced atomically (jsonl appends a "
                            "line), a device or FIFO written in place. Checked before the "
                            "test starts")
    group.add_argument("-q", "--quiet", action="store_true",
                       help="nothing on stdout (use with -o); errors still go to stderr")
    group.add_argument("--per-stream", action="store_true",
                       help="with -P, show every stream, not only the sums")


RATE_HZ = checked(float, lambda v: 0 < v <= 100, "must be above 0 and at most 100 per second")


def add_latency_options(parser: argparse.ArgumentParser) -> None:
    """netprobe's latency probes beside a test (--latency and its settings)."""
    group = parser.add_argument_group("latency under load (needs netprobe server on HOST; "
                                      "with --iperf3, TCP handshakes to its port)")
    group.add_argument("--latency", action="store_true",
                       help="send small timestamped probes beside the test: idle baseline, "
                            "then latency under load, its increase, RPM and grade")
    group.add_argument("--latency-idle", type=SECONDS_OR_ZERO, default=2.0, metavar="SECONDS",
                       help="idle baseline before the load (default: 2)")
    group.add_argument("--latency-tail", type=SECONDS_OR_ZERO, default=0.0, metavar="SECONDS",
                       help="idle time after the load (default: 0)")
    group.add_argument("--latency-rate", type=RATE_HZ, default=20.0, metavar="PER_S",
                       help="probes per second (default: 20)")
    group.add_argument("--latency-transport", choices=("auto", "udp", "tcp"), default="auto",
                       help="probe over UDP, TCP, or UDP with TCP where UDP is dropped "
                            "(default: auto)")


def probe_options(args: argparse.Namespace) -> Any:
    """The ProbeOptions of --latency-idle, -tail, -rate and -transport."""
    from netprobe.latency.probing import ProbeOptions

    return ProbeOptions(idle_s=args.latency_idle, tail_s=args.latency_tail,
                        rate_hz=args.latency_rate, transport=args.latency_transport,
                        port=getattr(args, "agent_port", None))


def add_agent_options(parser: argparse.ArgumentParser) -> None:
    """The agents on the far hosts: third-party tests (--from/--to), --no-agent."""
    group = parser.add_argument_group("agents (netprobe server on the far hosts)")
    group.add_argument("--from", dest="from_host", metavar="HOST",
                       help="third-party test: the agent on HOST runs the test against "
                            "--to (that agent must allow it: --allow-third-party)")
    group.add_argument("--to", dest="to_host", metavar="HOST",
                       help="the target of a third-party test (same as HOST)")
    group.add_argument("--no-agent", action="store_true",
                       help="do not ask an agent on HOST to start the tool's server: use "
                            "one already running there")
    add_agent_port(group)


def add_agent_port(group: Any) -> None:
    """``--agent-port``: where the agents (``netprobe server``) on the far hosts listen."""
    group.add_argument("--agent-port", type=PORT, metavar="PORT",
                       help="port of the agents (default: {server:port})")


MODE_FLAGS = {"receive": "--receive", "no_sync": "--no-sync", "iperf3": "--iperf3"}
"""Tool modes (:attr:`netprobe.plugin.Tool.modes`) and the flags that ask for them."""


def add_mode_options(parser: argparse.ArgumentParser) -> None:
    """Peers started by someone else (Windows NTttcp, say): --receive, --no-sync."""
    group = parser.add_argument_group("a peer started elsewhere (Windows NTttcp, iperf3 -s)")
    group.add_argument("--receive", action="store_true",
                       help="run only the receiving end, on this machine or with --from "
                            "AGENT on that agent's (HOST, if given, is the address to "
                            "listen on; -p its port, default the tool's): wait for a sender "
                            "started elsewhere and report what it received. --tool ntttcp")
    group.add_argument("--no-sync", action="store_true",
                       help="no start handshake with the other end (ntttcp -N), for a peer "
                            "run without one: Windows ntttcp.exe -ns, or ntttcp -N. "
                            "--tool ntttcp")
    group.add_argument("--iperf3", action="store_true",
                       help="the far end is a stock `iperf3 -s` (no iperf3 binary needed "
                            "here): speak iperf3's protocol to it; -p its port, default "
                            "5201. --tool native")
    group.add_argument("--udp-counters-64bit", action="store_true",
                       help="with --iperf3 -u: 64-bit sequence numbers in the datagrams "
                            "(iperf3's --udp-counters-64bit; the server is told)")
    group.add_argument("--username", metavar="USER",
                       help="--iperf3: authenticate as USER to a server run with "
                            "--rsa-private-key-path (iperf3's RSA authentication); the "
                            "password from $IPERF3_PASSWORD, else asked at the terminal")
    group.add_argument("--rsa-public-key-path", metavar="FILE",
                       help="--iperf3 --username: the server's RSA public key (PEM)")
    group.add_argument("--use-pkcs1-padding", action="store_true",
                       help="--iperf3 --username: PKCS#1 v1.5 padding, for servers before "
                            "iperf3 3.17 or run with --use-pkcs1-padding (default: OAEP)")


def mode_options(args: argparse.Namespace, tool_cls: Any) -> dict[str, Any]:
    """The tool options of the mode flags given; UsageError for a mode the tool lacks."""
    chosen = {mode: True for mode in MODE_FLAGS if getattr(args, mode, False)}
    for mode in chosen:
        if mode not in getattr(tool_cls, "modes", frozenset()):
            raise UsageError(f"{MODE_FLAGS[mode]}: the {tool_cls.name} tool has no such mode")
    auth = iperf3_auth(args)
    if auth is not None:
        chosen["iperf3_auth"] = auth
    return chosen


def iperf3_auth(args: argparse.Namespace) -> Any:
    """``--username`` and ``--rsa-public-key-path``: the credentials for a stock iperf3
    server (:class:`~netprobe.engine.iperf3.auth.ClientAuth`), the password from
    ``$IPERF3_PASSWORD`` or the terminal, as a stock client takes it; None without them."""
    user, path = getattr(args, "username", None), getattr(args, "rsa_public_key_path", None)
    if not (user or path):
        if getattr(args, "use_pkcs1_padding", False):
            raise UsageError("--use-pkcs1-padding needs --username and --rsa-public-key-path")
        return None
    if not (user and path):
        raise UsageError("iperf3 authentication needs both --username and "
                         "--rsa-public-key-path")
    if not getattr(args, "iperf3", False):
        raise UsageError("--username and --rsa-public-key-path are for a stock iperf3 "
                         "server: add --iperf3")
    if getattr(args, "from_host", None):
        raise UsageError("--username cannot be combined with --from (the agent would "
                         "need the password)")
    try:
        from netprobe.engine.iperf3.auth import PASSWORD_ENV, AuthError, ClientAuth
    except ImportError:
        raise UsageError("iperf3 authentication needs the cryptography package: pip "
                         "install 'netprobe-meter[iperf3-auth]'") from None
    password = os.environ.get(PASSWORD_ENV)
    if password is None:
        if not sys.stdin.isatty():
            raise UsageError(f"--username: set ${PASSWORD_ENV} to the password (there is "
                             "no terminal to ask it at)")
        import getpass

        password = getpass.getpass("Password: ")
    try:
        return ClientAuth.load(user, password, path, args.use_pkcs1_padding)
    except AuthError as exc:
        raise UsageError(str(exc)) from None


def add_trial_options(parser: argparse.ArgumentParser, flags: tuple[str, ...],
                      default: int | None, help_text: str) -> None:
    """How many trials (``--repeat`` or ``-n``) and the pause between them."""
    group = parser.add_argument_group("trials")
    group.add_argument(*flags, dest="repeat" if flags[0] == "--repeat" else "trials",
                       type=COUNT, default=default, metavar="N", help=help_text)
    group.add_argument("--pause", type=SECONDS_OR_ZERO, metavar="SECONDS",
                       help="seconds to wait between trials (default: 0)")


# --- from arguments to a spec ------------------------------------------------------------


def spec_from_args(args: argparse.Namespace) -> TestSpec:
    """The TestSpec for ``netprobe run`` arguments (SpecError if the values do not fit)."""
    from netprobe.schema import TestSpec

    return TestSpec(
        tool=args.tool, host=_host(args), protocol="udp" if args.udp else "tcp",
        direction=args.direction, streams=args.parallel, duration_s=_duration(args),
        bytes_total=_bytes(args), interval_s=args.interval or None, omit_s=args.omit,
        length_bytes=args.length, window_bytes=args.window,
        rate_bits_per_second=_rate(args), mss_bytes=args.mss, nodelay=args.nodelay,
        dscp=args.dscp, congestion=args.congestion, ip_version=args.ip_version,
        port=args.port, bind_address=args.bind, zerocopy=args.zerocopy,
        skip_rx_copy=args.skip_rx_copy, udp_gso=getattr(args, "udp_gso", None),
    )


HOST_OPTIONS = (("host", "HOST"), ("client", "-c/--client"), ("to_host", "--to"),
                ("from_host", "--from"))
"""Where a far host can be given, and how its error names it."""


def check_addresses(args: argparse.Namespace) -> None:
    """SpecError naming the option (``-B/--bind``, ``HOST``, ``--from``...) whose address
    does not resolve, or, for ``-B``, is no address of this host: said before anything
    runs, where the engine's own lookup gave a bare resolver errno and no option."""
    for dest, option in HOST_OPTIONS:
        value = getattr(args, dest, None)
        if value:
            _resolves(option, value)
    if getattr(args, "bind", None) and not getattr(args, "from_host", None):
        _bindable("-B/--bind", args.bind)  # with --from the far agent binds it, not here


def _ascii(name: str) -> str | bytes:
    # getaddrinfo encodes a str with the idna codec, an import a run's start-up need not
    # pay (see engine.sockets.resolve); an ASCII name is the same bytes.
    return name.encode("ascii") if name.isascii() else name


def _resolves(option: str, host: str) -> None:
    try:
        socket.getaddrinfo(_ascii(host), None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else "not a valid name"
        raise SpecError(f"{option} {host}: cannot resolve host {host!r}: {reason}") from None


def _bindable(option: str, address: str) -> None:
    try:
        found = socket.getaddrinfo(_ascii(address), 0, type=socket.SOCK_DGRAM,
                                   flags=socket.AI_PASSIVE)
        with socket.socket(found[0][0], socket.SOCK_DGRAM) as probe:
            probe.bind(found[0][4])
    except (socket.gaierror, UnicodeError) as exc:
        gai = exc if isinstance(exc, socket.gaierror) else socket.gaierror(0, "not a valid name")
        raise listen_error(option, address, 0, gai) from None
    except OSError as exc:
        raise listen_error(option, address, 0, exc) from None


def _rate(args: argparse.Namespace) -> float | None:
    """The spec's rate: -b as given (0 is unlimited, None in the spec); UDP defaults to 1M."""
    if args.bitrate is None:
        return UDP_DEFAULT_RATE if args.udp else None
    return args.bitrate or None


def _host(args: argparse.Namespace) -> str | None:
    given = {h for h in (args.host, args.client, getattr(args, "to_host", None)) if h}
    if len(given) > 1:
        raise UsageError(f"two hosts given: {' and '.join(sorted(given))}")
    if getattr(args, "from_host", None) and not given and not getattr(args, "receive", False):
        raise UsageError("--from needs the target host: --to HOST")
    if not given and getattr(args, "no_agent", False) and args.port is not None:
        # --no-agent -p PORT: the user's own server listens there, here on loopback; the
        # tool must not start a second one on the same port.
        return "::1" if args.ip_version == 6 else "127.0.0.1"
    return given.pop() if given else None


def _duration(args: argparse.Namespace) -> float | None:
    # A byte count bounds the test by itself (as in iperf3 -n) unless -t is also given.
    if args.time is not None:
        return float(args.time) or FOREVER_S
    return None if _bytes(args) is not None else DEFAULT_DURATION_S


def _bytes(args: argparse.Namespace) -> int | None:
    """-n as given, or -k buffers of -l bytes (the native engine's lengths by default)."""
    blocks = getattr(args, "blockcount", None)
    if blocks is None:
        return args.bytes
    if args.bytes is not None:
        raise UsageError("-k and -n both say how much to send: give one")
    length = args.length
    if length is None and args.tool == "native":
        from netprobe.engine.side import TCP_DEFAULT_LENGTH, UDP_DEFAULT_LENGTH

        length = UDP_DEFAULT_LENGTH if args.udp else TCP_DEFAULT_LENGTH
    if length is None:
        raise UsageError(f"-k needs -l with --tool {args.tool} (its buffer size is its own)")
    return int(blocks * length)


def _units(text: str) -> Any:
    from netprobe.cli.units import Units

    try:
        return Units(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
