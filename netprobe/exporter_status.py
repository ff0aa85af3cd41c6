"""``/status?target=HOST&module=NAME``: what a watched agent has done, from its ``status``
reply, for Prometheus. No test runs and no traffic but the request itself flows, so a
status scrape takes no probe slot.

The target is resolved exactly as a ``/probe``'s is (the module's targets or the fleet
file's agents, the agents' port and secret from the configuration only): the exporter asks
nothing of a host its configuration does not name. The series are labelled ``module`` and
``target``:

* ``netprobe_agent_up``: 1 when the agent answered its status;
* ``netprobe_agent_tests_running``, ``netprobe_agent_slots``: its native slots in use, of;
* ``netprobe_iperf3_tests_total{outcome="served|refused|busy"}``: the stock iperf3 clients
  its ``--iperf3`` listener served, refused (ACL, limits, bad parameters) and told busy
  since it started (a counter: it restarts at 0 with the server, which ``rate()`` expects);
* ``netprobe_iperf3_tests_running``: iperf3 tests running now.

An agent without ``--iperf3`` gives no iperf3 series (absent, never 0); an agent that does
not answer gives ``netprobe_agent_up 0`` and ``netprobe_agent_status_failed_info{reason}``.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from netprobe.engine.protocol import DEFAULT_PORT as AGENT_PORT
from netprobe.exporter_config import ExporterConfig
from netprobe.exporter_probe import ProbeRefused, _fleet_agent, _target, module_and_target

STATUS_TIMEOUT_S = 5.0
"""Longest a status request waits for the agent (without a scrape timeout to go by)."""
OUTCOMES = ("served", "refused", "busy")
"""The iperf3 listener's counters, in the order they are exported."""
REASON_MAX_CHARS = 200


@attrs.frozen
class Watched:
    """An agent a /status may ask."""

    module: str
    target: str
    """As the scrape named it (the label)."""
    host: str
    port: int
    secret_file: str | None


def resolve_status(config: ExporterConfig, query: Mapping[str, list[str]]) -> Watched:
    """The agent ``query`` names, inside ``config`` (ProbeRefused if not)."""
    if not config.modules:
        raise ProbeRefused(403, "/status is off: start the exporter with --config FILE, whose "
                                "modules name the agents it may ask")
    asked = {key: values[-1] for key, values in query.items()}
    for key in asked:
        if key not in ("target", "module"):
            raise ProbeRefused(400, f"unknown /status parameter {key[:80]!r} (known: target, "
                                    "module)")
    name, module, target = module_and_target(config, asked, "/status")
    host, _port, secret_file, agent_port, far_end = _target(
        module, target, _fleet_agent(config, module, target))
    if not far_end:
        raise ProbeRefused(403, f"/status: module {name}'s targets run no netprobe agent "
                                "(agent = false)")
    return Watched(name, target, host, agent_port or AGENT_PORT, secret_file)


def ask(watched: Watched, timeout_s: float | None) -> tuple[dict[str, Any] | None, str | None]:
    """The agent's status reply, or None and why not."""
    from netprobe.engine.auth import load_secret
    from netprobe.errors import NetprobeError
    from netprobe.farend import agent_status

    try:
        secret = load_secret(watched.secret_file) if watched.secret_file else None
        return agent_status(watched.host, secret, watched.port,
                            timeout=timeout_s or STATUS_TIMEOUT_S), None
    except (NetprobeError, OSError) as exc:
        return None, str(exc)


def status_metrics(watched: Watched, reply: dict[str, Any] | None, error: str | None) -> bytes:
    """The text exposition of one agent's status (see the module's docstring)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    labels = {"module": watched.module, "target": watched.target}
    names, values = list(labels), list(labels.values())
    families: list[Any] = []

    def gauge(name: str, text: str, value: float) -> None:
        family = GaugeMetricFamily(name, text, labels=names)
        family.add_metric(values, value)
        families.append(family)

    gauge("netprobe_agent_up", "1 when the agent answered its status, else 0.",
          1 if reply is not None else 0)
    if reply is None:
        reason = " ".join((error or "no status").split())[:REASON_MAX_CHARS]
        failed = GaugeMetricFamily("netprobe_agent_status_failed_info",
                                   "Why the agent's status was not had (always 1).",
                                   labels=[*names, "reason"])
        failed.add_metric([*values, reason], 1)
        families.append(failed)
    else:
        running = reply.get("running")
        if isinstance(running, list):
            gauge("netprobe_agent_tests_running", "Native slots in use now.", len(running))
        if _count(reply.get("slots")) is not None:
            gauge("netprobe_agent_slots", "Native tests it serves at once.", reply["slots"])
        iperf3 = reply.get("iperf3")
        if isinstance(iperf3, dict):
            _iperf3(iperf3, names, values, families)
    registry = CollectorRegistry()
    registry.register(_Fixed(families))
    return generate_latest(registry)


def _iperf3(counts: dict[str, Any], names: list[str], values: list[str],
            families: list[Any]) -> None:
    """The iperf3 listener's series (a count the agent did not send is left out)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    tests = CounterMetricFamily("netprobe_iperf3_tests",
                                "Stock iperf3 clients served, refused and told busy since "
                                "the server started.", labels=[*names, "outcome"])
    for outcome in OUTCOMES:
        value = _count(counts.get(outcome))
        if value is not None:
            tests.add_metric([*values, outcome], value)
    families.append(tests)
    running = _count(counts.get("running"))
    if running is not None:
        gauge = GaugeMetricFamily("netprobe_iperf3_tests_running",
                                  "iperf3 tests running now.", labels=names)
        gauge.add_metric(values, running)
        families.append(gauge)


def _count(value: Any) -> int | None:
    """A count from the agent's reply (foreign data): a non-negative int, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


class _Fixed:
    """A collector of families already built."""

    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> Any:
        """The families."""
        return iter(self.families)
