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
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, overload

import attrs

from netprobe.engine.protocol import DEFAULT_PORT
from netprobe.errors import SpecError
from netprobe.limits import (
    FLEET_FILE_MAX_BYTES,
    LONGEST_S,
    InputTooLarge,
    read_regular_file,
)
from netprobe.schema import TestSpec
from netprobe.units import parse_bitrate, parse_bytes

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, as a backport (a dependency only on these Pythons)
    import tomli as tomllib

GROUP_TYPES = ("mesh", "disjoint", "list")
DEFAULT_EVERY_S = 3600.0
LONGEST_EVERY_S = 366 * 86_400.0
"""The longest ``every``: a year (a group's period; its rounds and slip get a week,
``LONGEST_S``, as a test's durations do)."""
MAX_DEPTH = 32
"""The deepest nesting of arrays, inline tables and dotted keys a fleet file may have
(a fleet file needs 3 or 4); checked on the text before the TOML parser, which recurses
once per level and would end in RecursionError, or take minutes on dotted keys."""
MAX_GROUP_TESTS = 100_000_000
"""Most tests (ordered pairs) in one group: a 10,000-agent mesh (99,990,000) and no
more. Rounds are generated as the run reaches them, so memory is not the bound: one pass
of a group this size is already 2 x 9,999 rounds, days of testing."""


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
    secret_file: str | None = None
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
    pairs: Sequence[tuple[str, str]]
    """Every (source, target) pair the group tests, by agent name: a tuple for a list
    group, and a lazy sequence for a mesh or a disjoint group (a 10,000-agent mesh is
    10^8 pairs, never made all at once)."""
    spec: TestSpec
    """What each pair runs (``host`` is filled in per pair)."""
    every_s: float = DEFAULT_EVERY_S
    """Seconds between the starts of the group's runs (``--forever``)."""
    slip_s: float = 0.0
    """Each start is delayed by a random 0..slip_s seconds, so fleets do not start in step."""
    round_timeout_s: float | None = None
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
    archive: str | None = None
    """Archive URL from the file, if any."""


def load(path: str) -> Fleet:
    """Read and check the fleet file at ``path`` (FleetFileError with a one-line reason)."""
    return parse(read_toml(path, "a fleet file"), path)


def read_toml(path: str, what: str) -> dict[str, Any]:
    """The TOML document at ``path``, read as every configuration netprobe takes is: a
    regular file only (a FIFO or a device refused at once), at most FLEET_FILE_MAX_BYTES,
    nesting bounded before the parser recurses; FleetFileError naming ``path`` and
    ``what`` it should have been."""
    try:
        text = read_regular_file(path, FLEET_FILE_MAX_BYTES).decode()
        nesting(text, path)
        return tomllib.loads(text)
    except OSError as exc:  # a FIFO or a device too: "not a regular file (a FIFO)"
        raise FleetFileError(f"cannot read {path}: {exc.strerror or exc}: {what} is a "
                             "TOML file") from None
    except InputTooLarge:
        raise FleetFileError(f"{path}: longer than {FLEET_FILE_MAX_BYTES >> 20} MiB, "
                             f"not {what}") from None
    except UnicodeDecodeError as exc:
        raise FleetFileError(f"{path}: not valid TOML: not UTF-8 text ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise FleetFileError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:  # the check above should have refused it first
        raise FleetFileError(f"{path}: nested too deep to parse") from None


def nesting(text: str, path: str = "<fleet>") -> None:
    """FleetFileError if ``text`` nests arrays, inline tables or dotted keys deeper than
    MAX_DEPTH. One pass over the text, skipping strings and comments; a rough reading of
    TOML that only counts, so that the parser never meets what would overflow its stack."""
    depth = keys = line = 0
    stack: list[str] = []
    in_key = True  # a key is read at a line's start, and after "{" or "," in a table
    i, n = 0, len(text)
    while i < n:
        plain = _PLAIN.match(text, i)  # skip what counts for nothing in one step
        if plain:
            i = plain.end()
            continue
        c = text[i]
        if c in "\"'":
            i = _string_end(text, i)
            continue
        if c == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if c == "\n":
            line += 1
            if not stack:
                in_key, keys = True, 0
        elif c in "[{":
            if c == "[" and in_key and not stack:  # a table header: its keys follow
                i += 1
                continue
            stack.append(c)
            depth = max(depth, len(stack))
            in_key, keys = c == "{", 0
        elif c in "]}":
            if stack:
                stack.pop()
        elif c == "=":
            in_key = False
        elif c == ",":
            in_key, keys = bool(stack) and stack[-1] == "{", 0
        elif c == "." and in_key:
            keys += 1
            depth = max(depth, len(stack) + keys)
        if depth > MAX_DEPTH:
            raise FleetFileError(f"{path}: line {line + 1}: nested deeper than {MAX_DEPTH} "
                                 "levels (arrays, inline tables or dotted keys); a fleet "
                                 "file needs 4")
        i += 1


_PLAIN = re.compile(r"[^\"'#\n\[\]{}=,.]+")
_BASIC = re.compile(r'"(?:[^"\\\n]|\\.)*"?')
_LITERAL = re.compile(r"'[^'\n]*'?")


def _string_end(text: str, i: int) -> int:
    """The index just past the string that starts at ``i`` (basic or literal, one line or
    multi-line); the end of the text if it never closes (the parser then says so)."""
    quote = text[i]
    if text.startswith(quote * 3, i):
        end = text.find(quote * 3, i + 3)
        while quote == '"' and end > 0 and _escaped(text, end):
            end = text.find(quote * 3, end + 1)
        return len(text) if end < 0 else end + 3
    found = (_BASIC if quote == '"' else _LITERAL).match(text, i)
    return found.end() if found else i + 1


def _escaped(text: str, at: int) -> bool:
    """Whether the character at ``at`` follows an odd run of backslashes."""
    run = 0
    while at - run - 1 >= 0 and text[at - run - 1] == "\\":
        run += 1
    return run % 2 == 1


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
    every = _seconds(body.get("every", DEFAULT_EVERY_S), f"{key}.every", path, positive=True,
                     most=LONGEST_EVERY_S)
    slip = _seconds(body.get("slip", 0), f"{key}.slip", path)
    if slip >= every:
        raise FleetFileError(f"{path}: {key}.slip: must be shorter than every ({every:g} s)")
    timeout = body.get("round_timeout")
    return Group(name, kind, pairs, _spec(body.get("spec", {}), f"{key}.spec", path), every,
                 slip, None if timeout is None else
                 _seconds(timeout, f"{key}.round_timeout", path, positive=True), sides)



def _mesh(body: Mapping[str, Any], key: str, agents: Mapping[str, Agent], path: str
          ) -> Sequence[tuple[str, str]]:
    members = _members(body, key, agents, path)
    _bounded(len(members) * (len(members) - 1), key, path,
             f"{len(members):,} agents in a mesh make {len(members):,} x "
             f"{len(members) - 1:,} = {len(members) * (len(members) - 1):,} tests")
    return MeshPairs(tuple(members))


def _disjoint(body: Mapping[str, Any], key: str, agents: Mapping[str, Agent], path: str
              ) -> Sequence[tuple[str, str]]:
    side_a = _names(body.get("a"), f"{key}.a", agents, path)
    side_b = _names(body.get("b"), f"{key}.b", agents, path)
    shared = sorted(set(side_a) & set(side_b))
    if shared:
        raise FleetFileError(f"{path}: {key}.b: also in {key}.a: {', '.join(shared)}")
    one_way = body.get("unidirectional", False)
    if not isinstance(one_way, bool):
        raise FleetFileError(f"{path}: {key}.unidirectional: must be true or false")
    total = len(side_a) * len(side_b) * (1 if one_way else 2)
    _bounded(total, key, path, f"{len(side_a):,} x {len(side_b):,} agents"
             f"{'' if one_way else ' both ways'} make {total:,} tests")
    return DisjointPairs(tuple(side_a), tuple(side_b), not one_way)


def _list(body: Mapping[str, Any], key: str, agents: Mapping[str, Agent], path: str
          ) -> tuple[tuple[str, str], ...]:
    raw = body.get("pairs")
    if not isinstance(raw, list):
        raise FleetFileError(f"{path}: {key}.pairs: needs a list of [source, target] pairs")
    pairs: dict[tuple[str, str], None] = {}  # a dict: "listed twice?" in constant time
    for n, pair in enumerate(raw):
        where = f"{key}.pairs[{n}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise FleetFileError(f"{path}: {where}: must be [source, target], got {pair!r}")
        if pair[0] == pair[1]:
            raise FleetFileError(f"{path}: {where}: an agent cannot test itself ({pair[0]})")
        source, target = _names(pair, where, agents, path)
        if (source, target) in pairs:
            raise FleetFileError(f"{path}: {where}: {source} -> {target} is listed twice")
        pairs[(source, target)] = None
    return tuple(pairs)


_PAIRS = {"mesh": _mesh, "disjoint": _disjoint, "list": _list}


def _bounded(total: int, key: str, path: str, arithmetic: str) -> None:
    if total > MAX_GROUP_TESTS:
        raise FleetFileError(f"{path}: {key}: {arithmetic}; a group may have at most "
                             f"{MAX_GROUP_TESTS:,} (split it into groups)")


class _LazyPairs(Sequence[tuple[str, str]]):
    """Ordered pairs worked out from their index, never all held at once."""

    def __len__(self) -> int:
        raise NotImplementedError

    def at(self, index: int) -> tuple[str, str]:
        """The pair at ``index`` (0 <= index < len)."""
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> tuple[str, str]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[str, str]]: ...

    def __getitem__(self, index: int | slice
                    ) -> tuple[str, str] | Sequence[tuple[str, str]]:
        if isinstance(index, slice):
            return tuple(self.at(i) for i in range(*index.indices(len(self))))
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("pair index out of range")
        return self.at(index)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return (self.at(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __hash__(self) -> int:
        return hash((type(self), len(self)))

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {len(self):,} pairs>"


class MeshPairs(_LazyPairs):
    """Every ordered pair of distinct members, source-major (a0->a1, a0->a2, ...)."""

    def __init__(self, members: tuple[str, ...]) -> None:
        self.members = members
        """The mesh's agents, in order."""

    def __len__(self) -> int:
        return len(self.members) * (len(self.members) - 1)

    def at(self, index: int) -> tuple[str, str]:
        """The pair at ``index``."""
        source, rest = divmod(index, len(self.members) - 1)
        return self.members[source], self.members[rest + (rest >= source)]

    def __contains__(self, pair: object) -> bool:
        return (isinstance(pair, tuple) and len(pair) == 2 and pair[0] != pair[1]
                and pair[0] in self.members and pair[1] in self.members)


class DisjointPairs(_LazyPairs):
    """Every a -> b pair (a-major), then every b -> a if ``both``."""

    def __init__(self, side_a: tuple[str, ...], side_b: tuple[str, ...], both: bool) -> None:
        self.side_a, self.side_b, self.both = side_a, side_b, both

    def __len__(self) -> int:
        return len(self.side_a) * len(self.side_b) * (2 if self.both else 1)

    def at(self, index: int) -> tuple[str, str]:
        """The pair at ``index``."""
        back, index = divmod(index, len(self.side_a) * len(self.side_b))
        a, b = divmod(index, len(self.side_b))
        pair = (self.side_a[a], self.side_b[b])
        return (pair[1], pair[0]) if back else pair


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
# Written as on the command line: "50M" bits/s (SI), "128k" bytes (1024-based).
_SUFFIXED = {"rate": parse_bitrate, "bytes": parse_bytes, "length": parse_bytes,
             "window": parse_bytes}
UDP_DEFAULT_RATE = 1_000_000  # as `netprobe run -u`: a forgotten rate floods no link


def _spec(value: Any, key: str, path: str) -> TestSpec:
    body = _table(value, key, path)
    _keys(body, key, set(_SPEC_KEYS), path)
    fields: dict[str, Any] = {"duration_s": 10.0}
    for name, item in body.items():
        if name in _SECONDS_KEYS:
            item = _seconds(item, f"{key}.{name}", path)
        elif name in _SUFFIXED and isinstance(item, str):
            item = _suffixed(item, name, f"{key}.{name}", path)
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


def _seconds(value: Any, key: str, path: str, positive: bool = False,
             most: float = LONGEST_S) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError(f"not a duration: {value!r}")
        seconds = float(value) if isinstance(value, (int, float)) else parse_duration(str(value))
    except ValueError as exc:
        raise FleetFileError(f"{path}: {key}: {exc}") from None
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        raise FleetFileError(f"{path}: {key}: must be {'more than' if positive else 'at least'}"
                             f" 0 seconds, got {value!r}")
    if seconds > most:
        raise FleetFileError(f"{path}: {key}: must be at most {most:g} s "
                             f"({most / 86400:g} days), got {value!r}")
    return seconds


def _suffixed(text: str, name: str, key: str, path: str) -> float:
    """A rate or byte count written with a unit suffix, as ``-b`` and ``-l`` take them."""
    try:
        return _SUFFIXED[name](text)
    except ValueError as exc:
        raise FleetFileError(f"{path}: {key}: {exc}") from None


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


def _opt_str(table: Mapping[str, Any], name: str, key: str, path: str) -> str | None:
    value = table.get(name)
    if value is not None and not isinstance(value, str):
        raise FleetFileError(f"{path}: {key}.{name}: must be a string")
    return value
