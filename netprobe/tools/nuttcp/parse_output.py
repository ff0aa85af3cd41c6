"""Pure parsers for nuttcp output (6.x and 8.x), and its mapping into the result schema.

nuttcp prints everything on the client, the server's half included (servers print nothing).
Four shapes are understood, line by line, so the same code reads a live run and a saved file:

- ``-fparse`` key=value: interval lines use ``real_sec``, summary lines ``real_seconds``;
- plain brief lines: ``596.0625 MB / 5.00 sec = 1000.0045 Mbps 87 %TX 5 %RX 0 retrans ...``;
- ``-v`` lines prefixed ``nuttcp-t:`` (transmitter) and ``nuttcp-r:`` (receiver), in both
  the ``-fparse`` and the plain form: each side's own totals, CPU and socket settings.

Units as nuttcp prints them: ``MB`` is 2**20 bytes, ``KB`` 1024 bytes, ``Mbps`` 10**6 bit/s.
nuttcp 6.x always prints ``0 retrans`` (it cannot count them) and has no cwnd, so its
retransmits are reported as unknown (None), not 0.

Which end measured what (nuttcp 8.2.2's source and real runs, normal and ``-r``): the
interval lines are printed by the receiver, timed by it, over the bytes it read (the
server's reach the client over the control connection; servers print nothing of their
own); their ``retrans``/``cwnd`` are the sender's counters, which the sender writes into
its data buffers and the receiver reads back, with one stream only. With ``-N`` the
per-stream retransmits and cwnd are only in the sender's ``-v`` totals
(``retrans_by_stream=113+125``, plain ``retrans = 243 ( 103+140 )``); per-stream bytes are
never printed, but nuttcp's sender writes one buffer to each stream in turn, in one loop,
so each stream's share of the total follows from it (:func:`stream_bytes`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

import attrs

from netprobe import reporting
from netprobe.schema import (
    Cpu,
    CpuUsage,
    FlowSummary,
    Interval,
    SideSummary,
    SocketInfo,
    StreamResult,
)
from netprobe.tools import _bounded
from netprobe.tools._bounded import Text

MIB = 1 << 20
"""nuttcp's MB."""
KIB = 1 << 10
"""nuttcp's KB (window sizes, cwnd)."""

_SIDE_ROLE = {"t": "sender", "r": "receiver"}
_NUM = r"(\d+(?:\.\d+)?)"


@dataclass
class SideReport:
    """What one side printed with ``-v``: ``nuttcp-t`` (sender) or ``nuttcp-r`` (receiver)."""

    role: str
    version: str | None = None
    megabytes: float | None = None
    seconds: float | None = None
    mbps: float | None = None
    retransmits: int | None = None
    retrans_by_stream: list[int] | None = None
    """``-N``: each stream's retransmits, stream 1 first (nuttcp 7+, TCP, ``-v`` only)."""
    cwnd_kb: int | None = None
    cwnd_by_stream: list[int] | None = None
    """``-N``: each stream's last cwnd in KB, stream 1 first."""
    rtt_ms: float | None = None
    mss: int | None = None
    send_window: int | None = None
    receive_window: int | None = None
    cpu_percent: float | None = None
    cpu_seconds: float | None = None
    drop: int | None = None
    pkt: int | None = None
    loss_percent: float | None = None
    buflen: int | None = None
    nbuf: int | None = None
    nstream: int | None = None
    port: int | None = None
    mode: str | None = None
    host: str | None = None
    time_limit: float | None = None
    interval_s: float | None = None


@dataclass
class Sample:
    """One brief line: an interval report, or the final summary (``summary=True``)."""

    megabytes: float
    seconds: float
    mbps: float
    summary: bool = False
    retransmits: int | None = None
    cwnd_kb: int | None = None
    rtt_ms: float | None = None
    tx_cpu: float | None = None
    rx_cpu: float | None = None
    drop: int | None = None
    pkt: int | None = None
    loss_percent: float | None = None


@dataclass
class NuttcpOutput:
    """Everything read from one nuttcp client output so far."""

    sides: dict[str, SideReport] = field(default_factory=dict)
    """``t`` and ``r`` sides, as printed with ``-v``."""
    first_side: str | None = None
    """The side printed first: the client's own (``r`` means the client received)."""
    intervals: list[Sample] = field(default_factory=list)
    """Interval lines, the first :data:`netprobe.reporting.MAX_INTERVALS_KEPT` of them."""
    intervals_not_kept: int = 0
    """Interval lines read past the limit, counted and not kept (bounded memory)."""
    brief: Sample | None = None
    """The brief summary line (printed without ``-v``)."""
    errors: list[str] = field(default_factory=list)
    """Error messages the tool printed, as printed."""
    usage_printed: bool = False
    """nuttcp printed its usage text: it rejected its arguments."""
    unknown: list[int] = field(default_factory=list)
    """Line numbers of lines that were not understood."""
    recognized: int = 0
    """Lines understood."""
    last_line: int = 0

    @property
    def version(self) -> str | None:
        """The nuttcp version, as printed in ``-v`` output."""
        for side in self.sides.values():
            if side.version:
                return side.version
        return None

    @property
    def has_summary(self) -> bool:
        """True once a final figure has been read (brief line or a side's totals)."""
        return self.brief is not None or any(
            side.megabytes is not None and side.seconds is not None for side in self.sides.values()
        )


# --- line parsing ---------------------------------------------------------------------

_PREFIX = re.compile(r"^nuttcp-([tr]):\s?(.*)$")
_KV = re.compile(r"([A-Za-z_]+)=(\"[^\"]*\"|\S+)")
_BRIEF = re.compile(rf"^{_NUM} MB /\s*{_NUM} sec =\s*{_NUM} Mbps(.*)$")
_BRIEF_FIELDS: list[tuple[str, re.Pattern[str]]] = [
    ("tx_cpu", re.compile(rf"{_NUM} %TX")),
    ("rx_cpu", re.compile(rf"{_NUM} %RX")),
    ("retransmits", re.compile(r"(\d+) retrans")),
    ("cwnd_kb", re.compile(r"(\d+) KB-cwnd")),
    ("rtt_ms", re.compile(rf"{_NUM} msRTT")),
    ("drop_pkt", re.compile(r"(\d+) /\s*(\d+) ~?drop/pkt")),
    ("loss_percent", re.compile(rf"{_NUM} ~?%loss")),
]
_ERROR_TEXT = re.compile(
    r"(error|failed|bad hostname|refused|not supported|only supported|unknown|invalid)", re.I
)


class NuttcpParser:
    """Reads nuttcp output one line at a time (live or from a file) into :class:`NuttcpOutput`."""

    def __init__(self) -> None:
        self.out = NuttcpOutput()

    def feed(self, line: str) -> Sample | None:
        """Read one line; return the interval sample if the line was one."""
        self.out.last_line += 1
        text = line.strip()
        if not text:
            return None
        prefixed = _PREFIX.match(text)
        if prefixed:
            ok = self._side_line(prefixed.group(1), prefixed.group(2).strip())
            sample = None
        else:
            sample = self._bare_line(text)
            ok = sample is not None or self._message_line(text)
        if ok:
            self.out.recognized += 1
        else:
            self.out.unknown.append(self.out.last_line)
        return sample if sample is not None and not sample.summary else None

    # -- lines without a side prefix: brief samples, error messages ---------------------

    def _bare_line(self, text: str) -> Sample | None:
        sample = _parse_kv_sample(text) if "megabytes=" in text else _parse_brief(text)
        if sample is None:
            return None
        if sample.summary:
            self.out.brief = sample
        elif len(self.out.intervals) < reporting.MAX_INTERVALS_KEPT:
            self.out.intervals.append(sample)
        else:
            self.out.intervals_not_kept += 1
        return sample

    def _message_line(self, text: str) -> bool:
        if text.startswith("Usage") or self.out.usage_printed:
            self.out.usage_printed = True  # the usage text, all of it, means "bad arguments"
            return True
        if re.match(r"^nuttcp-\d+(?:\.\d+)+$", text):
            return True  # the -V answer
        if re.match(r"^errno=\d+$", text) or _ERROR_TEXT.search(text):
            if text not in self.out.errors:
                self.out.errors.append(text)
            return True
        return False

    # -- nuttcp-t: / nuttcp-r: lines ---------------------------------------------------

    def _side_line(self, letter: str, rest: str) -> bool:
        side = self.out.sides.get(letter)
        if side is None:
            side = self.out.sides[letter] = SideReport(role=_SIDE_ROLE[letter])
            if self.out.first_side is None:
                self.out.first_side = letter
        if "Error" in rest:
            message = f"nuttcp-{letter}: {rest}"
            if message not in self.out.errors:
                self.out.errors.append(message)
            return True
        version = re.match(r"^v(\d+(?:\.\d+)*):\s*(.*)$", rest)
        if version:
            side.version = version.group(1)
            return True
        if rest.startswith("Info"):
            return True
        if _apply_plain(side, rest):  # first: "buflen=65536, nstream=2, ..." is plain too
            return True
        return bool(re.match(r"^[A-Za-z_]+=", rest)) and _apply_kv(side, dict(_KV.findall(rest)))


def _num(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value.rstrip("%"))
    except ValueError:
        return None


def _int(value: str | None) -> int | None:
    number = _num(value)  # "nan", or digits past a float's range ("inf"): unknown
    return None if number is None or not math.isfinite(number) else int(number)


def _parse_kv_sample(text: str) -> Sample | None:
    kv = dict(_KV.findall(text))
    megabytes = _num(kv.get("megabytes"))
    seconds = _num(kv.get("real_seconds", kv.get("real_sec")))
    mbps = _num(kv.get("rate_Mbps"))
    if megabytes is None or seconds is None or mbps is None:
        return None
    return Sample(
        megabytes=megabytes,
        seconds=seconds,
        mbps=mbps,
        summary="real_seconds" in kv,
        retransmits=_int(kv.get("retrans")),
        cwnd_kb=_int(kv.get("cwnd")),
        rtt_ms=_num(kv.get("rtt_ms")),
        tx_cpu=_num(kv.get("tx_cpu")),
        rx_cpu=_num(kv.get("rx_cpu")),
        drop=_int(kv.get("drop")),
        pkt=_int(kv.get("pkt")),
        loss_percent=_num(kv.get("data_loss")),
    )


def _parse_brief(text: str) -> Sample | None:
    match = _BRIEF.match(text)
    if not match:
        return None
    # -frunningtotal and -fxmitstats append "Tot: ..." / "Trans: ...": not this sample's.
    rest = re.split(r"\s(?:Tot|Trans):", match.group(4))[0]
    sample = Sample(float(match.group(1)), float(match.group(2)), float(match.group(3)))
    sample.summary = "%TX" in rest
    for name, pattern in _BRIEF_FIELDS:
        found = pattern.search(rest)
        if not found:
            continue
        if name == "drop_pkt":
            sample.drop, sample.pkt = int(found.group(1)), int(found.group(2))
        elif name in ("retransmits", "cwnd_kb"):
            setattr(sample, name, int(found.group(1)))
        else:
            setattr(sample, name, float(found.group(1)))
    return sample


def _apply_kv(side: SideReport, kv: dict[str, str]) -> bool:
    """Apply one ``-fparse -v`` line; False if none of its keys is known."""
    known = False
    for key, value in kv.items():
        setter = _KV_SETTERS.get(key)
        if setter is not None:
            setter(side, value.strip('"'), kv)
            known = True
    return known or bool(set(kv) & _KV_IGNORED)


def _set(name: str, conv: Callable[[str | None], object]) -> Callable[..., None]:
    def setter(side: SideReport, value: str, _kv: dict[str, str]) -> None:
        setattr(side, name, conv(value))

    return setter


def _plus_list(value: str | None) -> list[int] | None:
    """``113+125`` (``-fparse``) or `` 103+140 `` (plain): one number per stream."""
    parts = (value or "").strip().split("+")
    return [int(part) for part in parts] if all(part.isdigit() for part in parts) else None


def _set_megabytes(side: SideReport, value: str, kv: dict[str, str]) -> None:
    # "megabytes=... cpu_seconds=..." repeats the total on a CPU line: keep the first one.
    if "real_seconds" in kv or side.megabytes is None:
        side.megabytes = _num(value)


def _set_cpu(side: SideReport, value: str, kv: dict[str, str]) -> None:
    side.cpu_percent = _num(value)
    user, system = _num(kv.get("user")), _num(kv.get("system"))
    if user is not None and system is not None:
        side.cpu_seconds = round(user + system, 3)


_KV_SETTERS: dict[str, Callable[[SideReport, str, dict[str, str]], None]] = {
    "megabytes": _set_megabytes,
    "real_seconds": _set("seconds", _num),
    "rate_Mbps": _set("mbps", _num),
    "retrans": _set("retransmits", _int),
    "retrans_by_stream": _set("retrans_by_stream", _plus_list),
    "cwnd": _set("cwnd_kb", _int),
    "cwnd_by_stream": _set("cwnd_by_stream", _plus_list),
    "rtt_ms": _set("rtt_ms", _num),
    "mss": _set("mss", _int),
    "send_window_size": _set("send_window", _int),
    "receive_window_size": _set("receive_window", _int),
    "cpu": _set_cpu,
    "drop": _set("drop", _int),
    "pkt": _set("pkt", _int),
    "data_loss": _set("loss_percent", _num),
    "buflen": _set("buflen", _int),
    "nbuf": _set("nbuf", _int),
    "nstream": _set("nstream", _int),
    "port": _set("port", _int),
    "mode": _set("mode", str),
    "host": _set("host", str),
    "time_limit": _set("time_limit", _num),
    "reporting_interval": _set("interval_s", _num),
}
_KV_IGNORED = {
    "send_window_avail", "io_calls", "rate_limit", "accept", "connect", "cpu_seconds",
    "initial_congestion_window", "initial_congestion_window_kb", "nodelay",
}  # fmt: skip


_PLAIN: list[tuple[re.Pattern[str], tuple[tuple[str, Callable[[str], object]], ...]]] = [
    (
        re.compile(rf"^{_NUM} MB in {_NUM} real seconds = {_NUM} KB/sec = {_NUM} Mbps"),
        (("megabytes", float), ("seconds", float), ("", str), ("mbps", float)),
    ),
    (
        re.compile(r"^retrans = (\d+)(?: \(([\d+ ]+)\))?(?: cwnd = (\d+) KB(?: \(([\d+ ]+)\))?)?"),
        (
            ("retransmits", int),
            ("retrans_by_stream", _plus_list),
            ("cwnd_kb", int),
            ("cwnd_by_stream", _plus_list),
        ),
    ),
    (
        re.compile(rf"^connect to (\S+) with mss=(\d+), RTT={_NUM} ms"),
        (("", str), ("mss", int), ("rtt_ms", float)),
    ),
    (
        re.compile(r"^send window size = (\d+), receive window size = (\d+)"),
        (("send_window", int), ("receive_window", int)),
    ),
    (
        re.compile(rf"^(\d+) / (\d+) drop/pkt {_NUM}% data loss"),
        (("drop", int), ("pkt", int), ("loss_percent", float)),
    ),
    (
        re.compile(
            r"^buflen=(\d+),(?: nbuf=(\d+),)? nstream=(\d+), port=(\d+) (tcp|udp)"
            r"(?: -> (\S+))?"
        ),
        (
            ("buflen", int),
            ("nbuf", int),
            ("nstream", int),
            ("port", int),
            ("mode", str),
            ("host", str),
        ),
    ),
    (re.compile(rf"^time limit = {_NUM} seconds?"), (("time_limit", float),)),
    (re.compile(rf"^interval reporting every {_NUM} seconds?"), (("interval_s", float),)),
]
_PLAIN_IGNORED = re.compile(
    r"^(available send window|accept from|rate limit =|initial congestion window|"
    r"\d+ I/O calls|[\d.]+ MB in [\d.]+ CPU seconds|nodelay)"
)
_PLAIN_CPU = re.compile(rf"^{_NUM}user {_NUM}sys \S+real (\d+)%")


def _apply_plain(side: SideReport, rest: str) -> bool:
    """Apply one plain ``-v`` line; False if it is not a known one."""
    cpu = _PLAIN_CPU.match(rest)
    if cpu:
        side.cpu_seconds = round(float(cpu.group(1)) + float(cpu.group(2)), 3)
        side.cpu_percent = float(cpu.group(3))
        return True
    for pattern, fields in _PLAIN:
        match = pattern.match(rest)
        if not match:
            continue
        for (name, conv), value in zip(fields, match.groups()):
            if name and value is not None:
                setattr(side, name, conv(value))
        return True
    return bool(_PLAIN_IGNORED.match(rest))


# --- mapping into the schema --------------------------------------------------------


def version_major(version: str | None) -> int | None:
    """The major number of a version string like ``6.1.2`` (None if unknown)."""
    if not version:
        return None
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def counts_retransmits(out: NuttcpOutput) -> bool:
    """True when this nuttcp really counts retransmits (7.x and later; 6.x always says 0).

    Without a version in the output, a reported cwnd (which only 8.x prints) tells."""
    major = version_major(out.version)
    if major is not None:
        return major >= 7
    cwnd_seen = [s.cwnd_kb for s in out.sides.values()] + [s.cwnd_kb for s in out.intervals]
    if out.brief is not None:
        cwnd_seen.append(out.brief.cwnd_kb)
    return any(value is not None for value in cwnd_seen)


def sample_bytes(megabytes: float) -> int:
    """Bytes from nuttcp's MB figure (printed to 4 decimals: +-52 bytes)."""
    return round(megabytes * MIB)


PRINTED_SECONDS_STEP = 0.01
"""nuttcp prints its times to 2 decimals."""


def exact_seconds(megabytes: float, seconds: float, mbps: float) -> float:
    """A totals line's time to more than the 2 decimals nuttcp prints.

    nuttcp reckons its rate from its exact elapsed time, so MB / rate gives that time back
    (rate and MB are printed to 4 decimals). A test stopped after 0.39 s is 0.3945 s: the
    printed time alone is 1.1% off its own bytes and rate. The derived time is taken only
    where it rounds to the printed one; otherwise the printed figure stands as it is."""
    if megabytes <= 0 or mbps <= 0:
        return seconds
    derived = megabytes * MIB * 8 / (mbps * 1e6)
    slack = PRINTED_SECONDS_STEP / 2 + derived * 1e-4  # the rate's own last digit
    return round(derived, 6) if abs(derived - seconds) <= slack else seconds


def to_interval(sample: Sample, start_s: float, direction: str, retrans_ok: bool) -> Interval:
    """One interval line as a receiver Interval: its bytes and time are the receiver's;
    its retransmits and cwnd the sender's, as carried in the data (:data:`INTERVAL_NOTE`)."""
    received = None if sample.pkt is None or sample.drop is None else sample.pkt - sample.drop
    return Interval(
        direction=direction,
        role="receiver",
        stream_id=None,
        start_s=round(start_s, 6),
        end_s=round(start_s + sample.seconds, 6),
        bytes=sample_bytes(sample.megabytes),
        bits_per_second=sample.mbps * 1e6,
        retransmits=sample.retransmits if retrans_ok else None,
        cwnd_bytes=None if sample.cwnd_kb is None else sample.cwnd_kb * KIB,
        packets=received,
        lost_packets=sample.drop,
    )


def intervals(
    out: NuttcpOutput, direction: str, end_s: float | None = None,
    totals: FlowSummary | None = None,
) -> tuple[Interval, ...]:
    """All interval lines read, timed by adding up their lengths from 0, and the tail.

    Zero-byte reports that start at or after ``end_s`` (a UDP receiver keeps reporting
    until it sees the end of the test) are dropped. nuttcp prints no line for the last,
    partial interval: its tail is what ``totals`` (the summary) holds beyond the lines."""
    found: list[Interval] = []
    start = 0.0
    retrans_ok = counts_retransmits(out)
    for sample in out.intervals:
        item = to_interval(sample, start, direction, retrans_ok)
        start = item.end_s
        if end_s is not None and item.bytes == 0 and item.start_s >= end_s - 1e-6:
            continue
        found.append(item)
    return tuple(with_tail(found, totals))


_TAIL_MIN_S = 0.01  # nuttcp prints seconds to 2 decimals: a shorter tail is rounding


def with_tail(found: Sequence[Interval], totals: FlowSummary | None) -> list[Interval]:
    """The lines and what nuttcp left out at the end (the summary minus the lines' sums):
    its own interval, or, when it is shorter than the 2-decimal rounding of nuttcp's
    times, added to the last line's (so the intervals always add up to the summary).

    A figure no line carries (retransmits with -N, where nuttcp's lines have none) stays
    unknown in the tail too: the summary's total is not all the last moment's."""
    found = list(found)
    receiver = totals.receiver if totals is not None else None
    if not found or receiver is None:
        return found
    last, sender = found[-1], totals.sender if totals is not None else None
    more_bytes = receiver.bytes - sum(i.bytes for i in found)
    rest: dict[str, Any] = {
        "retransmits": _rest(sender.retransmits if sender else None,
                             [i.retransmits for i in found]),
        "packets": _rest(receiver.packets, [i.packets for i in found]),
        "lost_packets": _rest(receiver.lost_packets, [i.lost_packets for i in found]),
    }
    if more_bytes <= 0 and not rest["retransmits"]:
        return found
    start, end = last.end_s, round(receiver.end_s, 6)
    if end - start >= _TAIL_MIN_S:
        nbytes = max(0, more_bytes)
        tail = attrs.evolve(last, start_s=start, end_s=end, bytes=nbytes,
                            bits_per_second=nbytes * 8 / (end - start), cwnd_bytes=None,
                            **rest)
        return [*found, tail]
    nbytes = last.bytes + max(0, more_bytes)
    merged = {k: (getattr(last, k) or 0) + v for k, v in rest.items() if v is not None}
    span = last.end_s - last.start_s
    return [*found[:-1], attrs.evolve(last, bytes=nbytes, **merged,
                                      bits_per_second=nbytes * 8 / span if span else 0.0)]


def _rest(total: int | None, parts: list[int | None]) -> int | None:
    """What ``total`` holds beyond ``parts``; None when no part is known (the lines do not
    carry this figure) or the total is unknown."""
    if total is None or all(part is None for part in parts):
        return None
    return max(0, total - sum(part or 0 for part in parts))


INTERVAL_NOTE = (
    "nuttcp's interval lines are the receiver's count, taken where the data arrives (on "
    "the server, or here with --reverse); their retransmits and cwnd are the sender's, "
    "carried to the receiver in the data (one stream only)"
)
"""Which end measured what on a nuttcp interval line (said in every Result that has them)."""


def _process_cpu(percent: float | None, seconds: float | None = None) -> Cpu | None:
    if percent is None and seconds is None:
        return None
    return Cpu(process=CpuUsage(total_percent=percent, cpu_seconds=seconds))


def side_summary(side: SideReport, retrans_ok: bool, with_cpu: bool = True) -> SideSummary | None:
    """One side's totals (None until its totals line has been read)."""
    if side.megabytes is None or side.seconds is None or side.mbps is None:
        return None
    sender = side.role == "sender"
    received = None if side.pkt is None or side.drop is None else side.pkt - side.drop
    retrans = side.retransmits if sender and retrans_ok else None
    return SideSummary(
        role=side.role,
        start_s=0.0,
        end_s=exact_seconds(side.megabytes, side.seconds, side.mbps),
        bytes=sample_bytes(side.megabytes),
        bits_per_second=side.mbps * 1e6,
        retransmits=retrans,
        retransmits_scope="connection" if retrans is not None else None,
        # nuttcp measures its RTT once, at connect, on the idle connection: a floor of the
        # path's RTT, not the loaded mean rtt_us stands for (35 us where the loaded link's
        # smoothed RTT was 3 ms)
        min_rtt_us=None if side.rtt_ms is None or not sender else round(side.rtt_ms * 1000),
        cwnd_bytes=None if side.cwnd_kb is None or not sender else side.cwnd_kb * KIB,
        packets=received,
        lost_packets=side.drop,
        lost_percent=side.loss_percent,
        call_length_bytes=call_length(side),
        cpu=_process_cpu(side.cpu_percent, side.cpu_seconds) if with_cpu else None,
    )


def call_length(side: SideReport | None) -> int | None:
    """What the side's loop asked of each write() or read(): its own ``buflen`` (each end
    prints its own; over UDP it is the datagram's length, which the spec says)."""
    if side is None or side.mode != "tcp" or not side.buflen or side.buflen <= 0:
        return None
    return side.buflen


def brief_summaries(
    brief: Sample, protocol: str, retrans_ok: bool
) -> tuple[SideSummary | None, SideSummary]:
    """Sender and receiver totals from a brief summary line.

    The brief line is the receiver's count. For TCP everything sent was received, so the
    sender total is the same figure; for UDP the sender's own total is not printed."""
    received = None if brief.pkt is None or brief.drop is None else brief.pkt - brief.drop
    receiver = SideSummary(
        role="receiver",
        start_s=0.0,
        end_s=brief.seconds,
        bytes=sample_bytes(brief.megabytes),
        bits_per_second=brief.mbps * 1e6,
        packets=received,
        lost_packets=brief.drop,
        lost_percent=brief.loss_percent,
        cpu=_process_cpu(brief.rx_cpu),
    )
    if protocol == "udp":
        return None, receiver
    retrans = brief.retransmits if retrans_ok else None
    sender = SideSummary(
        role="sender",
        start_s=0.0,
        end_s=brief.seconds,
        bytes=receiver.bytes,
        bits_per_second=receiver.bits_per_second,
        retransmits=retrans,
        retransmits_scope="connection" if retrans is not None else None,
        min_rtt_us=None if brief.rtt_ms is None else round(brief.rtt_ms * 1000),  # idle
        cwnd_bytes=None if brief.cwnd_kb is None else brief.cwnd_kb * KIB,
        cpu=_process_cpu(brief.tx_cpu),
    )
    return sender, receiver


def flows(
    out: NuttcpOutput, direction: str, protocol: str, streams: int
) -> tuple[tuple[FlowSummary, ...], tuple[StreamResult, ...], list[str]]:
    """Summed figures, per-stream figures (one stream only: nuttcp sums -N streams) and
    warnings about what the output could not say."""
    warnings: list[str] = []
    retrans_ok = counts_retransmits(out)
    sender = receiver = None
    tx, rx = out.sides.get("t"), out.sides.get("r")
    if tx is not None or rx is not None:
        sender = side_summary(tx, retrans_ok) if tx else None
        receiver = side_summary(rx, retrans_ok) if rx else None
    if sender is None and receiver is None and out.brief is not None:
        sender, receiver = brief_summaries(out.brief, protocol, retrans_ok)
        if protocol == "tcp":
            warnings.append(
                "nuttcp brief output prints one total (the receiver's); for TCP the sender "
                "total is taken to be the same"
            )
    if sender is None and receiver is None:
        return (), (), warnings
    if protocol == "tcp" and not retrans_ok:
        warnings.append("this nuttcp (6.x) cannot count retransmits: left unknown")
    flow = FlowSummary(direction=direction, sender=sender, receiver=receiver)
    tx = out.sides.get("t")
    count = (tx.nstream if tx is not None else None) or streams
    if count == 1:
        return (flow,), _single_stream(out, direction, retrans_ok), warnings
    per_stream = _streams(tx, direction, retrans_ok, count)
    warnings.append(STREAMS_NOTE if per_stream else
                    "nuttcp prints per-stream figures only with -v: no per-stream records")
    return (flow,), per_stream, warnings


STREAMS_NOTE = (
    "nuttcp prints no per-stream bytes: each stream's are its share of the sender's total "
    "as nuttcp writes it (a buffer to each stream in turn); per-stream retransmits and "
    "cwnd are as nuttcp printed them"
)
"""How nuttcp's per-stream records were made (said in every Result that has them)."""


def stream_bytes(total: int, buflen: int, streams: int) -> list[int]:
    """Each stream's share of ``total``, as nuttcp's sender writes: whole buffers to stream
    1, 2, ..., N, 1, ... in turn in one loop (no stream's writes run ahead of another's), and the
    write the end of the test cut short counts its part, on the stream that was next."""
    full, part = divmod(total, buflen)
    shares = [(full // streams + (index < full % streams)) * buflen for index in range(streams)]
    shares[full % streams] += part
    return shares


def _streams(
    tx: SideReport | None, direction: str, retrans_ok: bool, count: int
) -> tuple[StreamResult, ...]:
    """One record per stream from the sender's -v totals (nothing without them)."""
    total = side_summary(tx, retrans_ok, with_cpu=False) if tx is not None else None
    if tx is None or total is None or not tx.buflen or total.end_s <= 0:
        return ()
    by_stream = tx.retrans_by_stream
    if by_stream is None and tx.retransmits == 0:
        # nuttcp leaves retrans_by_stream out when the total is 0 (seen live on loopback,
        # with cwnd_by_stream still printed): none in all is none in each.
        by_stream = [0] * count
    retrans = _per_stream(by_stream if retrans_ok else None, count)
    cwnd = _per_stream(tx.cwnd_by_stream, count)
    socket = _socket(tx)
    found = []
    shares = stream_bytes(total.bytes, tx.buflen, count)
    for index, (share, retransmits, cwnd_kb) in enumerate(zip(shares, retrans, cwnd)):
        sender = SideSummary(
            role="sender", start_s=0.0, end_s=total.end_s, bytes=share,
            bits_per_second=share * 8 / total.end_s, retransmits=retransmits,
            retransmits_scope="connection" if retransmits is not None else None,
            cwnd_bytes=None if cwnd_kb is None else cwnd_kb * KIB,
            call_length_bytes=total.call_length_bytes,
        )
        found.append(StreamResult(index + 1, direction, sender=sender, socket=socket))
    return tuple(found)


def _per_stream(values: list[int] | None, count: int) -> list[int | None]:
    """``values`` when there is one per stream, else unknown for each."""
    if values is None or len(values) != count:
        return [None] * count
    return list(values)


def _socket(tx: SideReport | None) -> SocketInfo | None:
    """The sender's socket settings as printed (once: every stream is set up alike)."""
    if tx is None or not (tx.send_window or tx.receive_window or tx.mss):
        return None
    return SocketInfo(
        send_buffer_bytes=tx.send_window, receive_buffer_bytes=tx.receive_window,
        mss_bytes=tx.mss,
    )


def _single_stream(out: NuttcpOutput, direction: str, retrans_ok: bool) -> tuple[StreamResult, ...]:
    tx, rx = out.sides.get("t"), out.sides.get("r")
    if tx is None and rx is None:
        return ()
    stream = StreamResult(
        stream_id=1,
        direction=direction,
        sender=side_summary(tx, retrans_ok, with_cpu=False) if tx else None,
        receiver=side_summary(rx, retrans_ok, with_cpu=False) if rx else None,
        socket=_socket(tx),
    )
    return (stream,)


def failure_message(out: NuttcpOutput) -> str | None:
    """The tool's own error message, if it printed one."""
    if out.errors:
        return "; ".join(out.errors)
    if out.usage_printed:
        return "nuttcp printed its usage text: it did not accept its arguments"
    return None


def parse_lines(text: Text) -> NuttcpOutput:
    """Parse a whole saved output, a line at a time (a str or a big log's SpooledLog)."""
    parser = NuttcpParser()
    for line in _bounded.lines(text):
        parser.feed(line.rstrip("\r\n"))
    return parser.out
