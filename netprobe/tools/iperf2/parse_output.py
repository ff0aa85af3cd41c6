"""Pure parsers for iperf 2 output: the human report lines (legacy and ``-e`` enhanced,
any ``-f`` unit) and the CSV report (``-y C``: 2.1.x without a header, 2.2 with one).

Whose figures a line holds: an enhanced line says it by its columns (``Write/Err`` ... is
a sender, ``Reads=Dist`` or jitter/loss a receiver); a legacy line is placed by the
process that printed it and the connection's ``(reverse)``/``(full-duplex)`` marks. The
line after ``Server Report:`` on a UDP client is the server's receiver report.

Every transfer id's last line that starts at 0 is its summary; earlier lines are intervals.
Streams are keyed by the initiating end's port, which both processes print, so a client's
and a server's report of the same stream land on the same stream number.
"""

from __future__ import annotations

import datetime
import re
import threading
from collections.abc import Iterable
from typing import Any

import attrs

from netprobe import reporting
from netprobe.driven.figures import Figures
from netprobe.errors import ParseError
from netprobe.schema import Endpoint, FlowSummary, Interval, Latency, SideSummary, StreamResult
from netprobe.tools import _bounded
from netprobe.tools._bounded import SpooledLog, Text
from netprobe.tools._iperf_common import side_directions, side_of, tcp_rtt_latency
from netprobe.units import KIB, binary_factor, si_factor

TOOL = "iperf2"
"""The ``measured_by`` of iperf 2's latency figures."""
C2S = "client_to_server"
S2C = "server_to_client"

_LINE = re.compile(
    r"^\[\s*(?P<star>\*)?(?P<id>\d+|SUM(?:-\d+)?|FD\d+)\]\s+"
    r"(?P<start>\d+(?:\.\d+)?)-\s*(?P<end>\d+(?:\.\d+)?)\s+sec\s+"
    r"(?P<xfer>\d+(?:\.\d+)?)\s+(?P<xunit>[KMGT]?)Bytes?\s+"
    r"(?P<rate>\d+(?:\.\d+)?)\s+(?P<runit>[KMGTkmgt]?)bits?/sec(?P<rest>.*)$"
)
_TCP_TX = re.compile(
    r"^\s+(?P<writes>\d+)/(?P<werr>\d+)\s+(?P<retry>\d+)"
    r"(?:\s+(?:(?P<cwnd>\d+)K|NA)/(?P<rtt>\d+)(?:\((?P<rttvar>\d+)\))?\s+us)?"
)
_BOUNCE = re.compile(
    r"^\s+(?P<count>\d+)=(?P<avg>[\d.]+)/(?P<min>[\d.]+)/(?P<max>[\d.]+)/[\d.]+\s+ms"
    r"\s+(?P<retry>\d+)\s+(?:(?P<cwnd>\d+)K|NA)/(?P<rtt>\d+)\s+us"
)
"""A --bounceback client's columns: ``BB cnt=avg/min/max/stdev`` in ms, retries, cwnd/RTT."""
_TCP_RX = re.compile(r"^\s+(?P<reads>\d+)=\d+(?::\d+)*")
_UDP_RX = re.compile(
    r"^\s+(?P<jitter>\d+(?:\.\d+)?)\s+ms\s+(?P<lost>-?\d+)/\s*(?P<total>-?\d+)\s+\((?P<pct>[^)]*)%\)"
)
_UDP_TX = re.compile(r"^\s+(?P<writes>\d+)/(?P<werr>\d+)\s+(?P<pps>\d+)\s+pps")
_OOO = re.compile(
    r"^\[\s*\*?(?P<id>\d+|SUM)\]\s+(?P<start>[\d.]+)-\s*(?P<end>[\d.]+)\s+sec\s+"
    r"(?P<n>\d+)\s+datagrams received out-of-order"
)
_CONNECTED = re.compile(
    r"^\[\s*\*?(?P<id>\d+)\]\s+local\s+(?P<laddr>\S+?)(?:%\S+)?\s+port\s+(?P<lport>\d+)\s+"
    r"connected with\s+(?P<raddr>\S+)\s+port\s+(?P<rport>\d+)(?P<rest>.*)$"
)
_LISTENING = re.compile(r"Server listening on (?P<proto>TCP|UDP)(?: \(v6\))? port (?P<port>\d+)")
_CONNECTING = re.compile(
    r"Client connecting to (?P<host>[^,]+), (?P<proto>TCP|UDP) port (?P<port>\d+)"
)
_BUFFER = re.compile(r"^(?P<kind>Read|Write) buffer size:\s+(?P<n>\d+) Byte\b")
"""A header's call length, in bytes as -e prints it with -f b and on every client (in
other formats a server's Read is rounded, "128 KByte", so it is not read: unknown)."""
_WHEN = re.compile(r"\bon (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \(UTC\)")

FAILURE_PATTERNS = (
    re.compile(r"(?P<why>(?:tcp |udp )?connect failed: .+)"),
    re.compile(r"(?P<why>read failed: .+)"),
    re.compile(r"(?P<why>unrecognized option .+|invalid option .+)"),
    re.compile(r"WARNING: (?P<why>option .+ (?:is not valid|ignored).*)"),
    re.compile(r"WARNING: (?P<why>unknown report.+)"),
    re.compile(r"WARNING: (?P<why>did not receive ack of last datagram.*)"),
    re.compile(r"ERROR: (?P<why>.+)"),
    re.compile(r"(?P<why>.+: Unknown host)"),
    re.compile(r"(?P<why>failed to find an ip address.+)"),
)
"""iperf 2 exits 0 on most failures: these lines in its output mean the test failed."""

_MAYBE_FAILURE = re.compile("failed|option|WARNING|ERROR|Unknown host")
"""A word every one of FAILURE_PATTERNS holds: one cheap search rules out the common line
(a report) before the patterns, whose leading ``.+`` makes a search slow, are tried."""


def failure_in(line: str) -> str | None:
    """The complaint on ``line`` if it reports a failure (iperf 2 often exits 0 anyway)."""
    if not _MAYBE_FAILURE.search(line):
        return None
    for pattern in FAILURE_PATTERNS:
        found = pattern.search(line)
        if found:
            return found.group("why").strip()
    return None


class StreamKeys:
    """Stream numbers from 1 per direction, shared by the readers of one test's client and
    server output (they run in two threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[tuple[str, str], int] = {}

    def number(self, direction: str, key: str) -> int:
        """The stream number of connection ``key`` in ``direction``."""
        with self._lock:
            if (direction, key) not in self._ids:
                used = sum(1 for d, _ in self._ids if d == direction)
                self._ids[(direction, key)] = used + 1
            return self._ids[(direction, key)]


@attrs.define
class _Record:
    label: str
    direction: str
    role: str
    sample: Interval
    writes: int | None = None
    bounce: Bounces | None = None


@attrs.frozen
class Bounces:
    """What a --bounceback line says of its round trips (microseconds)."""

    count: int
    mean_us: float
    min_us: float
    max_us: float

    @classmethod
    def read(cls, found: re.Match[str]) -> Bounces:
        """From a match of the bounce-back columns (printed in ms)."""
        return cls(int(found["count"]), *(round(float(found[k]) * 1000, 3)
                                          for k in ("avg", "min", "max")))


def _size(value: str, unit: str) -> int:
    return round(float(value) * binary_factor(unit))


def _rate(value: str, unit: str) -> float:
    return float(value) * si_factor(unit)


class _KeptRecords:
    """The report lines a reader keeps: the first :data:`netprobe.reporting.MAX_INTERVALS_KEPT`,
    then only each stream's latest (the final one, once it comes, is its summary), and a
    count of the rest. Read whole, an hour of -i 0.01 took 47x its log in memory."""

    def __init__(self) -> None:
        self.records: list[_Record] = []
        self.latest: dict[tuple[str, str, str], _Record] = {}
        self.not_kept = 0

    def add(self, record: _Record) -> None:
        """Keep ``record``, or hold it as its stream's latest past the limit."""
        if len(self.records) < reporting.MAX_INTERVALS_KEPT:
            self.records.append(record)
            return
        key = (record.label, record.direction, record.role)
        if key in self.latest:
            self.not_kept += 1
        self.latest[key] = record

    def all(self) -> list[_Record]:
        """What was kept, in order: the first records, then each stream's latest."""
        return [*self.records, *self.latest.values()]

    def warn(self, parts: Figures) -> None:
        """Say in ``parts`` how many interval lines were read and not kept."""
        if self.not_kept:
            parts.warnings.append(
                f"{len(parts.intervals)} interval reports kept in the result, "
                f"{self.not_kept} more read and not kept; the summaries are iperf's own")


class TextReader:
    """Reads one iperf 2 process's human output line by line (live or from a file)."""

    def __init__(
        self, process_is_client: bool, keys: StreamKeys | None = None, intervals: bool = True
    ) -> None:
        self.is_client = process_is_client
        self.keys = keys or StreamKeys()
        self.intervals_on = intervals
        self._kept = _KeptRecords()
        self.records = self._kept.records
        self.failures: list[str] = []
        self.listening: set[int] = set()
        self.connections: dict[str, tuple[str, int, str, int, str]] = {}
        self.ooo: dict[tuple[str, float], int] = {}
        self.protocol: str | None = None
        self.server_port: int | None = None
        self.server_host: str | None = None
        self.start_time: str | None = None
        self.buffer: dict[str, int] = {}
        """The process's "Read"/"Write buffer size" headers: its -l."""
        self._server_report = False

    def feed(self, line: str) -> Interval | None:
        """Take one line; return the interval sample it holds, if it is one (summary lines
        and everything else give None)."""
        line = line.rstrip()
        failure = failure_in(line)
        if failure:
            self.failures.append(failure)
            return None
        if "Server Report:" in line:
            self._server_report = True
            return None
        if self._header(line):
            return None
        record = self._data_line(line)
        if record is None:
            return None
        self._kept.add(record)
        if not self.intervals_on or self._is_summary(record):
            return None
        return record.sample

    def _header(self, line: str) -> bool:
        if "bits/sec" in line:
            return False  # a report line, the common case: no header has a rate
        for pattern, handler in (
            (_LISTENING, self._on_listening),
            (_CONNECTING, self._on_connecting),
            (_CONNECTED, self._on_connected),
        ):
            found = pattern.search(line)
            if found:
                handler(found)
                return True
        buffer = _BUFFER.match(line)
        if buffer:
            if int(buffer["n"]) > 0:
                self.buffer.setdefault(buffer["kind"].lower(), int(buffer["n"]))
            return True
        ooo = _OOO.match(line)
        if ooo:
            self.ooo[(ooo["id"], float(ooo["start"]))] = int(ooo["n"])
            return True
        return False

    def _on_listening(self, found: re.Match[str]) -> None:
        self.listening.add(int(found["port"]))
        self.protocol = self.protocol or found["proto"].lower()

    def _on_connecting(self, found: re.Match[str]) -> None:
        self.protocol = found["proto"].lower()
        if self.server_port is None:
            self.server_port, self.server_host = int(found["port"]), found["host"].strip()

    def _on_connected(self, found: re.Match[str]) -> None:
        lport, rport = int(found["lport"]), int(found["rport"])
        self.connections[found["id"]] = (
            found["laddr"],
            lport,
            found["raddr"],
            rport,
            found["rest"],
        )
        when = _WHEN.search(found["rest"])
        if when and self.start_time is None:
            moment = datetime.datetime.strptime(when.group(1), "%Y-%m-%d %H:%M:%S")
            self.start_time = moment.replace(tzinfo=datetime.timezone.utc).isoformat()

    def _key(self, label: str) -> str:
        """The initiating end's port: the same on both processes' lines for a stream."""
        conn = self.connections.get(label)
        if conn is None:
            return f"id{label}"
        _, lport, _, rport, _ = conn
        return str(rport if lport in self.listening else lport)

    def _data_line(self, line: str) -> _Record | None:
        found = _LINE.match(line)
        if found is None or found["id"].startswith("FD"):
            return None  # not a report line, or a full-duplex both-ways sum
        if found["id"].startswith("SUM") and (self.full_duplex or self.bounceback):
            # With --full-duplex, [SUM] adds up both directions; a bounce-back test's are 0.
            return None
        is_client = self.is_client and not self._server_report
        self._server_report = False
        bounce = _BOUNCE.match(found["rest"])
        role, extra, writes = _bounce_columns(bounce) if bounce else _columns(found["rest"])
        role = role or self._legacy_role(found["id"], bool(found["star"]), is_client)
        direction = side_directions(is_client, role)
        label = found["id"]
        stream = None if label.startswith("SUM") else self.keys.number(direction, self._key(label))
        sample = Interval(
            direction=direction,
            role=role,
            stream_id=stream,
            start_s=float(found["start"]),
            end_s=float(found["end"]),
            bytes=_size(found["xfer"], found["xunit"]),
            bits_per_second=_rate(found["rate"], found["runit"]),
            **extra,
        )
        return _Record(label, direction, role, sample, writes,
                       Bounces.read(bounce) if bounce else None)

    def _legacy_role(self, label: str, star: bool, is_client: bool) -> str:
        """Role of a line without enhanced columns. A connection this process accepted
        as the client (-d/-r back-connection) it receives on; one the server opened it
        sends on. Otherwise the client sends and the server receives, both flipped for a
        reversed stream (-R, or the starred half of --full-duplex)."""
        conn = self.connections.get(label)
        accepted = (conn[1] in self.listening) if conn else not is_client
        if is_client and accepted:
            return "receiver"
        if not is_client and not accepted:
            return "sender"
        flipped = star or "(reverse)" in (conn[4] if conn else "")
        return "sender" if is_client != flipped else "receiver"

    @property
    def bounceback(self) -> bool:
        """True for a --bounceback test (a latency test: small writes echoed back)."""
        return any("(bb w/" in conn[4] for conn in self.connections.values())

    @property
    def full_duplex(self) -> bool:
        """True when the streams carry both directions on one socket (--full-duplex)."""
        return any("(full-duplex)" in conn[4] for conn in self.connections.values())

    def _is_summary(self, record: _Record) -> bool:
        if record.sample.start_s > 0.0005:
            return False
        return any(
            r is not record and r.label == record.label and r.role == record.role
            for r in self.records
        )

    def parts(self) -> Figures:
        """Intervals and summaries of everything read so far."""
        parts = build_parts(self._kept.all(), self.ooo, self.intervals_on)
        parts.call_lengths = self.call_lengths()
        self._kept.warn(parts)
        return parts

    def call_lengths(self) -> dict[tuple[str, str], int]:
        """Each end's read/write length as this process's headers say it. iperf 2 uses one
        -l for reading and writing; the server reads with its own and writes (-R, -d,
        --full-duplex) with the client's (strace of 2.1.8, client -l 16K, server -l 64K:
        the server's reads 65536, its writes and all the client's calls 16384)."""
        write, read = self.buffer.get("write"), self.buffer.get("read")
        found: dict[tuple[str, str], int | None]
        if self.is_client:
            found = {("client_to_server", "sender"): write,
                     ("server_to_client", "sender"): write,
                     ("server_to_client", "receiver"): write or read}
        else:
            found = {("client_to_server", "receiver"): read,
                     ("server_to_client", "sender"): write}
        return {key: n for key, n in found.items() if n is not None}


def _bounce_columns(found: re.Match[str]) -> tuple[str, dict[str, Any], None]:
    """A bounce-back client's line: it sends the requests (its RTT is the srtt's)."""
    rtt = int(found["rtt"])
    return "sender", {
        "retransmits": int(found["retry"]),
        "cwnd_bytes": int(found["cwnd"]) * KIB if found["cwnd"] else None,
        "rtt_us": rtt or None,
    }, None


def _columns(rest: str) -> tuple[str | None, dict[str, Any], int | None]:
    """The role implied by the columns after the bit rate, their values, and the write
    count (a UDP sender's datagrams). UDP first: ``writes/err  N pps`` would also match the
    TCP ``writes/err  retries`` pattern."""
    found = _UDP_TX.match(rest)
    if found:
        return "sender", {"packets": int(found["writes"])}, int(found["writes"])
    found = _TCP_TX.match(rest)
    if found:
        rtt = int(found["rtt"]) if found["rtt"] else None
        return (
            "sender",
            {
                "retransmits": int(found["retry"]),
                "cwnd_bytes": int(found["cwnd"]) * KIB if found["cwnd"] else None,
                "rtt_us": rtt if rtt else None,
                "rttvar_us": int(found["rttvar"]) if found["rttvar"] and rtt else None,
            },
            int(found["writes"]),
        )
    found = _UDP_RX.match(rest)
    if found:
        lost, total = int(found["lost"]), int(found["total"])
        return (
            "receiver",
            {
                "jitter_ms": float(found["jitter"]),
                "lost_packets": lost if lost >= 0 else None,
                "packets": received(lost, total),
            },
            None,
        )
    if _TCP_RX.match(rest):
        return "receiver", {}, None
    return None, {}, None


# --- from records to result parts -------------------------------------------------------------


def build_parts(
    records: list[_Record], ooo: dict[tuple[str, float], int], intervals_given: bool = True
) -> Figures:
    """Split each stream's lines into intervals and its summary, then sum up per flow."""
    parts = Figures()
    groups: dict[tuple[str, str, str], list[_Record]] = {}
    if len({r.direction for r in records if r.sample.stream_id is not None}) > 1:
        # Both directions (-d, -r, --full-duplex): iperf 2's [SUM] lines add up both ways.
        records = [r for r in records if r.sample.stream_id is not None]
    for record in records:
        groups.setdefault((record.label, record.direction, record.role), []).append(record)
    finals: list[_Record] = []
    for group in groups.values():
        last = group[-1]
        is_final = last.sample.start_s <= 0.0005
        body = group[:-1] if is_final else group
        parts.intervals.extend(_with_ooo(r.sample, r.label, ooo) for r in body)
        if is_final:
            finals.append(last)
    parts.streams = _streams(finals, groups, ooo)
    parts.latency = _bounce_latency([r.bounce for r in finals if r.bounce is not None])
    parts.summaries = _flows(finals, parts.streams, ooo)
    ends = [f.sample.end_s for f in finals]
    parts.duration_s = max(ends) if ends else None
    return parts


def _bounce_latency(streams: list[Bounces]) -> Latency | None:
    """The round trips of a bounce-back test, every stream's summary pooled (iperf 2 gives
    count, mean, min and max; its 100 us histogram is too coarse for percentiles)."""
    count = sum(b.count for b in streams)
    if not count:
        return None
    return Latency(
        count=count,
        mean_us=round(sum(b.mean_us * b.count for b in streams) / count, 3),
        min_us=min(b.min_us for b in streams),
        max_us=max(b.max_us for b in streams),
        measured_by=TOOL,
        metric="round_trip",
    )


def latency(parts: Figures) -> Latency | None:
    """What iperf 2 measured of latency: a bounce-back test's round trips, else the TCP
    senders' smoothed RTT of each interval (``-e``)."""
    return parts.latency or tcp_rtt_latency(parts.intervals, TOOL)


def _with_ooo(sample: Interval, label: str, ooo: dict[tuple[str, float], int]) -> Interval:
    if sample.role != "receiver" or sample.jitter_ms is None:
        return sample
    return attrs.evolve(sample, out_of_order_packets=ooo.get((label, sample.start_s), 0))


def received(lost: int | None, total: int | None) -> int | None:
    """The datagrams a UDP receiver got, from its report's ``lost/total``: ``total`` is
    the count the sender's numbering says was sent (the highest number seen), not what
    arrived (a lossy link: 127,381 "total" where the receiver's kernel took in 81,665)."""
    if total is None or total < 0:
        return None
    return max(total - lost, 0) if lost is not None and lost >= 0 else None


def lost_percent(lost: int | None, got: int | None) -> float | None:
    """``lost`` as a percentage of the datagrams expected (``got`` received plus lost)."""
    if lost is None or got is None or lost + got <= 0:
        return None
    return 100.0 * lost / (lost + got)


def _side(
    record: _Record, samples: list[Interval], ooo: dict[tuple[str, float], int]
) -> SideSummary:
    s = record.sample
    rtts = [i.rtt_us for i in samples if i.rtt_us is not None]
    cwnds = [i.cwnd_bytes for i in samples if i.cwnd_bytes is not None]
    return side_of(
        s,
        min_rtt_us=min(rtts) if rtts else None,
        max_rtt_us=max(rtts) if rtts else None,
        cwnd_bytes=max(cwnds) if cwnds else None,
        lost_percent=lost_percent(s.lost_packets, s.packets),
        out_of_order_packets=_final_ooo(record, ooo),
    )


def _final_ooo(record: _Record, ooo: dict[tuple[str, float], int]) -> int | None:
    if record.sample.out_of_order_packets is not None:
        return record.sample.out_of_order_packets
    if record.sample.jitter_ms is None:
        return None
    return ooo.get((record.label, 0.0), 0)  # iperf 2 prints the line only when not zero


def _streams(
    finals: list[_Record],
    groups: dict[tuple[str, str, str], list[_Record]],
    ooo: dict[tuple[str, float], int],
) -> list[StreamResult]:
    by_stream: dict[tuple[str, int], dict[str, SideSummary]] = {}
    for record in finals:
        if record.sample.stream_id is None:
            continue
        # RTT/cwnd extremes over the interval samples; the final line's values are taken
        # as the connection closes, so they count only when there were no intervals.
        group = groups[(record.label, record.direction, record.role)]
        samples = [r.sample for r in group[:-1]] or [record.sample]
        side = _side(record, samples, ooo)
        by_stream.setdefault((record.direction, record.sample.stream_id), {})[record.role] = side
    return [
        StreamResult(number, direction, sides.get("sender"), sides.get("receiver"))
        for (direction, number), sides in sorted(by_stream.items())
    ]


def _flows(
    finals: list[_Record], streams: list[StreamResult], ooo: dict[tuple[str, float], int]
) -> list[FlowSummary]:
    flows: dict[str, dict[str, SideSummary]] = {}
    for record in finals:
        if record.sample.stream_id is None:
            flows.setdefault(record.direction, {})[record.role] = _side(record, [], ooo)
    for direction in {s.direction for s in streams}:
        mine = [s for s in streams if s.direction == direction]
        sides = flows.setdefault(direction, {})
        for role in ("sender", "receiver"):
            have = [getattr(s, role) for s in mine if getattr(s, role) is not None]
            if role not in sides and have and len(have) == len(mine):
                # iperf prints no [SUM] for one stream (nor in CSV 2.1.x): add them up.
                sides[role] = have[0] if len(have) == 1 else _added(have)
    return [
        FlowSummary(direction, sides.get("sender"), sides.get("receiver"))
        for direction, sides in sorted(flows.items())
    ]


def _added(sides: list[SideSummary]) -> SideSummary:
    """Streams' totals added up: bytes, packets and losses are sums; the rate is over the
    whole span; per-socket TCP figures are not added."""
    start, end = min(s.start_s for s in sides), max(s.end_s for s in sides)
    nbytes = sum(s.bytes for s in sides)

    def total(name: str) -> int | None:
        values = [getattr(s, name) for s in sides]
        return None if any(v is None for v in values) else sum(values)

    lost, packets = total("lost_packets"), total("packets")
    return SideSummary(
        role=sides[0].role,
        start_s=start,
        end_s=end,
        bytes=nbytes,
        bits_per_second=nbytes * 8 / (end - start) if end > start else 0.0,
        retransmits=total("retransmits"),
        retransmits_scope=sides[0].retransmits_scope,
        packets=packets,
        lost_packets=lost,
        lost_percent=lost_percent(lost, packets),
        out_of_order_packets=total("out_of_order_packets"),
    )


def merge(client: Figures, server: Figures) -> Figures:
    """One test's client and server parts together: each side's figures from the process
    that measured them (the other's copy fills gaps)."""
    out = attrs.evolve(client, intervals=client.intervals + _new_intervals(client, server))
    out.streams = _merge_by(client.streams, server.streams, lambda s: (s.direction, s.stream_id))
    out.summaries = _merge_by(client.summaries, server.summaries, lambda f: f.direction)
    out.warnings = client.warnings + server.warnings
    out.errors = client.errors + [e for e in server.errors if e not in client.errors]
    out.duration_s = client.duration_s or server.duration_s
    out.latency = client.latency or server.latency
    out.call_lengths = {**server.call_lengths, **client.call_lengths}
    return out


def _new_intervals(client: Figures, server: Figures) -> list[Interval]:
    have = {(i.direction, i.role) for i in client.intervals}
    return [i for i in server.intervals if (i.direction, i.role) not in have]


def _merge_by(mine: list[Any], theirs: list[Any], key: Any) -> list[Any]:
    merged = {key(item): item for item in mine}
    for item in theirs:
        ours = merged.get(key(item))
        if ours is None:
            merged[key(item)] = item
        else:
            merged[key(item)] = attrs.evolve(
                ours, sender=ours.sender or item.sender, receiver=ours.receiver or item.receiver
            )
    return list(merged.values())


def endpoints(reader: TextReader) -> tuple[Endpoint, Endpoint]:
    """Client and server endpoints as one process's output names them."""
    conn = next(iter(reader.connections.values()), None)
    if conn is None:
        return (
            Endpoint(role="client"),
            Endpoint(role="server", host=reader.server_host, port=reader.server_port),
        )
    laddr, lport, raddr, rport, _ = conn
    if reader.is_client:
        return (
            Endpoint(role="client", address=laddr, port=lport),
            Endpoint(role="server", host=reader.server_host, address=raddr, port=rport),
        )
    return (
        Endpoint(role="client", address=raddr, port=rport),
        Endpoint(role="server", address=laddr, port=lport),
    )


def read_text(text: Text, process_is_client: bool, keys: StreamKeys | None = None) -> TextReader:
    """Feed a whole saved output through a TextReader."""
    reader = TextReader(process_is_client, keys)
    for line in _lines(text):
        reader.feed(line)
    return reader


RAW_KEPT_CHARS = _bounded.RAW_KEPT_CHARS
"""Most of a saved log kept as the result's raw output (see netprobe.tools._bounded)."""


def kept_raw(text: Text) -> str:
    """``text`` for the result's raw output: whole, or its head and how much was left out."""
    return _bounded.kept_raw(text, RAW_KEPT_CHARS)


SPOOL_CHARS = _bounded.SPOOL_CHARS
"""Most of one test's text :func:`split_tests` holds in memory; past it, a temporary file."""


def _lines(text: Text | Iterable[str]) -> Iterable[str]:
    return _bounded.lines(text)


def _read_until_first_connection(text: Text) -> TextReader:
    # What the guess needs (the listening ports, the port it connected to, the first
    # connection) comes before the first report: reading on would cost a second full parse.
    reader = TextReader(True)
    for line in _lines(text):
        reader.feed(line)
        if reader.connections:
            break
    return reader


def guess_is_client(text: Text, name: str = "") -> bool | None:
    """Whether a saved output came from the client: by its name, else by whether its first
    connection was the one it opened. None if it cannot tell."""
    words = [w for w in re.split(r"[^a-z]+", name.lower()) if w]
    named = [w for w in words if w in ("client", "sender", "server", "receiver")]
    if named:
        return named[-1] in ("client", "sender")
    reader = _read_until_first_connection(text)
    conn = next(iter(reader.connections.values()), None)
    if conn is not None and reader.listening:
        return conn[1] not in reader.listening
    if reader.server_port is not None or "Client connecting to" in text:
        return True
    if reader.listening:
        return False
    return None


# --- CSV ---------------------------------------------------------------------------------------

_CSV_NAMES = {
    "time": "time",
    "srcaddress": "src",
    "srcport": "sport",
    "dstaddr": "dst",
    "dstaddress": "dst",
    "dstport": "dport",
    "transferid": "id",
    "interval": "interval",
    "istart": "istart",
    "iend": "iend",
    "bytes": "bytes",
    "speed": "speed",
    "bits_per_second": "speed",
    "jitter": "jitter",
    "errors": "lost",
    "lost": "lost",
    "datagrams": "total",
    "errpercent": "pct",
    "outoforder": "ooo",
    "out_of_order": "ooo",
    "tcpretry": "retry",
    "retry": "retry",
    "tcpcwnd": "cwnd",
    "cwnd": "cwnd",
    "tcprtt": "rtt",
    "rtt": "rtt",
    "rttvar": "rttvar",
    "writecnt": "writes",
    "readcnt": "reads",
}
_V21_TCP = ["time", "src", "sport", "dst", "dport", "id", "interval", "bytes", "speed"]
_V21_UDP = [*_V21_TCP, "jitter", "lost", "total", "pct", "ooo"]


def looks_like_csv(text: Text) -> bool:
    """True for ``-y C`` output (data rows, or a 2.2 header row)."""
    for line in _lines(text):
        cells = line.strip().split(",")
        if len(cells) >= 8:
            stamp = re.fullmatch(r"\d{14}(\.\d+)?", cells[0])
            return cells[0].lower() == "time" or stamp is not None
    return False


def parse_csv(text: Text, process_is_client: bool, source: str = "<input>") -> Figures:
    """Intervals and summaries from ``-y C`` rows. Direction: the row's source end opened
    the connection; rows to the main server port flow client to server. Read twice, row
    by row (the main port first), so that memory does not grow with the rows."""
    first = min(_csv_rows(text, source), default=None,
                key=lambda r: (r[1].get("id", 1e9) or 1e9, r[0]))
    if first is None:
        raise ParseError("no iperf CSV rows found", source)
    main_port = first[1].get("dport")
    keys = StreamKeys()
    kept = _KeptRecords()
    for _, row in _csv_rows(text, source):
        kept.add(_csv_record(row, process_is_client, main_port, keys))
    parts = build_parts(kept.all(), {}, True)
    kept.warn(parts)
    return parts


def _csv_rows(text: Text, source: str) -> Iterable[tuple[int, dict[str, Any]]]:
    header: list[str] | None = None
    for number, line in enumerate(_lines(text), start=1):
        cells = [c.strip() for c in line.strip().split(",")]
        if len(cells) < 8:
            continue  # iperf's banner lines, blank lines
        if cells[0].lower() == "time":
            header = [_CSV_NAMES.get(c.lower(), c.lower()) for c in cells]
            continue
        names = header or (_V21_UDP if len(cells) >= 14 else _V21_TCP)
        try:
            yield number, _csv_values(dict(zip(names, cells)))
        except (ValueError, KeyError) as exc:
            raise ParseError(f"unreadable CSV row ({exc})", source, number) from None


def _csv_values(raw: dict[str, str]) -> dict[str, Any]:
    row: dict[str, Any] = dict(raw)
    if "interval" in raw and "-" in raw["interval"]:
        start, end = raw["interval"].split("-", 1)
        row["istart"], row["iend"] = float(start), float(end)
    else:
        row["istart"], row["iend"] = float(raw["istart"]), float(raw["iend"])
    for name in (
        "sport",
        "dport",
        "id",
        "bytes",
        "lost",
        "total",
        "ooo",
        "retry",
        "cwnd",
        "rtt",
        "rttvar",
        "writes",
    ):
        if raw.get(name) not in (None, ""):
            row[name] = int(float(raw[name]))
    for name in ("speed", "jitter", "pct"):
        if raw.get(name) not in (None, ""):
            row[name] = float(raw[name])
    return row


def _csv_record(row: dict[str, Any], is_client: bool, main_port: Any, keys: StreamKeys) -> _Record:
    direction = C2S if row.get("dport") == main_port else S2C
    client_sends = direction == C2S
    role = "sender" if is_client == client_sends else "receiver"
    if row.get("total") == -1:  # 2.1.8: a UDP client's own row has no datagram count
        role = "sender"
    sum_row = (row.get("id") or 0) <= 0
    stream = None if sum_row else keys.number(direction, str(row.get("sport")))
    udp = "jitter" in row and role == "receiver"
    total, lost = row.get("total"), row.get("lost")
    sample = Interval(
        direction=direction,
        role=role,
        stream_id=stream,
        start_s=row["istart"],
        end_s=row["iend"],
        bytes=row["bytes"],
        bits_per_second=row.get("speed", 0.0),
        retransmits=row.get("retry") if role == "sender" and row.get("retry", -1) >= 0 else None,
        cwnd_bytes=row["cwnd"] * KIB if role == "sender" and row.get("cwnd", -1) > 0 else None,
        rtt_us=row.get("rtt") if role == "sender" and row.get("rtt", 0) > 0 else None,
        packets=received(lost, total) if udp else None,
        lost_packets=lost if udp and lost is not None and lost >= 0 else None,
        out_of_order_packets=row.get("ooo") if udp else None,
        jitter_ms=row.get("jitter") if udp else None,
    )
    return _Record(str(row.get("id")), direction, role, sample)


# --- one test at a time from a log of many ----------------------------------------------------


def split_tests(lines: Iterable[str]) -> Iterable[Text]:
    """The text of each test in a saved log that may hold several (a server's log, a file
    of appended runs), read line by line so that only one test is in memory at a time.
    See :func:`_tests_of` and, for CSV rows without a time, :func:`_unstamped_apart`."""
    for chunk in _tests_of(lines):
        if isinstance(chunk, str):
            yield from _unstamped_apart(chunk)
        else:  # spooled (past SPOOL_CHARS): long, so never a log of bare summary rows
            yield chunk


_UNSTAMPED = "19700101"
"""The time iperf 2.1.8 puts on every CSV row of a server (with or without ``-e``)."""


def _unstamped_apart(chunk: str) -> Iterable[str]:
    """A CSV test whose rows carry no time and no interval rows, one test per transfer
    when nothing in them says the transfers ran at once.

    Such rows are one summary per transfer and say nothing of when: two tests of the same
    length one after the other read as one test of two streams (a server's log of two 1 s
    tests and a -P 2 on loopback: one "4-stream" result at 20,696 Mbit/s). Transfers that
    ran at once show it when one accepted later (a higher id) finished first, or when they
    flow to different ports (``-d``): the rows then stay one test. Rows in the order
    accepted, to one port, read as tests one after the other (so does a -P test whose
    streams happened to finish in that order: the rows cannot tell them apart). Rows with
    interval rows (``-i``) or a real time are left as they are.
    """
    lines = chunk.splitlines(keepends=True)
    rows = [(i, cells) for i, line in enumerate(lines)
            if len(cells := line.strip().split(",")) >= 9 and _span_of(cells) is not None]
    ids = [int(cells[5]) if cells[5].isdigit() else -1 for _, cells in rows]
    apart = (len(rows) > 1 and ids == sorted(set(ids)) and min(ids) >= 0
             and len({cells[4] for _, cells in rows}) == 1
             and all(cells[0].startswith(_UNSTAMPED) and _span_of(cells) == _span_of(rows[0][1])
                     for _, cells in rows))
    if not apart:
        yield chunk
        return
    prefix = "".join(line for i, line in enumerate(lines) if i < rows[0][0])
    for i, _ in rows:
        yield prefix + lines[i]


def _span_of(cells: list[str]) -> tuple[float, float] | None:
    try:
        start, end = (float(v) for v in cells[6].split("-", 1))
    except (ValueError, IndexError):
        return None
    return start, end


def _tests_of(lines: Iterable[str]) -> Iterable[Text]:
    """The tests of a log as its lines tell them apart.

    Text: a test ends when, after it printed report lines, another connection is accepted
    (a connection the process opened itself, after ``Client connecting to``, is the
    reverse half of the same test: ``-r``, ``-d``) or another ``Server listening`` banner
    begins. CSV: see :class:`_CsvTests`.
    """
    chunk = SpooledLog(SPOOL_CHARS)
    banner: list[str] = []  # the process's banner, which says whether it is the server
    text_tests, csv_tests = _TextTests(), _CsvTests()
    for line in lines:
        cells = line.strip().split(",")
        starts = csv_tests.starts_test(cells) if len(cells) >= 8 else text_tests.starts_test(line)
        if starts and chunk.chars:
            yield _held(chunk)
            chunk = SpooledLog(SPOOL_CHARS)
            for kept in [] if _LISTENING.search(line) else banner:
                chunk.add(kept)
        elif (text_tests.banner_line(line) and not text_tests.reported
              and (len(cells) < 8 or cells[0].strip().lower() == "time")):
            banner.append(line)  # a CSV data row is a test's, never a banner's
        chunk.add(line)
    if chunk.chars:
        yield _held(chunk)


def _held(chunk: SpooledLog) -> Text:
    return _bounded.held(chunk, SPOOL_CHARS)


class _TextTests:
    """Where human-readable tests begin: after a test has printed report lines, at another
    ``Server listening`` banner, at another connection accepted by a process whose test
    began by accepting one (a server), and at another ``Client connecting to`` of a process
    whose test began by connecting (a client). The connection a client accepts (``-r``,
    ``-d``) or a server opens is the other half of the same test."""

    def __init__(self) -> None:
        self.reported = False
        self.outgoing_next = False  # a "Client connecting to" banner came before
        self.began_outgoing: bool | None = None  # how the current test's first connection was

    def banner_line(self, line: str) -> bool:
        """A line of the banner before the first connection (kept for later tests)."""
        return self.began_outgoing is None and not _CONNECTED.match(line.strip())

    def starts_test(self, line: str) -> bool:
        text = line.strip()
        starts = False
        if _LISTENING.search(text):
            starts = self.reported
        elif _CONNECTING.search(text):
            starts = self.reported and self.began_outgoing is True
            self.outgoing_next = True
        elif _CONNECTED.match(text):
            outgoing, self.outgoing_next = self.outgoing_next, False
            starts = self.reported and not outgoing and self.began_outgoing is False
            if self.began_outgoing is None or starts:
                self.began_outgoing = outgoing
        elif _LINE.match(text):
            self.reported = True
        if starts:
            self.reported = False
            if not _CONNECTED.match(text):
                self.began_outgoing = None
        return starts


class _CsvTests:
    """Where CSV tests begin. A transfer's rows are its intervals, then its summary (the
    row from 0 to the end). A test ends with a row of a transfer whose summary was given
    (or that started at 0 twice), and with a new transfer whose row is not of the current
    test's time span and time (``-e`` stamps each row with the real second; without it the
    stamp is 19700101000000 and only the span tells tests apart, so two tests of the same
    length, one after the other, still read as one test of two streams)."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[float, float]] = {}  # transfer -> its last row's span
        self.done: set[str] = set()
        self.key: tuple[str, str] | None = None  # the current test's (stamp, span)

    def starts_test(self, cells: list[str]) -> bool:
        try:
            start, end = (float(v) for v in cells[6].split("-", 1))
        except (ValueError, IndexError):
            return False  # a header row, or one _csv_rows will name as unreadable
        transfer, key = f"{cells[5]}:{cells[2]}", (cells[0], cells[6])
        before = self.last.get(transfer)
        if before is None:
            starts = start == 0 and self.key is not None and not _same_time(self.key, key)
        else:
            starts = transfer in self.done or (before[0] == 0 and start == 0)
        if starts:
            self.last, self.done, self.key, before = {}, set(), None, None
        if start == 0 and before is None and self.key is None:
            self.key = key
        elif start == 0 and before is not None and before[0] > 0:
            self.done.add(transfer)
            self.key = key
        self.last[transfer] = (start, end)
        return starts


def _same_time(one: tuple[str, str], other: tuple[str, str]) -> bool:
    """Same span, stamped within a second (streams of one test end together)."""
    if one[1] != other[1]:
        return False
    try:
        first, second = (datetime.datetime.strptime(k[0][:14], "%Y%m%d%H%M%S")
                         for k in (one, other))
    except ValueError:
        return one[0] == other[0]
    return abs((first - second).total_seconds()) <= 1
