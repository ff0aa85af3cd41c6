"""Rounds in which no host takes part in two tests at once (pure functions).

A throughput test loads both of its hosts: two tests sharing a host share its link and
each reads about half. So a group's pairs are run in rounds of disjoint pairs, one round
after the other. A mesh of n hosts is compiled by the round-robin (circle) method: fix one
host, rotate the others one place per round; n-1 rounds of n/2 pairs cover every
unordered pair once, and the same rounds reversed cover the other direction, 2(n-1)
rounds in all. An odd n gets a stand-in host: whoever meets it sits the round out (a
bye), n rounds per direction. Disjoint groups (A x B) are a Latin square, max(|A|, |B|)
rounds per direction, and so are reference groups (the others x the references); any other
set of pairs is packed first-fit. A random group runs ``peers`` of the circle rounds a run
(each host meets one peer in each), taken in turn from a seeded order of all of them, so
that any ceil(C/peers) successive runs meet every pair (C circle rounds: n-1, or n for an
odd n).
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import attrs

from netprobe.fleet.config import (
    DisjointPairs,
    Fleet,
    Group,
    MeshPairs,
    RandomPairs,
    circle_count,
)

Pair = tuple[str, str]
Round = tuple[Pair, ...]


def circle_round(hosts: Sequence[str], number: int) -> Round:
    """Round ``number`` (from 0) of the circle method over ``hosts``: host 0 stays, the
    others have turned ``number`` places; worked out alone, so a plan never holds more
    than the round it is at."""
    ring: list[str | None] = list(hosts)
    if len(ring) % 2:
        ring.append(None)  # the bye
    n = len(ring)
    turn = number % (n - 1)
    rest = ring[1:]
    ring = [ring[0], *rest[len(rest) - turn:], *rest[:len(rest) - turn]]
    pairs = []
    for i in range(n // 2):
        a, b = ring[i], ring[n - 1 - i]
        if a is not None and b is not None:
            # Alternate who sends first so that each host sends about as often as it
            # receives within one direction's rounds.
            pairs.append((a, b) if i % 2 == 0 else (b, a))
    return tuple(pairs)


def circle_rounds(hosts: Sequence[str]) -> list[Round]:
    """Every unordered pair of ``hosts`` once, as rounds of disjoint pairs (circle method)."""
    return [circle_round(hosts, k) for k in range(circle_count(len(hosts)))]


def mesh_rounds(hosts: Sequence[str]) -> list[Round]:
    """Every ordered pair of ``hosts`` once: the circle rounds, then the same reversed."""
    forward = circle_rounds(hosts)
    return forward + [tuple((b, a) for a, b in r) for r in forward]


def bipartite_round(side_a: Sequence[str], side_b: Sequence[str], r: int) -> Round:
    """Round ``r`` (from 0) of the Latin square: a_i meets b_j where (i + j) mod k = r."""
    k = max(len(side_a), len(side_b))
    return tuple((side_a[i], side_b[(r - i) % k]) for i in range(len(side_a))
                 if (r - i) % k < len(side_b))


def bipartite_rounds(side_a: Sequence[str], side_b: Sequence[str]) -> list[Round]:
    """Every a -> b pair once in max(|A|, |B|) rounds: in round r, a_i meets b_j where
    (i + j) mod k = r, so each host appears at most once per round."""
    k = max(len(side_a), len(side_b))
    return [bipartite_round(side_a, side_b, r) for r in range(k)]


def pack_rounds(pairs: Iterable[Pair]) -> list[Round]:
    """Any pairs, each once, first-fit into rounds where no host appears twice.

    Each host keeps the rounds it is in as the bits of one integer, so a pair's round is
    the lowest bit clear in both of its hosts' (one integer operation over the rounds),
    not a scan of every round's hosts: a 1,000-agent list of 499,500 pairs packs in about
    a second, where the scan took minutes."""
    rounds: list[list[Pair]] = []
    busy: dict[str, int] = {}
    for pair in dict.fromkeys(pairs):  # each pair once, order kept
        taken = 0
        for host in pair:
            taken |= busy.get(host, 0)
        number = (~taken & (taken + 1)).bit_length() - 1  # the lowest clear bit
        if number == len(rounds):
            rounds.append([])
        rounds[number].append(pair)
        for host in pair:
            busy[host] = busy.get(host, 0) | (1 << number)
    return [tuple(r) for r in rounds]


def run_number(group: Group, now: float | None = None) -> int:
    """The number of the group's run that starts at ``now`` (default: the clock): its
    slot on the grid of ``every`` since the epoch, so that successive scheduled runs have
    successive numbers and every runner agrees on them without keeping state."""
    return int((time.time() if now is None else now) // group.every_s)


def random_order(pairs: RandomPairs) -> tuple[tuple[str, ...], list[int]]:
    """A random group's hosts in their seeded order and its circle rounds' seeded order:
    both fixed by the seed alone, so that every run takes its turn from the same cycle."""
    rng = random.Random(pairs.seed)
    hosts = list(pairs.members)
    rng.shuffle(hosts)
    order = list(range(circle_count(len(hosts))))
    rng.shuffle(order)
    return tuple(hosts), order


def random_rounds(pairs: RandomPairs, run: int) -> list[Round]:
    """Run ``run``'s rounds of a random group, all at once (see random_round)."""
    hosts, order = random_order(pairs)
    count = pairs.peers * (2 if pairs.both else 1)
    return [random_round(pairs, run, i, hosts, order) for i in range(count)]


def random_round(pairs: RandomPairs, run: int, index: int, hosts: Sequence[str],
                 order: Sequence[int]) -> Round:
    """Round ``index`` of run ``run`` of a random group (``hosts`` and ``order`` from
    random_order): the circle round at place run x peers + index (mod peers) of the seeded
    cycle of C rounds, so no round twice in a run (peers <= C) and any ceil(C / peers)
    successive runs hold every circle round, i.e. every pair. Both ways: the run's peers
    rounds, then the same reversed. One way: reversed on every other pass of the cycle,
    so 2 ceil(C / peers) runs hold every ordered pair."""
    back, step = divmod(index, pairs.peers)
    place = run * pairs.peers + step
    r = circle_round(hosts, order[place % len(order)])
    reverse = back == 1 if pairs.both else (place // len(order)) % 2 == 1
    return tuple((b, a) for a, b in r) if reverse else r


def runs_to_cover(pairs: RandomPairs) -> int:
    """How many successive runs of a random group test every pair (every ordered pair
    when both ways; one way, every unordered pair, twice as many for every ordered one)."""
    return -(-circle_count(len(pairs.members)) // pairs.peers)


class GroupRounds(Sequence[Round]):
    """The rounds of one group, each worked out when it is asked for: circle for a mesh,
    Latin square for A x B and a reference group (then reversed, both ways), first-fit for
    a list, run ``run``'s few rounds for a random group; only the group's own pairs, each
    at most once. ``len`` and ``tests`` are arithmetic."""

    def __init__(self, group: Group, run: int | None = None) -> None:
        pairs = group.pairs
        self._packed: list[Round] | None = None
        self.run = run_number(group) if run is None else run
        """The run these rounds are of (what a random group's peers depend on)."""
        self.kind = "list"
        self._both = True
        if isinstance(pairs, RandomPairs):  # peers may be n-1: one round at a time too
            self._random = pairs
            hosts, self._order = random_order(pairs)
            self._hosts: Sequence[str] = hosts
            self._half = pairs.peers
            self._both = pairs.both
            self.kind = "random"
        elif isinstance(pairs, MeshPairs):
            self._hosts = pairs.members
            self._half = circle_count(len(pairs.members))
            self.kind = "mesh"
        elif isinstance(pairs, DisjointPairs):
            self._sides = (pairs.side_a, pairs.side_b)
            self._half = max(len(pairs.side_a), len(pairs.side_b))
            self._both = pairs.both
            self.kind = "disjoint"
        else:  # a list: held in the file already, so packing it costs no more
            self._packed = pack_rounds(pairs)
        self.tests = (sum(len(r) for r in self._packed) if self._packed is not None
                      else len(self) * (len(self._hosts) // 2) if self.kind == "random"
                      else len(pairs))
        """How many tests the rounds hold."""

    def __len__(self) -> int:
        if self._packed is not None:
            return len(self._packed)
        return self._half * (2 if self._both else 1)

    @overload
    def __getitem__(self, index: int) -> Round: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Round]: ...

    def __getitem__(self, index: int | slice) -> Round | Sequence[Round]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("round index out of range")
        if self._packed is not None:
            return self._packed[index]
        if self.kind == "random":
            return random_round(self._random, self.run, index, self._hosts, self._order)
        back, number = divmod(index, self._half)
        r = (circle_round(self._hosts, number) if self.kind == "mesh"
             else bipartite_round(*self._sides, number))
        return tuple((b, a) for a, b in r) if back else r

    def __iter__(self) -> Iterator[Round]:
        return (self[i] for i in range(len(self)))


def group_rounds(group: Group, run: int | None = None) -> GroupRounds:
    """The rounds of one group (see GroupRounds), generated as they are reached; ``run``
    numbers the run (default: the one the clock is in, see run_number)."""
    return GroupRounds(group, run)


@attrs.frozen
class PlannedRound:
    """One round of a plan: which group, its number in the group, and its pairs."""

    group: str
    """The group's name."""
    index: int
    """1-based number of the round within its group."""
    of: int
    """How many rounds the group has."""
    pairs: Round
    """(source, target) agent names; no name twice."""


class Plan(Sequence[PlannedRound]):
    """Every round of the chosen groups, group after group (a fleet run never overlaps
    groups), each made when it is reached: iterating a 10,000-agent mesh holds one round
    of 5,000 pairs at a time, not its 10^8 tests. ``len`` and ``tests`` are arithmetic."""

    def __init__(self, groups: Sequence[Group], run: int | None = None) -> None:
        self.groups = [(g, group_rounds(g, run)) for g in groups]
        """Each chosen group with its rounds."""
        self.tests = sum(rounds.tests for _, rounds in self.groups)
        """How many tests the plan holds."""

    def __len__(self) -> int:
        return sum(len(rounds) for _, rounds in self.groups)

    @overload
    def __getitem__(self, index: int) -> PlannedRound: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[PlannedRound]: ...

    def __getitem__(self, index: int | slice
                    ) -> PlannedRound | Sequence[PlannedRound]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        for group, rounds in self.groups:
            if 0 <= index < len(rounds):
                return PlannedRound(group.name, index + 1, len(rounds), rounds[index])
            index -= len(rounds)
        raise IndexError("round index out of range")

    def __iter__(self) -> Iterator[PlannedRound]:
        for group, rounds in self.groups:
            for n, r in enumerate(rounds, start=1):
                yield PlannedRound(group.name, n, len(rounds), r)


def plan(fleet: Fleet, groups: Sequence[str] | None = None, run: int | None = None
         ) -> Plan:
    """Every round of the fleet, group after group, generated as it is reached; ``run``
    numbers the run for random groups (default: each group's slot now, see run_number)."""
    return Plan([g for g in fleet.groups if groups is None or g.name in groups], run)


def without_host(rounds: Sequence[Round], host: str) -> list[Round]:
    """The rounds with ``host``'s pairs taken out (a host that left the fleet) and the
    rounds left empty dropped; every other pair keeps its round."""
    kept = [tuple(p for p in r if host not in p) for r in rounds]
    return [r for r in kept if r]


def conflicts(rounds: Iterable[Round]) -> list[str]:
    """Hosts that appear twice in one round, as 'round N: host' (empty for a good plan)."""
    found = []
    for n, r in enumerate(rounds, start=1):
        seen: set[str] = set()
        for host in (h for pair in r for h in pair):
            if host in seen:
                found.append(f"round {n}: {host}")
            seen.add(host)
    return found


def next_start(slot: float, every: float, slip: float, now: float, rng: random.Random
               ) -> tuple[float, float]:
    """After a run of the slot starting at ``slot`` ends at ``now``: the next slot, and
    when to start it (the slot plus a random 0..slip). A run that overran its period starts
    the latest slot already past at once, and skips those before it: one catch-up, never
    a pile of them, and the schedule stays on its grid instead of drifting."""
    passed = max(1, math.floor((now - slot) / every))
    following = slot + passed * every
    if following <= now:
        return following, now
    return following, following + rng.uniform(0, slip)
