"""Archives: the netprobe.archives plugin group, SQLite always and PostgreSQL against a
real server; the same records come back from both, figures as columns, whole Results
as JSON; a writer killed mid-stream leaves only whole records."""
from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import attrs
import pytest

from netprobe import convert
from netprobe.archives import (
    Archive,
    ArchiveError,
    PairRecord,
    Run,
    figures,
    open_archive,
    scheme_of,
)
from netprobe.archives.sqlite import SqliteArchive, path_of
from netprobe.errors import SpecError
from netprobe.schema import Result

from .servers import NETPROBE


@pytest.fixture(scope="module")
def results() -> list[Result]:
    """Two real results: TCP and UDP over loopback (both ends here)."""
    out = []
    for extra in ([], ["-u", "-b", "20M"]):
        run = subprocess.run([*NETPROBE, "run", "-t", "0.5", "--json", *extra],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        out.append(convert.from_json(run.stdout))
    return out


def _fill(archive: Archive, results: list[Result]) -> None:
    archive.start_run(Run("run-1", "fleet.toml", "2026-12-01T10:00:00.000+00:00", 2, 3))
    archive.add(PairRecord("run-1", "core", 1, "a", "b", "2026-12-01T10:00:01.000+00:00", "ok",
                       None, results[0]))
    archive.add(PairRecord("run-1", "core", 1, "c", "d", "2026-12-01T10:00:01.500+00:00",
                       "unreachable", "no netprobe agent answers at 10.0.0.4"))
    archive.add(PairRecord("run-1", "core", 2, "a", "b", "2026-12-01T10:00:05.000+00:00", "ok",
                       None, results[1]))
    archive.finish_run("run-1", "2026-12-01T10:00:09.000+00:00", "done")


def _check_round_trip(archive: Archive, results: list[Result]) -> None:
    _fill(archive, results)
    (run,) = archive.runs()
    assert (run.run_id, run.status, run.rounds, run.pairs) == ("run-1", "done", 2, 3)
    assert run.started == "2026-12-01T10:00:00.000+00:00"
    assert run.finished == "2026-12-01T10:00:09.000+00:00"
    records = archive.records("run-1")
    assert [(r.round, r.source, r.target, r.outcome) for r in records] == [
        (1, "a", "b", "ok"), (1, "c", "d", "unreachable"), (2, "a", "b", "ok")]
    assert records[0].result == results[0] and records[2].result == results[1]
    assert records[1].result is None and "10.0.0.4" in str(records[1].error)
    latest = archive.latest()  # the newest of each (group, source, target)
    assert [(r.round, r.source) for r in latest] == [(1, "c"), (2, "a")]
    # the same, from the figure columns alone (what /metrics reads)
    light = archive.latest_figures()  # type: ignore[attr-defined]
    assert [record for record, _ in light] == [attrs.evolve(r, result=None) for r in latest]
    for (_, found), record in zip(light, latest):
        assert found == pytest.approx(figures(record.result)) if record.result else \
            set(found.values()) == {None}


def _figures_by_sql(rows: list[tuple], results: list[Result]) -> None:
    tcp = results[0].summary()
    assert tcp is not None and tcp.receiver is not None and tcp.sender is not None
    ok = [r for r in rows if r[1] == "ok"]
    assert ok[0][2] == "tcp" and ok[0][3] == pytest.approx(tcp.receiver.bits_per_second)
    assert ok[0][4] == tcp.sender.retransmits and ok[1][2] == "udp"
    assert next(r for r in rows if r[1] == "unreachable")[3] is None


def test_sqlite_archive(tmp_path: Path, results: list[Result]) -> None:
    db = tmp_path / "fleet.db"
    with open_archive(f"sqlite://{db}") as archive:
        assert isinstance(archive, SqliteArchive)
        _check_round_trip(archive, results)
    with sqlite3.connect(db) as plain:  # the figures are real columns, for any SQL tool
        rows = plain.execute("SELECT source, outcome, protocol, receiver_bits_per_second, "
                             "retransmits FROM results ORDER BY id").fetchall()
        indexes = {r[0] for r in plain.execute("SELECT name FROM sqlite_master "
                                               "WHERE type = 'index'")}
    _figures_by_sql(rows, results)
    assert "results_time_pair" in indexes
    with open_archive(str(db)) as again:  # reopened: the same data, nothing recreated
        assert len(again.records()) == 3


def test_postgres_archive(postgres_url: str, results: list[Result]) -> None:
    import psycopg

    with open_archive(postgres_url) as archive:
        assert type(archive).__name__ == "PostgresArchive"
        _check_round_trip(archive, results)
    conninfo = postgres_url
    with psycopg.connect(conninfo) as plain:
        rows = plain.execute("SELECT source, outcome, protocol, receiver_bits_per_second, "
                             "retransmits FROM results ORDER BY id").fetchall()
        kinds = dict(plain.execute("SELECT column_name, data_type FROM information_schema."
                                   "columns WHERE table_name = 'results'").fetchall())
        indexes = {r[0] for r in plain.execute("SELECT indexname FROM pg_indexes "
                                               "WHERE tablename = 'results'")}
        mbit = plain.execute("SELECT (result->'summaries'->0->'receiver'->>'bits_per_second')"
                             "::float FROM results WHERE protocol = 'tcp'").fetchone()
    _figures_by_sql(rows, results)
    assert kinds["time"] == "timestamp with time zone" and kinds["result"] == "jsonb"
    assert "results_time_pair" in indexes
    assert mbit is not None and mbit[0] == pytest.approx(rows[0][3])  # the JSON is queryable
    with open_archive(postgres_url.replace("postgresql:", "postgres:", 1)) as again:
        assert len(again.records()) == 3


def test_postgres_unreachable_is_one_line() -> None:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed")
    with pytest.raises(ArchiveError) as caught:
        open_archive("postgresql://netprobe:hunter2@127.0.0.1:1/none")
    assert "hunter2" not in str(caught.value) and "\n" not in str(caught.value)


def test_archive_urls(tmp_path: Path) -> None:
    assert scheme_of("/var/lib/x.db") == scheme_of("x.db") == "sqlite"
    assert scheme_of("sqlite:///x.db") == "sqlite" and scheme_of("postgres://h/d") == "postgresql"
    assert path_of("sqlite:///var/x.db") == "/var/x.db" and path_of("sqlite:rel.db") == "rel.db"
    with pytest.raises(SpecError, match="no archive plugin for 'mongodb'"):
        open_archive("mongodb://h/d")
    with pytest.raises(ArchiveError, match="no such directory"):
        open_archive(str(tmp_path / "missing" / "x.db"))


WRITER = textwrap.dedent("""
    import sys
    from netprobe import convert
    from netprobe.archives import PairRecord, Run, open_archive
    result = convert.from_json(open(sys.argv[2]).read())
    archive = open_archive(sys.argv[1])
    archive.start_run(Run("killed", "f", "2026-12-01T10:00:00.000+00:00", 1, 100000))
    for n in range(100000):
        archive.add(PairRecord("killed", "g", 1, "a", f"b{n}", "2026-12-01T10:00:01.000+00:00",
                           "ok", None, result))
        print(n, flush=True)
""")


def test_a_killed_writer_leaves_only_whole_records(tmp_path: Path,
                                                   results: list[Result]) -> None:
    db, saved = tmp_path / "k.db", tmp_path / "r.json"
    saved.write_text(convert.to_json(results[0]))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db), str(saved)],
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    done = -1
    end = time.monotonic() + 30
    while done < 50 and time.monotonic() < end:  # at least 50 committed, then kill mid-write
        done = int(writer.stdout.readline())
    writer.send_signal(signal.SIGKILL)
    writer.wait(10)
    with sqlite3.connect(db) as plain:
        assert plain.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        rows = plain.execute("SELECT target, result FROM results").fetchall()
    assert len(rows) >= done + 1  # every add that returned is there
    for _, text in rows:  # and each one is whole
        assert convert.structure(json.loads(text), Result) == results[0]
    with open_archive(str(db)) as archive:
        assert archive.runs()[0].finished is None  # the run shows as never finished
