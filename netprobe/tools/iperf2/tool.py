"""The iperf 2 adapter: drives the installed ``iperf`` (2.x) binary and maps its output
into the result schema.

The command lines are :mod:`~netprobe.tools.iperf2.command`'s; one run is an
:class:`~netprobe.tools.iperf2.session.Iperf2Session`; the output is read by
:mod:`~netprobe.tools.iperf2.parse_output`, and saved outputs become a Result in
:mod:`~netprobe.tools.iperf2.parse_saved`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import cast

import attrs

from netprobe.errors import NetprobeError
from netprobe.plugin import Capabilities, Reporter
from netprobe.resultops import fill_missing
from netprobe.schema import RawOutput, Result, TestSpec
from netprobe.tools._iperf_common import IperfTool, Probed
from netprobe.tools.iperf2 import parse_output as p2
from netprobe.tools.iperf2.command import DEFAULT_PORT, server_argv
from netprobe.tools.iperf2.parse_saved import parse_sources
from netprobe.tools.iperf2.session import Iperf2Session

ENV_VAR = "NETPROBE_IPERF2"
"""Environment variable naming the iperf 2 binary to use."""


Iperf2Binary = Probed
"""What probing found: the binary, its version and its --help text."""


class Iperf2Tool(IperfTool):
    """iperf 2 driven as an external program; one Result like every other tool.

    Options: ``path`` (the binary), ``start_server`` (default True: for a local host,
    start an iperf 2 server and stop it afterwards; False to use one already running).
    """

    name = "iperf2"
    aliases = ("iperf",)
    description = "iperf 2, the installed binary driven by netprobe"
    capabilities = Capabilities.all_but(
        "omit",  # no warm-up exclusion in iperf 2.1
        "zerocopy", "skip_rx_copy",  # iperf 2 always copies
        max_streams=None, min_interval_s=0.01,
    )

    program, env_var, install_hint = "iperf", ENV_VAR, "iperf 2.x: apt install iperf"
    version_args = ("-v",)  # iperf 2 prints its version to stderr and exits 1
    version_pattern, label = r"iperf version (2\.\d+(?:\.\d+)?\S*)", "iperf 2"
    default_port = DEFAULT_PORT

    # --- refusing what cannot be honoured -------------------------------------------------

    def refusals(self, spec: TestSpec) -> list[str]:
        """The base checks plus iperf 2's own limits."""
        found = super().refusals(spec)
        if spec.bytes_total is not None and spec.direction != "normal":
            found.append("iperf2 cannot honour --bytes: iperf 2 counts -n on the client's own "
                         "sends only")
        found.extend(_endless_byte_counts(spec))
        found.extend(self.tcp_only_refusals(spec, ("--mss", "--nodelay", "--congestion")))
        found.extend(self.missing_options([
            ("--reverse", spec.direction == "reverse", "--reverse", ""),
            ("--bidir", spec.direction == "bidir", "--full-duplex", ""),
        ]))
        return found

    # --- running ---------------------------------------------------------------------------

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        """Run the test; start a local server (stopped by PID afterwards) when the host is
        this machine."""
        launch = self.launch(spec)
        return Iperf2Session(spec, reporter, name=self.name, binary=self.found(),
                             launch=launch).run()

    # --- parsing saved output -----------------------------------------------------------------

    def far_end_argv(self, spec: TestSpec, address: str, port: int) -> list[str] | None:
        """``iperf -s`` on ``address:port`` with the client's report format."""
        return server_argv(self.found(), spec, address, port)

    def merge_far_end(self, result: Result, far_end: RawOutput) -> Result:
        """iperf 2's client does not print the receiver's figures over TCP: read them from
        the server's own output and fill what the client's result lacks."""
        sources = [(raw.name, raw.text) for raw in result.raw if raw.name == "client"]
        try:
            both = self.parse([*sources, ("server", far_end.text)])
        except NetprobeError as exc:
            return attrs.evolve(result, raw=(*result.raw, far_end),
                                warnings=(*result.warnings, f"far end output unreadable: {exc}"))
        return fill_missing(result, both, far_end)

    def split_tests(self, lines: Iterable[str]) -> Iterator[str]:
        """Each test of a log that holds several (see p2.split_tests). A test past
        p2.SPOOL_CHARS comes as a p2.SpooledLog, which this tool's parse reads as it reads
        a str: the parse command passes each test from split_tests to parse untouched."""
        yield from cast(Iterator[str], p2.split_tests(lines))

    def parse(self, sources: Sequence[tuple[str, str]]) -> Result:
        """Saved iperf 2 output (``-e`` or legacy text, or ``-y C`` CSV, with or without
        the 2.2 header; client and/or server) as one Result. Raises ParseError when a
        source holds no iperf 2 report."""
        return parse_sources(self.name, sources)


TCP_MIN_BYTES = 60
"""The smallest TCP ``-n`` iperf 2.1.8 stops at: below it the client sends without end
(measured on loopback: 59 bytes ran for as long as it was let run, 60 stopped at 60)."""
UDP_DEFAULT_LENGTH = 1470
"""iperf 2's UDP datagram payload when ``-l`` is not given."""


def _endless_byte_counts(spec: TestSpec) -> list[str]:
    """A byte count iperf 2 would never reach the end of: refused before it runs.

    iperf 2.1.8 stops a byte-count test only once the count is at least its TCP threshold,
    or, for UDP, one whole datagram; below that it sends until it is killed (a fuzz of
    ``-n`` found 94 GB sent in 96 s for ``-n 1``)."""
    if spec.bytes_total is None:
        return []
    if spec.protocol == "udp":
        floor = spec.length_bytes or UDP_DEFAULT_LENGTH
        what = f"one datagram ({floor} bytes)"
    else:
        floor, what = TCP_MIN_BYTES, f"{TCP_MIN_BYTES} bytes"
    if spec.bytes_total >= floor:
        return []
    return [f"iperf2 cannot honour --bytes {spec.bytes_total}: iperf 2 never stops for a "
            f"count below {what}; ask for at least that"]
