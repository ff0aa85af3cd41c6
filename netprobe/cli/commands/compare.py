"""``netprobe compare [HOST]``: one test through several tools, interleaved, side by side."""
from __future__ import annotations

import argparse
from typing import Any, Optional

from netprobe.cli import args as opts
from netprobe.cli.common import RegistryLoader, make_tool, secret_options
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
    opts.add_socket_options(parser)
    opts.add_agent_options(parser)  # --agent-port, --no-agent, --from/--to: as run has them
    opts.add_output_options(parser)


def handle(args: argparse.Namespace, load: RegistryLoader) -> int:
    """The spec through each tool that can honour it, interleaved."""
    from netprobe.cli.trialsink import run_trials_shown
    from netprobe.results.trials import Skipped, screen

    spec = _one_datagram_size(opts.spec_from_args(args))
    registry = load()
    names = _tool_names(args.tools, registry.names())
    tools = [make_tool(registry, name, secret_options(args))
             for name in names]  # an unknown name is exit 3
    ready, skipped = screen(tools, spec)
    skipped += [Skipped(f.name, (f"failed to load: {f.error}",)) for f in registry.failures
                if args.tools is None and f.name not in registry.tools]  # not a shadowed name
    if not ready:
        reasons = "; ".join(r for s in skipped for r in s.reasons) or "no tools installed"
        refused = any(" cannot honour " in r for s in skipped for r in s.reasons)
        raise (SpecError if refused else ToolUnavailable)(f"no tool can run this test: "
                                                          f"{reasons}")
    return run_trials_shown(args, spec, ready, args.trials, skipped)


UDP_COMPARE_LENGTH = 1448
"""Datagram payload every tool gets in ``compare -u`` without ``-l``: one datagram in a
1500-byte MTU over IPv4 and IPv6. Left to themselves the tools differ (native 1448, iperf3
32768 or the MTU, nuttcp 8192, iperf2 1470), and so would their loss and rate."""


def _one_datagram_size(spec: Any) -> Any:
    if spec.protocol != "udp" or spec.length_bytes is not None:
        return spec
    import attrs

    from netprobe.cli.render import print_note

    print_note(f"every tool sends {UDP_COMPARE_LENGTH}-byte datagrams (-l sets another "
               "size)")
    return attrs.evolve(spec, length_bytes=UDP_COMPARE_LENGTH)


def _tool_names(given: Optional[str], installed: list[str]) -> list[str]:
    if given is None:  # every installed tool, the native engine first as the reference
        return sorted(installed, key=lambda name: (name != "native", name))
    names = [name.strip() for name in given.split(",") if name.strip()]
    if not names:
        raise SpecError("--tools needs at least one tool name")
    return list(dict.fromkeys(names))  # a tool named twice runs once per round
