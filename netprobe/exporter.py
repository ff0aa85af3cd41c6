"""``netprobe exporter``: netprobe's figures for Prometheus (prometheus_client, the
``[exporter]`` extra).

``/probe?target=HOST&tool=T&duration=S&...`` runs one test to HOST (through its agent,
like any ``netprobe run``) and answers with that test's figures, as blackbox_exporter
does; ``from=AGENT`` makes it a third-party test from that agent. ``/metrics`` serves the
newest figures of every fleet pair from an archive. A test that failed, or a pair that was
unreachable, still gives every series: ``netprobe_up 0`` and zeros, never a gap.

Names follow Prometheus's conventions: a ``netprobe_`` prefix, base units in the name
(``_bits_per_second``, ``_bytes``, ``_seconds``), labels for what varies (tool, target;
group, source, target in a fleet).
"""
from __future__ import annotations

import socket
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional
from urllib.parse import parse_qs, urlsplit

import attrs

from netprobe.archives import Record, figures
from netprobe.errors import NetprobeError, SpecError, listen_error
from netprobe.schema import Result, TestSpec

DEFAULT_PORT = 9531
"""Where the exporter listens by default (any free port will do; say it in the scrape job)."""
MAX_PROBE_S = 60.0
"""Longest test a /probe may ask for."""
SCRAPE_MARGIN_S = 1.5
"""Kept free of Prometheus's scrape timeout for the test's start and the answer."""

# (name, help, netprobe's figure, scale to the base unit) for each per-test gauge.
GAUGES = (
    ("receiver_bits_per_second", "What arrived, in bits per second.",
     "receiver_bits_per_second", 1),
    ("sender_bits_per_second", "What was sent, in bits per second.", "sender_bits_per_second", 1),
    ("received_bytes", "Bytes that arrived during the test.", "bytes", 1),
    ("retransmits", "TCP retransmits of the test's sender.", "retransmits", 1),
    ("rtt_seconds", "Smoothed TCP round-trip time at the sender.", "rtt_us", 1e-6),
    ("lost_packets", "UDP datagrams lost.", "lost_packets", 1),
    ("jitter_seconds", "UDP jitter at the receiver.", "jitter_ms", 1e-3),
)


def _values(result: Optional[Result]) -> dict[str, float]:
    """Each gauge's value for a result: 0 for what is unknown or when there is no result."""
    found = figures(result)
    return {name: float(found[key] or 0) * scale for name, _, key, scale in GAUGES}


# --- /probe -------------------------------------------------------------------------------

_PROBE_FIELDS = {"tool": str, "protocol": str, "direction": str, "streams": int,
                 "duration": float, "omit": float, "port": int, "rate": float}
_SPEC_NAMES = {"duration": "duration_s", "omit": "omit_s", "rate": "rate_bits_per_second"}


def probe_spec(query: Mapping[str, list[str]], default_tool: str,
               scrape_timeout_s: Optional[float]) -> TestSpec:
    """The TestSpec a /probe query asks for (SpecError for a bad parameter)."""
    target = (query.get("target") or [""])[0].strip()
    if not target:
        raise SpecError("/probe needs a target: /probe?target=HOST")
    fields: dict[str, Any] = {"tool": default_tool, "duration_s": 5.0}
    for key, values in query.items():
        if key in ("target", "from"):
            continue
        kind = _PROBE_FIELDS.get(key)
        if kind is None:
            raise SpecError(f"unknown /probe parameter {key!r} "
                            f"(known: target, from, {', '.join(_PROBE_FIELDS)})")
        try:
            fields[_SPEC_NAMES.get(key, key)] = kind(values[-1])
        except ValueError:
            raise SpecError(f"/probe parameter {key}: not a {kind.__name__}: "
                            f"{values[-1]!r}") from None
    if fields.get("protocol") == "udp":
        fields.setdefault("rate_bits_per_second", 1_000_000)  # as `netprobe run -u`
    limit = MAX_PROBE_S if scrape_timeout_s is None else min(
        MAX_PROBE_S, scrape_timeout_s - SCRAPE_MARGIN_S)
    if fields["duration_s"] + fields.get("omit_s", 0.0) > limit:
        raise SpecError(f"the test ({fields['duration_s']:g} s) would not end within "
                        f"{limit:g} s (scrape timeout and the exporter's limit)")
    return TestSpec(host=target, **fields)


Runner = Callable[[TestSpec, Optional[str]], Result]


def run_probe(spec: TestSpec, source: Optional[str]) -> Result:
    """Run the probe's test through the one run pipeline (from ``source``'s agent if given)."""
    from netprobe.plugin import NullReporter, load_registry
    from netprobe.session import run_spec

    tool = load_registry(only=spec.tool).get(spec.tool)()
    return run_spec(tool, spec, NullReporter(), from_host=source)


def probe_metrics(spec: Optional[TestSpec], result: Optional[Result], error: Optional[str],
                  seconds: float, target: str) -> bytes:
    """The text exposition of one probe: every series, zeros when the test failed."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    registry = CollectorRegistry()
    tool = spec.tool if spec else ""
    labels = {"tool": tool, "target": target}
    up = result is not None and result.status == "ok" and error is None
    Gauge("netprobe_up", "1 when the test completed, else 0.", list(labels),
          registry=registry).labels(**labels).set(1 if up else 0)
    Gauge("netprobe_probe_duration_seconds", "How long the probe took.", list(labels),
          registry=registry).labels(**labels).set(seconds)
    values = _values(result if up else None)
    for name, help_text, _, _ in GAUGES:
        Gauge(f"netprobe_{name}", help_text, list(labels),
              registry=registry).labels(**labels).set(values[name])
    return generate_latest(registry)


# --- /metrics -----------------------------------------------------------------------------


class FleetCollector:
    """The newest record of every fleet pair in an archive, read at each scrape."""

    def __init__(self, open_archive: Callable[[], Any]) -> None:
        self.open_archive = open_archive

    def collect(self) -> Iterator[Any]:
        """Gauges labelled by group, source, target and tool; zeros where not ok."""
        from prometheus_client.core import GaugeMetricFamily

        with self.open_archive() as archive:
            latest: list[Record] = archive.latest()
            skipped = len(getattr(archive, "warnings", []))
        names = ("group", "source", "target", "tool")
        up = GaugeMetricFamily("netprobe_fleet_up", "1 when the pair's latest test was ok.",
                               labels=names)
        when = GaugeMetricFamily("netprobe_fleet_test_timestamp_seconds",
                                 "When the pair's latest test started (Unix time).",
                                 labels=names)
        gauges = {name: GaugeMetricFamily(f"netprobe_fleet_{name}", text, labels=names)
                  for name, text, _, _ in GAUGES}
        for record in latest:
            ok = record.outcome == "ok"
            labels = [record.group, record.source, record.target,
                      figures(record.result)["tool"] or ""]
            up.add_metric(labels, 1 if ok else 0)
            when.add_metric(labels, _unix(record.time))
            for name, value in _values(record.result if ok else None).items():
                gauges[name].add_metric(labels, value)
        bad = GaugeMetricFamily("netprobe_fleet_archive_skipped_rows",
                                "Archive rows left out at this scrape: not JSON, or not a "
                                "result (netprobe fleet matrix names them).")
        bad.add_metric([], skipped)
        yield up
        yield when
        yield from gauges.values()
        yield bad


def _unix(text: str) -> float:
    import datetime

    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# --- the HTTP server --------------------------------------------------------------------


@attrs.define
class Exporter:
    """The exporter's HTTP server (``serve_forever`` it; ``shutdown`` it)."""

    address: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    archive_url: Optional[str] = None
    tool: str = "native"
    runner: Runner = run_probe
    server: Optional[ThreadingHTTPServer] = None
    _probes: threading.Semaphore = attrs.field(factory=lambda: threading.Semaphore(1))

    def start(self) -> int:
        """Bind; the port listened on."""
        exporter = self

        class Handler(_Handler):
            owner = exporter

        class Server(ThreadingHTTPServer):
            address_family = _listen_family(exporter.address, exporter.port)

        try:
            self.server = Server((self.address, self.port), Handler)
        except OSError as exc:
            raise listen_error("--listen", self.address, self.port, exc) from None
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        return self.port

    def metrics(self) -> bytes:
        """The /metrics page: the archive's fleet figures."""
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry()
        if self.archive_url:
            from netprobe.archives import open_archive

            url = self.archive_url
            registry.register(FleetCollector(lambda: open_archive(url)))
        return generate_latest(registry)

    def probe(self, query: Mapping[str, list[str]], scrape_timeout_s: Optional[float]
              ) -> bytes:
        """The /probe page: one test, one at a time (two would share the link)."""
        import time

        started = time.monotonic()
        target = (query.get("target") or [""])[0]
        spec = probe_spec(query, self.tool, scrape_timeout_s)
        sources = query.get("from")
        source = sources[-1] if sources else None
        with self._probes:
            try:
                result: Optional[Result] = self.runner(spec, source)
                error = None
            except NetprobeError as exc:
                result, error = None, str(exc)
        return probe_metrics(spec, result, error, time.monotonic() - started, target)


def _listen_family(address: str, port: int) -> int:
    """The address family to listen on ``address`` with (IPv6 for ``::1``; the HTTP
    server's own default is IPv4 whatever the address); SpecError naming ``--listen``
    when ``address`` is neither an address nor a name this host resolves."""
    try:
        found = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise listen_error("--listen", address, port, exc) from None
    return int(found[0][0])


class _Handler(BaseHTTPRequestHandler):
    owner: Exporter

    def do_GET(self) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST

        parts = urlsplit(self.path)
        try:
            if parts.path == "/metrics":
                body = self.owner.metrics()
            elif parts.path == "/probe":
                body = self.owner.probe(parse_qs(parts.query), _timeout(self.headers))
            else:
                self._reply(404, b"netprobe exporter: /probe?target=HOST or /metrics\n",
                            "text/plain")
                return
        except SpecError as exc:
            self._reply(400, f"{exc}\n".encode(), "text/plain")
            return
        except NetprobeError as exc:  # the archive: a scrape error Prometheus shows
            self._reply(500, f"{exc}\n".encode(), "text/plain")
            return
        self._reply(200, body, CONTENT_TYPE_LATEST)

    def _reply(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the exporter does not print (the CLI may log)."""


def _timeout(headers: Any) -> Optional[float]:
    value = headers.get("X-Prometheus-Scrape-Timeout-Seconds")
    try:
        return float(value) if value else None
    except ValueError:
        return None
