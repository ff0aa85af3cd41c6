"""``--tool native``: netprobe's own engine (C data path via cffi, Python control).

Without a host it starts an embedded server on loopback for the duration of the test:
the self-test that works on any machine with nothing else installed or running.
"""

from __future__ import annotations

import attrs

from netprobe.engine.capabilities import NATIVE_CAPABILITIES, native_refusals
from netprobe.errors import TestFailed
from netprobe.plugin import Availability, Reporter, Tool
from netprobe.reporting import RelayReporter
from netprobe.schema import Result, TestSpec
from netprobe.version import __version__


class NativeTool(Tool):
    """netprobe's own TCP/UDP engine."""

    name = "native"
    description = "netprobe's own engine: C data path, one port for control and data"
    capabilities = NATIVE_CAPABILITIES
    udp_batched_send = True  # whole GSO messages by sendmmsg (docs/performance.md)
    overhead_s = 0.1  # the in-process server and the control handshake (loopback: 0.05-0.1)
    modes = frozenset({"iperf3"})  # --iperf3: the far end is a stock `iperf3 -s`

    def probe(self) -> Availability:
        """Always available: the pure-Python data path stands in for the compiled one."""
        try:
            from netprobe import core
        except ImportError as exc:  # a broken install, not a missing compiler
            return Availability(False, __version__, (f"core module failed to load: {exc}",))
        detail = (
            "data path: C (compiled core)"
            if core.DATA_PATH == "c"
            else ("data path: pure Python (compiled core not available; slower)")
        )
        return Availability(True, __version__, details=(detail,))

    def refusals(self, spec: TestSpec) -> list[str]:
        """The engine's own refusals: the same the netprobe server applies to a request."""
        found = native_refusals(spec)
        if self.options.get("iperf3"):
            if not spec.host:
                found.append("--iperf3 needs HOST: the stock iperf3 server to test against")
            if spec.protocol == "udp" and spec.omit_s:
                found.append("--iperf3: -O is not supported with UDP")
        if self.options.get("udp_counters_64bit") and not (
                self.options.get("iperf3") and spec.protocol == "udp"):
            found.append("--udp-counters-64bit is iperf3's UDP option: with --iperf3 -u")
        return found

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        """Run against ``spec.host``'s netprobe server, or an embedded one on loopback.

        The engine's events arise on its sampler and control threads: a RelayReporter
        hands them to ``reporter`` from one thread (the Reporter contract)."""
        self.check(spec)  # refused here too, not only by the CLI: a plugin host may call run()
        relay = RelayReporter(reporter)
        try:
            with relay:
                result = self._run(spec, relay)
        except TestFailed as exc:
            if isinstance(exc.partial, Result):
                exc.partial = _warned(exc.partial, relay.warnings)
            raise
        return _warned(result, relay.warnings)

    def _run(self, spec: TestSpec, reporter: Reporter) -> Result:
        from netprobe.engine.auth import load_secret
        from netprobe.engine.client import run_test

        if spec.host and self.options.get("iperf3"):
            from netprobe.engine.iperf3.client import run_iperf3_test

            return run_iperf3_test(spec, reporter, spec.host, self.options.get("iperf3_auth"),
                                   udp64=bool(self.options.get("udp_counters_64bit")),
                                   probe_hz=self.options.get("iperf3_latency_hz"))
        if spec.host:
            # "secret": the secret itself, from whoever holds it (an agent's own, as the
            # client of a third-party test); else the file, else $NETPROBE_SECRET.
            secret = self.options.get("secret") or load_secret(self.options.get("secret_file"))
            return run_test(spec, reporter, spec.host, secret)
        return self._self_test(spec, reporter)

    def _self_test(self, spec: TestSpec, reporter: Reporter) -> Result:
        from netprobe.engine.client import run_test
        from netprobe.engine.server import Server, ServerConfig

        loopback = "::1" if spec.ip_version == 6 else "127.0.0.1"
        server = Server(ServerConfig(bind_address=loopback, port=spec.port or 0, max_tests=1))
        try:
            port = server.start()
        except OSError as exc:
            raise TestFailed(f"cannot start the embedded server on {loopback}: {exc}") from None
        reporter.note(f"embedded server on {loopback} port {port}")
        try:
            return run_test(_with_port(spec, port), reporter, loopback)
        finally:
            server.close()


def _warned(result: Result, warnings: list[str]) -> Result:
    return attrs.evolve(result, warnings=(*result.warnings, *warnings)) if warnings else result


def _with_port(spec: TestSpec, port: int) -> TestSpec:
    return attrs.evolve(spec, port=port)
