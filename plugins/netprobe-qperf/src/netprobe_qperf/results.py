"""From qperf's figures to netprobe's result records (see the mapping in ``tool.py``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

from netprobe.plugin import bits_per_second
from netprobe.schema import (
    Cpu,
    CpuUsage,
    Endpoint,
    FlowSummary,
    Latency,
    RawOutput,
    Result,
    SideSummary,
    StreamResult,
    TestSpec,
    ToolInfo,
)

from netprobe_qperf.parse import Output, Report

DIRECTION = "client_to_server"
"""qperf's socket tests always send from the client to the server."""


def bw_test(spec: TestSpec) -> str:
    """The qperf throughput test for ``spec``."""
    return f"{spec.protocol}_bw"


def lat_test(spec: TestSpec) -> str:
    """The qperf latency test for ``spec``."""
    return f"{spec.protocol}_lat"


def size_args(spec: TestSpec, test: str) -> list[str]:
    """``-m``/``-sb`` for ``test``: the length applies to the throughput test only (the
    latency test keeps qperf's 1-byte messages); the socket buffer to both."""
    args = []
    if spec.length_bytes is not None and test.endswith("_bw"):
        args += ["-m", str(spec.length_bytes)]
    if spec.window_bytes is not None:
        args += ["-sb", str(spec.window_bytes)]
    return args


def _int(value: Optional[float]) -> Optional[int]:
    return None if value is None else round(value)


@dataclass
class Figures:
    """The throughput and latency reports of one run, and how to turn them into records."""

    protocol: str
    """``tcp`` or ``udp``."""
    bw: Optional[Report] = None
    """The tcp_bw/udp_bw report."""
    lat: Optional[Report] = None
    """The tcp_lat/udp_lat report."""
    notes: list[str] = field(default_factory=list)
    """qperf's own warnings."""
    derived: bool = False
    """True once a figure had to be derived from qperf's rounded ones."""
    lat_when: str = ""
    """When the latency test ran, for the note that explains the latency figure."""

    @classmethod
    def from_outputs(cls, outputs: Sequence[Output], spec: TestSpec) -> Figures:
        """The figures of ``spec``'s tests among ``outputs``."""
        found = cls(spec.protocol)
        for out in outputs:
            found.bw = found.bw or out.report(bw_test(spec))
            found.lat = found.lat or out.report(lat_test(spec))
            found.notes += [f"qperf: {w}" for w in out.warnings]
        return found

    # -- throughput ---------------------------------------------------------------------

    def _side(self, role: str, with_cpu: bool) -> Optional[SideSummary]:
        """``send``/``recv`` figures as one side's summary; None when qperf gave none."""
        prefix = "send" if role == "sender" else "recv"
        report = self.bw
        if report is None:
            return None
        seconds = report.get(f"{prefix}_real_time") or report.get("time")
        nbytes = _int(report.get(f"{prefix}_bytes"))
        if nbytes is None and seconds:
            nbytes = self._derived_bytes(prefix, seconds)
        if nbytes is None or not seconds:
            return None
        packets = _int(report.get(f"{prefix}_msgs")) if self.protocol == "udp" else None
        lost = self._lost(packets) if role == "receiver" else None
        return SideSummary(
            role=role, start_s=0.0, end_s=seconds, bytes=nbytes,
            bits_per_second=bits_per_second(nbytes, seconds), packets=packets,
            lost_packets=lost[0] if lost else None, lost_percent=lost[1] if lost else None,
            cpu=_host_cpu(report, prefix) if with_cpu else None,
        )

    def _derived_bytes(self, prefix: str, seconds: float) -> Optional[int]:
        """Bytes from qperf's (rounded) bw figure, when it did not print the byte count."""
        assert self.bw is not None
        rate = self.bw.get(f"{prefix}_bw")
        if rate is None and prefix == "recv":
            rate = self.bw.get("bw")  # tcp_bw prints the receiver's rate as "bw"
        if rate is None:
            return None
        self.derived = True
        return round(rate * seconds)

    def _lost(self, received: Optional[int]) -> Optional[tuple[int, float]]:
        """UDP: datagrams the client sent that the server did not receive, and percent."""
        sent = _int(self.bw.get("send_msgs")) if self.bw is not None else None
        if received is None or sent is None or sent <= 0 or received > sent:
            return None
        return sent - received, (sent - received) * 100 / sent

    def summaries(self, sender_cpu: bool, receiver_cpu: bool) -> tuple[FlowSummary, ...]:
        """The one flow qperf measures, client (sender) to server (receiver); CPU only for
        the ends that ran on this machine (qperf reads the CPU of the host it runs on)."""
        sender, receiver = self._side("sender", sender_cpu), self._side("receiver", receiver_cpu)
        if sender is None and receiver is None:
            return ()
        return (FlowSummary(DIRECTION, sender=sender, receiver=receiver),)

    def streams(self) -> tuple[StreamResult, ...]:
        """The same figures as stream 1 (qperf runs one connection), without CPU."""
        sender, receiver = self._side("sender", False), self._side("receiver", False)
        if sender is None and receiver is None:
            return ()
        return (StreamResult(1, DIRECTION, sender=sender, receiver=receiver),)

    def duration_s(self) -> Optional[float]:
        """How long data flowed, as the receiver timed it."""
        if self.bw is None:
            return None
        return self.bw.get("recv_real_time") or self.bw.get("time")

    # -- latency ------------------------------------------------------------------------

    def latency(self) -> Optional[Latency]:
        """Round trips: twice qperf's one-way mean; qperf gives no distribution. None when
        qperf printed no latency, or no time or message count to say how many."""
        report = self.lat
        one_way = report.get("latency") if report is not None else None
        if report is None or one_way is None or one_way <= 0:
            return None
        count = _int(report.get("loc_recv_msgs"))
        time_s = report.get("loc_real_time") or report.get("time")
        if count is None and time_s:
            count = round(time_s / (2 * one_way))  # how qperf's own figure is made
            self.derived = True
        if count is None:
            return None
        return Latency(count=count, mean_us=2 * one_way * 1e6, measured_by="qperf")

    def warnings(self) -> list[str]:
        """What a reader of the result should know about these figures."""
        found = list(self.notes)
        latency = self.latency()
        if self.derived:
            found.append("figures derived from qperf's rounded ones (qperf -vv -uu -e 12 "
                         "prints exact byte and message counts)")
        if self.bw is not None and self.bw.figures and not self.summaries(False, False):
            found.append(f"{self.bw.test}: qperf printed no byte count or time: no summary "
                         f"(figures printed: {_listed(self.bw)})")
        if self.lat is not None and self.lat.figures and latency is None:
            found.append(f"{self.lat.test}: qperf printed no message count or time: no latency "
                         f"record (figures printed: {_listed(self.lat)})")
        if self.lat is not None and latency is not None:
            found.append(self._latency_note())
        return found

    def _latency_note(self) -> str:
        assert self.lat is not None
        size = _int(self.lat.get("msg_size"))
        what = f"{self.lat.test}, {size}-byte messages" if size else self.lat.test
        return (f"latency: mean round trip ({what}{self.lat_when}) = 2 x qperf's one-way "
                "figure; qperf reports no distribution, so min, percentiles and max are unknown")


def _listed(report: Report) -> str:
    return ", ".join(f"{name} {value:g}" for name, value in report.figures.items())


def _host_cpu(report: Report, prefix: str) -> Optional[Cpu]:
    """qperf's CPU figures come from /proc/stat: the whole host, in percent of one CPU."""
    used = report.get(f"{prefix}_cpus_used")
    cores = os.cpu_count() or 0
    if used is None or cores <= 0:
        return None
    user, kernel = report.get(f"{prefix}_cpus_user"), report.get(f"{prefix}_cpus_kernel")
    host = CpuUsage(
        user_percent=None if user is None else user / cores,
        system_percent=None if kernel is None else kernel / cores,
        total_percent=used / cores,
    )
    return Cpu(host=host)


def from_saved(name: str, text: str, out: Output) -> Result:
    """A Result from one saved qperf client output (spec reconstructed from it)."""
    bw = next((r for r in out.reports if r.test.endswith("_bw")), None)
    lat = next((r for r in out.reports if r.test.endswith("_lat")), None)
    first = bw or lat or out.reports[0]
    spec = TestSpec(tool="qperf", protocol=first.test.split("_")[0],
                    duration_s=float(round(first.get("time") or 2)), interval_s=None,
                    length_bytes=_int(bw.get("msg_size")) if bw else None)
    figures = Figures(spec.protocol, bw=bw, lat=lat, notes=[f"qperf: {w}" for w in out.warnings])
    summaries = figures.summaries(False, False)  # first: it notes derived figures
    warnings = ["test options reconstructed from the output; the host is not in it",
                "CPU figures left out: the saved output does not say which host ran which end",
                *figures.warnings()]
    return Result(
        tool=ToolInfo(name="qperf"), spec=spec, start_time=None,
        local=Endpoint(role="client"), remote=Endpoint(role="server"),
        status="failed" if out.errors else "ok", duration_s=figures.duration_s(),
        summaries=summaries, streams=figures.streams(), latency=figures.latency(),
        warnings=tuple(warnings), errors=tuple(out.errors), raw=(RawOutput(name=name, text=text),),
    )
