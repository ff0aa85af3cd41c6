"""``netprobe run [HOST]``: one test (``--repeat N``: N trials and their statistics)."""
from __future__ import annotations

import argparse
from typing import Any

from netprobe.cli import args as opts
from netprobe.cli.common import (
    RegistryLoader,
    agent_access,
    emit_partial,
    lines_shown,
    machine_record,
    make_tool,
    output,
    registry_for,
    secret_options,
    status_code,
)
from netprobe.cli.exitcodes import UsageError
from netprobe.errors import TestFailed, TestInterrupted


def add_parser(commands: Any, summary: str, epilog: str) -> None:
    """The ``run`` command's options."""
    parser = opts.subparser(commands, "run", summary, epilog,
                            "%(prog)s [HOST] [--tool NAME] [options]")
    parser.set_defaults(handler=handle)
    parser.add_argument("host", nargs="?", metavar="HOST",
                        help="the far end (a `netprobe server`, or the tool's own server); "
                             "omit it to run both ends on this machine over loopback")
    parser.add_argument("-c", "--client", metavar="HOST", help="same as HOST (iperf3 habit)")
    parser.add_argument("--tool", default="native", metavar="NAME",
                        help="tool plugin that runs the test (default: native; see "
                             "`netprobe tools`)")
    opts.add_test_options(parser)
    opts.add_socket_options(parser)
    opts.add_agent_options(parser)
    opts.add_mode_options(parser)
    opts.add_latency_options(parser)
    opts.add_output_options(parser, stream=True)
    opts.add_trial_options(parser, ("--repeat",), None,
                           "run the test N times and summarise the trials (mean, median, sd, "
                           "min, max, 95%% confidence interval of the mean)")


def handle(args: argparse.Namespace, load: RegistryLoader) -> int:
    """Run the test and write its result (a partial one too, when it fails)."""
    from netprobe.session import prepare, run_spec

    spec = opts.spec_from_args(args)
    opts.check_addresses(args)  # a bad -B or HOST named by its option, before any run
    if args.pause is not None and args.repeat is None:
        raise UsageError("--pause needs --repeat")
    registry = registry_for(load, spec.tool)
    modes = opts.mode_options(args, registry.get(spec.tool))
    if args.udp_counters_64bit:
        if not modes.get("iperf3"):
            raise UsageError("--udp-counters-64bit is iperf3's UDP option: with --iperf3 -u")
        modes["udp_counters_64bit"] = True  # the tool refuses it without -u
    if args.latency and modes.get("iperf3"):
        modes["iperf3_latency_hz"] = args.latency_rate  # probes of its own: see below
    tool = make_tool(registry, spec.tool, {**(secret_options(args) or {}), **modes})
    prepare(tool, spec, from_host=args.from_host)  # refused (exit 2) before anything else
    if args.latency and (args.repeat is not None or args.from_host):
        raise UsageError("--latency cannot be combined with --repeat or --from")
    # A stock server has no echo: the probes are TCP handshakes to its port while the
    # test runs (netprobe.engine.iperf3.handshake), so no idle tail, no UDP.
    if args.latency and modes.get("iperf3") and (args.latency_tail
                                                 or args.latency_transport == "udp"):
        raise UsageError("--iperf3 --latency probes by TCP handshakes while the test "
                         "runs: no --latency-tail or --latency-transport udp")
    if args.repeat is not None:
        if args.format == "json-stream":
            raise UsageError("--format json-stream writes one test as it runs; with --repeat "
                             "use --format jsonl (one line per trial)")
        from netprobe.cli.trialsink import run_trials_shown

        return run_trials_shown(args, spec, [tool], args.repeat, [])
    out = output(args)
    out.check()  # an unwritable -o costs no test
    reporter = out.reporter(spec)
    try:
        if args.latency and not modes.get("iperf3"):
            result = _with_latency(tool, spec, reporter, args)
        else:
            result = run_spec(tool, spec, reporter, from_host=args.from_host,
                              agent=agent_access(args))
    except TestFailed as exc:
        emit_partial(out, exc.partial or machine_record(out, tool.name, spec, exc), reporter)
        raise
    except KeyboardInterrupt:  # Ctrl-C before the tool could make a partial result
        emit_partial(out, machine_record(out, tool.name, spec, TestInterrupted("interrupted")),
                     reporter)
        raise
    out.emit(result, intervals_shown=lines_shown(reporter))
    return status_code(result)


def _with_latency(tool: Any, spec: Any, reporter: Any, args: argparse.Namespace) -> Any:
    """The test with netprobe's latency probes beside it (--latency)."""
    from netprobe.engine.auth import load_secret
    from netprobe.latency.beside import run_with_latency
    from netprobe.session import run_spec

    return run_with_latency(lambda live: run_spec(tool, spec, live, agent=agent_access(args)),
                            spec, reporter,
                            opts.probe_options(args), load_secret(args.secret_file))
