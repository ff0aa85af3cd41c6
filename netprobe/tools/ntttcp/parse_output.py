"""Pure parsers for NTTTCP for Linux (1.4.x) output, and its mapping into the result schema.

Three kinds of output, one per process role (``sender`` = ``-s``, ``receiver`` = ``-r``):

- the console log, read line by line (live or from a file; ``-O`` log files are the same
  without the banner). On a terminal the real-time lines are ``ESC[2K...\\r`` segments of
  one physical line; through a pipe they end in newlines. Both are understood.
- the ``-x`` XML result file (``<ntttcps>`` / ``<ntttcpr>``), and
- the ``-j`` JSON result file (``{"ntttcps": {...}}``): every value in it is a string.

Units as ntttcp prints them: console ``Gbps``/``Mbps`` are SI (format_throughput divides by
1000); the result files' ``MB`` is 10**6 bytes. ``retrans segs`` and the user/system/idle/
softirq figures are host-wide counters from /proc (both sides print the same values on one
host); ``cpu busy (all)`` is the process's own CPU time over wall time (percent of one core,
above 100 with several threads).
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from typing import Any, Callable

from netprobe.errors import ParseError
from netprobe.schema import Cpu, CpuUsage, SideSummary, StreamResult
from netprobe.units import MIB, si_factor

# The MB of NTTTCP for Linux 1.4.0's (and Windows NTttcp's) result files is MIB.
SEPARATOR = "-" * 20
"""ntttcp's section separator starts with (at least) this."""

_ESC_CLEAR_LINE = "\x1b[2K"
_LOG = re.compile(r"^(\d\d:\d\d:\d\d) (INFO|ERR|DBG|WARN)\s*: ?(.*)$")
_REALTIME = re.compile(r"^Real-time throughput: ([\d.]+)\s*(\w+)$")
_TOTALS = re.compile(r"^\s*([\w/ ()]+?)\s*:\s*(\S.*?)\s*$")
_INCOMING = re.compile(r"^New connection: (\S+):\d+ --> local:")
_THREAD_ROW = re.compile(r"^(\d+)\s+([\d.]+)\s+([\d.]+\s*[KMG]?bps)$")
_THROUGHPUT = re.compile(r"^([\d.]+)\s*([KMG]?)bps$")


@dataclass(frozen=True)
class ThreadTotal:
    """One data thread's own figures (one connection per thread as netprobe runs ntttcp):
    the console's ``Thread  Time(s)  Throughput`` rows (-V) or a result file's threads."""

    index: int
    duration_s: float
    bits_per_second: float
    bytes: int
    """Derived (rate x time): ntttcp prints no per-thread byte count."""


@dataclass
class Totals:
    """One process's final report (console ``#####  Totals:  #####`` block or result file)."""

    duration_s: float | None = None
    bytes: int | None = None
    bits_per_second: float | None = None
    retransmits: int | None = None
    cpu_cores: int | None = None
    user_percent: float | None = None
    system_percent: float | None = None
    idle_percent: float | None = None
    iowait_percent: float | None = None
    softirq_percent: float | None = None
    cycles_per_byte: float | None = None
    busy_percent: float | None = None
    rtt_us: int | None = None
    connections: int | None = None
    host_busy_percent: float | None = None
    """The whole machine's CPU use, where only that is printed (Windows ``Avg. CPU %``)."""
    call_length_bytes: int | None = None
    """What its data loop asked of each send() (a sender) or recv() (a receiver): ``-b``,
    from its parameters (the console's ``... socket buffer (bytes)`` line, printed with -V,
    or a result file's; ntttcp's "socket buffer" is the call's buffer, not SO_SNDBUF)."""
    threads: list[ThreadTotal] = field(default_factory=list)
    megabyte: int = 10**6
    """What the result file's ``MB`` is (10**6, or 2**20 in NTTTCP for Linux 1.4.0 and in
    Windows NTttcp); the console's ``total bytes`` is exact."""


@dataclass
class Params:
    """Test options as the output shows them (verbose console header or result file)."""

    streams: int | None = None
    protocol: str | None = None
    ipv6: bool | None = None
    port: int | None = None
    duration_s: int | None = None
    warmup_s: int | None = None
    server_address: str | None = None


@dataclass
class ConsoleOutput:
    """Everything read from one ntttcp process's console output so far."""

    role: str | None = None
    version: str | None = None
    params: Params = field(default_factory=Params)
    totals: Totals = field(default_factory=Totals)
    in_totals: bool = False
    report_complete: bool = False
    """The totals block and the separator after it have been printed."""
    started: bool = False
    """``Network activity progressing...`` was printed."""
    peer_address: str | None = None
    """The far address of the first data connection a receiver's ``-V`` log shows."""
    connected: bool = False
    """A data connection is up (``-V``'s ``New connection``, ``connections created``, or
    data reported): a no-sync receiver's test starts then."""
    warmup_done: bool = False
    errors: list[str] = field(default_factory=list)
    usage_printed: bool = False
    interrupted: bool = False
    realtime_count: int = 0
    unknown: list[int] = field(default_factory=list)
    recognized: int = 0
    last_line: int = 0


@dataclass
class RealtimeSample:
    """One ``Real-time throughput`` line (ntttcp reports about every 0.5 s, untimed)."""

    bits_per_second: float
    during_warmup: bool
    batched: bool
    """True when several samples arrived in one physical line (a terminal's ``\\r``
    updates): their arrival time says nothing about when each was measured."""


def parse_throughput(text: str) -> float | None:
    """``28.26Gbps`` -> 28.26e9 bit/s (SI units, as ntttcp formats them)."""
    found = _THROUGHPUT.match(text.strip())
    return float(found.group(1)) * si_factor(found.group(2)) if found else None


def number(text: str) -> float | None:
    """The number a value starts with (``3.01 seconds`` -> 3.01), None if none."""
    found = re.match(r"^-?[\d.]+", text.strip())
    if not found:
        return None
    try:
        return float(found.group(0))
    except ValueError:
        return None


class ConsoleParser:
    """Reads ntttcp console output one physical line at a time.

    ``warmup``: a warm-up (-W) was asked for, so real-time samples before ``Test warmup
    completed.`` are marked as such."""

    def __init__(self, warmup: bool = False) -> None:
        self.out = ConsoleOutput()
        self.warmup = warmup
        self._last_ok = True

    def feed(self, line: str) -> list[RealtimeSample]:
        """Read one physical line; return the real-time samples it carried."""
        self.out.last_line += 1
        segments = [s.replace(_ESC_CLEAR_LINE, "").strip() for s in line.split("\r")]
        segments = [s for s in segments if s]
        found: list[RealtimeSample] = []
        understood = not segments
        for segment in segments:
            sample = self._segment(segment, batched=len(segments) > 1)
            if sample is not None:
                found.append(sample)
                understood = True
            elif self._last_ok:
                understood = True
        if understood:
            self.out.recognized += 1
        else:
            self.out.unknown.append(self.out.last_line)
        return found

    def _segment(self, text: str, batched: bool) -> RealtimeSample | None:
        self._last_ok = True
        realtime = _REALTIME.match(text)
        if realtime:
            rate = parse_throughput(realtime.group(1) + realtime.group(2))
            if rate is None:
                self._last_ok = False
                return None
            self.out.realtime_count += 1
            self.out.connected = True
            during_warmup = self.warmup and not self.out.warmup_done
            return RealtimeSample(rate, during_warmup, batched)
        self._last_ok = self._other(text)
        return None

    def _other(self, text: str) -> bool:
        banner = re.match(r"^NTTTCP for Linux (\S+)", text)
        if banner:
            self.out.version = banner.group(1)
            return True
        if text.startswith(SEPARATOR):
            if self.out.in_totals:
                self._report_done()
            return True
        log = _LOG.match(text)
        if log:
            return self._log(log.group(2), log.group(3).strip())
        return self._header(text)

    def _report_done(self) -> None:
        out = self.out
        out.report_complete = True
        out.in_totals = False
        if out.params.protocol is None and out.totals.retransmits is None:
            out.params.protocol = "udp"  # ntttcp shows "retrans segs" for TCP only

    # -- timestamped log lines ----------------------------------------------------------

    def _log(self, level: str, message: str) -> bool:
        if level == "ERR":
            if message not in self.out.errors:
                self.out.errors.append(message)
            if "UDP in IPv6" in message:
                self.out.params.protocol, self.out.params.ipv6 = "udp", True
            return True
        if level == "DBG":
            peer = _INCOMING.match(message)
            if peer and self.out.peer_address is None:
                self.out.peer_address = peer.group(1).strip("[]")
            if message.startswith("New connection"):
                self.out.connected = True
            return True
        if self.out.in_totals and self._total(message):
            return True
        return self._info(message)

    def _info(self, message: str) -> bool:
        out = self.out
        if message.startswith("Network activity progressing"):
            out.started = True
        elif message.startswith("Test warmup completed"):
            out.warmup_done = True
        elif message.startswith("#####  Totals:"):
            out.in_totals = True
        elif message.startswith("Interrupted by Ctrl+C"):
            out.interrupted = True
        elif "UDP send size" in message:
            out.params.protocol = "udp"
        elif re.match(r"^\d+ connections (tested|created)", message):
            out.role = "sender"
            out.connected = True
            tested = re.match(r"^(\d+) connections tested", message)
            if tested:
                out.totals.connections = int(tested.group(1))
        elif _THREAD_ROW.match(message):
            found = _THREAD_ROW.match(message)
            assert found is not None
            rate = parse_throughput(found.group(3)) or 0.0
            seconds = float(found.group(2))
            out.totals.threads.append(
                ThreadTotal(int(found.group(1)), seconds, rate, round(rate / 8 * seconds)))
        elif message.startswith("Starting sender activity"):
            out.role = "sender"
        elif ("failed" in message) and message not in out.errors:
            out.errors.append(message)  # e.g. "failed to connect to receiver" (INFO with -N)
        return True  # other INFO lines are progress messages

    def _total(self, message: str) -> bool:
        found = _TOTALS.match(message)
        if not found:
            return False
        key, value = found.group(1).strip(), found.group(2)
        setter = _TOTAL_SETTERS.get(key)
        if setter is not None:
            setter(self.out.totals, value)
            return True
        # the --show-tcp-retrans / --show-nic-packets / -V per-thread blocks
        return True

    # -- the verbose header and the usage text -------------------------------------------

    def _header(self, text: str) -> bool:
        out = self.out
        if text.startswith("*** "):
            if "sender role" in text:
                out.role = "sender"
            elif "receiver role" in text and out.role is None:
                out.role = "receiver"
            return True
        if text.startswith(("Author:", "Usage", "ntttcp: [")) or out.usage_printed:
            if text.startswith("ntttcp: ") and not text.startswith("ntttcp: ["):
                out.errors.append(text)  # e.g. "ntttcp: unrecognized option '--bogus'"
            else:
                out.usage_printed = True
            return True
        if text.startswith("ntttcp: "):
            out.errors.append(text)
            return True
        param = re.match(r"^([\w ()./-]+):\s+(\S.*)$", text)
        if param:
            key, value = param.group(1).strip(), param.group(2).strip()
            if key in ("sender socket buffer (bytes)", "receiver socket buffer (bytes)"):
                # printed for the process's own role only (-V)
                out.totals.call_length_bytes = _positive(value)
            else:
                _apply_param(out.params, key, value)
            return True
        return False


def _set_total(name: str, conv: Callable[[str], Any]) -> Callable[[Totals, str], None]:
    def setter(totals: Totals, value: str) -> None:
        setattr(totals, name, conv(value))

    return setter


def _int_of(value: str) -> int | None:
    found = number(value)  # digits past a float's range are inf: unknown, as a count
    return None if found is None or not math.isfinite(found) else int(found)


_TOTAL_SETTERS: dict[str, Callable[[Totals, str], None]] = {
    "test duration": _set_total("duration_s", number),
    "total bytes": _set_total("bytes", _int_of),
    "throughput": _set_total("bits_per_second", parse_throughput),
    "retrans segs": _set_total("retransmits", _int_of),
    "cpu cores": _set_total("cpu_cores", _int_of),
    "user": _set_total("user_percent", number),
    "system": _set_total("system_percent", number),
    "idle": _set_total("idle_percent", number),
    "iowait": _set_total("iowait_percent", number),
    "softirq": _set_total("softirq_percent", number),
    "cycles/byte": _set_total("cycles_per_byte", number),
    "cpu busy (all)": _set_total("busy_percent", number),
    "tcpi rtt": _set_total("rtt_us", _int_of),
}


def _apply_param(params: Params, key: str, value: str) -> None:
    if key == "connections":
        counts = [int(n) for n in re.findall(r"\d+", value)]
        if counts:
            product = 1
            for count in counts:
                product *= count
            params.streams = product
    elif key == "ports":
        params.streams = _int_of(value)
    elif key == "protocol":
        params.protocol = value.lower()
    elif key == "domain":
        params.ipv6 = value == "IPv6"
    elif key == "server address":
        params.server_address = value
    elif key == "server port starting at":
        params.port = _int_of(value)
    elif key == "test duration (sec)":
        params.duration_s = _int_of(value)
    elif key == "test warm-up (sec)":
        params.warmup_s = _int_of(value) or 0


def parse_console(text: str) -> ConsoleOutput:
    """Parse a whole saved console output (or ``-O`` log)."""
    parser = ConsoleParser()
    for line in text.split("\n"):
        parser.feed(line)
    return parser.out


# --- result files -----------------------------------------------------------------------


@dataclass
class ResultFile:
    """What an ``-x`` XML or ``-j`` JSON result file says."""

    role: str
    params: Params
    totals: Totals
    flavour: str = "linux"
    """``linux`` (NTTTCP for Linux since mid-2021: MB = 10**6), ``linux-mib`` (older
    builds that also call themselves 1.4.0: MB = 2**20, floored) or ``windows``
    (ntttcp.exe: MB = 2**20)."""


def xml_flavour(version: str, rate_metrics: set[str | None]) -> str:
    """Which writer made an XML result. Both Linux generations say ``5.33-linux``: the
    10**6 one also writes a ``Bps`` (at first ``bps``) throughput; the 2**20 one does not."""
    if not version.endswith("-linux"):
        return "windows"
    return "linux" if rate_metrics & {"Bps", "bps"} else "linux-mib"


def parse_xml(text: str, source: str) -> ResultFile:
    """Read an ``-x`` result file (NTTTCP for Linux or Windows NTttcp); ParseError (with
    line) if it is not one or is cut."""
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as exc:
        line = exc.position[0] if exc.position else None
        raise ParseError(f"not a complete ntttcp XML result: {exc}", source, line) from None
    if root.tag not in ("ntttcps", "ntttcpr"):
        raise ParseError(f"not an ntttcp XML result (root <{root.tag}>)", source, 1)
    values = {child.tag: (child.text or "").strip() for child in root}
    rates = {
        child.get("metric"): (child.text or "").strip() for child in root.findall("throughput")
    }
    flavour = xml_flavour(root.get("version", ""), set(rates))
    megabyte = 10**6 if flavour == "linux" else MIB
    section = root.find("parameters")
    params = {} if section is None else {c.tag: (c.text or "").strip() for c in section}
    busy = number(values.get("cpu_busy_all", values.get("cpu", "")))
    totals = Totals(
        duration_s=number(values.get("realtime", "")),
        bytes=_megabytes(values.get("total_bytes"), megabyte),
        # "bps" (bits, written for two weeks of 2021) before "Bps" (bytes)
        bits_per_second=number(rates.get("bps") or "") or _bps(rates.get("Bps"),
                                                                rates.get("MB/s"), megabyte),
        retransmits=_int_of(values.get("packets_retransmitted", "")),
        cpu_cores=_int_of(values.get("cpu_cores", "")),
        user_percent=number(values.get("user", "")),
        system_percent=number(values.get("system", "")),
        idle_percent=number(values.get("idle", "")),
        iowait_percent=number(values.get("iowait", "")),
        softirq_percent=number(values.get("softirq", "")),
        cycles_per_byte=number(values.get("cycles_per_byte", values.get("cycles", ""))),
        busy_percent=None if flavour == "windows" else busy,
        host_busy_percent=busy if flavour == "windows" else None,
        rtt_us=_int_of(values.get("tcp_average_rtt", "")),
        connections=_int_of(values.get("conns_tested", "")),
        threads=[_xml_thread(t, megabyte) for t in root.findall("thread")],
        megabyte=megabyte,
    )
    role = "sender" if root.tag == "ntttcps" else "receiver"
    totals.call_length_bytes = _file_call_length(params, role, xml=True)
    return ResultFile(role, _file_params(params, xml=True), totals, flavour)


def _xml_thread(element: ElementTree.Element, megabyte: int) -> ThreadTotal:
    rates = {c.get("metric"): (c.text or "") for c in element.findall("throughput")}
    seconds = number(element.findtext("realtime", "")) or 0.0
    per_second = number(rates.get("KB/s", "")) or 0.0
    rate = per_second * (1000 if megabyte == 10**6 else 1024) * 8
    return ThreadTotal(_int_of(element.get("index", "")) or 0, seconds, rate,
                       round(rate / 8 * seconds))


def parse_json(text: str, source: str) -> ResultFile:
    """Read a ``-j`` result file (all values are strings; only 10**6-byte builds write it)."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        line = getattr(exc, "lineno", None)
        raise ParseError(f"not a complete ntttcp JSON result: {exc}", source, line) from None
    if not isinstance(document, dict) or not ({"ntttcps", "ntttcpr"} & set(document)):
        raise ParseError("not an ntttcp JSON result (no ntttcps/ntttcpr object)", source, 1)
    role = "sender" if "ntttcps" in document else "receiver"
    body = document["ntttcps" if role == "sender" else "ntttcpr"]
    if not isinstance(body, dict):
        raise ParseError("ntttcp JSON result has no body", source, 1)
    rates = {
        item.get("metric"): item.get("value")
        for item in body.get("throughputs", [])
        if isinstance(item, dict)
    }
    threads = [_json_thread(t) for t in body.get("threads", []) if isinstance(t, dict)]
    totals = Totals(
        duration_s=number(_metric_value(body, "realTime")),
        bytes=_megabytes(_metric_value(body, "totalBytes"), 10**6),
        bits_per_second=_bps(rates.get("Bps"), rates.get("MB/s"), 10**6),
        retransmits=_int_of(str(body.get("packets_retransmitted", ""))),
        cycles_per_byte=number(_metric_value(body, "cycles")),
        busy_percent=number(_metric_value(body, "cpu")),
        # -V only: "tcpAverageRtt metric": "231 us" (the key holds the word), and one
        # "threads" entry per data thread
        rtt_us=_int_of(str(body.get("tcpAverageRtt metric", "")).split(" ")[0]),
        connections=len(threads) or None,
        threads=threads,
    )
    params = body.get("parameters")
    params = params if isinstance(params, dict) else {}
    totals.call_length_bytes = _file_call_length(params, role, xml=False)
    return ResultFile(role, _file_params(params, False), totals)


def _json_thread(item: dict[str, Any]) -> ThreadTotal:
    seconds = number(_metric_value(item, "realTime")) or 0.0
    rates = {r.get("metric"): str(r.get("value", "")) for r in item.get("throughputs", [])
             if isinstance(r, dict)}
    rate = (number(rates.get("KB/s", "")) or 0.0) * 1000 * 8
    return ThreadTotal(_int_of(str(item.get("index", ""))) or 0, seconds, rate,
                       round(rate / 8 * seconds))


def _metric_value(body: dict[str, Any], key: str) -> str:
    item = body.get(key)
    return str(item.get("value", "")) if isinstance(item, dict) else ""


def _megabytes(value: str | None, megabyte: int) -> int | None:
    found = number(value or "")
    return None if found is None else round(found * megabyte)


def _bps(bytes_per_second: str | None, megabytes_per_second: str | None = None,
         megabyte: int = 10**6) -> float | None:
    found = number(bytes_per_second or "")
    if found is not None:
        return found * 8
    found = number(megabytes_per_second or "")
    return None if found is None else found * megabyte * 8


def _file_params(raw: dict[str, Any], xml: bool) -> Params:
    def get(xml_key: str, json_key: str) -> str:
        return str(raw.get(xml_key if xml else json_key, ""))

    return Params(
        protocol="udp" if get("udp", "udp") == "True" else "tcp",
        ipv6=get("use_ipv6", "useIpv6") == "True",
        port=_int_of(get("port", "port")),
        duration_s=_int_of(get("run_time", "runTime")),
        warmup_s=_int_of(get("warmup_time", "warmupTime")),
    )


def _file_call_length(raw: dict[str, Any], role: str, xml: bool) -> int | None:
    """A result file's call length for its own role: a file holds both -b settings."""
    if role == "sender":
        return _positive(str(raw.get("send_socket_buff" if xml else "sendSocketBuff", "")))
    return _positive(str(raw.get("recv_socket_buff" if xml else "recvSocketBuff", "")))


def _positive(value: str) -> int | None:
    found = _int_of(value)
    return found if found is not None and found > 0 else None


# --- mapping into the schema --------------------------------------------------------


def merge(console: Totals | None, result_file: Totals | None) -> Totals:
    """One side's totals: the result file's more precise figures where it has them, the
    console's for the rest (JSON files lack the host CPU breakdown, for instance) and for
    the byte count, which the console prints exactly (a file rounds it to its MB)."""
    merged = Totals()
    for name in Totals.__dataclass_fields__:
        value = getattr(result_file, name) if result_file is not None else None
        if (value is None or value == []) and console is not None:
            value = getattr(console, name)
        if value is not None:
            setattr(merged, name, value)
    if console is not None and console.bytes is not None and result_file is not None:
        merged.bytes = console.bytes
        if result_file.megabyte != 10**6 and merged.duration_s:
            # that file's rate comes from its floored 2**20-byte MB: the exact one instead
            merged.bits_per_second = console.bytes * 8 / merged.duration_s
    return merged


def disagreement(console: Totals | None, result_file: Totals | None, role: str) -> str | None:
    """A warning when a console's exact byte count and its result file's differ by more
    than the file's rounding (one of its MB): a unit misread, or two different runs."""
    if console is None or result_file is None:
        return None
    if console.bytes is None or result_file.bytes is None:
        return None
    if abs(console.bytes - result_file.bytes) <= result_file.megabyte:
        return None
    return (f"ntttcp {role}: its console says {console.bytes:,} bytes, its result file "
            f"{result_file.bytes:,} (MB read as {result_file.megabyte:,} bytes); the "
            "console's exact count is used")


def host_cpu(totals: Totals) -> CpuUsage | None:
    """Host-wide CPU figures (percent of all cores, cycles per byte), or None if not
    printed (a ``-j`` file alone has the cycles per byte, not the breakdown)."""
    if totals.user_percent is None and totals.idle_percent is None:
        if totals.cycles_per_byte is None and totals.host_busy_percent is None:
            return None
        return CpuUsage(total_percent=totals.host_busy_percent,
                        cycles_per_byte=totals.cycles_per_byte)
    busy = None if totals.idle_percent is None else round(100.0 - totals.idle_percent, 2)
    return CpuUsage(
        user_percent=totals.user_percent,
        system_percent=totals.system_percent,
        total_percent=busy,
        softirq_percent=totals.softirq_percent,
        idle_percent=totals.idle_percent,
        cycles_per_byte=totals.cycles_per_byte,
    )


def side_summary(
    role: str, totals: Totals, protocol: str, warmup_s: float = 0.0
) -> SideSummary | None:
    """One process's totals as a SideSummary (None if its report was not read)."""
    if totals.bytes is None or totals.duration_s is None:
        return None
    rate = totals.bits_per_second
    if rate is None:
        rate = totals.bytes * 8 / totals.duration_s if totals.duration_s > 0 else 0.0
    process = None if totals.busy_percent is None else CpuUsage(total_percent=totals.busy_percent)
    host = host_cpu(totals)
    retrans = totals.retransmits if role == "sender" and protocol == "tcp" else None
    return SideSummary(
        role=role,
        start_s=warmup_s,
        end_s=round(warmup_s + totals.duration_s, 6),
        bytes=totals.bytes,
        bits_per_second=rate,
        retransmits=retrans,
        retransmits_scope="host" if retrans is not None else None,
        rtt_us=totals.rtt_us if role == "sender" else None,
        call_length_bytes=totals.call_length_bytes if protocol == "tcp" else None,
        cpu=Cpu(process=process, host=host) if process or host else None,
    )


def streams(sender: Totals | None, receiver: Totals | None, protocol: str,
            warmup_s: float = 0.0) -> tuple[StreamResult, ...]:
    """One stream per data thread (one connection each, as netprobe runs ntttcp), sender
    and receiver matched by thread index (sender thread i talks to receiver port base+i).
    Per-thread figures are only printed with -V or in result files."""
    found: dict[int, dict[str, SideSummary]] = {}
    for role, totals in (("sender", sender), ("receiver", receiver)):
        if totals is None:
            continue
        length = totals.call_length_bytes if protocol == "tcp" else None
        for thread in totals.threads:
            found.setdefault(thread.index, {})[role] = SideSummary(
                role=role, start_s=warmup_s, end_s=round(warmup_s + thread.duration_s, 6),
                bytes=thread.bytes, bits_per_second=thread.bits_per_second,
                call_length_bytes=length)
    if len(found) < 2:
        return ()  # one thread: its figures are the summary's
    return tuple(StreamResult(stream_id=index, direction="client_to_server",
                              sender=sides.get("sender"), receiver=sides.get("receiver"))
                 for index, sides in sorted(found.items()))


def failure_message(out: ConsoleOutput) -> str | None:
    """The tool's own error messages, if it printed any."""
    if out.errors:
        return "; ".join(out.errors)
    if out.usage_printed:
        return "ntttcp printed its usage text: it did not accept its arguments"
    return None


def guess_role(text: str, name: str) -> str | None:
    """The role of a console output: from what it printed, else from the file name."""
    out = parse_console(text)
    if out.role:
        return out.role
    for role in ("sender", "receiver"):
        if role in name.lower():
            return role
    if out.in_totals or out.report_complete:
        return "receiver"  # a sender would have reported its connections
    return None
