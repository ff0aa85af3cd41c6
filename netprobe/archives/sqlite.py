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
        """Open (create) the file, in WAL mode with full syncs."""
        path = path_of(url)
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise ArchiveError(f"archive {redact(url)}: no such directory {folder}")
        try:
            connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=FULL")
            connection.execute("PRAGMA foreign_keys=ON")
        except sqlite3.Error as exc:
            raise ArchiveError(f"archive {redact(url)}: {exc}") from None
        return connection

    def errors(self) -> tuple[type[BaseException], ...]:
        """sqlite3's errors."""
        return (sqlite3.Error,)
