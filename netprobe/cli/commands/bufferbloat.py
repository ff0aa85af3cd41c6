"""``netprobe bufferbloat [HOST]``: idle, download, upload, both, idle, with latency probes
throughout; a table per phase, the grade, and which direction's queue is the problem.

``netprobe rrul`` (:mod:`netprobe.cli.commands.rrul`) is the same command with Flent's
RRUL shape: one loaded phase of 4 streams each way at once."""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from netprobe.cli import args as opts
from netprobe.cli import common
from netprobe.errors import TestFailed

RRUL_NOTE = ("Flent users: `netprobe rrul HOST` runs RRUL's shape instead, 4 TCP streams "
             "each way at once for 60 s between 5 s of idle probes.")


def add_parser(commands: Any, summary: str, epilog: str) -> None:
    """The ``bufferbloat`` command's options."""
    parser = add_phased_parser(commands, "bufferbloat", summary, epilog, loaded_s=10.0,
                               idle_s=10.0,
                               phases="seconds of each loaded phase: download, upload, both")
    parser.description = f"{summary}. {RRUL_NOTE}"
    parser.set_defaults(handler=handle)


def add_phased_parser(commands: Any, name: str, summary: str, epilog: str, loaded_s: float,
                      idle_s: float, phases: str) -> argparse.ArgumentParser:
    """The options of a test in phases with probes throughout (``bufferbloat``, ``rrul``)."""
    parser = opts.subparser(commands, name, summary, epilog,
                            "%(prog)s [HOST] [-t SECONDS] [-P N] [options]")
    parser.set_defaults(client=None, reverse=None)
    parser.add_argument("host", nargs="?", metavar="HOST",
                        help="the far end, running `netprobe server`; omit it to test this "
                             "machine over loopback")
    parser.add_argument("--tool", default="native", metavar="NAME",
                        help="tool that loads the link (default: native; the probes are "
                             "always netprobe's)")
    group = parser.add_argument_group("phases")
    group.add_argument("-t", "--time", type=opts.SECONDS, default=loaded_s, metavar="SECONDS",
                       help=f"{phases} (default: {loaded_s:g})")
    group.add_argument("--idle", type=opts.SECONDS_OR_ZERO, default=idle_s, metavar="SECONDS",
                       help=f"seconds of the idle phases before and after (default: {idle_s:g})")
    group.add_argument("-O", "--omit", type=opts.SECONDS_OR_ZERO, default=0.0, metavar="SECONDS",
                       help="warm up each loaded phase for SECONDS first, left out of its "
                            "throughput (as in iperf3; the probes count it as loaded)")
    group.add_argument("-P", "--parallel", type=opts.COUNT, default=4, metavar="N",
                       help="TCP streams per direction (default: 4)")
    group.add_argument("-i", "--interval", type=opts.SECONDS_OR_ZERO, default=1.0,
                       metavar="SECONDS", help="seconds between interval reports (default: 1)")
    group.add_argument("--latency-rate", type=opts.RATE_HZ, default=20.0, metavar="PER_S",
                       help="probes per second (default: 20)")
    group.add_argument("--latency-transport", choices=("auto", "udp", "tcp"), default="auto",
                       help="probe over UDP, TCP, or UDP with TCP where UDP is dropped")
    opts.add_socket_options(parser)
    opts.add_output_options(parser)
    return parser


def _spec(args: argparse.Namespace) -> Any:
    from netprobe.schema import TestSpec

    return TestSpec(
        tool=args.tool, host=args.host, protocol="tcp", direction="normal",
        streams=args.parallel, duration_s=args.time, interval_s=args.interval or None,
        omit_s=args.omit,
        length_bytes=args.length, window_bytes=args.window, mss_bytes=args.mss,
        nodelay=args.nodelay, dscp=args.dscp, congestion=args.congestion,
        ip_version=args.ip_version, port=args.port, bind_address=args.bind,
        zerocopy=args.zerocopy, skip_rx_copy=args.skip_rx_copy,
    )


def handle(args: argparse.Namespace, load: common.RegistryLoader) -> int:
    """Run the five phases and write the one result (a partial one too, when it fails)."""
    from netprobe.latency.bufferbloat import LOADED_PHASES

    return run_phases(args, load, LOADED_PHASES)


def run_phases(args: argparse.Namespace, load: common.RegistryLoader,
               plan: Sequence[tuple[str, str]]) -> int:
    """Idle, the loaded phases of ``plan`` (name, direction), idle; write the one result."""
    from netprobe.latency.bufferbloat import phase_spec, prepare_plan, run_plan
    from netprobe.latency.probing import ProbeOptions

    spec = _spec(args)
    registry = common.registry_for(load, spec.tool)
    tool = common.make_tool(registry, spec.tool, common.secret_options(args))
    prepare_plan(tool, spec, plan)  # refused (exit 2) before anything runs
    access = common.agent_access(args)
    out = common.output(args)
    out.check()
    reporter = out.reporter(phase_spec(spec, "bidir"))
    options = ProbeOptions(idle_s=args.idle, rate_hz=args.latency_rate,
                           transport=args.latency_transport)
    try:
        result = run_plan(tool, spec, plan, reporter, options, access, label=args.command)
    except TestFailed as exc:
        common.emit_partial(out, exc.partial or common.machine_record(
            out, tool.name, phase_spec(spec, "bidir"), exc), reporter)
        raise
    out.emit(result, intervals_shown=common.lines_shown(reporter))
    return common.status_code(result)
