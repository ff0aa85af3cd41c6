"""The embedded default archive: one SQLite file (the standard library's sqlite3).

``sqlite:///var/lib/netprobe/fleet.db`` names /var/lib/netprobe/fleet.db (three slashes
and an absolute path, as in a file URL); ``sqlite:fleet.db`` or a plain path name a file
relative to the working directory. The file is in WAL mode with full syncs: each result
is one transaction, durable when ``add`` returns, and readers (``fleet matrix``, the
exporter) never block the runner.
"""
from __future__ import annotations

import os
import sqlite3
import urllib.parse
from typing import Any

from netprobe.archives import ArchiveError
from netprobe.archives.sql import Dialect, SqlArchive
from netprobe.redact import redact

BUSY_TIMEOUT_S = 10.0  # a reader holding the file briefly must not fail the runner's write


def path_of(url: str) -> str:
    """The file an ``sqlite:`` URL (or a plain path) names."""
    if not url.lower().startswith("sqlite:"):
        return url
    rest = url[len("sqlite:"):]
    if rest.startswith("//"):
        rest = rest[2:]  # sqlite:///abs -> /abs ; sqlite://rel -> rel
    if not rest:
        raise ArchiveError(f"archive {redact(url)}: names no file")
    return rest


class SqliteArchive(SqlArchive):
    """Runs and results in one SQLite file."""

    scheme = "sqlite"
    dialect = Dialect(placeholder="?", id_column="id INTEGER PRIMARY KEY AUTOINCREMENT",
                      real="REAL", integer="INTEGER", time="TEXT", json="TEXT")

    @classmethod
    def exists(cls, url: str) -> bool:
        """Whether the file is there."""
        return os.path.exists(path_of(url))

    def connect(self, url: str) -> Any:
        """Open (create) the file, in WAL mode with full syncs; a file on a read-only
        mount is opened for reading only; a file that is not a netprobe archive (another
        application's database, or no database at all) is refused before anything in it
        changes."""
        path = path_of(url)
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise ArchiveError(f"archive {redact(url)}: no such directory {folder}")
        _check_header(path, url)
        try:
            connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
            _check_tables(connection, url)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=FULL")
            connection.execute("PRAGMA foreign_keys=ON")
        except sqlite3.Error as exc:
            if not _unwritable(exc, path):
                raise ArchiveError(f"archive {redact(url)}: {self.explain(exc)}") from None
            connection = self._read_only(path, url, exc)
        return connection

    def _read_only(self, path: str, url: str, first: sqlite3.Error) -> Any:
        """The file opened for reading only: ``mode=ro`` where SQLite can still map the
        WAL index, else ``immutable=1`` (a WAL file on a read-only mount has no -shm file
        and cannot get one; nobody can write there, so reading it as fixed is right)."""
        uri = "file:" + urllib.parse.quote(os.path.abspath(path))
        problem: BaseException = first
        for flags in ("mode=ro", "mode=ro&immutable=1"):
            try:
                connection = sqlite3.connect(f"{uri}?{flags}", uri=True,
                                             timeout=BUSY_TIMEOUT_S, check_same_thread=False)
                _check_tables(connection, url)
                connection.execute("SELECT COUNT(*) FROM runs").fetchone()
            except sqlite3.Error as exc:
                problem = exc
                continue
            self.read_only = f"cannot write it: {self.explain(first)}"
            return connection
        raise ArchiveError(f"archive {redact(url)}: cannot open it for writing "
                           f"({self.explain(first)}) nor for reading ({problem})")

    def explain(self, exc: BaseException) -> str:
        """sqlite3's error, with what it means for a full disk, a read-only file or a
        lock."""
        text = " ".join(str(exc).split())
        name = getattr(exc, "sqlite_errorname", "")
        if name == "SQLITE_FULL" or "disk is full" in text:
            return f"cannot write: the disk is full ({text})"
        if name.startswith("SQLITE_READONLY") or "readonly" in text:
            return f"cannot write: the file or its directory is read-only ({text})"
        if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text:
            return (f"another process has held the archive locked for over "
                    f"{BUSY_TIMEOUT_S:g} s ({text})")
        return text

    def errors(self) -> tuple[type[BaseException], ...]:
        """sqlite3's errors."""
        return (sqlite3.Error,)


_HEADER = b"SQLite format 3\x00"
COLUMNS = {"runs": frozenset({"run_id", "fleet", "started", "rounds", "pairs", "status"}),
           "results": frozenset({"run_id", "grp", "round", "source", "target", "outcome",
                                 "result"})}
"""Columns a netprobe archive's tables have (among others, so that a user's own extra
columns, tables or views do not make it foreign)."""


def _check_header(path: str, url: str) -> None:
    """ArchiveError unless ``path`` is absent, empty or an SQLite database."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(_HEADER))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ArchiveError(f"archive {redact(url)}: cannot read it: "
                           f"{exc.strerror or exc}") from None
    if head and head != _HEADER:
        raise ArchiveError(f"archive {redact(url)}: not a netprobe archive (not an SQLite "
                           "database at all)")


def _check_tables(connection: sqlite3.Connection, url: str) -> None:
    """ArchiveError if the database has tables and no netprobe runs and results among
    them: another application's file is not to be added to."""
    names = {row[0] for row in connection.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not names:
        return  # a new, empty database: the archive's tables are made in it
    missing = [table for table, wanted in COLUMNS.items() if table not in names
               or not wanted <= {row[1] for row in connection.execute(
                   f"PRAGMA table_info({table})")}]
    if missing:
        shown = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
        connection.close()
        raise ArchiveError(f"archive {redact(url)}: not a netprobe archive (its tables are "
                           f"{shown}; an archive has runs and results with netprobe's columns)")


def _unwritable(exc: sqlite3.Error, path: str) -> bool:
    """Whether opening failed because the file (or its folder, where the WAL and its
    index go) cannot be written: the case for a read-only open."""
    text = str(exc)
    if "readonly" in text or "read-only" in text:
        return True
    return "unable to open" in text and os.path.exists(path) and (
        not os.access(path, os.W_OK) or not os.access(os.path.dirname(os.path.abspath(path))
                                                      or ".", os.W_OK)
        or _read_only_mount(path))


def _read_only_mount(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False
