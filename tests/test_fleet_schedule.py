"""The fleet scheduler as pure functions: every pair exactly once per direction, no host
twice in a round, the round counts of the circle method (byes for odd n), disjoint and
list groups packed conflict-free, and a host that leaves mid-fleet."""
from __future__ import annotations

import itertools
import random

import pytest

from netprobe.fleet import config, schedule
from netprobe.fleet.schedule import Round


def _hosts(n: int) -> list[str]:
    return [f"h{i}" for i in range(n)]


def _flat(rounds: list[Round]) -> list[tuple[str, str]]:
    return [pair for r in rounds for pair in r]


@pytest.mark.parametrize("n", range(2, 13))
def test_mesh_every_ordered_pair_once_no_host_twice(n: int) -> None:
    hosts = _hosts(n)
    rounds = schedule.mesh_rounds(hosts)
    pairs = _flat(rounds)
    assert sorted(pairs) == sorted(itertools.permutations(hosts, 2))  # each exactly once
    assert schedule.conflicts(rounds) == []
    per_direction = n - 1 if n % 2 == 0 else n
    assert len(rounds) == 2 * per_direction
    for r in rounds:  # n/2 pairs a round; odd n: one host sits out (the bye)
        assert len(r) == n // 2
        sitting_out = set(hosts) - {h for pair in r for h in pair}
        assert len(sitting_out) == n % 2


@pytest.mark.parametrize("n", range(2, 13))
def test_circle_covers_each_unordered_pair_once(n: int) -> None:
    rounds = schedule.circle_rounds(_hosts(n))
    unordered = [frozenset(p) for p in _flat(rounds)]
    assert len(unordered) == len(set(unordered)) == n * (n - 1) // 2
    assert schedule.conflicts(rounds) == []


def test_conflicts_finds_a_host_twice() -> None:
    assert schedule.conflicts([(("a", "b"), ("a", "c"))]) == ["round 1: a"]


@pytest.mark.parametrize(("p", "q"), [(1, 1), (1, 4), (3, 3), (2, 5), (5, 2), (4, 7)])
def test_bipartite_is_a_latin_square(p: int, q: int) -> None:
    side_a, side_b = [f"a{i}" for i in range(p)], [f"b{j}" for j in range(q)]
    rounds = schedule.bipartite_rounds(side_a, side_b)
    assert sorted(_flat(rounds)) == sorted(itertools.product(side_a, side_b))
    assert len(rounds) == max(p, q) and schedule.conflicts(rounds) == []


def test_pack_rounds_any_pairs_conflict_free() -> None:
    rng = random.Random(19)
    hosts = _hosts(9)
    for _ in range(50):
        pairs = rng.sample(list(itertools.permutations(hosts, 2)), rng.randint(1, 40))
        rounds = schedule.pack_rounds(pairs + pairs[:3])  # a repeated pair runs once
        assert sorted(_flat(rounds)) == sorted(pairs)
        assert schedule.conflicts(rounds) == []
        degree = max(sum(h in p for p in pairs) for h in hosts)
        assert len(rounds) <= 2 * degree - 1  # first-fit's bound


@pytest.mark.parametrize("n", range(3, 13))
def test_a_host_that_leaves_mid_fleet(n: int) -> None:
    hosts = _hosts(n)
    rounds = schedule.mesh_rounds(hosts)
    done, rest = rounds[: len(rounds) // 3], rounds[len(rounds) // 3:]
    leaver = hosts[n // 2]
    left = schedule.without_host(rest, leaver)
    assert all(leaver not in pair for pair in _flat(left))
    assert schedule.conflicts(left) == []
    # What the others still owe each other is all still there, each pair once.
    owed = [p for p in _flat(rest) if leaver not in p]
    assert sorted(_flat(left)) == sorted(owed)
    ran = set(_flat(done)) | set(_flat(left))
    others = [h for h in hosts if h != leaver]
    assert set(itertools.permutations(others, 2)) <= ran
    assert all(r for r in left), "rounds left empty are dropped"


FLEET = """
[fleet]
archive = "sqlite:///tmp/x.db"
[agents.a]
address = "10.0.0.1"
labels = { role = "core" }
[agents.b]
address = "10.0.0.2"
labels = { role = "core" }
[agents.c]
address = "10.0.0.3"
labels = { role = "core" }
[agents.d]
address = "10.0.0.4"
port = 5400
labels = { role = "edge" }
[groups.core]
type = "mesh"
labels = { role = "core" }
every = "1h30m"
slip = "5m"
spec = { duration = "2s", streams = 2 }
[groups.edge]
type = "disjoint"
a = ["d"]
b = ["a", "b"]
spec = { tool = "iperf3", protocol = "udp" }
[groups.manual]
type = "list"
pairs = [["a", "d"], ["b", "c"], ["c", "a"]]
every = 600
"""


def _parse(text: str) -> config.Fleet:
    return config.parse(config.tomllib.loads(text), "fleet.toml")


def test_fleet_file_groups_and_plan() -> None:
    fleet = _parse(FLEET)
    core, edge, manual = fleet.groups
    assert fleet.archive == "sqlite:///tmp/x.db" and fleet.agents["d"].port == 5400
    assert core.every_s == 5400 and core.slip_s == 300 and core.spec.streams == 2
    assert core.spec.duration_s == 2.0 and len(core.pairs) == 6
    assert edge.pairs == (("d", "a"), ("d", "b"), ("a", "d"), ("b", "d"))
    assert edge.spec.rate_bits_per_second == 1_000_000  # UDP's default, as on the CLI
    assert manual.every_s == 600 and manual.pairs == (("a", "d"), ("b", "c"), ("c", "a"))
    rounds = schedule.plan(fleet)
    assert [(r.group, r.index, r.of) for r in rounds][:2] == [("core", 1, 6), ("core", 2, 6)]
    for group in fleet.groups:
        mine = [r.pairs for r in rounds if r.group == group.name]
        assert sorted(_flat(mine)) == sorted(group.pairs) and schedule.conflicts(mine) == []
    assert len([r for r in rounds if r.group == "edge"]) == 4


@pytest.mark.parametrize(("change", "message"), [
    (("address = \"10.0.0.1\"", "address = 7"), "agents.a.address: needs a host name"),
    (("port = 5400", "port = 70000"), "agents.d.port: must be a port number"),
    (("every = \"1h30m\"", "every = \"soon\""), "groups.core.every: not a duration"),
    (("slip = \"5m\"", "slip = \"2h\""), "groups.core.slip: must be shorter than every"),
    (("type = \"mesh\"", "type = \"star\""), "groups.core.type: must be one of"),
    (("b = [\"a\", \"b\"]", "b = [\"a\", \"zz\"]"), "groups.edge.b: no such agent: zz"),
    (("b = [\"a\", \"b\"]", "b = [\"d\"]"), "groups.edge.b: also in groups.edge.a: d"),
    (("[\"b\", \"c\"]", "[\"b\", \"b\"]"), "groups.manual.pairs[1]: an agent cannot test"),
    (("[\"b\", \"c\"]", "[\"a\", \"d\"]"), "groups.manual.pairs[1]: a -> d is listed twice"),
    (("streams = 2", "streams = 0"), "groups.core.spec: streams must be"),
    (("streams = 2", "stream = 2"), "groups.core.spec.stream: unknown key"),
    (("labels = { role = \"core\" }\nevery", "labels = { role = \"none\" }\nevery"),
     "groups.core.labels: match 0 agent(s)"),
    (("[fleet]", "[fleeet]"), "fleeet: unknown key"),
])
def test_fleet_file_errors_name_the_key(change: tuple[str, str], message: str) -> None:
    old, new = change
    assert old in FLEET
    with pytest.raises(config.FleetFileError) as caught:
        _parse(FLEET.replace(old, new, 1))
    text = str(caught.value)
    assert text.startswith("fleet.toml: ") and message in text and "\n" not in text


def test_fleet_file_unreadable_or_not_toml(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(config.FleetFileError, match="cannot read"):
        config.load(str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[agents\n")
    with pytest.raises(config.FleetFileError, match="not valid TOML"):
        config.load(str(bad))


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("1.5s", 1.5), ("5m", 300),
                                              ("1h30m", 5400), ("1d", 86400), ("250ms", 0.25)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert config.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "h", "5x", "1h 5", "-3s", "inf"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises((ValueError, config.FleetFileError)):
        config._seconds(text, "k", "f")


def test_spec_rates_and_sizes_take_suffixes_as_the_command_line_does() -> None:
    # duration = "3s" was taken, rate = "50M" refused: the same units as -b, -l, -w, -n.
    text = FLEET.replace('spec = { tool = "iperf3", protocol = "udp" }',
                         'spec = { tool = "iperf3", protocol = "udp", rate = "50M", '
                         'length = "1k", window = "4M", bytes = "1G" }')
    edge = _parse(text).groups[1]
    assert edge.spec.rate_bits_per_second == 50_000_000
    assert edge.spec.length_bytes == 1024 and edge.spec.window_bytes == 4 * 2**20
    assert edge.spec.bytes_total == 2**30
    with pytest.raises(config.FleetFileError, match=r"groups\.edge.*spec\.rate.*bit rate"):
        _parse(FLEET.replace('protocol = "udp" }', 'protocol = "udp", rate = "fast" }'))
