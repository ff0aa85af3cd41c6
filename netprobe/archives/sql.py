"""The SQL both built-in archives share: the same two tables, the same queries; each
database brings its column types, its placeholder and its connection.

``runs``: one row per fleet run. ``results``: one row per test, with the summary figures
as columns (``FIGURES``) for queries and dashboards, and the whole Result as JSON for
``netprobe report``; an index on (time, source, target) for "this pair, lately".
"""
from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Sequence
from typing import Any

import attrs

from netprobe import convert
from netprobe.archives import FIGURES, Archive, ArchiveError, PairRecord, Run, figures
from netprobe.errors import NetprobeError
from netprobe.redact import redact
from netprobe.schema import Result


@attrs.frozen
class Dialect:
    """What differs between databases."""

    placeholder: str
    """The parameter marker: ``?`` or ``%s``."""
    id_column: str
    """The auto-numbered key column."""
    real: str
    """A floating-point column."""
    integer: str
    """A 64-bit integer column."""
    time: str
    """A timestamp column."""
    json: str
    """A JSON column."""


_RECORD_COLUMNS = ("run_id", "grp", "round", "source", "target", "time", "outcome", "error")
_FIGURE_TYPES = {"tool": "text", "protocol": "text", "duration_s": "real",
                 "sender_bits_per_second": "real", "receiver_bits_per_second": "real",
                 "bytes": "integer", "retransmits": "integer", "rtt_us": "real",
                 "lost_packets": "integer", "jitter_ms": "real"}


def create_statements(d: Dialect) -> list[str]:
    """The tables and the index, created if missing."""
    types = {"text": "TEXT", "real": d.real, "integer": d.integer}
    figure_columns = ", ".join(f"{name} {types[_FIGURE_TYPES[name]]}" for name in FIGURES)
    return [
        f"CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, fleet TEXT NOT NULL, "
        f"started {d.time} NOT NULL, finished {d.time}, rounds {d.integer} NOT NULL, "
        f"pairs {d.integer} NOT NULL, status TEXT NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS results ({d.id_column}, "
        f"run_id TEXT NOT NULL REFERENCES runs(run_id), grp TEXT NOT NULL, "
        f"round {d.integer} NOT NULL, source TEXT NOT NULL, target TEXT NOT NULL, "
        f"time {d.time} NOT NULL, outcome TEXT NOT NULL, error TEXT, {figure_columns}, "
        f"result {d.json})",
        "CREATE INDEX IF NOT EXISTS results_time_pair ON results (time, source, target)",
        "CREATE INDEX IF NOT EXISTS results_run ON results (run_id)",
    ]


class SqlArchive(Archive):
    """An archive over a DB-API connection; subclasses connect and name their dialect."""

    dialect: Dialect

    def __init__(self, url: str) -> None:
        self.url = self.shown(url)
        """The URL as messages show it (no password)."""
        self.warnings: list[str] = []
        """Rows the readers skipped, one line each naming the row and why."""
        self.read_only: str | None = None
        """Why the archive was opened only for reading (None: it can be written)."""
        self._lock = threading.Lock()  # one connection, many runner threads
        self.connection = self.connect(url)
        try:
            if self.read_only is None:
                with self._lock:
                    self.before_create()
                    for statement in create_statements(self.dialect):
                        self._execute(statement)
                    self._commit()
        except NetprobeError:
            self.close()
            raise

    # -- what subclasses provide ------------------------------------------------------

    def connect(self, url: str) -> Any:
        """A DB-API connection for ``url`` (ArchiveError if it cannot be had)."""
        raise NotImplementedError

    def before_create(self) -> None:
        """Run before the tables are created, in the same transaction (a database where
        several runners may create them at once serialises them here)."""

    def shown(self, url: str) -> str:
        """``url`` fit for messages: its password, if any, replaced by ``***``."""
        return redact(url)

    def errors(self) -> tuple[type[BaseException], ...]:
        """The driver's exceptions that mean the database refused or failed."""
        raise NotImplementedError

    def encode_json(self, data: Any) -> Any:
        """A Result's unstructured form as the JSON column takes it."""
        return json.dumps(data, allow_nan=False)

    def decode_json(self, value: Any) -> Any:
        """The JSON column's value back to plain data."""
        return json.loads(value) if isinstance(value, (str, bytes)) else value

    def time_in(self, text: str) -> Any:
        """An ISO 8601 time as the time column takes it."""
        return text

    def time_out(self, value: Any) -> str:
        """The time column's value as ISO 8601 text."""
        return str(value)

    def text_in(self, text: str) -> str:
        """A text parameter as the database can keep it (a subclass replaces what its
        database refuses)."""
        return text

    def explain(self, exc: BaseException) -> str:
        """The driver's error in a few words (a subclass adds what it means)."""
        return " ".join(str(exc).split())

    # -- the interface ------------------------------------------------------------------

    def start_run(self, run: Run) -> None:
        """Record that a run began."""
        self._write("INSERT INTO runs (run_id, fleet, started, finished, rounds, pairs, status) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (run.run_id, run.fleet, self.time_in(run.started), None, run.rounds,
                     run.pairs, run.status))

    def add(self, record: PairRecord) -> None:
        """One test's record, committed before this returns."""
        self._write(*self.insert_of(record))

    def insert_of(self, record: PairRecord) -> tuple[str, tuple[Any, ...]]:
        """The INSERT of one record and its parameters (``?`` marks, text made fit for
        the database), for a caller that writes it inside a transaction of its own (the
        shared schedule archives a result and frees its hosts in one)."""
        data = convert.unstructure(record.result) if record.result is not None else None
        values = (record.run_id, record.group, record.round, record.source, record.target,
                  self.time_in(record.time), record.outcome, record.error,
                  *figures(record.result).values(),
                  None if data is None else self.encode_json(data))
        columns = (*_RECORD_COLUMNS, *FIGURES, "result")
        marks = ", ".join("?" * len(columns))
        values = tuple(self.text_in(v) if isinstance(v, str) else v for v in values)
        return f"INSERT INTO results ({', '.join(columns)}) VALUES ({marks})", values

    def finish_run(self, run_id: str, finished: str, status: str) -> None:
        """Record how and when a run ended."""
        self._write("UPDATE runs SET finished = ?, status = ? WHERE run_id = ?",
                    (self.time_in(finished), status, run_id))

    def runs(self) -> list[Run]:
        """Every run, oldest first (a row that cannot be read is skipped, with a warning)."""
        rows = self._read("SELECT run_id, fleet, started, rounds, pairs, finished, status "
                          "FROM runs ORDER BY started, run_id")
        out = []
        for r in rows:
            try:
                out.append(Run(str(r[0]), str(r[1]), self.time_out(r[2]), int(r[3]),
                               int(r[4]), None if r[5] is None else self.time_out(r[5]),
                               str(r[6])))
            except (TypeError, ValueError) as exc:
                self._skip(f"runs row {_shown(r[0])}", exc)
        return out

    def records(self, run_id: str | None = None) -> list[PairRecord]:
        """Every record (of one run), in the order they were written."""
        where, params = ("WHERE run_id = ? ", (run_id,)) if run_id else ("", ())
        return self._records(f"{where}ORDER BY id", params)

    def latest(self) -> list[PairRecord]:
        """The newest record of each (group, source, target)."""
        return self._records("WHERE id IN (SELECT MAX(id) FROM results "
                             "GROUP BY grp, source, target) ORDER BY id", ())

    def latest_figures(self) -> list[tuple[PairRecord, dict[str, Any]]]:
        """The newest record of each (group, source, target) with its summary figures
        (``FIGURES``), read from their columns without decoding a single result: what a
        metrics scrape needs, at a fraction of :meth:`latest`'s cost on a big fleet. The
        records carry no ``result``; a row whose columns cannot be read is skipped, with a
        warning."""
        rows = self._read(f"SELECT {', '.join(_RECORD_COLUMNS)}, {', '.join(FIGURES)}, id "
                          "FROM results WHERE id IN (SELECT MAX(id) FROM results "
                          "GROUP BY grp, source, target) ORDER BY id")
        out = []
        for row in rows:
            try:
                record = PairRecord(row[0], row[1], int(row[2]), row[3], row[4],
                                    self.time_out(row[5]), row[6], row[7])
            except Exception as exc:  # a row is data: any fault in it skips the row
                self._skip(f"results row {_shown(row[-1])} (run {_shown(row[0])}, "
                           f"{_shown(row[3])} -> {_shown(row[4])})", exc)
                continue
            out.append((record, dict(zip(FIGURES, row[len(_RECORD_COLUMNS):-1]))))
        return out

    def close(self) -> None:
        """Close the connection."""
        connection = getattr(self, "connection", None)
        if connection is not None:
            with contextlib.suppress(Exception):  # a broken connection: nothing more to do
                connection.close()
            self.connection = None

    # -- plumbing -----------------------------------------------------------------------

    def _records(self, tail: str, params: Sequence[Any]) -> list[PairRecord]:
        rows = self._read(f"SELECT {', '.join(_RECORD_COLUMNS)}, result, id FROM results "
                          f"{tail}", params)
        out = []
        for row in rows:
            try:
                out.append(self._record(row))
            except Exception as exc:  # a row is data: any fault in it skips the row
                self._skip(f"results row {_shown(row[9])} (run {_shown(row[0])}, "
                           f"{_shown(row[3])} -> {_shown(row[4])})", exc)
        return out

    def _record(self, row: Sequence[Any]) -> PairRecord:
        try:
            data = None if row[8] is None else self.decode_json(row[8])
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            raise ValueError(f"its result is not JSON ({exc})") from None
        result = None if data is None else convert.structure(data, Result)
        return PairRecord(row[0], row[1], int(row[2]), row[3], row[4], self.time_out(row[5]),
                      row[6], row[7], result)

    def _skip(self, row: str, exc: BaseException) -> None:
        """Note a row a reader left out (the rest of the archive still reads)."""
        why = " ".join(str(exc).split())[:300] or type(exc).__name__
        self.warnings.append(f"archive {self.url}: {row} skipped: {why}")

    def _commit(self) -> None:
        try:
            self.connection.commit()
        except self.errors() as exc:
            raise ArchiveError(f"archive {self.url}: {self.explain(exc)}") from None

    def _sql(self, statement: str) -> str:
        return statement.replace("?", self.dialect.placeholder)

    def _execute(self, statement: str, params: Sequence[Any] = ()) -> Any:
        if self.connection is None:
            raise ArchiveError(f"archive {self.url} is closed")
        try:
            cursor = self.connection.cursor()
            cursor.execute(self._sql(statement), tuple(params))
            return cursor
        except self.errors() as exc:
            raise ArchiveError(f"archive {self.url}: {redact(self.explain(exc))}") from None

    def _write(self, statement: str, params: Sequence[Any]) -> None:
        """One statement in its own transaction; any failure of the database (a full
        disk, a read-only file, a lock held too long) is one ArchiveError, and what was
        committed before stays as it was."""
        if self.read_only is not None:
            raise ArchiveError(f"archive {self.url} is read-only here ({self.read_only}): "
                               "it can be read, not written")
        params = tuple(self.text_in(p) if isinstance(p, str) else p for p in params)
        with self._lock:
            try:
                self._execute(statement, params)
                self._commit()
            except BaseException:
                if self.connection is not None:
                    with contextlib.suppress(*self.errors()):  # the error above says why
                        self.connection.rollback()
                raise

    def _read(self, statement: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        with self._lock:
            try:
                rows = list(self._execute(statement, params).fetchall())
            except self.errors() as exc:  # a fault while fetching (a damaged page)
                raise ArchiveError(f"archive {self.url}: {self.explain(exc)}") from None
            self._commit()  # end the read transaction (PostgreSQL opens one)
            return rows


def _shown(value: Any) -> str:
    """A column's value for a warning: short, on one line."""
    text = " ".join(str(value).split())
    return text if len(text) <= 40 else text[:37] + "..."
