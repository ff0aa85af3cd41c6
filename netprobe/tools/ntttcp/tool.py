"""NTTTCP for Linux driven as a netprobe tool.

The sender (``-s``) is the client; for a test on this machine the adapter first starts the
receiver (``-r``; the role is always given: without one ntttcp silently becomes a receiver)
with the same mapping, duration, protocol and ports, on a free base port whose sync port
(base - 1) is free too. Both write ``-x`` XML and ``-j`` JSON result files (read, kept in
``Result.raw`` and deleted); the console output is read live for the ~0.5 s
``Real-time throughput`` lines and for what the files lack (RTT with ``-V``).

ntttcp's receiver (and then the sender, which waits for it) often prints its whole report
and does not exit: once a report is complete and its result files are written, the
process is stopped. Traps handled: ``-h`` exits 23, no receiver exits 24, bad arguments
exit 23 or 255, errors go to stdout; UDP over IPv6 is not implemented (it hangs), so it is
refused.

Command lines: :mod:`netprobe.tools.ntttcp.command`.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Sequence
from typing import Any, ClassVar

import attrs

from netprobe.driven import DrivenTool, family_for, read_version
from netprobe.errors import NetprobeError
from netprobe.plugin import Availability, Capabilities, Reporter
from netprobe.resultops import fill_missing, short_sender_totals
from netprobe.schema import RawOutput, Result, TestSpec
from netprobe.tools.ntttcp.command import common_args, line_buffer_prefix, make_plan
from netprobe.tools.ntttcp.intervals import REALTIME_PERIOD_S, reconcile
from netprobe.tools.ntttcp.parse_saved import parse_sources
from netprobe.tools.ntttcp.session import COUNTER_NOTE, RECONCILED_NOTE, NtttcpSession

MAX_STREAMS = 512
"""ntttcp's most receiver ports (MAX_NUM_SERVER_PORTS)."""


class NtttcpTool(DrivenTool):
    """NTTTCP for Linux (1.4.x): drives the sender, and a receiver for local tests.

    Options: ``path`` (the binary), ``start_server`` (False: never start a receiver, even
    for this machine), ``line_buffered`` (False: do not run ntttcp under ``stdbuf -oL``,
    which makes its console output arrive line by line through a pipe); the modes
    ``receive`` (only a receiver, here, for an outside sender: ``netprobe run --receive``)
    and ``no_sync`` (``-N`` on both roles: ``--no-sync``), for Windows NTttcp peers.
    """

    name: ClassVar[str] = "ntttcp"
    description: ClassVar[str] = (
        "NTTTCP for Linux (sender driven; receiver started for local tests)"
    )
    modes: ClassVar[frozenset[str]] = frozenset({"receive", "no_sync"})
    capabilities: ClassVar[Capabilities] = Capabilities.all_but(
        "byte_count", "window", "mss", "dscp", "congestion", "zerocopy", "skip_rx_copy",
        directions=frozenset({"normal"}),
        max_streams=MAX_STREAMS, min_interval_s=REALTIME_PERIOD_S,
    )

    program: ClassVar[str] = "ntttcp"
    env_var: ClassVar[str] = "NETPROBE_NTTTCP"
    install_hint: ClassVar[str] = ("NTTTCP for Linux is not packaged by Debian: build it "
                                   "from microsoft/ntttcp-for-linux")

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self._help = ""

    def identify(self, path: str) -> Availability:
        """The version from the first line of ``ntttcp -h`` (it has no version option;
        ``-h`` exits 23); the help text says which options this build has."""
        found, self._help = read_version(path, ["-h"], r"NTTTCP for Linux (\S+)",
                                         "NTTTCP for Linux")
        return found

    # -- refusals -----------------------------------------------------------------------

    def refusals(self, spec: TestSpec) -> list[str]:
        """Capability refusals plus ntttcp's own: whole seconds, no UDP over IPv6, exact
        rates, UDP datagram size, and options this build's help does not list."""
        found = super().refusals(spec)

        def refuse(option: str, why: str) -> None:
            found.append(f"ntttcp cannot honour {option}: {why}")

        if spec.duration_s is not None and not float(spec.duration_s).is_integer():
            refuse(f"--time {spec.duration_s:g}", "ntttcp -t takes whole seconds")
        if spec.omit_s and not float(spec.omit_s).is_integer():
            refuse(f"--omit {spec.omit_s:g}", "ntttcp -W takes whole seconds")
        if spec.protocol == "udp" and family_for(spec) == socket.AF_INET6:
            refuse("--udp with IPv6", "UDP over IPv6 is not implemented in ntttcp (it hangs)")
        rate = spec.rate_bits_per_second
        if rate is not None and not float(rate * spec.streams).is_integer():
            refuse(f"--bitrate {rate:g}", "ntttcp -B takes whole bits per second")
        if self.options.get("receive"):
            self._receive_refusals(spec, refuse)
        found += self._feature_refusals(spec, refuse)
        return found

    @staticmethod
    def _receive_refusals(spec: TestSpec, refuse: Any) -> None:
        """Receive-only: what only the (outside) sender decides cannot be asked here."""
        # (a UDP spec always has a rate, netprobe's default: not the user's wish)
        rate = spec.rate_bits_per_second is not None and spec.protocol == "tcp"
        sender_side = [(rate, "--bitrate"),
                       (spec.nodelay, "--nodelay"), (spec.bind_address is not None, "--bind")]
        for asked, option in sender_side:
            if asked:
                refuse(option, "with --receive the sender started elsewhere decides it")

    def _feature_refusals(self, spec: TestSpec, refuse: Any) -> list[str]:
        """Options this build does not list in its help (known only after a probe)."""
        if not self._help:
            return []
        wanted = [
            (spec.nodelay, "--no-delay", "--nodelay"),
            (spec.rate_bits_per_second is not None, "-B ", "--bitrate"),
            (spec.omit_s > 0, "-W ", "--omit"),
            (spec.bind_address is not None, "-a ", "--bind"),
        ]
        for asked, flag, option in wanted:
            if asked and flag not in self._help:
                refuse(option, f"this ntttcp build has no {flag.strip()} option")
        return []

    # -- run ----------------------------------------------------------------------------

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        """Run the test (starting a receiver first when the host is this machine)."""
        self.check(spec)  # what the capabilities refuse, before the probe runs ntttcp -h
        binary = self.binary()
        self.check(spec)  # and what this build lacks, known from its help
        workdir = tempfile.mkdtemp(prefix="netprobe-ntttcp-")
        try:
            plan = make_plan(spec, binary, self.options, workdir, self._help)
            return NtttcpSession(spec, plan, reporter, self.probe().version).run()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def far_end_argv(self, spec: TestSpec, address: str, port: int) -> list[str] | None:
        """The receiver (``-r``) with the sender's thread mapping, duration and ports; its
        console report is what the agent sends back."""
        prefix = line_buffer_prefix(self.options)
        return [*prefix, self.binary(), "-r", *common_args(spec, address, port)]

    def merge_far_end(self, result: Result, far_end: RawOutput) -> Result:
        """The receiver's console report fills the receiver figures the sender lacks."""
        try:
            theirs = parse_sources([("receiver", far_end.text)])
        except NetprobeError:
            return super().merge_far_end(result, far_end)
        merged = fill_missing(result, theirs, far_end)
        # The far end's figures can change the sender's total: the check again, once.
        short = short_sender_totals("ntttcp", merged.spec.protocol, merged.summaries)
        merged = attrs.evolve(merged, warnings=tuple(dict.fromkeys((*merged.warnings, *short))))
        receiver = merged.summaries[0].receiver if merged.summaries else None
        if receiver is None or not any(w == COUNTER_NOTE for w in merged.warnings):
            return merged
        # the sender's acknowledged bytes and the far receiver's total count the same bytes
        return attrs.evolve(merged, intervals=reconcile(merged.intervals, receiver.bytes,
                                                        "sender"),
                            warnings=(*merged.warnings, RECONCILED_NOTE))

    # -- parse --------------------------------------------------------------------------

    def parse(self, sources: Sequence[tuple[str, str]]) -> Result:
        """Read saved ntttcp outputs: console logs, -x XML and -j JSON files, either role."""
        return parse_sources(sources)
