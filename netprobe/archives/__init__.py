"""Archives: where fleet results are kept, one plugin group of their own.

An archive is named by a URL whose scheme is the plugin's entry-point name in the
``netprobe.archives`` group: ``sqlite:///var/lib/netprobe/fleet.db`` (or a plain file
path), ``postgresql://user@host/db``. Third parties add archives by publishing a package
with an entry point in that group whose class derives from :class:`Archive`.

Every archive keeps the same two things: runs (one row per fleet run) and results (one
row per test, written as the test ends, with the summary figures as columns and the
whole Result as JSON), so a runner that is killed loses at most the tests in flight.
"""
from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, Callable, ClassVar

import attrs

from netprobe.errors import NetprobeError, SpecError
from netprobe.redact import redact
from netprobe.schema import Result

GROUP = "netprobe.archives"
"""The entry-point group of archive plugins."""

OUTCOMES = ("ok", "failed", "unreachable", "timeout", "interrupted", "busy")
"""What became of one pair's test: ``unreachable`` when an agent of the pair did not
answer before the round, ``timeout`` when the round ended before the test did, ``busy``
when the target, a stock iperf3 server, was running someone else's test."""


class ArchiveError(NetprobeError):
    """The archive cannot be opened, read or written (the message says which and why)."""


class ArchiveMissing(ArchiveError, SpecError):
    """A reader named an archive that is not there: a bad argument (exit 2), not a fault."""


@attrs.frozen
class PairRecord:
    """One pair's test in one round, as archived (a fleet's record; netprobe.record.Record
    is the base class of the schema's records, a different thing)."""

    run_id: str
    """The fleet run it belongs to."""
    group: str
    """The group's name."""
    round: int
    """The round's number within its group, from 1."""
    source: str
    """The sending agent's name."""
    target: str
    """The receiving agent's name."""
    time: str
    """When the test started (UTC, ISO 8601)."""
    outcome: str = attrs.field(validator=attrs.validators.in_(OUTCOMES))
    """ok, failed, unreachable, timeout, interrupted or busy."""
    error: str | None = None
    """Why it is not ok (None when it is)."""
    result: Result | None = None
    """The whole result (a partial one for a failed test; None when none came back)."""


@attrs.frozen
class Run:
    """One fleet run."""

    run_id: str
    """Unique id (also the results' ``run_id``)."""
    fleet: str
    """The fleet file it ran."""
    started: str
    """UTC, ISO 8601."""
    rounds: int
    """Rounds planned."""
    pairs: int
    """Tests planned."""
    finished: str | None = None
    """UTC, ISO 8601; None while it runs, or when the runner died."""
    status: str = "incomplete"
    """incomplete (written when the run starts: it is still running, or its runner
    stopped before it could record its end, killed or on a full disk), done, interrupted
    or failed (the archive refused a write)."""


def figures(result: Result | None) -> dict[str, Any]:
    """The summary figures kept as columns: the flow the spec asked for (client to server,
    or server to client for a reverse test); every figure None when unknown."""
    out: dict[str, Any] = dict.fromkeys(FIGURES)
    if result is None:
        return out
    direction = "server_to_client" if result.spec.direction == "reverse" else "client_to_server"
    flow = result.summary(direction)
    sender = flow.sender if flow else None
    receiver = flow.receiver if flow else None
    out.update(
        tool=result.tool.name, protocol=result.spec.protocol, duration_s=result.duration_s,
        sender_bits_per_second=sender.bits_per_second if sender else None,
        receiver_bits_per_second=receiver.bits_per_second if receiver else None,
        bytes=receiver.bytes if receiver else (sender.bytes if sender else None),
        retransmits=sender.retransmits if sender else None,
        rtt_us=sender.rtt_us if sender else None,
        lost_packets=receiver.lost_packets if receiver else None,
        jitter_ms=receiver.jitter_ms if receiver else None)
    return out


FIGURES = ("tool", "protocol", "duration_s", "sender_bits_per_second",
           "receiver_bits_per_second", "bytes", "retransmits", "rtt_us", "lost_packets",
           "jitter_ms")
"""The result's figures an archive keeps as columns, in this order."""


class Archive(abc.ABC):
    """Where a fleet's runs and results go. Methods may be called from several threads."""

    scheme: ClassVar[str] = ""
    """The URL scheme (the entry-point name)."""
    url: str = ""
    """The archive's URL as messages show it (no password)."""

    @abc.abstractmethod
    def __init__(self, url: str) -> None:
        """Open (and create, if new) the archive at ``url``; ArchiveError if it cannot."""

    @classmethod
    def exists(cls, url: str) -> bool:
        """Whether ``url`` names an archive that is there already, asked before a reader
        opens it (so that a mistyped path is an error, not a new empty archive). True
        where a plugin cannot tell, as on a database server, where opening makes only
        empty tables."""
        return True

    @abc.abstractmethod
    def start_run(self, run: Run) -> None:
        """Record that a run began."""

    @abc.abstractmethod
    def add(self, record: PairRecord) -> None:
        """Keep one test's record, durably, before returning (one transaction)."""

    @abc.abstractmethod
    def finish_run(self, run_id: str, finished: str, status: str) -> None:
        """Record how and when a run ended."""

    @abc.abstractmethod
    def runs(self) -> list[Run]:
        """Every run, oldest first."""

    @abc.abstractmethod
    def records(self, run_id: str | None = None) -> list[PairRecord]:
        """Every record (of one run), in the order they were written."""

    @abc.abstractmethod
    def latest(self) -> list[PairRecord]:
        """The newest record of each (group, source, target)."""

    warnings: list[str]
    """Rows the readers skipped (one line each, naming the row and why); an archive that
    never skips may leave it unset (readers use ``getattr(archive, "warnings", [])``)."""

    def close(self) -> None:  # noqa: B027 (a default: not every archive holds a connection)
        """Release the connection."""

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def scheme_of(url: str) -> str:
    """The plugin name for ``url``: its scheme, or ``sqlite`` for a plain file path."""
    head, sep, _ = url.partition(":")
    if not sep or "/" in head or len(head) < 2:  # a path (C:\\ has a one-letter "scheme")
        return "sqlite"
    return {"postgres": "postgresql"}.get(head.lower(), head.lower())


def backend_manager(name: str) -> Any:
    """The stevedore manager for one archive plugin (the one place tests can substitute)."""
    from stevedore import DriverManager  # imported late: start-up time on small routers

    return DriverManager(namespace=GROUP, name=name, invoke_on_load=False)


def installed() -> list[str]:
    """The names of the installed archive plugins."""
    from stevedore import ExtensionManager

    return sorted(ExtensionManager(namespace=GROUP).names())


def open_archive(url: str, manager: Callable[[str], Any] = backend_manager, *,
                 create: bool = True) -> Archive:
    """The archive ``url`` names, opened (SpecError when no plugin handles its scheme).
    ``create=False`` is a reader's: ArchiveMissing rather than a new, empty archive."""
    name = scheme_of(url)
    try:
        cls = manager(name).driver
    except Exception as exc:  # NoMatches, or the plugin failed to import
        known = ", ".join(installed()) or "none"
        raise SpecError(f"no archive plugin for {name!r} in {redact(url)!r} (installed: {known}): "
                        f"{exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Archive)):
        raise SpecError(f"archive plugin {name!r} is not a netprobe Archive: {cls!r}")
    if not create and not cls.exists(url):
        raise ArchiveMissing(f"archive {redact(url)}: there is none (`netprobe fleet run` makes "
                             "one; a report or a matrix only reads)")
    return cls(url)


__all__: Sequence[str] = ["FIGURES", "GROUP", "OUTCOMES", "Archive", "ArchiveError",
                          "ArchiveMissing", "PairRecord",
                          "Run", "figures", "open_archive", "scheme_of"]
