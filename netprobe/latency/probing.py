"""The probe session beside a test: its options, the far end it probes, the reporter that
adds the probes' latency to each interval, and the probes' figures put into the result.

The probes need a netprobe server at the far end (the native tool's server, or ``netprobe
server`` as the agent next to a driven tool's server); with no host, a server of their own
runs on loopback. :mod:`netprobe.latency.phases` runs a session through its phases.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import attrs

from netprobe.engine import protocol
from netprobe.engine.prober import DEFAULT_RATE_HZ, Prober
from netprobe.errors import TestFailed
from netprobe.latency import figures as latency
from netprobe.plugin import Reporter
from netprobe.schema import Interval, Result, TestSpec

DEFAULT_IDLE_S = 2.0
"""Idle baseline before the load: 40 probes at the default rate, enough for a median."""
BYTE_COUNT_SESSION_S = 600.0
"""How long the probes may run beside a test a byte count ends (its length is unknown)."""
SESSION_MARGIN_S = 60.0
"""How much longer than planned the server keeps a probe session (set-up, slow ends)."""


@attrs.frozen
class ProbeOptions:
    """How the probes run beside a test."""

    idle_s: float = DEFAULT_IDLE_S
    """Idle baseline before the load."""
    tail_s: float = 0.0
    """Idle time after the load (0: none)."""
    rate_hz: float = DEFAULT_RATE_HZ
    """Probes per second."""
    transport: str = "auto"
    """``udp``, ``tcp`` or ``auto`` (UDP, TCP where UDP gets no answer)."""
    port: int | None = None
    """The netprobe server's port (default: the test's port for native, else 5301)."""


def probe_port(spec: TestSpec, options: ProbeOptions) -> int:
    """Where the probes go: the option, the native test's own port, or netprobe's."""
    if options.port:
        return options.port
    if spec.tool == "native" and spec.port:
        return spec.port
    return protocol.DEFAULT_PORT


@contextmanager
def far_end(spec: TestSpec, options: ProbeOptions) -> Iterator[tuple[str, int]]:
    """The (host, port) of a netprobe server for the probes; one of our own on loopback
    when the test has no host."""
    if spec.host:
        yield spec.host, probe_port(spec, options)
        return
    from netprobe.engine.server import Server, ServerConfig

    loopback = "::1" if spec.ip_version == 6 else "127.0.0.1"
    server = Server(ServerConfig(bind_address=loopback, port=0))
    try:
        port = server.start()
    except OSError as exc:
        raise TestFailed(f"latency probes: cannot start a server on {loopback}: {exc}") from None
    try:
        yield loopback, port
    finally:
        server.close()


def open_prober(host: str, port: int, secret: bytes | None, options: ProbeOptions,
                session_s: float, phase: str = "idle") -> Prober:
    """A started prober against the netprobe server at host:port (TestFailed if none)."""
    from netprobe.farend import AgentConnection

    agent = AgentConnection.open(host, port, secret)
    if agent is None:
        raise TestFailed(f"latency probes: no netprobe server answers at {host} port {port} "
                         "(run `netprobe server` there)")
    prober = Prober(options.rate_hz, options.transport)
    prober.start(agent.channel, session_s, phase)
    return prober


class LatencyReporter:
    """Passes a test's events on, adding the probes' latency to each interval.

    Intervals carry test time (seconds since the test's start); the probes their own.
    The first samples tell the offset: a native side's sampler hands its interval on the
    moment it ends, so the smallest (now - end_s) seen is the test's start in probe time.
    """

    def __init__(self, inner: Reporter, prober: Prober) -> None:
        self.inner = inner
        self.prober = prober
        self.zero_s: float | None = None

    def interval(self, sample: Interval) -> None:
        """Add the probes' latency to the interval, then pass it on."""
        estimate = self.prober.now_s() - sample.end_s
        if self.zero_s is None or estimate < self.zero_s:
            self.zero_s = estimate
        self.inner.interval(self.add(sample, self.prober.answered()))

    def note(self, message: str) -> None:
        """Pass the note on."""
        self.inner.note(message)

    def add(self, sample: Interval, samples: list[latency.ProbeSample]) -> Interval:
        """``sample`` with the round trips of the probes answered within it."""
        zero = self.zero_s or 0.0
        rtts = latency.answered_between(samples, zero + sample.start_s, zero + sample.end_s)
        return latency.with_interval_latency(sample, rtts)


def attach(result: Result, log: latency.ProbeLog, live: LatencyReporter) -> Result:
    """The result with the probes' Latency and per-interval latency."""
    if live.zero_s is None:  # no live intervals: the test started with the loaded phase
        loaded = [p.start_s for p in log.phases if p.loaded]
        live.zero_s = loaded[0] if loaded else 0.0
    samples = list(log.samples)
    intervals = tuple(live.add(i, samples) for i in result.intervals)
    warnings = list(result.warnings)
    # The tool's own figure (qperf's, iperf 2's TCP RTT) measures something else: kept
    # apart in tool_latency, never mixed into the probes' phases.
    own = result.latency if result.latency is not None else result.tool_latency
    bad = ", ".join(f"{count} {why}" for why, count in log.bad)
    if bad:
        warnings.append(f"latency probes ignored as bad: {bad}")
    summary = attrs.evolve(latency.summarize(log), test_start_s=round(live.zero_s, 4))
    return attrs.evolve(result, latency=summary, tool_latency=own, intervals=intervals,
                        warnings=tuple(warnings))


def pause(prober: Prober, seconds: float) -> None:
    """Let the probes run ``seconds`` more (an idle phase)."""
    end = prober.now_s() + seconds
    while prober.now_s() < end:
        time.sleep(min(0.05, max(0.0, end - prober.now_s())))
