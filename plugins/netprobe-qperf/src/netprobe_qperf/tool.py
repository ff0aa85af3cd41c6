"""qperf driven as a netprobe tool: ``netprobe run --tool qperf``.

A test runs qperf's ``tcp_bw`` (or ``udp_bw`` with ``-u``) for the spec's duration, then
``tcp_lat`` (``udp_lat``) for ``latency_s`` seconds (default 1; 0 skips it). For a test on
this machine the plugin starts a qperf server on a free port (``--listen_port``) and stops
it, with the processes it forks per test, by its PID; against another host the client talks
to the qperf server running there: one a netprobe agent started (:meth:`far_end_argv`) or
one started by hand (``qperf`` with no arguments, port 19765).

What qperf reports, and where it goes in the result:

- ``send_bytes``/``send_real_time`` and ``recv_bytes``/``recv_real_time`` (``-vv``) become
  the sender's and the receiver's summaries (throughput = bytes * 8 / seconds); for UDP
  ``send_msgs``/``recv_msgs`` are the datagrams, and their difference the loss.
- ``*_cpus_used`` is qperf's reading of /proc/stat: the whole host, in percent of one CPU.
  It is kept, as percent of all cores, for the ends that run on this machine.
- ``latency`` is qperf's *one-way* figure: the ping-pong time divided by the messages both
  ends received. ``Result.latency`` holds round trips: ``mean_us`` is twice qperf's figure
  and ``count`` the round trips the client completed. qperf gives no distribution, so the
  minimum, percentiles and maximum stay None (unknown, never made up).
- qperf prints nothing while it runs: interval samples are taken by netprobe from the
  processes' I/O counters (see ``sampling.py``; sender only for UDP), and say so.

Option mapping (netprobe -> qperf): length ``-m`` (message size); window ``-sb`` (socket
buffer, both ends); port ``-lp`` (qperf's listen port, both ends); ``-6``/IPv6 host: the
client connects to ``::1`` (qperf's server listens on both families); duration ``-t`` (whole
seconds). Reverse, parallel streams, byte counts, rate limits and the other socket options
have no qperf equivalent for the socket tests and are refused.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any, ClassVar, Optional

from netprobe.driven import (
    DrivenProcess,
    DrivenSession,
    DrivenTool,
    Ready,
    free_port,
    listening,
    local_server_wanted,
    read_version,
    readable_sources,
    system_name,
)
from netprobe.errors import ParseError
from netprobe.plugin import Availability, Capabilities, Reporter
from netprobe.schema import Endpoint, Interval, RawOutput, Result, TestSpec, ToolInfo

from netprobe_qperf import results
from netprobe_qperf.parse import Output, parse
from netprobe_qperf.sampling import NOTE, Sampler

ENV_VAR = "NETPROBE_QPERF"
"""Environment variable naming the qperf binary (else PATH)."""
DEFAULT_LISTEN_PORT = 19765
"""qperf's default --listen_port."""
DEFAULT_LATENCY_S = 1
"""Seconds of the latency test that follows the throughput test."""
MAX_UDP_LENGTH = 65507
"""Largest UDP payload over IPv4."""
_FLAGS = ("-vv", "-uu", "-e", "12")  # every figure, units unified, twelve digits
_START_TIMEOUT_S = 5.0
_GRACE_S = 15.0
_SAMPLE_POLL_S = 0.02


class QperfTool(DrivenTool):
    """qperf (0.4.x): tcp_bw/udp_bw throughput, then tcp_lat/udp_lat latency.

    Options: ``path`` (the qperf binary; else $NETPROBE_QPERF, else PATH), ``latency_s``
    (seconds of latency test after the throughput test, whole seconds; 0 skips it),
    ``start_server`` (False: never start a server, even for this machine).
    """

    name: ClassVar[str] = "qperf"
    description: ClassVar[str] = "qperf 0.4 (tcp_bw/udp_bw, then tcp_lat/udp_lat latency)"
    overhead_s: ClassVar[float] = 0.2  # the server's start: 0.15-0.2 s here
    capabilities: ClassVar[Capabilities] = Capabilities(
        protocols=frozenset({"tcp", "udp"}),
        directions=frozenset({"normal"}),
        max_streams=1,
        byte_count=False,  # qperf -n hangs tcp_bw in 0.4.11: not offered
        min_interval_s=0.1,  # sampled from /proc/PID/io: qperf prints nothing until the end
        length=True,
        window=True,
        ipv6=True,
        port=True,
    )

    program: ClassVar[str] = "qperf"
    env_var: ClassVar[str] = ENV_VAR
    install_hint: ClassVar[str] = "install the qperf package"

    # -- probe ----------------------------------------------------------------------------

    def identify(self, path: str) -> Availability:
        """Ask qperf its version (``qperf -V``)."""
        return read_version(path, ["-V"], r"qperf\s+(\d+(?:\.\d+)+)", "qperf",
                            exit_codes=(0,))[0]

    def expected_s(self, spec: TestSpec) -> Optional[float]:
        """The throughput test, then the latency test (``latency_s``), and the overhead."""
        throughput = super().expected_s(spec)
        latency = self.options.get("latency_s", DEFAULT_LATENCY_S)
        extra = latency if isinstance(latency, int) and latency > 0 else 0
        return None if throughput is None else throughput + extra

    # -- refusals -------------------------------------------------------------------------

    def refusals(self, spec: TestSpec) -> list[str]:
        """Capability refusals plus the limits of qperf's own options."""
        found = super().refusals(spec)

        def refuse(option: str, why: str) -> None:
            found.append(f"qperf cannot honour {option}: {why}")

        duration = spec.duration_s
        if duration is not None and (duration < 1 or not float(duration).is_integer()):
            refuse(f"--time {duration:g}", "qperf -t takes whole seconds (at least 1)")
        if spec.protocol == "udp" and (spec.length_bytes or 0) > MAX_UDP_LENGTH:
            refuse(f"--length {spec.length_bytes}", f"largest UDP payload is {MAX_UDP_LENGTH}")
        latency = self.options.get("latency_s", DEFAULT_LATENCY_S)
        if not isinstance(latency, int) or latency < 0:
            found.append(f"qperf option latency_s must be a whole number of seconds: {latency!r}")
        return found

    # -- run ------------------------------------------------------------------------------

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        """Run the throughput test, then the latency test; a local server when needed."""
        self.check(spec)
        session = QperfSession(spec, reporter, self.binary(), self.probe().version,
                               self.options)
        return session.run()

    def far_end_argv(self, spec: TestSpec, address: str, port: int) -> Optional[list[str]]:
        """The qperf server a netprobe agent starts for ``run HOST --tool qperf``:
        ``qperf --listen_port PORT``. qperf cannot bind one address: it listens on all of
        the host's (``address`` is not used). The agent stops it when the client is done."""
        return [self.binary(), "--listen_port", str(port)]

    # -- parse ----------------------------------------------------------------------------

    def parse(self, sources: Sequence[tuple[str, str]]) -> Result:
        """Read saved qperf client output (any verbosity; ``-vv -uu`` gives every figure)."""
        name, text = readable_sources(sources, "qperf")[0]
        out = parse(text, name)
        if not any(r.test in ("tcp_bw", "udp_bw", "tcp_lat", "udp_lat") for r in out.reports):
            raise ParseError("no qperf test results in the output", name, 1)
        return results.from_saved(name, text, out)


class QperfSession(DrivenSession):
    """One run: the server (for a local test), the two client runs, and the result."""

    def __init__(self, spec: TestSpec, reporter: Reporter, binary: str,
                 version: Optional[str], options: dict[str, Any]) -> None:
        super().__init__(spec, reporter, tool="qperf", version=version)
        self.binary = binary
        self.latency_s = int(options.get("latency_s", DEFAULT_LATENCY_S))
        self.local = local_server_wanted(spec, options)
        self.port = spec.port or (free_port() if self.local else DEFAULT_LISTEN_PORT)
        self.host = self._connect_host()
        self.server: Optional[DrivenProcess] = None
        self.clients: list[DrivenProcess] = []
        self.outputs: list[Output] = []
        self.sampler: Optional[Sampler] = None

    def _connect_host(self) -> str:
        six = self.spec.ip_version == 6 or (self.spec.host is not None and ":" in self.spec.host)
        if self.local:
            return "::1" if six else "127.0.0.1"
        assert self.spec.host is not None
        return self.spec.host

    def start_server(self) -> bool:
        """Start the local server (a test on this machine); False if it did not listen."""
        if not self.local:
            return True
        argv = (self.binary, "--listen_port", str(self.port))
        ready = self.serve("server", argv, _listening(self.port), _START_TIMEOUT_S)
        self.server = self.driven.processes["server"]
        return ready

    def run_client(self) -> None:
        """The throughput test, then (unless it failed) the latency test."""
        self._client(results.bw_test(self.spec), int(self.spec.duration_s or 0))
        if self.latency_s > 0 and not self.problems:
            self._client(results.lat_test(self.spec), self.latency_s)

    def failures(self) -> list[str]:
        """What went wrong in either client run."""
        return list(self.problems)

    def _client(self, test: str, seconds: int) -> None:
        argv = [self.binary, self.host, "--listen_port", str(self.port), "-t", str(seconds),
                *_FLAGS, *results.size_args(self.spec, test), test]
        # Only the throughput test is watched for CPU starvation: a latency ping-pong on a
        # busy host waits at every turn, which is its latency, not a throughput limit.
        client = self.driven.start(test, argv, watch=test.endswith("_bw"))
        self.clients.append(client)
        sampler = self._sampler(client, test)
        tick = sampler.poll if sampler is not None else None
        if not self.driven.wait(lambda: _exited(client.pid), seconds + _GRACE_S, tick,
                                poll_s=_SAMPLE_POLL_S):
            client.stop()
            self.problems.append(f"qperf {test} did not finish within {seconds + _GRACE_S:g} s")
            return
        if sampler is not None:
            sampler.finish()  # before the wait reaps it: its counters are still readable
        code = client.wait(_START_TIMEOUT_S)
        self._read(client, test, -1 if code is None else code)

    def _sampler(self, client: DrivenProcess, test: str) -> Optional[Sampler]:
        """Interval samples for the throughput test, when the spec asks for them."""
        if self.spec.interval_s is None or not test.endswith("_bw"):
            return None
        server = self.server.pid if self.server is not None else None
        self.sampler = Sampler(self.driven, self.spec.interval_s, client.pid, server,
                               receiver_counted=self.spec.protocol == "tcp")
        return self.sampler

    def _read(self, client: DrivenProcess, test: str, code: int) -> None:
        try:
            out = parse(client.text, test)
        except ParseError as exc:
            self.problems.append(f"qperf {test}: {exc}")
            return
        self.outputs.append(out)
        report = out.report(test)
        if code != 0 or report is None or not report.figures:
            why = "; ".join(out.errors) or "no figures printed"
            self.problems.append(f"qperf {test} failed (exit code {code}): {why}")

    def result(self, status: str, errors: list[str]) -> Result:
        """The Result from qperf's reports (also partial), with netprobe's samples."""
        figures = results.Figures.from_outputs(self.outputs, self.spec)
        figures.lat_when = f", a {self.latency_s} s test after the throughput test"
        local = Endpoint(role="client", system=system_name())
        remote = Endpoint(role="server", host=self.spec.host, address=self.host,
                          port=self.port, system=system_name() if self.local else None)
        return Result(
            tool=ToolInfo(name="qperf", version=self.version), spec=self.spec,
            start_time=self.start_time, local=local, remote=remote, status=status,
            duration_s=figures.duration_s(), summaries=figures.summaries(True, self.local),
            streams=figures.streams(), latency=figures.latency(),
            intervals=self.intervals(),
            warnings=(*self._warnings(figures), *self.driven.warnings),
            errors=tuple(errors), raw=self._raw(),
        )

    def intervals(self) -> tuple[Interval, ...]:
        """The samples taken from the processes' I/O counters (qperf prints none)."""
        return tuple(self.sampler.intervals) if self.sampler is not None else ()

    def _warnings(self, figures: results.Figures) -> list[str]:
        found = figures.warnings()
        return [NOTE, *found] if self.intervals() else found

    def _raw(self) -> tuple[RawOutput, ...]:
        found = [client.raw() for client in self.clients]
        if self.server is not None:
            found.append(self.server.raw())
        return tuple(found)


def _exited(pid: int) -> bool:
    """Has our child ``pid`` exited? It is left unreaped (WNOWAIT), so that its final I/O
    counters can still be read and DrivenProcess.wait() still gets its exit code."""
    try:
        found = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return found is not None


def _listening(port: int) -> Ready:
    """qperf's server listens on [::] (both families) where IPv6 is on, else on 0.0.0.0."""
    six, four = listening([(port, False)], socket.AF_INET6), listening([(port, False)],
                                                                       socket.AF_INET)
    return lambda server: six(server) or four(server)
