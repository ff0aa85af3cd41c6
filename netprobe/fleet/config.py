"""The fleet file: agents, test groups, specs and schedules (TOML).

::

    [fleet]
    archive = "sqlite:///var/lib/netprobe/fleet.db"   # where results go (optional)
    secret_file = "/etc/netprobe/secret"              # default for every agent (optional)

    [agents.ams]
    address = "192.0.2.10"
    labels = { site = "ams", role = "core" }

    [groups.core]
    type = "mesh"                 # mesh | disjoint | list
    agents = ["ams", "fra", "lon"]  # or labels = { role = "core" }, or "*"
    every = "1h"                  # the schedule of --forever
    slip = "5m"                   # each start is delayed by a random 0..slip
    spec = { tool = "native", duration = "10s", streams = 1, protocol = "tcp" }

``disjoint`` groups name ``a`` and ``b`` (agent lists) and test every a -> b pair, and
b -> a too unless ``unidirectional = true``; ``list`` groups name their ``pairs`` as
``[["ams", "fra"], ...]`` (source, target). Every mistake is one line that names the key.
"""
from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping
from typing import Any, Optional

import attrs

from netprobe.engine.protocol import DEFAULT_PORT
from netprobe.errors import SpecError
from netprobe.limits import FLEET_FILE_MAX_BYTES, InputTooLarge, read_at_most
from netprobe.schema import TestSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, as a backport (a dependency only on these Pythons)
    import tomli as tomllib

GROUP_TYPES = ("mesh", "disjoint", "list")
DEFAULT_EVERY_S = 3600.0


class FleetFileError(SpecError):
    """The fleet file cannot be used; the message names the file and the key."""


@attrs.frozen
class Agent:
    """One host of the fleet: a ``netprobe server --allow-third-party``."""

    name: str
    """The name the groups use."""
    address: str
    """Host name or address the agent listens on (the others test to it there)."""
    port: int = DEFAULT_PORT
    """The agent's port."""
    secret_file: Optional[str] = None
    """File holding the shared secret the agent asks for (None: no authentication)."""
    labels: Mapping[str, str] = attrs.field(factory=dict)
    """Free-form labels (site, role, ...), for selecting agents and for metrics."""


@attrs.frozen
class Group:
    """A set of ordered pairs tested with one spec on one schedule."""

    name: str
    """The group's name (its table name in the file)."""
    kind: str
    """mesh, disjoint or list."""
    pairs: tuple[tuple[str, str], ...]
    """Every (source, target) pair the group tests, by agent name."""
    spec: TestSpec
    """What each pair runs (``host`` is filled in per pair)."""
    every_s: float = DEFAULT_EVERY_S
    """Seconds between the starts of the group's runs (``--forever``)."""
    slip_s: float = 0.0
    """Each start is delayed by a random 0..slip_s seconds, so fleets do not start in step."""
    round_timeout_s: Optional[float] = None
    """Longest a round may take (None: the test's length plus a margin)."""
    sides: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    """A disjoint group's sets A and B (empty for the other kinds)."""


@attrs.frozen
class Fleet:
    """A whole fleet file, checked."""

    path: str
    """Where it was read from."""
    agents: Mapping[str, Agent]
    """Agents by name."""
    groups: tuple[Group, ...]
    """Groups in file order."""
    archive: Optional[str] = None
    """Archive URL from the file, if any."""


def load(path: str) -> Fleet:
    """Read and check the fleet file at ``path`` (FleetFileError with a one-line reason)."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.loads(read_at_most(handle, FLEET_FILE_MAX_BYTES).decode())
    except OSError as exc:
        raise FleetFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    except InputTooLarge:
        raise FleetFileError(f"{path}: longer than {FLEET_FILE_MAX_BYTES >> 20} MiB, "
                             "not a fleet file") from None
    except UnicodeDecodeError as exc:
        raise FleetFileError(f"{path}: not valid TOML: not UTF-8 text ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise FleetFileError(f"{path}: not valid TOML: {exc}") from None
    return parse(data, path)


def parse(data: Mapping[str, Any], path: str = "<fleet>") -> Fleet:
    """A Fleet from the parsed TOML of a fleet file."""
    _keys(data, "", {"fleet", "agents", "groups"}, path)
    head = _table(data.get("fleet", {}), "fleet", path)
    _keys(head, "fleet", {"archive", "secret_file", "port"}, path)
    defaults = {"secret_file": _opt_str(head, "secret_file", "fleet", path),
                "port": _port(head.get("port", DEFAULT_PORT), "fleet.port", path)}
    agents = _agents(_table(data.get("agents"), "agents", path), defaults, path)
    groups_table = _table(data.get("groups"), "groups", path)
    groups = tuple(_group(name, _table(body, f"groups.{name}", path), agents, path)
                   for name, body in groups_table.items())
    if not groups:
        raise FleetFileError(f"{path}: groups: the fleet has no test groups")
    return Fleet(path, agents, groups, _opt_str(head, "archive", "fleet", path))


# --- agents -------------------------------------------------------------------------------


def _agents(table: Mapping[str, Any], defaults: dict, path: str) -> dict[str, Agent]:
    agents = {}
    for name, body in table.items():
        key = f"agents.{name}"
        body = _table(body, key, path)
        _keys(body, key, {"address", "port", "secret_file", "labels"}, path)
        address = body.get("address")
        if not isinstance(address, str) or not address.strip():
            raise FleetFileError(f"{path}: {key}.address: needs a host name or address")
        labels = _table(body.get("labels", {}), f"{key}.labels", path)
        if not all(isinstance(v, str) for v in labels.values()):
            raise FleetFileError(f"{path}: {key}.labels: values must be strings")
        agents[name] = Agent(
            name, address.strip(), _port(body.get("port", defaults["port"]), f"{key}.port", path),
            _opt_str(body, "secret_file", key, path) or defaults["secret_file"], dict(labels))
    if not agents:
        raise FleetFileError(f"{path}: agents: the fleet has no agents")
    return agents


def _port(value: Any, key: str, path: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        raise FleetFileError(f"{path}: {key}: must be a port number 1-65535, got {value!r}")
    return value


# --- groups -------------------------------------------------------------------------------

_GROUP_KEYS = {"type", "agents", "labels", "a", "b", "unidirectional", "pairs", "every",
               "slip", "round_timeout", "spec"}


def _group(name: str, body: Mapping[str, Any], agents: Mapping[str, Agent], path: str) -> Group:
    key = f"groups.{name}"
    _keys(body, key, _GROUP_KEYS, path)
    kind = body.get("type")
    if kind not in GROUP_TYPES:
        raise FleetFileError(f"{path}: {key}.type: must be one of {', '.join(GROUP_TYPES)}, "
                             f"got {kind!r}")
    pairs = _PAIRS[kind](body, key, agents, path)
    sides = (tuple(body["a"]), tuple(body["b"])) if kind == "disjoint" else ((), ())
    if not pairs:
        raise FleetFileError(f"{path}: {key}: the group has no pairs to test")
    every = _seconds(body.get("every", DEFAULT_EVERY_S), f"{key}.every", path, positive=True)
    slip = _seconds(body.get("slip", 0), f"{key}.slip", path)
    if slip >= every:
        raise FleetFileError(f"{path}: {key}.slip: must be shorter than every ({every:g} s)")
    timeout = body.get("round_timeout")
    return Group(name, kind, pairs, _spec(body.get("spec", {}), f"{key}.spec", path), every,
                 slip, None if timeout is None else
                 _seconds(timeout, f"{key}.round_timeout", path, positive=True), sides)



def _mesh(body: Mapping[str, Any], key: str, agents: Mapping[str, Agent], path: str
          ) -> tuple[tuple[str, str], ...]:
    members = _members(body, key, agents, path)
    return tuple((a, b) for a in members for b in members if a != b)


def _disjoint(body: Mapping[str, Any], key: str, agents: Mapping[str, Agent], path: str
              ) -> tuple[tuple[str, str], ...]:
    side_a = _names(body.get("a"), f"{key}.a", agents, path)
    side_b = _names(body.get("b"), f"{key}.b", agents, path)
    shared = sorted(set(side_a) & set(side_b))
    if shared:
        raise FleetFileError(f"{path}: {key}.b: also in {key}.a: {', '.join(shared)}")
    one_way = body.get("unidirectional", False)
    if not isinstance(one_way, bool):
        raise FleetFileError(f"{path}: {key}.unidirectional: must be true or false")
    pairs = [(a, b) for a in side_a for b in side_b]
    return tuple(pairs if one_way else pairs + [(b, a) for a, b in pairs])


def _list(body: Mapping[str, Any], key: str, agents: Mapping[str, Agent], path: str
          ) -> tuple[tuple[str, str], ...]:
    raw = body.get("pairs")
    if not isinstance(raw, list):
        raise FleetFileError(f"{path}: {key}.pairs: needs a list of [source, target] pairs")
    pairs: list[tuple[str, str]] = []
    for n, pair in enumerate(raw):
        where = f"{key}.pairs[{n}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise FleetFileError(f"{path}: {where}: must be [source, target], got {pair!r}")
        if pair[0] == pair[1]:
            raise FleetFileError(f"{path}: {where}: an agent cannot test itself ({pair[0]})")
        source, target = _names(pair, where, agents, path)
        if (source, target) in pairs:
            raise FleetFileError(f"{path}: {where}: {source} -> {target} is listed twice")
        pairs.append((source, target))
    return tuple(pairs)


_PAIRS = {"mesh": _mesh, "disjoint": _disjoint, "list": _list}


def _members(body: Mapping[str, Any], key: str, agents: Mapping[str, Agent], path: str
             ) -> list[str]:
    """A mesh's agents: a list of names, "*" for all, or the agents matching ``labels``."""
    if "labels" in body:
        wanted = _table(body["labels"], f"{key}.labels", path)
        members = [name for name, agent in agents.items()
                   if all(agent.labels.get(k) == v for k, v in wanted.items())]
        if len(members) < 2:
            raise FleetFileError(f"{path}: {key}.labels: match {len(members)} agent(s); a "
                                 "mesh needs 2 or more")
        return members
    selected = body.get("agents", "*")
    members = list(agents) if selected == "*" else _names(selected, f"{key}.agents", agents,
                                                          path)
    if len(members) < 2:
        raise FleetFileError(f"{path}: {key}.agents: a mesh needs 2 or more agents")
    return members


def _names(value: Any, key: str, agents: Mapping[str, Agent], path: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or not value:
        raise FleetFileError(f"{path}: {key}: needs a list of agent names")
    unknown = [v for v in value if v not in agents]
    if unknown:
        raise FleetFileError(f"{path}: {key}: no such agent: {', '.join(unknown)}")
    if len(set(value)) != len(value):
        raise FleetFileError(f"{path}: {key}: an agent is named twice")
    return list(value)


# --- the spec -----------------------------------------------------------------------------

_SPEC_KEYS = {
    "tool": "tool", "protocol": "protocol", "direction": "direction", "streams": "streams",
    "duration": "duration_s", "omit": "omit_s", "interval": "interval_s", "bytes": "bytes_total",
    "length": "length_bytes", "window": "window_bytes", "rate": "rate_bits_per_second",
    "congestion": "congestion", "dscp": "dscp", "ip_version": "ip_version",
}
_SECONDS_KEYS = {"duration", "omit", "interval"}
UDP_DEFAULT_RATE = 1_000_000  # as `netprobe run -u`: a forgotten rate floods no link


def _spec(value: Any, key: str, path: str) -> TestSpec:
    body = _table(value, key, path)
    _keys(body, key, set(_SPEC_KEYS), path)
    fields: dict[str, Any] = {"duration_s": 10.0}
    for name, item in body.items():
        if name in _SECONDS_KEYS:
            item = _seconds(item, f"{key}.{name}", path)
        fields[_SPEC_KEYS[name]] = item
    if fields.get("protocol") == "udp":
        fields.setdefault("rate_bits_per_second", UDP_DEFAULT_RATE)
    if "bytes_total" in fields and "duration" not in body:
        fields["duration_s"] = None
    try:
        return TestSpec(**fields)
    except (SpecError, TypeError, ValueError) as exc:
        raise FleetFileError(f"{path}: {key}: {exc}") from None


# --- small checks -------------------------------------------------------------------------

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds in ``text``: ``90``, ``1.5s``, ``5m``, ``1h30m``, ``1d`` (ValueError if not)."""
    compact = text.strip().lower().replace(" ", "")
    try:
        return float(compact)
    except ValueError:
        pass
    parts = _DURATION.findall(compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        raise ValueError(f"not a duration (e.g. 30s, 5m, 1h): {text!r}")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def _seconds(value: Any, key: str, path: str, positive: bool = False) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError(f"not a duration: {value!r}")
        seconds = float(value) if isinstance(value, (int, float)) else parse_duration(str(value))
    except ValueError as exc:
        raise FleetFileError(f"{path}: {key}: {exc}") from None
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        raise FleetFileError(f"{path}: {key}: must be {'more than' if positive else 'at least'}"
                             f" 0 seconds, got {value!r}")
    return seconds


def _table(value: Any, key: str, path: str) -> Mapping[str, Any]:
    if value is None:
        raise FleetFileError(f"{path}: {key}: missing")
    if not isinstance(value, Mapping):
        raise FleetFileError(f"{path}: {key}: must be a table")
    return value


def _keys(table: Mapping[str, Any], key: str, known: set, path: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        where = f"{key}.{unknown[0]}" if key else unknown[0]
        raise FleetFileError(f"{path}: {where}: unknown key (known: {', '.join(sorted(known))})")


def _opt_str(table: Mapping[str, Any], name: str, key: str, path: str) -> Optional[str]:
    value = table.get(name)
    if value is not None and not isinstance(value, str):
        raise FleetFileError(f"{path}: {key}.{name}: must be a string")
    return value
