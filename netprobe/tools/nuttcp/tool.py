"""nuttcp driven as a netprobe tool: the Tool (probe, refusals, run, parse).

How the command lines are built is in :mod:`~netprobe.tools.nuttcp.command`; one run is a
:class:`~netprobe.tools.nuttcp.session.NuttcpSession`; how nuttcp's output is read, in
:mod:`~netprobe.tools.nuttcp.parse_output` (live and saved alike) and
:mod:`~netprobe.tools.nuttcp.parse_saved` (a saved output as a Result).
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Iterator, Sequence
from typing import ClassVar, cast

from netprobe.driven import (
    DrivenTool,
    read_version,
)
from netprobe.plugin import Availability, Capabilities, Reporter
from netprobe.schema import Result, TestSpec
from netprobe.tools._bounded import SpooledLog, held
from netprobe.tools.nuttcp import command
from netprobe.tools.nuttcp import parse_output as p
from netprobe.tools.nuttcp.command import make_plan
from netprobe.tools.nuttcp.parse_saved import parse_sources
from netprobe.tools.nuttcp.session import NuttcpSession

MAX_STREAMS = 128
"""nuttcp's MAXSTREAM: it silently lowers larger -N values to this."""


class NuttcpTool(DrivenTool):
    """nuttcp (6.x, 8.x): drives the nuttcp client, and a one-shot server for local tests.

    Options: ``path`` (the binary), ``timeout_s`` (limit for byte-count tests),
    ``data_port`` (data port against a remote server; default control port + 1, or the
    server's default when no port is given), ``start_server`` (False: never start a server,
    even for this machine; a nuttcp server must already listen).
    """

    name: ClassVar[str] = "nuttcp"
    description: ClassVar[str] = "nuttcp 6.x/8.x (client driven; one-shot server for local tests)"
    capabilities: ClassVar[Capabilities] = Capabilities.all_but(
        "omit", "congestion", "bind", "zerocopy", "skip_rx_copy",
        directions=frozenset({"normal", "reverse"}),
        max_streams=MAX_STREAMS, min_interval_s=0.1,
    )
    program: ClassVar[str] = "nuttcp"
    env_var: ClassVar[str] = "NETPROBE_NUTTCP"
    install_hint: ClassVar[str] = "install the nuttcp package"

    def identify(self, path: str) -> Availability:
        """Ask the version (``nuttcp -V``); 6.x is the oldest with ``-fparse -v`` output."""
        found, _text = read_version(path, ["-V"], r"nuttcp-(\d+(?:\.\d+)+)", "nuttcp")
        major = p.version_major(found.version) or 0
        if found.available and major < 6:
            why = f"nuttcp {found.version} is too old: netprobe needs 6.x or later"
            return Availability(False, version=found.version, reasons=(why,), path=path)
        return found

    def refusals(self, spec: TestSpec) -> list[str]:
        """Capability refusals plus the ones nuttcp's option units impose."""
        return [*super().refusals(spec), *command.refusals(spec, lambda: self.probe().version)]

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        """Run the test (starting a one-shot server first when the host is this machine)."""
        self.check(spec)
        plan = make_plan(spec, self.binary(), self.options)
        return NuttcpSession(spec, plan, reporter, self.probe().version).run()

    def far_end_argv(self, spec: TestSpec, address: str, port: int) -> list[str] | None:
        """A one-shot ``nuttcp -1 --nofork`` with its control port on ``port``; the client
        names the data port (``port + 1``). nuttcp's client prints both sides already."""
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        return command.server_argv(self.binary(), port, family)

    def split_tests(self, lines: Iterable[str]) -> Iterator[str]:
        """The one test of a saved output, spooled past _bounded.SPOOL_CHARS (a big log
        comes as a SpooledLog, which parse reads as it reads a str)."""
        chunk = SpooledLog()
        for line in lines:
            chunk.add(line)
        yield cast(str, held(chunk))

    def parse(self, sources: Sequence[tuple[str, str]]) -> Result:
        """Read saved nuttcp client output (-fparse or plain, brief or -v; 6.x or 8.x)."""
        return parse_sources(sources)
