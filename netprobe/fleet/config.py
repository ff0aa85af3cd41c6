"""The fleet file: agents, test groups, specs and schedules (TOML).

::

    [fleet]
    archive = "sqlite:///var/lib/netprobe/fleet.db"   # where results go (optional)
    secret_file = "/etc/netprobe/secret"              # default for every agent (optional)
    lease = "20s"             # a shared run's claim, renewed while its test runs (optional)

    [agents.ams]
    address = "192.0.2.10"
    labels = { site = "ams", role = "core" }

    [groups.core]
    type = "mesh"                 # mesh | disjoint | list | reference | random
    agents = ["ams", "fra", "lon"]  # or labels = { role = "core" }, or "*"
    every = "1h"                  # the schedule of --forever
    slip = "5m"                   # each start is delayed by a random 0..slip
    spec = { tool = "native", duration = "10s", streams = 1, protocol = "tcp" }

``disjoint`` groups name ``a`` and ``b`` (agent lists) and test every a -> b pair, and
b -> a too unless ``unidirectional = true``; ``list`` groups name their ``pairs`` as
``[["ams", "fra"], ...]`` (source, target); ``reference`` groups test each of their agents
against each of their ``references`` (both ways unless ``unidirectional``), ``random`` groups
each agent against ``peers`` seeded random others a run, covering every pair over
successive runs. An entry of ``[agents]`` with ``iperf3_port = 5201`` is no agent but a
stock ``iperf3 -s`` on that port: only ever a target, tested by its source's agent with
the native engine speaking iperf3's protocol. Every mistake is one line that names the key.
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

GROUP_TYPES = ("mesh", "disjoint", "list", "reference", "random")
DEFAULT_EVERY_S = 3600.0
LONGEST_EVERY_S = 366 * 86_400.0
"""The longest ``every``: a year (a group's period; its rounds and slip get a week,
``LONGEST_S``, as a test's durations do). It is also the longest one run of a group may
take, rounds times each round's limit: a run that cannot end within the longest period
any schedule may have is refused with its arithmetic (the size bound of a group)."""
MAX_LEASE_S = 3600.0
"""The longest lease a fleet file may ask for: a dead runner's pairs wait for it."""
ROUND_MARGIN_S = 30.0
"""Past a test's planned length, how long its round waits: the agents' own start-up and
reply limits (the far end's server start, the result's trip back) fit inside it."""
BYTES_ROUND_S = 600.0
"""A round of tests ended by a byte count, not a time, is given this long (round_timeout
in the group overrides it)."""
MAX_DEPTH = 32
"""The deepest nesting of arrays, inline tables and dotted keys a fleet file may have
(a fleet file needs 3 or 4); checked on the text before the TOML parser, which recurses
once per level and would end in RecursionError, or take minutes on dotted keys."""


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
    iperf3_port: int | None = None
    """Not None: the host runs no agent but a stock ``iperf3 -s`` on this port (a target
    only: no status to ask, no far end to start, one test at a time)."""


@attrs.frozen
class Group:
    """A set of ordered pairs tested with one spec on one schedule."""

    name: str
    """The group's name (its table name in the file)."""
    kind: str
    """mesh, disjoint, list, reference or random."""
    pairs: Sequence[tuple[str, str]]
    """Every (source, target) pair the group tests, by agent name: a tuple for a list
    group, and a lazy sequence for the others (a 10,000-agent mesh is 10^8 pairs, never
    made all at once). A random group tests a few of them each run (RandomPairs)."""
    spec: TestSpec
    """What each pair runs (``host`` is filled in per pair)."""
    every_s: float = DEFAULT_EVERY_S
    """Seconds between the starts of the group's runs (``--forever``)."""
    slip_s: float = 0.0
    """Each start is delayed by a random 0..slip_s seconds, so fleets do not start in step."""
    round_timeout_s: float | None = None
    """Longest a round may take (None: the test's length plus a margin)."""
    sides: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    """A disjoint group's sets A and B, a reference group's others and references (empty
    for the other kinds)."""
    iperf3_targets: bool = False
    """Whether some of its targets are stock iperf3 servers (``iperf3_port``): its spec
    must then suit the native engine's iperf3 mode too."""

    def round_limit_s(self) -> float:
        """The longest one of the group's rounds may take (the runner's deadline)."""
        if self.round_timeout_s is not None:
            return self.round_timeout_s
        planned = self.spec.planned_s()  # None: a byte count ends the test
        return (BYTES_ROUND_S if planned is None else planned) + ROUND_MARGIN_S


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
    lease_s: float | None = None
    """How long a shared run's claim lasts unless renewed (None: the default); its runner
    renews it while the test runs, so it bounds how long a dead runner's pairs wait."""


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
    _keys(head, "fleet", {"archive", "secret_file", "port", "lease"}, path)
    defaults = {"secret_file": _opt_str(head, "secret_file", "fleet", path),
                "port": _port(head.get("port", DEFAULT_PORT), "fleet.port", path)}
    agents = _agents(_table(data.get("agents"), "agents", path), defaults, path)
    groups_table = _table(data.get("groups"), "groups", path)
    groups = tuple(_group(name, _table(body, f"groups.{name}", path), agents, path)
                   for name, body in groups_table.items())
    if not groups:
        raise FleetFileError(f"{path}: groups: the fleet has no test groups")
    lease = head.get("lease")
    return Fleet(path, agents, groups, _opt_str(head, "archive", "fleet", path),
                 None if lease is None else _seconds(lease, "fleet.lease", path, positive=True,
                                                     most=MAX_LEASE_S))


# --- agents -------------------------------------------------------------------------------


def _agents(table: Mapping[str, Any], defaults: dict, path: str) -> dict[str, Agent]:
    agents = {}
    for name, body in table.items():
        key = f"agents.{name}"
        body = _table(body, key, path)
        _keys(body, key, {"address", "port", "secret_file", "labels", "iperf3_port"}, path)
        address = body.get("address")
        if not isinstance(address, str) or not address.strip():
            raise FleetFileError(f"{path}: {key}.address: needs a host name or address")
        labels = _table(body.get("labels", {}), f"{key}.labels", path)
        if not all(isinstance(v, str) for v in labels.values()):
            raise FleetFileError(f"{path}: {key}.labels: values must be strings")
        iperf3 = _iperf3_port(body, key, path)
        agents[name] = Agent(
            name, address.strip(), _port(body.get("port", defaults["port"]), f"{key}.port", path),
            None if iperf3 else _opt_str(body, "secret_file", key, path) or
            defaults["secret_file"], dict(labels), iperf3)
    if not agents:
        raise FleetFileError(f"{path}: agents: the fleet has no agents")
    return agents


def _iperf3_port(body: Mapping[str, Any], key: str, path: str) -> int | None:
    """A stock iperf3 server's port, or None for a netprobe agent; an agent's own keys
    beside it are refused, as they would be silently ignored."""
    if "iperf3_port" not in body:
        return None
    port = _port(body["iperf3_port"], f"{key}.iperf3_port", path)
    for other in ("port", "secret_file"):
        if other in body:
            raise FleetFileError(f"{path}: {key}.{other}: not with iperf3_port (a stock "
                                 "iperf3 server is no netprobe agent: it has no agent port "
                                 "or secret)")
    return port


def _port(value: Any, key: str, path: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        raise FleetFileError(f"{path}: {key}: must be a port number 1-65535, got {value!r}")
    return value


# --- groups -------------------------------------------------------------------------------

_COMMON_KEYS = {"type", "every", "slip", "round_timeout", "spec"}
_TYPE_KEYS = {
    "mesh": {"agents", "labels"},
    "disjoint": {"a", "b", "unidirectional"},
    "list": {"pairs"},
    "reference": {"agents", "labels", "references", "unidirectional"},
    "random": {"agents", "labels", "peers", "seed", "unidirectional"},
}
"""The keys each type of group takes besides the common ones; another type's key is an
error naming the types it is for (not silently ignored)."""


def _group(name: str, body: Mapping[str, Any], agents: Mapping[str, Agent], path: str) -> Group:
    key = f"groups.{name}"
    _keys(body, key, _COMMON_KEYS.union(*_TYPE_KEYS.values()), path)
    kind = body.get("type")
    if kind not in GROUP_TYPES:
        raise FleetFileError(f"{path}: {key}.type: must be one of {', '.join(GROUP_TYPES)}, "
                             f"got {kind!r}")
    for other in sorted(set(body) - _COMMON_KEYS - _TYPE_KEYS[kind]):
        takers = [t for t in GROUP_TYPES if other in _TYPE_KEYS[t]]
        raise FleetFileError(f"{path}: {key}.{other}: not a key of a {kind} group (only of "
                             f"{', '.join(takers)})")
    pairs = _PAIRS[kind](body, key, agents, path)
    sides: tuple[tuple[str, ...], tuple[str, ...]] = (
        (pairs.side_a, pairs.side_b) if isinstance(pairs, DisjointPairs) else ((), ()))
    if not pairs:
        raise FleetFileError(f"{path}: {key}: the group has no pairs to test")
    every = _seconds(body.get("every", DEFAULT_EVERY_S), f"{key}.every", path, positive=True,
                     most=LONGEST_EVERY_S)
    slip = _seconds(body.get("slip", 0), f"{key}.slip", path)
    if slip >= every:
        raise FleetFileError(f"{path}: {key}.slip: must be shorter than every ({every:g} s)")
    timeout = body.get("round_timeout")
    group = Group(name, kind, pairs, _spec(body.get("spec", {}), f"{key}.spec", path), every,
                  slip, None if timeout is None else
                  _seconds(timeout, f"{key}.round_timeout", path, positive=True), sides)
    _bounded(group, key, path)
    return attrs.evolve(group, iperf3_targets=_iperf3_targets(group, key, agents, path))


def _iperf3_targets(group: Group, key: str, agents: Mapping[str, Agent], path: str) -> bool:
    """Whether ``group`` tests stock iperf3 servers; refuse one that would have such a
    server run a test (it only answers one), or test one with another tool than the
    native engine (the one client here that speaks its protocol through an agent). Worked
    out from the group's sides, never by walking a lazy mesh's pairs."""
    stock = {name for name, agent in agents.items() if agent.iperf3_port is not None}
    if not stock:
        return False
    pairs = group.pairs
    if isinstance(pairs, DisjointPairs):
        sources = set(pairs.side_a) | (set(pairs.side_b) if pairs.both else set())
        targets = set(pairs.side_b) | (set(pairs.side_a) if pairs.both else set())
    elif isinstance(pairs, MeshPairs):
        sources = targets = set(pairs.members)
    else:
        sources, targets = {s for s, _ in pairs}, {t for _, t in pairs}
    for name in sorted(sources & stock):
        hint = (" (set unidirectional = true to test only towards it)"
                if isinstance(pairs, DisjointPairs) and name in pairs.side_b else "")
        raise FleetFileError(f"{path}: {key}: {name} is a stock iperf3 server (agents.{name}"
                             f".iperf3_port): it can only be a target, never a source"
                             f"{hint}")
    if targets & stock and group.spec.tool != "native":
        raise FleetFileError(f"{path}: {key}.spec.tool: {min(targets & stock)} is a stock "
                             f"iperf3 server: only the native tool tests one (it speaks "
                             f"iperf3's protocol), not {group.spec.tool}")
    return bool(targets & stock)


def circle_count(hosts: int) -> int:
    """How many rounds the circle method takes for ``hosts`` hosts (one direction)."""
    return hosts - 1 if hosts % 2 == 0 else hosts


def run_rounds(group: Group) -> tuple[int, str]:
    """How many rounds one run of ``group`` takes, and how that is worked out (for the
    messages that refuse it); for a list, its busiest host's pair count, the fewest rounds
    any packing can have (first-fit needs at most twice that)."""
    pairs, ways = group.pairs, ""
    if isinstance(pairs, RandomPairs):
        n = pairs.peers * (2 if pairs.both else 1)
        return n, f"random, {pairs.peers:,} peers{' both ways' if pairs.both else ''}: {n:,}"
    if isinstance(pairs, MeshPairs):
        n = 2 * circle_count(len(pairs.members))
        return n, f"mesh of {len(pairs.members):,} agents: {n:,}"
    if isinstance(pairs, DisjointPairs):
        ways = " both ways" if pairs.both else ""
        n = max(len(pairs.side_a), len(pairs.side_b)) * (2 if pairs.both else 1)
        if isinstance(pairs, ReferencePairs):
            return n, (f"{len(pairs.side_a):,} agents against {len(pairs.side_b):,} "
                       f"reference(s){ways}: {n:,}")
        return n, f"{len(pairs.side_a):,} x {len(pairs.side_b):,} agents{ways}: {n:,}"
    degree: dict[str, int] = {}
    for pair in pairs:
        for host in pair:
            degree[host] = degree.get(host, 0) + 1
    n = max(degree.values(), default=0)
    return n, f"a list whose busiest agent is in {n:,} pairs: at least {n:,}"


def _bounded(group: Group, key: str, path: str) -> None:
    """Refuse a group whose one run could not end within LONGEST_EVERY_S (a year, the
    longest period a schedule may have): rounds times each round's limit, with the
    arithmetic. Memory is not the bound, rounds being made one at a time."""
    rounds, arithmetic = run_rounds(group)
    limit = group.round_limit_s()
    if rounds * limit > LONGEST_EVERY_S:
        raise FleetFileError(
            f"{path}: {key}: {arithmetic} rounds x {limit:,g} s = "
            f"{rounds * limit / 86_400:,.0f} days a run; a run may last at most "
            f"{LONGEST_EVERY_S / 86_400:g} days (the longest every): split the group, "
            "choose a sparser type (reference, random) or shorten its rounds")



def _mesh(body: Mapping[str, Any], key: str, agents: Mapping[str, Agent], path: str
          ) -> Sequence[tuple[str, str]]:
    return MeshPairs(tuple(_members(body, key, agents, path)))


def _disjoint(body: Mapping[str, Any], key: str, agents: Mapping[str, Agent], path: str
              ) -> Sequence[tuple[str, str]]:
    side_a = _names(body.get("a"), f"{key}.a", agents, path)
    side_b = _names(body.get("b"), f"{key}.b", agents, path)
    shared = sorted(set(side_a) & set(side_b))
    if shared:
        raise FleetFileError(f"{path}: {key}.b: also in {key}.a: {', '.join(shared)}")
    return DisjointPairs(tuple(side_a), tuple(side_b), _both(body, key, path))


def _both(body: Mapping[str, Any], key: str, path: str) -> bool:
    """Whether a group tests both ways (the default) or, ``unidirectional``, one way."""
    one_way = body.get("unidirectional", False)
    if not isinstance(one_way, bool):
        raise FleetFileError(f"{path}: {key}.unidirectional: must be true or false")
    return not one_way


def _reference(body: Mapping[str, Any], key: str, agents: Mapping[str, Agent], path: str
               ) -> Sequence[tuple[str, str]]:
    """Every agent of the group (``agents`` or ``labels``, all by default) but the
    references, against each reference: agent -> reference, and back unless
    unidirectional."""
    if "references" not in body:
        raise FleetFileError(f"{path}: {key}.references: needs a list of agent names (the "
                             "hosts every other agent is tested against)")
    references = _names(body["references"], f"{key}.references", agents, path)
    chosen = set(references)
    others = [m for m in _members(body, key, agents, path, least=1) if m not in chosen]
    if not others:
        raise FleetFileError(f"{path}: {key}.references: every agent of the group is a "
                             "reference; none is left to test against them")
    return ReferencePairs(tuple(others), tuple(references), _both(body, key, path))


def _random(body: Mapping[str, Any], key: str, agents: Mapping[str, Agent], path: str
            ) -> Sequence[tuple[str, str]]:
    """Each agent of the group against ``peers`` others a run, chosen by ``seed`` and the
    run's number (schedule.GroupRounds), every pair covered over successive runs."""
    members = _members(body, key, agents, path)
    peers = body.get("peers")
    most = len(members) - 1
    if peers is None:
        raise FleetFileError(f"{path}: {key}.peers: needs how many random peers each agent "
                             f"is tested with a run (1 to {most:,})")
    if not isinstance(peers, int) or isinstance(peers, bool) or not 1 <= peers <= most:
        raise FleetFileError(f"{path}: {key}.peers: must be a whole number from 1 to "
                             f"{most:,} (the group has {len(members):,} agents), got "
                             f"{peers!r}")
    seed = body.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise FleetFileError(f"{path}: {key}.seed: must be a whole number, got {seed!r}")
    return RandomPairs(tuple(members), peers, seed, _both(body, key, path))


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


_PAIRS = {"mesh": _mesh, "disjoint": _disjoint, "list": _list, "reference": _reference,
          "random": _random}


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


class ReferencePairs(DisjointPairs):
    """A reference group's pairs: each other agent (``side_a``) -> each reference
    (``side_b``), then back if ``both``; scheduled as a disjoint group is."""

    @property
    def references(self) -> tuple[str, ...]:
        """The reference hosts."""
        return self.side_b


class RandomPairs(MeshPairs):
    """Every ordered pair a random group may test (its members' mesh); each run tests
    ``peers`` rounds of them, chosen by ``seed`` and the run's number."""

    def __init__(self, members: tuple[str, ...], peers: int, seed: int, both: bool) -> None:
        super().__init__(members)
        self.peers, self.seed, self.both = peers, seed, both


def _members(body: Mapping[str, Any], key: str, agents: Mapping[str, Agent], path: str,
             least: int = 2) -> list[str]:
    """A mesh's (a reference or random group's) agents: a list of names, "*" for all, or
    the agents matching ``labels``; at least ``least`` of them."""
    kind = body.get("type")
    if "labels" in body:
        wanted = _table(body["labels"], f"{key}.labels", path)
        members = [name for name, agent in agents.items()
                   if all(agent.labels.get(k) == v for k, v in wanted.items())]
        if len(members) < least:
            raise FleetFileError(f"{path}: {key}.labels: match {len(members)} agent(s); a "
                                 f"{kind} group needs {least} or more")
        return members
    selected = body.get("agents", "*")
    members = list(agents) if selected == "*" else _names(selected, f"{key}.agents", agents,
                                                          path)
    if len(members) < least:
        raise FleetFileError(f"{path}: {key}.agents: a {kind} group needs {least} or more "
                             "agents")
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
