"""The latest pair-by-pair figures of a fleet, as a matrix (pure; the CLI and the
exporter draw it)."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from netprobe.archives import PairRecord, figures


@attrs.frozen
class Cell:
    """One ordered pair's latest test."""

    outcome: str
    """ok, failed, unreachable, timeout, interrupted or busy."""
    receiver_bits_per_second: float | None
    """What arrived (None when nothing was measured)."""
    time: str
    """When that test started."""
    error: str | None = None
    """Why it is not ok."""


@attrs.frozen
class Matrix:
    """Sources down, targets across, for one group (or all groups, newest wins)."""

    group: str | None
    """The group shown, None for all."""
    hosts: tuple[str, ...]
    """Every agent that appears, sources and targets, sorted by name (one order however
    the matrix is asked for: with the fleet file or the archive alone)."""
    cells: dict[tuple[str, str], Cell]
    """(source, target) -> its latest cell; pairs never tested are absent."""


def build(records: Iterable[PairRecord], group: str | None = None) -> Matrix:
    """The matrix of the newest record per pair among ``records`` (in archive order), its
    hosts sorted by name."""
    cells: dict[tuple[str, str], Cell] = {}
    hosts: set[str] = set()
    for record in records:
        if group is not None and record.group != group:
            continue
        hosts.update((record.source, record.target))
        bps = figures(record.result)["receiver_bits_per_second"] if record.outcome == "ok" \
            else None
        cells[(record.source, record.target)] = Cell(record.outcome, bps, record.time,
                                                     record.error)
    return Matrix(group, tuple(sorted(hosts)), cells)


def groups_of(records: Sequence[PairRecord]) -> list[str]:
    """The groups among ``records``, in first-seen order."""
    return list(dict.fromkeys(r.group for r in records))
