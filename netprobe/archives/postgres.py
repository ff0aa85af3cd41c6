"""The PostgreSQL archive (psycopg 3: ``pip install 'netprobe-meter[postgres]'``).

``postgresql://user:password@host:5432/dbname`` or any libpq connection string
(``postgresql:///netprobe?host=/run/postgresql`` for a unix socket). The tables are the
SQLite archive's, with real timestamps (``timestamptz``, UTC) and the Result as ``jsonb``;
they are created on first use. psycopg is imported only when this archive is opened, so
installs without the extra never load it.
"""
from __future__ import annotations

import datetime
from typing import Any

from netprobe.archives import ArchiveError
from netprobe.archives.sql import Dialect, SqlArchive
from netprobe.redact import redact


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise ArchiveError("the PostgreSQL archive needs psycopg 3: "
                           "pip install 'netprobe-meter[postgres]'") from None
    return psycopg


CREATE_LOCK = 0x6E65_7470_726F_6265
"""The advisory lock key under which a PostgreSQL archive's tables are created."""

NUL_REPLACEMENT = "\ufffd"
"""What a NUL character in text becomes in PostgreSQL, which refuses NUL in text and
jsonb alike."""


def _without_nul(data: Any) -> Any:
    """``data`` (plain JSON data) with NUL in every string and key replaced."""
    if isinstance(data, str):
        return data.replace("\x00", NUL_REPLACEMENT)
    if isinstance(data, dict):
        return {_without_nul(k): _without_nul(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_without_nul(v) for v in data]
    return data


class PostgresArchive(SqlArchive):
    """Runs and results in a PostgreSQL database."""

    scheme = "postgresql"
    dialect = Dialect(placeholder="%s", id_column="id BIGSERIAL PRIMARY KEY",
                      real="DOUBLE PRECISION", integer="BIGINT", time="TIMESTAMPTZ",
                      json="JSONB")

    def connect(self, url: str) -> Any:
        """Connect, with the session's time zone UTC so times read back as they went in."""
        psycopg = _psycopg()
        conninfo = "postgresql" + url[len("postgres"):] if url.startswith("postgres:") else url
        try:
            connection = psycopg.connect(conninfo, connect_timeout=10)
            connection.execute("SET TIME ZONE 'UTC'")
            connection.commit()
        except psycopg.Error as exc:
            # the driver may quote the connection string, password and all
            message = redact(" ".join(str(exc).split()), url)
            raise ArchiveError(f"archive {redact(url)}: {message}") from None
        return connection

    def before_create(self) -> None:
        """One creator at a time: runners started together on a new database would each
        find no table and create it, and all but one fail on the catalogue's unique key
        (CREATE TABLE IF NOT EXISTS does not lock against that). The lock ends with the
        transaction that creates the tables."""
        self._execute("SELECT pg_advisory_xact_lock(?)", (CREATE_LOCK,))

    def errors(self) -> tuple[type[BaseException], ...]:
        """psycopg's errors."""
        return (_psycopg().Error,)

    def encode_json(self, data: Any) -> Any:
        """A jsonb parameter (its text without NUL, as :meth:`text_in`)."""
        from psycopg.types.json import Jsonb

        return Jsonb(_without_nul(data))

    def text_in(self, text: str) -> str:
        """PostgreSQL keeps no NUL in text or jsonb: each becomes U+FFFD, the replacement
        character, so an agent's error text with one is kept (and seen to be altered)
        rather than failing the whole run."""
        return text.replace("\x00", NUL_REPLACEMENT)

    def time_in(self, text: str) -> Any:
        """An aware datetime for a timestamptz column."""
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))

    def time_out(self, value: Any) -> str:
        """ISO 8601 text, as netprobe writes times elsewhere."""
        if isinstance(value, datetime.datetime):
            return value.astimezone(datetime.timezone.utc).isoformat(timespec="milliseconds")
        return str(value)

