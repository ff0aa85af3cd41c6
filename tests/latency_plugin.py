"""A latency-only tool plugin, as a user writes one from docs/plugins.md: round trips of
UDP echoes to an echo server of its own on loopback (pure Python), no throughput figure,
no TCP or UDP test traffic a spec's protocol could choose. tests/test_plugin_measures.py
runs the conformance kit on it, and on broken copies of it."""
from __future__ import annotations

import math
import socket
import statistics
import threading
import time
from typing import ClassVar

from netprobe.errors import TestInterrupted
from netprobe.plugin import Availability, Capabilities, Reporter, Tool, utc_now_iso
from netprobe.schema import Endpoint, Latency, Result, TestSpec, ToolInfo

PROBE_GAP_S = 0.02
"""Time between probes."""
ANSWER_WAIT_S = 0.2
"""How long a probe waits for its echo before it counts as lost."""


class EchoServer:
    """A UDP echo on 127.0.0.1, on a port of its own, in a thread stopped on leaving."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = int(self.sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():  # ends within 0.1 s of stop
            try:
                data, peer = self.sock.recvfrom(2048)
            except socket.timeout:
                continue
            except OSError:
                return
            self.sock.sendto(data, peer)

    def __enter__(self) -> EchoServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self.sock.close()


def percentile(ordered: list[float], share: float) -> float:
    """Nearest-rank percentile of sorted samples."""
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


class EchoLatency(Tool):
    """Round trips of UDP echoes on loopback: latency only."""

    name = "echolatency"
    description = "UDP echo round trips on loopback (a latency-only test plugin)"
    measures: ClassVar[frozenset[str]] = frozenset({"latency"})
    capabilities = Capabilities(protocols=frozenset(), min_interval_s=None, port=False)

    def probe(self) -> Availability:
        return Availability(True, version="1")

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        self.check(spec)
        started = utc_now_iso()
        rtts: list[float] = []
        sent = 0
        try:
            with EchoServer() as echo, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as me:
                me.settimeout(ANSWER_WAIT_S)
                reporter.note(f"echo server on port {echo.port}")
                end = time.monotonic() + (spec.duration_s or 1.0)
                while time.monotonic() < end:  # bounded by the duration
                    sent += 1
                    rtt = self.one_probe(me, echo.port, sent)
                    if rtt is not None:
                        rtts.append(rtt)
                    time.sleep(PROBE_GAP_S)
        except KeyboardInterrupt:
            raise TestInterrupted("echolatency interrupted",
                                  self.result(spec, started, rtts, sent, "interrupted")) from None
        return self.result(spec, started, rtts, sent, "ok")

    @staticmethod
    def one_probe(me: socket.socket, port: int, number: int) -> float | None:
        """Round trip of one echo in microseconds (None: lost)."""
        payload = number.to_bytes(8, "big")
        began = time.perf_counter()
        me.sendto(payload, ("127.0.0.1", port))
        try:
            while True:  # stale answers are skipped; the socket timeout bounds each wait
                data = me.recv(64)
                if data == payload:
                    return (time.perf_counter() - began) * 1e6
        except socket.timeout:
            return None

    def result(self, spec: TestSpec, started: str, rtts: list[float], sent: int,
               status: str) -> Result:
        return Result(tool=ToolInfo(self.name, version="1"), spec=spec, start_time=started,
                      local=Endpoint("client"), remote=Endpoint("server", address="127.0.0.1"),
                      status=status, duration_s=spec.duration_s if status == "ok" else None,
                      latency=self.summary(rtts, sent))

    def summary(self, rtts: list[float], sent: int) -> Latency:
        ordered = sorted(rtts)
        lost = sent - len(rtts)
        if not ordered:
            return Latency(count=0, lost=lost, measured_by=self.name)
        return Latency(count=len(ordered), min_us=ordered[0], mean_us=statistics.fmean(ordered),
                       p50_us=percentile(ordered, 0.5), p90_us=percentile(ordered, 0.9),
                       p99_us=percentile(ordered, 0.99), max_us=ordered[-1], lost=lost,
                       lost_percent=100.0 * lost / sent, measured_by=self.name,
                       metric="round_trip")
