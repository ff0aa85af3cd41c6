"""``netprobe exporter``: netprobe's figures for Prometheus (prometheus_client, the
``[exporter]`` extra).

``/probe?target=HOST&module=M&duration=S&...`` runs one test to HOST and answers with
that test's figures, as blackbox_exporter does, but only within the exporter's
configuration (:mod:`netprobe.exporter_config`): a module names the tool, the targets,
the caps, the agents' port and secret; without a configuration ``/probe`` refuses (403).
The test runs in a child process that is killed the moment its scraper hangs up.
``/status?target=HOST&module=M`` asks such a target's agent for its counters (the iperf3
listener's served, refused and busy: :mod:`netprobe.exporter_status`), running no test.
``/metrics`` serves the newest figures of a fleet archive (:mod:`netprobe.exporter_fleet`):
per host, per reference host and the fleet's health by default, per pair only when the
configuration asks, capped. A probe that failed still gives ``netprobe_up 0``, never a gap.

The HTTP server serves a bounded number of connections at once (more are closed
unanswered), closes a connection idle for the configured time, and backs off when the
process is out of file descriptors rather than spinning on the listening socket.

Names follow Prometheus's conventions: a ``netprobe_`` prefix, base units in the name
(``_bits_per_second``, ``_bytes``, ``_seconds``), labels for what varies (tool, target;
group, agent, role in a fleet; source, target for its opt-in per-pair series).
"""
from __future__ import annotations

import contextlib
import errno
import socket
import sys
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional
from urllib.parse import parse_qs, urlsplit

import attrs

from netprobe.engine.auth import read_credential
from netprobe.errors import NetprobeError, SpecError, listen_error
from netprobe.exporter_config import NO_CONFIG, ExporterConfig
from netprobe.exporter_fleet import GAUGES, FleetCollector, values
from netprobe.exporter_probe import Probe, ProbeRefused, ScraperGone, hung_up, resolve, run_watched
from netprobe.schema import Result

DEFAULT_PORT = 9531
"""Where the exporter listens by default (any free port will do; say it in the scrape job)."""
QUEUE_WAIT_S = 60.0
"""Longest a /probe waits for the one before it (without a scrape timeout to go by)."""
ACCEPT_BACKOFF_S = 0.2
"""Pause after an accept() that failed for want of descriptors: the listening socket stays
readable, and retrying at once would spin a CPU until a connection closes."""

REASON_MAX_CHARS = 200
"""Longest failure reason put in a label (the log line has it whole)."""


# --- /probe -------------------------------------------------------------------------------

Runner = Callable[[Probe, Optional[socket.socket]], Result]
"""Runs a probe's test, watching its scraper's connection (see :func:`run_watched`)."""


def probe_metrics(probe: Probe, result: Result | None, error: str | None,
                  seconds: float, target: str) -> bytes:
    """The text exposition of one probe: ``netprobe_up``, how long it took, the figures
    it measured, and for a failed one ``netprobe_probe_failed_info`` with the reason."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    registry = CollectorRegistry()
    labels = {"module": probe.module, "tool": probe.spec.tool,
              "protocol": probe.spec.protocol, "target": target}
    up = result is not None and result.status == "ok" and error is None
    Gauge("netprobe_up", "1 when the test completed, else 0.", list(labels),
          registry=registry).labels(**labels).set(1 if up else 0)
    Gauge("netprobe_probe_duration_seconds", "How long the probe took.", list(labels),
          registry=registry).labels(**labels).set(seconds)
    if not up:
        said = error or ("; ".join(result.errors) if result else "")
        reason = " ".join((said or "the test did not complete").split())[:REASON_MAX_CHARS]
        Gauge("netprobe_probe_failed_info", "Why the probe failed (always 1).",
              [*labels, "reason"], registry=registry).labels(**labels, reason=reason).set(1)
    for name, value in values(result if up else None).items():
        help_text = next(text for gauge, text, _, _ in GAUGES if gauge == name)
        Gauge(f"netprobe_{name}", help_text, list(labels),
              registry=registry).labels(**labels).set(value)
    return generate_latest(registry)


# --- the HTTP server --------------------------------------------------------------------


@attrs.define
class Exporter:
    """The exporter's HTTP server (``serve_forever`` it; ``shutdown`` it)."""

    address: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    archive_url: str | None = None
    config: ExporterConfig = NO_CONFIG
    runner: Runner = run_watched
    log: Callable[[str], None] = lambda _line: None
    """Where a line about a refused or failed probe goes (the CLI prints it)."""
    server: ThreadingHTTPServer | None = None
    _probes: threading.Semaphore = attrs.field(factory=lambda: threading.Semaphore(1))
    _credentials: tuple[bytes | None, bytes | None] = (None, None)
    _fleet: FleetCollector | None = None

    def start(self) -> int:
        """Read the credentials, bind; the port listened on."""
        self._credentials = _credentials(self.config)
        exporter = self

        class Handler(_Handler):
            owner = exporter
            timeout = exporter.config.idle_timeout_s  # per read: idle clients are let go

        class Server(_BoundedServer):
            address_family = _listen_family(exporter.address, exporter.port)
            max_connections = exporter.config.max_connections

            def report(self, line: str) -> None:
                exporter.log(line)

        try:
            self.server = Server((self.address, self.port), Handler)
        except OSError as exc:
            raise listen_error("--listen", self.address, self.port, exc) from None
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        return self.port

    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header passes (always, when none is configured)."""
        import hmac

        token, basic = self._credentials
        if token is None and basic is None:
            return True
        scheme, _, value = (header or "").partition(" ")
        value = value.strip()
        if token is not None and scheme.lower() == "bearer":
            return hmac.compare_digest(value.encode(), token)
        if basic is not None and scheme.lower() == "basic":
            import base64
            import binascii

            try:
                given = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                return False
            return hmac.compare_digest(given, basic)
        return False

    def metrics(self) -> bytes:
        """The /metrics page: the archive's fleet figures."""
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry()
        if self.archive_url:
            registry.register(self._fleet_collector(self.archive_url))
        return generate_latest(registry)

    def _fleet_collector(self, url: str) -> FleetCollector:
        """The one collector of the fleet's series (it remembers what it last logged)."""
        if self._fleet is None:
            from netprobe.archives import open_archive

            self._fleet = FleetCollector(lambda: open_archive(url), self.config.metrics,
                                         self.config.references, self.log)
        return self._fleet

    def probe(self, query: Mapping[str, list[str]], scrape_timeout_s: float | None,
              client: socket.socket | None = None) -> bytes:
        """The /probe page: one test, one at a time (two would share the link); a probe
        whose scraper hangs up, waiting or running, is dropped (ScraperGone)."""
        started = time.monotonic()
        target = (query.get("target") or [""])[0]
        probe = resolve(self.config, query, scrape_timeout_s)
        self._wait_turn(client, started + (scrape_timeout_s or QUEUE_WAIT_S))
        try:
            try:
                result: Result | None = self.runner(probe, client)
                error = None
            except ScraperGone:
                raise
            except NetprobeError as exc:
                result, error = None, str(exc)
        finally:
            self._probes.release()
        if error is not None:
            self.log(f"probe of {target} (module {probe.module}) failed: {error}")
        body = probe_metrics(probe, result, error, time.monotonic() - started, target)
        if (query.get("debug") or [""])[-1].lower() == "true":  # as blackbox_exporter's
            said = f"probe failed: {error}" if error else "probe done"
            body = (f"{said}\nmodule {probe.module}: {probe.spec}\n\nmetrics:\n"
                    ).encode() + body
        return body

    def status(self, query: Mapping[str, list[str]], scrape_timeout_s: float | None) -> bytes:
        """The /status page: a watched agent's counters (its iperf3 listener's among them);
        no test, so no probe slot (see :mod:`netprobe.exporter_status`)."""
        from netprobe.exporter_status import ask, resolve_status, status_metrics

        watched = resolve_status(self.config, query)
        timeout = None if scrape_timeout_s is None else max(scrape_timeout_s - 0.5, 0.5)
        reply, error = ask(watched, timeout)
        if error is not None:
            self.log(f"status of {watched.target} (module {watched.module}) failed: {error}")
        return status_metrics(watched, reply, error)

    def _wait_turn(self, client: socket.socket | None, deadline: float) -> None:
        """Take the probe slot; ScraperGone if the scraper leaves first, ProbeRefused
        (503) if the deadline passes first."""
        while not self._probes.acquire(timeout=0.25):
            if client is not None and hung_up(client):
                raise ScraperGone("the scraper hung up while its probe waited")
            if time.monotonic() > deadline:
                raise ProbeRefused(503, "/probe: another probe is still running")
        if client is not None and hung_up(client):  # left just as its turn came
            self._probes.release()
            raise ScraperGone("the scraper hung up while its probe waited")


def _credentials(config: ExporterConfig) -> tuple[bytes | None, bytes | None]:
    """(bearer token, ``user:password``) as the configuration names them."""
    token = None if config.bearer_token_file is None else read_credential(
        config.bearer_token_file, "bearer token")
    basic = None
    if config.basic_user and config.basic_password_file:
        password = read_credential(config.basic_password_file, "basic auth password")
        basic = config.basic_user.encode() + b":" + password
    return token, basic


class _BoundedServer(ThreadingHTTPServer):
    """A threading HTTP server that serves at most ``max_connections`` at once and does
    not spin when accept() runs out of descriptors."""

    max_connections = 32
    _active = 0
    _lock = threading.Lock()

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                time.sleep(ACCEPT_BACKOFF_S)
            raise

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self._lock:
            if self._active >= self.max_connections:
                return False  # closed unanswered: a bounded server, not a queue
            self._active += 1
        return True

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._active -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up or went idle is its own doing: nothing is said. Anything
        else is one line through :meth:`report`, never socketserver's traceback on stderr:
        that was one traceback per hung-up client, and once stderr's pipe was full every
        handler blocked in it, holding its connection slot, until none was left."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)) or (
                isinstance(exc, OSError) and exc.errno in _CLIENT_GONE):
            return
        self.report(f"request from {client_address[0]} failed: "
                    f"{type(exc).__name__}: {exc}")

    def report(self, line: str) -> None:
        """Where a line about a failed request goes (the exporter's log)."""


_CLIENT_GONE = (errno.ENOTCONN, errno.EPIPE, errno.ECONNRESET, errno.ECONNABORTED)
"""What a read or write on a socket the client (or the watchdog) shut down fails with."""


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


LANDING = (b"<html><head><title>netprobe exporter</title></head><body>"
           b"<h1>netprobe exporter</h1><p><a href='/metrics'>/metrics</a>: the fleet "
           b"archive's latest figures.</p><p>/probe?target=HOST&amp;module=NAME: one test, "
           b"to a target the exporter's configuration names.</p><p>/status?target=HOST&amp;"
           b"module=NAME: that agent's counters (its iperf3 listener's).</p></body></html>\n")


class _Handler(BaseHTTPRequestHandler):
    owner: Exporter
    _watchdog: threading.Timer | None = None

    def setup(self) -> None:
        """The socket's timeout bounds each read; this bounds the whole request: a client
        that sends its request a byte at a time, each inside the idle timeout, is cut off
        when the idle timeout has passed since it connected."""
        super().setup()
        self._watchdog = threading.Timer(self.timeout or 10.0, self._cut_off)
        self._watchdog.daemon = True
        self._watchdog.start()

    def _cut_off(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # the request line and the headers are read
        if self._watchdog is not None:
            self._watchdog.cancel()
        return parsed

    def finish(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        super().finish()

    def do_GET(self) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST

        parts = urlsplit(self.path)
        if not self.owner.authorized(self.headers.get("Authorization")):
            self._reply(401, b"netprobe exporter: authentication required\n", "text/plain",
                        {"WWW-Authenticate": 'Basic realm="netprobe"'})
            return
        try:
            if parts.path == "/metrics":
                body = self.owner.metrics()
            elif parts.path == "/probe":
                body = self.owner.probe(parse_qs(parts.query, keep_blank_values=True),
                                        _timeout(self.headers), self.connection)
            elif parts.path == "/status":
                body = self.owner.status(parse_qs(parts.query, keep_blank_values=True),
                                         _timeout(self.headers))
            elif parts.path == "/":
                self._reply(200, LANDING, "text/html; charset=utf-8")
                return
            else:
                self._reply(404, b"netprobe exporter: /probe?target=HOST or /metrics\n",
                            "text/plain")
                return
        except ScraperGone as exc:
            self.owner.log(f"{exc}")
            self.close_connection = True
            return
        except ProbeRefused as exc:
            self.owner.log(f"{parts.path} refused ({exc.status}): {exc}")
            self._reply(exc.status, f"{exc}\n".encode(), "text/plain")
            return
        except SpecError as exc:
            self._reply(400, f"{exc}\n".encode(), "text/plain")
            return
        except NetprobeError as exc:  # the archive: a scrape error Prometheus shows
            self._reply(500, f"{exc}\n".encode(), "text/plain")
            return
        debug = parts.path == "/probe" and "debug=true" in parts.query.lower()
        self._reply(200, body, "text/plain; charset=utf-8" if debug else CONTENT_TYPE_LATEST)

    def _reply(self, code: int, body: bytes, kind: str,
               headers: Mapping[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the exporter does not print (the CLI may log)."""


def _timeout(headers: Any) -> float | None:
    value = headers.get("X-Prometheus-Scrape-Timeout-Seconds")
    try:
        found = float(value) if value else None
    except ValueError:
        return None
    return found if found is not None and 0 < found < 86_400 else None
