"""The iperf3 adapter: drives the installed ``iperf3`` binary and maps its output into the
result schema.

The command lines are :mod:`~netprobe.tools.iperf3.command`'s; one run is an
:class:`~netprobe.tools.iperf3.session.Iperf3Session` (the client always writes JSON,
``-J``, the authoritative record); the output is read by
:mod:`~netprobe.tools.iperf3.parse_output`, and saved outputs become a Result in
:mod:`~netprobe.tools.iperf3.parse_saved`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import cast

from netprobe.plugin import Capabilities, Reporter
from netprobe.schema import Result, TestSpec
from netprobe.tools._iperf_common import IperfTool, Probed, whole_seconds
from netprobe.tools.iperf3 import parse_output as p3
from netprobe.tools.iperf3.command import DEFAULT_PORT, Iperf3Binary, server_argv
from netprobe.tools.iperf3.parse_saved import parse_sources
from netprobe.tools.iperf3.session import Iperf3Session

ENV_VAR = "NETPROBE_IPERF3"
"""Environment variable naming the iperf3 binary to use."""
MAX_INTERVAL_S = 60.0

__all__ = ["Iperf3Binary", "Iperf3Tool"]


class Iperf3Tool(IperfTool):
    """iperf3 (ESnet) driven as an external program; one Result like every other tool.

    Options: ``path`` (the binary), ``start_server`` (default True: for a local host, start
    a one-off iperf3 server; False to use one that is already running).
    """

    name = "iperf3"
    description = "iperf3, the installed binary driven by netprobe"
    # 128 is iperf3's MAX_STREAMS; skip_rx_copy only with a binary that lists it (refusals()).
    capabilities = Capabilities.all_but(max_streams=128, min_interval_s=0.1)

    program, env_var, install_hint = "iperf3", ENV_VAR, "apt install iperf3"
    version_args, version_pattern = ("--version",), r"\biperf (3\.\d+(?:\.\d+)?[^\s(]*)"
    label, found_type, default_port = "iperf3", Iperf3Binary, DEFAULT_PORT

    def details(self, found: Probed) -> tuple[str, ...]:
        """Where live intervals come from with this binary."""
        stream = isinstance(found, Iperf3Binary) and found.json_stream
        live = "--json-stream" if stream else "the local server's output"
        return (f"live intervals from {live}",)

    def found(self) -> Iperf3Binary:
        """The binary this tool runs (what its --help lists included)."""
        found = super().found()
        assert isinstance(found, Iperf3Binary)
        return found

    # --- refusing what cannot be honoured -------------------------------------------------

    def refusals(self, spec: TestSpec) -> list[str]:
        """The base checks plus iperf3's own limits and those of the installed binary."""
        found = super().refusals(spec)

        def refuse(option: str, why: str) -> None:
            found.append(f"iperf3 cannot honour {option}: {why}")

        if not whole_seconds(spec.duration_s):
            refuse(f"--time {spec.duration_s}", "iperf3 -t takes whole seconds")
        if not whole_seconds(spec.omit_s):
            refuse(f"--omit {spec.omit_s}", "iperf3 -O takes whole seconds")
        if spec.interval_s is not None and spec.interval_s > MAX_INTERVAL_S:
            refuse(f"--interval {spec.interval_s}", f"longest is {MAX_INTERVAL_S:g} s")
        if spec.bytes_total is not None and (spec.streams > 1 or spec.direction == "bidir"):
            refuse("--bytes", "iperf3 -n counts the bytes of all streams together, not per stream")
        found.extend(self.tcp_only_refusals(spec, ("--mss", "--nodelay", "--congestion",
                                                   "--zerocopy")))
        found.extend(self.missing_options([
            ("--skip-rx-copy", spec.skip_rx_copy, "--skip-rx-copy", "3.19"),
            ("--bidir", spec.direction == "bidir", "--bidir", "3.7"),
            ("--congestion", spec.congestion is not None, "--congestion", "a Linux/FreeBSD build"),
        ]))
        return found

    # --- running ---------------------------------------------------------------------------

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        """Run the test; start a one-off local server when the host is this machine."""
        launch = self.launch(spec)
        return Iperf3Session(spec, reporter, name=self.name, binary=self.found(),
                             launch=launch).run()

    # --- parsing saved output -----------------------------------------------------------------

    def far_end_argv(self, spec: TestSpec, address: str, port: int) -> list[str] | None:
        """A one-off ``iperf3 -s -1`` on ``address:port`` (the client's -J has both sides)."""
        return server_argv(self.found(), spec, address, port)

    def split_tests(self, lines: Iterable[str]) -> Iterator[str]:
        """Each test of a log that holds several (see p3.split_tests). A big test comes
        as a SpooledLog, which parse reads as it reads a str (see netprobe.tools._bounded)."""
        yield from cast(Iterator[str], p3.split_tests(lines))

    def parse(self, sources: Sequence[tuple[str, str]]) -> Result:
        """Saved iperf3 output (``-J`` documents, ``--json-stream`` lines or human output;
        client and/or server) as one Result. Raises ParseError on unreadable input."""
        return parse_sources(self.name, sources)
