"""The exporter's configuration file (TOML): what ``/probe`` may test, and how hard.

Without it ``/probe`` refuses every request: an exporter must not be a traffic generator
that anyone who reaches it can aim anywhere. As blackbox_exporter's modules do, each
module fixes the tool, the agents' port and secret, the targets it may test and the caps
on what a scrape may ask::

    [exporter]
    fleet = "/etc/netprobe/fleet.toml"     # its agents may be targets (optional)
    bearer_token_file = "/etc/netprobe/exporter-token"    # optional
    basic_auth = { user = "prometheus", password_file = "/etc/netprobe/exporter-pw" }
    idle_timeout = "10s"       # a connection that sends nothing for this long is closed
    max_connections = 32       # more are closed at once, unanswered

    [modules.default]          # /probe?target=...&module=default (the default module)
    tool = "native"
    protocol = "tcp"           # tcp | udp
    targets = ["192.0.2.10", "lon"]   # addresses, or names of the fleet's agents
    fleet_agents = true        # any agent of the fleet file, by name or address
    sources = ["ams"]          # agents a /probe may name in from= (default: none)
    port = 5201                # the tool's server port at a listed target (optional)
    agent_port = 5201          # the agents' port at a listed target (optional)
    secret_file = "/etc/netprobe/secret"   # the agents' secret at a listed target
    agent = true               # false: listed targets run the tool's own server (port)
    duration = "5s"            # when a /probe names none
    max_duration = "10s"
    rate = 1_000_000           # bits/s when a /probe names none (UDP: always paced)
    max_rate = 100_000_000     # bits/s
    max_streams = 4

    [metrics]                  # what /metrics exports (docs/exporter.md)
    pair_series = false        # true: per-pair series too (small fleets: N^2 of them)
    max_pair_series = 1000     # pairs exported at most; the rest counted, not exported

A target that is a fleet agent is tested on that agent's port, with that agent's secret
(the fleet file's); a scrape can pass neither. Every mistake is one line naming the key.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from netprobe.fleet.config import (
    Agent,
    FleetFileError,
    _keys,
    _opt_str,
    _port,
    _seconds,
    _table,
    read_toml,
)
from netprobe.schema import PROTOCOLS

DEFAULT_MODULE = "default"
"""The module of a /probe that names none."""
DEFAULT_MAX_DURATION_S = 10.0
DEFAULT_MAX_RATE = 100_000_000.0
"""A module's rate cap (bits/s) when it sets none: a forgotten cap floods no link."""
DEFAULT_IDLE_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 32
DEFAULT_MAX_PAIR_SERIES = 1000
"""Pairs given per-pair series at most when they are asked for: about 7,000 series."""
MAX_PAIR_SERIES_LIMIT = 1_000_000


class ExporterConfigError(FleetFileError):
    """The exporter's configuration cannot be used; the message names the file and key."""


@attrs.frozen
class Module:
    """What one kind of /probe may do."""

    name: str
    """The module's name (``/probe?module=NAME``)."""
    tool: str = "native"
    """The only tool it runs."""
    protocol: str = "tcp"
    """tcp or udp."""
    targets: tuple[str, ...] = ()
    """Hosts it may test besides the fleet's agents (exact names or addresses)."""
    fleet_agents: bool = False
    """Any agent of the fleet file may be a target too."""
    sources: tuple[str, ...] = ()
    """Fleet agents a /probe may run a third-party test from (``from=``)."""
    port: int | None = None
    """The tool's server port at a listed target (None: the tool's own)."""
    agent_port: int | None = None
    """The agents' port at a listed target (None: netprobe's, or ``port`` for native)."""
    secret_file: str | None = None
    """The agents' secret at a listed target."""
    agent: bool = True
    """Listed targets run a netprobe agent (False: the tool's own server, on ``port``)."""
    duration_s: float = 5.0
    """A /probe's length when it names none."""
    max_duration_s: float = DEFAULT_MAX_DURATION_S
    """The longest a /probe may ask for (omit included)."""
    rate: float | None = None
    """Bits/s when a /probe names none (None: unpaced TCP; UDP gets 1 Mbit/s)."""
    max_rate: float = DEFAULT_MAX_RATE
    """The highest rate a /probe may ask for, bits/s."""
    max_streams: int = 4
    """The most parallel streams a /probe may ask for."""


@attrs.frozen
class MetricsOptions:
    """What /metrics exports beyond its per-host, per-reference and health series."""

    pair_series: bool = False
    """Export per-pair series (group, source, target, tool) too: N(N-1) pairs in a mesh,
    so off by default."""
    max_pair_series: int = DEFAULT_MAX_PAIR_SERIES
    """Most pairs given per-pair series; beyond it the failed pairs are kept first, then
    the lowest throughput, and the rest counted."""


@attrs.frozen
class ExporterConfig:
    """The whole configuration, checked."""

    path: str
    """Where it was read from."""
    modules: Mapping[str, Module]
    """Modules by name."""
    agents: Mapping[str, Agent] = attrs.field(factory=dict)
    """The fleet file's agents by name (empty without one)."""
    bearer_token_file: str | None = None
    """A file holding the token every request must bring (``Authorization: Bearer``)."""
    basic_user: str | None = None
    """The user of HTTP basic authentication (None: none)."""
    basic_password_file: str | None = None
    """The file holding that user's password."""
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    """A connection that sends nothing for this long is closed."""
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Connections served at once; more are closed unanswered."""
    metrics: MetricsOptions = MetricsOptions()
    """What /metrics exports."""
    references: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    """The fleet file's reference hosts by group (groups of a reference design)."""


NO_CONFIG = ExporterConfig("<none>", {})
"""No configuration: /metrics only, /probe refuses everything."""


def load(path: str) -> ExporterConfig:
    """Read and check the configuration at ``path`` (ExporterConfigError, one line)."""
    try:
        # Read as the fleet file is: a FIFO or device refused at once, size and nesting
        # bounded before the parser sees it.
        data = read_toml(path, "an exporter configuration")
    except FleetFileError as exc:
        raise ExporterConfigError(str(exc)) from None
    try:
        return parse(data, path)
    except ExporterConfigError:
        raise
    except FleetFileError as exc:  # the shared checks' errors, or the fleet file's
        raise ExporterConfigError(str(exc)) from None


_HEAD_KEYS = {"fleet", "bearer_token_file", "basic_auth", "idle_timeout", "max_connections"}


def parse(data: Mapping[str, Any], path: str = "<exporter>") -> ExporterConfig:
    """An ExporterConfig from the parsed TOML of a configuration file."""
    _keys(data, "", {"exporter", "modules", "metrics"}, path)
    head = _table(data.get("exporter", {}), "exporter", path)
    _keys(head, "exporter", _HEAD_KEYS, path)
    agents: Mapping[str, Agent] = {}
    references: dict[str, tuple[str, ...]] = {}
    fleet_path = _opt_str(head, "fleet", "exporter", path)
    if fleet_path:
        from netprobe.fleet.config import load as load_fleet

        fleet = load_fleet(fleet_path)
        agents = fleet.agents
        references = reference_hosts(fleet.groups)
    metrics = _metrics(data.get("metrics", {}), path)
    user, password_file = _basic_auth(head.get("basic_auth"), path)
    if "modules" not in data and "metrics" in data:
        modules_table: Mapping[str, Any] = {}  # /metrics settings only: /probe stays off
    else:
        modules_table = _table(data.get("modules"), "modules", path)
    modules = {name: _module(name, _table(body, f"modules.{name}", path), agents, path)
               for name, body in modules_table.items()}
    if not modules and "modules" in data:
        raise ExporterConfigError(f"{path}: modules: no modules: /probe would test nothing")
    return ExporterConfig(
        path, modules, agents, _opt_str(head, "bearer_token_file", "exporter", path),
        user, password_file,
        _seconds(head.get("idle_timeout", DEFAULT_IDLE_TIMEOUT_S), "exporter.idle_timeout",
                 path, positive=True),
        _count(head.get("max_connections", DEFAULT_MAX_CONNECTIONS),
               "exporter.max_connections", path, 1, 10_000), metrics, references)


def _metrics(value: Any, path: str) -> MetricsOptions:
    body = _table(value, "metrics", path)
    _keys(body, "metrics", {"pair_series", "max_pair_series"}, path)
    pair_series = body.get("pair_series", False)
    if not isinstance(pair_series, bool):
        raise ExporterConfigError(f"{path}: metrics.pair_series: must be true or false")
    return MetricsOptions(pair_series, _count(
        body.get("max_pair_series", DEFAULT_MAX_PAIR_SERIES), "metrics.max_pair_series",
        path, 1, MAX_PAIR_SERIES_LIMIT))


def reference_hosts(groups: Any) -> dict[str, tuple[str, ...]]:
    """The reference hosts of each group of a reference design: a group of kind
    ``reference`` keeps its agents and its references as ``sides`` (others, references);
    a group with a ``references`` field names them there. Other groups have none."""
    found = {}
    for group in groups:
        hosts = tuple(getattr(group, "references", None) or ())
        if not hosts and group.kind == "reference":
            hosts = tuple(group.sides[1])
        if hosts:
            found[group.name] = hosts
    return found


def _basic_auth(value: Any, path: str) -> tuple[str | None, str | None]:
    if value is None:
        return None, None
    body = _table(value, "exporter.basic_auth", path)
    _keys(body, "exporter.basic_auth", {"user", "password_file"}, path)
    user = _opt_str(body, "user", "exporter.basic_auth", path)
    password_file = _opt_str(body, "password_file", "exporter.basic_auth", path)
    if not user or not password_file or ":" in user:
        raise ExporterConfigError(f"{path}: exporter.basic_auth: needs a user (without ':') "
                                  "and a password_file")
    return user, password_file


_MODULE_KEYS = {"tool", "protocol", "targets", "fleet_agents", "sources", "port", "agent_port",
                "secret_file", "agent", "duration", "max_duration", "rate", "max_rate",
                "max_streams"}


def _module(name: str, body: Mapping[str, Any], agents: Mapping[str, Agent], path: str
            ) -> Module:
    key = f"modules.{name}"
    _keys(body, key, _MODULE_KEYS, path)
    tool = body.get("tool", "native")
    if not isinstance(tool, str) or not tool:
        raise ExporterConfigError(f"{path}: {key}.tool: must be a tool's name")
    protocol = body.get("protocol", "tcp")
    if protocol not in PROTOCOLS:
        raise ExporterConfigError(f"{path}: {key}.protocol: must be one of "
                                  f"{', '.join(PROTOCOLS)}, got {protocol!r}")
    targets = _strings(body.get("targets", []), f"{key}.targets", path)
    fleet_agents = body.get("fleet_agents", False)
    if not isinstance(fleet_agents, bool):
        raise ExporterConfigError(f"{path}: {key}.fleet_agents: must be true or false")
    if fleet_agents and not agents:
        raise ExporterConfigError(f"{path}: {key}.fleet_agents: needs exporter.fleet")
    if not targets and not fleet_agents:
        raise ExporterConfigError(f"{path}: {key}: no targets (targets = [...] or "
                                  "fleet_agents = true)")
    sources = _strings(body.get("sources", []), f"{key}.sources", path)
    agent = body.get("agent", True)
    if not isinstance(agent, bool):
        raise ExporterConfigError(f"{path}: {key}.agent: must be true or false")
    unknown = [s for s in sources if s not in agents]
    if unknown:
        raise ExporterConfigError(f"{path}: {key}.sources: not an agent of the fleet file: "
                                  f"{', '.join(unknown)}")
    max_duration = _seconds(body.get("max_duration", DEFAULT_MAX_DURATION_S),
                            f"{key}.max_duration", path, positive=True)
    duration = _seconds(body.get("duration", min(5.0, max_duration)), f"{key}.duration",
                        path, positive=True)
    if duration > max_duration:
        raise ExporterConfigError(f"{path}: {key}.duration: longer than max_duration "
                                  f"({max_duration:g} s)")
    max_rate = _rate(body.get("max_rate", DEFAULT_MAX_RATE), f"{key}.max_rate", path)
    rate = None if "rate" not in body else _rate(body["rate"], f"{key}.rate", path)
    if rate is not None and rate > max_rate:
        raise ExporterConfigError(f"{path}: {key}.rate: above max_rate ({max_rate:g})")
    return Module(
        name, tool, protocol, tuple(targets), fleet_agents, tuple(sources),
        None if "port" not in body else _port(body["port"], f"{key}.port", path),
        None if "agent_port" not in body else _port(body["agent_port"], f"{key}.agent_port",
                                                    path),
        _opt_str(body, "secret_file", key, path), agent, duration, max_duration, rate, max_rate,
        _count(body.get("max_streams", 4), f"{key}.max_streams", path, 1, 128))


def _strings(value: Any, key: str, path: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ExporterConfigError(f"{path}: {key}: needs a list of names")
    return [v.strip() for v in value]


def _rate(value: Any, key: str, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise ExporterConfigError(f"{path}: {key}: must be bits per second above 0, "
                                  f"got {value!r}")
    return float(value)


def _count(value: Any, key: str, path: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ExporterConfigError(f"{path}: {key}: must be a whole number {low}-{high}, "
                                  f"got {value!r}")
    return value
