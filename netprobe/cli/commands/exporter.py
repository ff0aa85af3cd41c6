"""``netprobe exporter``: /probe runs one test for Prometheus, to a target its
configuration (``--config``) names; /metrics serves a fleet archive's latest figures
(netprobe.exporter; needs ``pip install 'netprobe-meter[exporter]'``)."""
from __future__ import annotations

import argparse
from typing import Any

from netprobe.cli import args as opts
from netprobe.cli.common import RegistryLoader
from netprobe.cli.exitcodes import ExitCode
from netprobe.errors import ToolUnavailable


def add_parser(commands: Any, summary: str, epilog: str) -> None:
    """The ``exporter`` command's options."""
    parser = opts.subparser(commands, "exporter", summary, epilog,
                            "%(prog)s [--listen ADDRESS] [--port PORT] [--archive URL] "
                            "[--config FILE]")
    parser.set_defaults(handler=handle)
    parser.add_argument("--listen", default="127.0.0.1", metavar="ADDRESS",
                        help="address to listen on (default: 127.0.0.1; 0.0.0.0 for all)")
    parser.add_argument("--port", type=opts.LISTEN_PORT, metavar="PORT",
                        help="port to listen on (default: 9531; 0: any free port)")
    parser.add_argument("--archive", metavar="URL",
                        help="fleet archive whose latest figures /metrics serves")
    parser.add_argument("--config", metavar="FILE",
                        help="the exporter's configuration (TOML): the modules that say what "
                             "/probe may test and /status may ask, caps, authentication "
                             "(without it /probe and /status refuse every request)")


def handle(args: argparse.Namespace, _load: RegistryLoader) -> int:
    """Serve until Ctrl-C or SIGTERM."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise ToolUnavailable("the exporter needs prometheus_client: "
                              "pip install 'netprobe-meter[exporter]'") from None
    from netprobe.cli.render import print_note, print_warning
    from netprobe.exporter import DEFAULT_PORT, Exporter
    from netprobe.exporter_config import NO_CONFIG, load

    config = load(args.config) if args.config else NO_CONFIG
    port = DEFAULT_PORT if args.port is None else args.port
    exporter = Exporter(args.listen, port, args.archive, config, log=print_warning)
    bound = exporter.start()
    probes = (f"/probe?target=HOST and /status?target=HOST, modules: "
              f"{', '.join(config.modules)}" if config.modules
              else "/probe and /status off: no --config")
    print_note(f"netprobe exporter listening on {args.listen} port {bound} "
               f"({probes}; /metrics)")
    assert exporter.server is not None
    try:
        exporter.server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        print_note("netprobe exporter: stopped")
    finally:
        exporter.server.server_close()
    return ExitCode.OK
