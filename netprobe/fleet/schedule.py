"""Rounds in which no host takes part in two tests at once (pure functions).

A throughput test loads both of its hosts: two tests sharing a host share its link and
each reads about half. So a group's pairs are run in rounds of disjoint pairs, one round
after the other. A mesh of n hosts is compiled by the round-robin (circle) method: fix one
host, rotate the others one place per round; n-1 rounds of n/2 pairs cover every
unordered pair once, and the same rounds reversed cover the other direction, 2(n-1)
rounds in all. An odd n gets a stand-in host: whoever meets it sits the round out (a
bye), n rounds per direction. Disjoint groups (A x B) are a Latin square, max(|A|, |B|)
rounds per direction; any other set of pairs is packed first-fit.
"""
from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from typing import Optional

import attrs

from netprobe.fleet.config import Fleet, Group

Pair = tuple[str, str]
Round = tuple[Pair, ...]


def circle_rounds(hosts: Sequence[str]) -> list[Round]:
    """Every unordered pair of ``hosts`` once, as rounds of disjoint pairs (circle method)."""
    ring: list[Optional[str]] = list(hosts)
    if len(ring) % 2:
        ring.append(None)  # the bye
    n = len(ring)
    rounds = []
    for _ in range(n - 1):
        pairs = []
        for i in range(n // 2):
            a, b = ring[i], ring[n - 1 - i]
            if a is not None and b is not None:
                # Alternate who sends first so that each host sends about as often as it
                # receives within one direction's rounds.
                pairs.append((a, b) if i % 2 == 0 else (b, a))
        rounds.append(tuple(pairs))
        ring = [ring[0], ring[-1], *ring[1:-1]]  # host 0 stays, the rest turn one place
    return rounds


def mesh_rounds(hosts: Sequence[str]) -> list[Round]:
    """Every ordered pair of ``hosts`` once: the circle rounds, then the same reversed."""
    forward = circle_rounds(hosts)
    return forward + [tuple((b, a) for a, b in r) for r in forward]


def bipartite_rounds(side_a: Sequence[str], side_b: Sequence[str]) -> list[Round]:
    """Every a -> b pair once in max(|A|, |B|) rounds: in round r, a_i meets b_j where
    (i + j) mod k = r, so each host appears at most once per round."""
    k = max(len(side_a), len(side_b))
    return [tuple((side_a[i], side_b[(r - i) % k]) for i in range(len(side_a))
                  if (r - i) % k < len(side_b)) for r in range(k)]


def pack_rounds(pairs: Iterable[Pair]) -> list[Round]:
    """Any pairs, each once, first-fit into rounds where no host appears twice."""
    rounds: list[list[Pair]] = []
    busy: list[set[str]] = []
    for pair in dict.fromkeys(pairs):  # each pair once, order kept
        for members, hosts in zip(rounds, busy):
            if not hosts & set(pair):
                members.append(pair)
                hosts.update(pair)
                break
        else:
            rounds.append([pair])
            busy.append(set(pair))
    return [tuple(r) for r in rounds]


def group_rounds(group: Group) -> list[Round]:
    """The rounds of one group: circle for a full mesh, Latin square for a full A x B,
    first-fit for the rest; only the group's own pairs, each exactly once."""
    wanted = set(group.pairs)
    hosts = list(dict.fromkeys(h for pair in group.pairs for h in pair))
    if group.kind == "mesh" and len(wanted) == len(hosts) * (len(hosts) - 1):
        return mesh_rounds(hosts)
    if group.kind == "disjoint":
        side_a, side_b = group.sides
        forward = bipartite_rounds(side_a, side_b)
        both = (side_b[0], side_a[0]) in wanted
        return forward + [tuple((b, a) for a, b in r) for r in forward] if both else forward
    return pack_rounds(group.pairs)


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


def plan(fleet: Fleet, groups: Optional[Sequence[str]] = None) -> list[PlannedRound]:
    """Every round of the fleet, group after group (a fleet run never overlaps groups)."""
    chosen = [g for g in fleet.groups if groups is None or g.name in groups]
    out = []
    for group in chosen:
        rounds = group_rounds(group)
        out += [PlannedRound(group.name, n, len(rounds), r) for n, r in
                enumerate(rounds, start=1)]
    return out


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
