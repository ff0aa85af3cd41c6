"""``netprobe compare [HOST]``: one test through several tools, interleaved, side by side."""
from __future__ import annotations

import argparse
from typing import Any

from netprobe.cli import args as opts
from netprobe.cli.common import RegistryLoader, make_tool, secret_options
from netprobe.cli.exitcodes import UsageError
from netprobe.errors import SpecError, ToolUnavailable


def add_parser(commands: Any, summary: str, epilog: str) -> None:
    """The ``compare`` command's options."""
    parser = opts.subparser(commands, "compare", summary, epilog,
                            "%(prog)s [HOST] [--tools A,B,...] [-n TRIALS] [options]")
    parser.set_defaults(handler=handle, tool="native")
    parser.add_argument("host", nargs="?", metavar="HOST",
                        help="the far end, where each tool's server runs; omit it to run "
                             "both ends on this machine over loopback")
    parser.add_argument("-c", "--client", metavar="HOST", help="same as HOST")
    parser.add_argument("--tools", metavar="A,B,...",
                        help="tools to compare; the first is the reference for the ratios "
                             "(default: every installed tool, native first). A tool that "
                             "cannot honour the options, or cannot run here, is left out and "
                             "listed with the reason")
    opts.add_trial_options(parser, ("-n", "--trials"), opts.DEFAULT_TRIALS,
                           f"trials per tool (default: {opts.DEFAULT_TRIALS}), run A B C A B "
                           "C ... so that drift hits every tool alike. Here -n counts trials: "
                           "the byte count is --bytes")
    opts.add_test_options(parser, bytes_flags=("--bytes",))
    parser.add_argument("--own-lengths", action="store_true",
                        help="run each tool at its own default call length (without it every "
                             f"tool writes and reads {_kib(COMPARE_TCP_LENGTH)} over TCP, "
                             f"{UDP_COMPARE_LENGTH}-byte datagrams over UDP, unless -l "
                             "says another); the table says each tool's")
    opts.add_socket_options(parser)
    opts.add_agent_options(parser)  # --agent-port, --no-agent, --from/--to: as run has them
    parser.add_argument("--iperf3", action="store_true",
                        help="HOST runs a stock `iperf3 -s` (-p its port, default "
                             f"{IPERF3_PORT}): compare netprobe's engine speaking iperf3's "
                             "protocol (native) with the stock iperf3 client against that "
                             "one server (only native and iperf3 take part; default both)")
    opts.add_output_options(parser)


def handle(args: argparse.Namespace, load: RegistryLoader) -> int:
    """The spec through each tool that can honour it, interleaved."""
    from netprobe.cli.trialsink import run_trials_shown
    from netprobe.results.trials import Skipped, screen

    given = opts.spec_from_args(args)
    if args.iperf3:
        given = _at_stock_server(given, args)
    spec = _equal_lengths(given, args.own_lengths)
    opts.check_addresses(args)  # a bad -B or HOST named by its option, before any run
    registry = load()
    names = _tool_names(args.tools, registry.names())
    if args.iperf3 and args.tools is None:
        names = [name for name in names if name in IPERF3_SPEAKERS]
    tools = [make_tool(registry, name, _tool_options(args, name))
             for name in names]  # an unknown name is exit 3
    ready, skipped = screen(
        [t for t in tools if not args.iperf3 or t.name in IPERF3_SPEAKERS], spec)
    if args.iperf3:  # a tool named that cannot talk to a stock iperf3 server, said so
        skipped = [Skipped(t.name, (f"--iperf3: the far end is a stock iperf3 server; only "
                                    f"{' and '.join(IPERF3_SPEAKERS)} speak its protocol",))
                   for t in tools if t.name not in IPERF3_SPEAKERS] + skipped
    if spec.length_bytes != given.length_bytes:  # compare's length, not the user's
        skipped = [_own_lengths_hint(entry) for entry in skipped]
    skipped += [Skipped(f.name, (f"failed to load: {f.error}",)) for f in registry.failures
                if args.tools is None and f.name not in registry.tools]  # not a shadowed name
    if not ready:
        reasons = "; ".join(r for s in skipped for r in s.reasons) or "no tools installed"
        refused = any(" cannot honour " in r for s in skipped for r in s.reasons)
        raise (SpecError if refused else ToolUnavailable)(f"no tool can run this test: "
                                                          f"{reasons}")
    return run_trials_shown(args, spec, ready, args.trials, skipped)


IPERF3_PORT = 5201
"""The stock iperf3 server's port in ``compare --iperf3`` without ``-p`` (iperf3's own)."""

IPERF3_SPEAKERS = ("native", "iperf3")
"""The tools ``compare --iperf3`` runs against a stock ``iperf3 -s``: netprobe's engine in
its iperf3 mode, and the stock iperf3 client; every other tool needs its own server."""


def _at_stock_server(spec: Any, args: argparse.Namespace) -> Any:
    """``spec`` aimed at the stock iperf3 server (UsageError without HOST, or with --from:
    the clients compared are this machine's). A port in the spec also keeps the agents
    out: no far end is started, both clients go to the one server already listening."""
    if not spec.host:
        raise UsageError("--iperf3 needs HOST: the stock iperf3 server to test against")
    if args.from_host:
        raise UsageError("--iperf3 compares the clients on this machine: not with --from")
    import attrs

    return attrs.evolve(spec, port=spec.port or IPERF3_PORT)


def _tool_options(args: argparse.Namespace, name: str) -> dict[str, Any] | None:
    """The options ``name`` runs with: with --iperf3 the native engine in its iperf3 mode,
    the stock client never starting a server of its own (the one at HOST is the test)."""
    options = secret_options(args)
    if not args.iperf3:
        return options
    mode = {"iperf3": True} if name == "native" else {"start_server": False}
    return {**(options or {}), **mode}


COMPARE_TCP_LENGTH = 128 * 1024
"""The write and read length every tool gets in a TCP ``compare`` without ``-l``: iperf3's
and iperf 2's own default, so that those two run as their users know them. Left to
themselves the tools differ (native 256 KiB or 1 MiB by its length probe, nuttcp 64 KiB),
and on loopback the call length alone moves the rate by tens of percent."""

UDP_COMPARE_LENGTH = 1448
"""Datagram payload every tool gets in ``compare -u`` without ``-l``: one datagram in a
1500-byte MTU over IPv4 and IPv6. Left to themselves the tools differ (native 1448, iperf3
32768 or the MTU, nuttcp 8192, iperf2 1470), and so would their loss and rate."""


def _equal_lengths(spec: Any, own: bool) -> Any:
    """``spec`` with one call length for every tool, said on stderr; as given with ``-l``
    or ``--own-lengths`` (with both, a SpecError)."""
    if own and spec.length_bytes is not None:
        raise SpecError("--own-lengths and -l/--length contradict each other: give one")
    if own or spec.length_bytes is not None:
        return spec
    import attrs

    from netprobe.cli.render import print_note

    if spec.protocol == "udp":
        length = UDP_COMPARE_LENGTH
        words = f"every tool sends {length}-byte datagrams"
    else:
        length = COMPARE_TCP_LENGTH
        words = f"every tool writes and reads {_kib(length)} per call"
    print_note(f"{words} (-l sets another, --own-lengths each tool's default)")
    return attrs.evolve(spec, length_bytes=length)


def _own_lengths_hint(entry: Any) -> Any:
    """``entry`` with a refused ``--length`` that compare chose saying how to include it."""
    refused = f"{entry.tool} cannot honour --length"
    if not any(reason.startswith(refused) for reason in entry.reasons):
        return entry
    import attrs

    return attrs.evolve(entry, reasons=tuple(
        f"{reason} (compare's common length; --own-lengths runs each tool at its own)"
        if reason.startswith(refused) else reason for reason in entry.reasons))


def _kib(length: int) -> str:
    return f"{length // 1024}K"


def _tool_names(given: str | None, installed: list[str]) -> list[str]:
    if given is None:  # every installed tool, the native engine first as the reference
        return sorted(installed, key=lambda name: (name != "native", name))
    names = [name.strip() for name in given.split(",") if name.strip()]
    if not names:
        raise SpecError("--tools needs at least one tool name")
    return list(dict.fromkeys(names))  # a tool named twice runs once per round
