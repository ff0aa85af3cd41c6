"""Archives under faults (issue 33 item 10): a full disk, a read-only mount, a row that is
not JSON, another application's SQLite file, text PostgreSQL refuses. Each is one clear
error or a skipped row with a warning naming it; nothing archived before is lost and the
run's row never says "running" after its runner has stopped.

The full disk is a small tmpfs and the read-only mount a read-only bind of one, both
mounted and unmounted here (root only: the tests skip with the reason otherwise)."""
from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from netprobe import convert
from netprobe.archives import Archive, ArchiveError, PairRecord, Run, open_archive
from netprobe.fleet import config
from netprobe.fleet.runner import FleetRunner
from netprobe.schema import Result

from .servers import NETPROBE


@pytest.fixture(scope="module")
def result() -> Result:
    """One real loopback result (both ends here)."""
    run = subprocess.run([*NETPROBE, "run", "-t", "0.3", "-i", "0.1", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return convert.from_json(run.stdout)


def _mount_reason() -> str:
    if os.geteuid() != 0:
        return "mounting a small tmpfs needs root"
    return ""


@contextlib.contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``where``, unmounted afterwards."""
    if _mount_reason():
        pytest.skip(_mount_reason())
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                              str(where)], capture_output=True, text=True, timeout=30)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], timeout=30, check=False)


@contextlib.contextmanager
def _read_only(source: Path, where: Path) -> Iterator[Path]:
    """``source`` bind-mounted read-only at ``where``."""
    where.mkdir()
    subprocess.run(["mount", "--bind", str(source), str(where)], check=True, timeout=30)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(where)], check=True, timeout=30)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], timeout=30, check=False)


def _record(n: int, result: Result | None, error: str | None = None) -> PairRecord:
    return PairRecord("run-1", "core", 1, f"s{n}", f"t{n}", "2026-12-01T10:00:01.000+00:00",
                  "ok" if error is None else "failed", error, result)


def _fill_until_full(archive: Archive, result: Result, most: int = 2000) -> tuple[int, str]:
    archive.start_run(Run("run-1", "fleet.toml", "2026-12-01T10:00:00.000+00:00", 1, most))
    for n in range(most):
        try:
            archive.add(_record(n, result))
        except ArchiveError as exc:
            return n, str(exc)
    raise AssertionError(f"{most} records fit in the small tmpfs")


def test_full_disk_is_one_error_and_keeps_what_was_archived(tmp_path: Path,
                                                             result: Result) -> None:
    with _tmpfs(tmp_path / "small", "256k") as small:
        url = str(small / "f.db")
        with open_archive(url) as archive:
            kept, message = _fill_until_full(archive, result)
            with contextlib.suppress(ArchiveError):  # the disk may take this or not
                archive.finish_run("run-1", "2026-12-01T10:01:00.000+00:00", "failed")
        assert "full" in message and "f.db" in message and "\n" not in message
        with open_archive(url, create=False) as archive:
            (run,) = archive.runs()
            records = archive.records()
        assert kept > 0 and len(records) == kept  # every record before the failure is there
        assert run.status in ("failed", "incomplete") and run.status != "running"


def test_full_disk_under_a_fleet_run(tmp_path: Path, result: Result) -> None:
    """The runner's pair threads write the records: a full disk must reach the caller as
    one ArchiveError (no thread traceback) and the run's row must not say running."""
    names = [f"h{n}" for n in range(12)]
    text = "".join(f'[agents.{n}]\naddress = "127.0.0.1"\n' for n in names)
    text += '[groups.mesh]\ntype = "mesh"\nspec = { duration = 0.3 }\n'
    fleet = config.parse(config.tomllib.loads(text), "big.toml")
    hooked: list[str] = []
    old_hook = threading.excepthook
    threading.excepthook = lambda args: hooked.append(repr(args.exc_value))
    try:
        with _tmpfs(tmp_path / "small", "192k") as small:
            url = str(small / "f.db")
            with open_archive(url) as archive:
                runner = FleetRunner(fleet, archive, third_party=lambda agent, spec: result,
                                     status=lambda agent: {"state": "idle", "running": []})
                with pytest.raises(ArchiveError, match="full") as raised:
                    runner.run_once()
            with open_archive(url, create=False) as archive:
                (run,) = archive.runs()
                records = archive.records()
    finally:
        threading.excepthook = old_hook
    assert hooked == []
    assert run.status in ("failed", "incomplete")
    assert run.status == "failed" or f"run {run.run_id} reads 'incomplete'" in str(raised.value)
    assert "\n" not in str(raised.value)
    assert records and all(r.result is not None for r in records)


def _archive_with_rows(path: Path, result: Result) -> None:
    with open_archive(str(path)) as archive:
        archive.start_run(Run("run-1", "fleet.toml", "2026-12-01T10:00:00.000+00:00", 1, 3))
        for n in range(3):
            archive.add(_record(n, result))
        archive.finish_run("run-1", "2026-12-01T10:00:09.000+00:00", "done")


def test_a_row_that_is_not_json_is_skipped_with_a_warning(tmp_path: Path,
                                                          result: Result) -> None:
    path = tmp_path / "f.db"
    _archive_with_rows(path, result)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE results SET result = '{not json' WHERE source = 's1'")
        db.execute("UPDATE results SET result = '{\"spec\": 5}' WHERE source = 's2'")
    with open_archive(str(path), create=False) as archive:
        records = archive.records()
        latest = archive.latest()
        warnings = list(archive.warnings)
    assert [r.source for r in records] == ["s0"] and [r.source for r in latest] == ["s0"]
    assert any("row 2" in w and "s1" in w and "JSON" in w for w in warnings), warnings
    assert any("row 3" in w and "s2" in w for w in warnings), warnings


def test_the_exporter_skips_a_bad_row_and_counts_it(tmp_path: Path, result: Result) -> None:
    pytest.importorskip("prometheus_client")
    from netprobe.exporter import FleetCollector
    from netprobe.exporter_config import MetricsOptions

    path = tmp_path / "f.db"
    _archive_with_rows(path, result)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE results SET time = x'ff00' WHERE source = 's0'")
    metrics = {m.name: m.samples for m in
               FleetCollector(lambda: open_archive(str(path)),
                              MetricsOptions(pair_series=True)).collect()}
    assert sorted(s.labels["source"] for s in metrics["netprobe_fleet_up"]) == ["s1", "s2"]
    assert [s.value for s in metrics["netprobe_fleet_archive_skipped_rows"]] == [1]


def test_report_and_matrix_skip_a_bad_row(tmp_path: Path, result: Result) -> None:
    path = tmp_path / "f.db"
    _archive_with_rows(path, result)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE results SET result = 'garbage' WHERE source = 's1'")
    for command in (["fleet", "matrix", "--archive", str(path)],
                    ["report", "--archive", str(path)]):
        run = subprocess.run([*NETPROBE, *command], capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 0, run.stderr
        assert "Traceback" not in run.stderr and "row 2" in run.stderr, run.stderr


def test_another_applications_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE moz_places (id INTEGER PRIMARY KEY, url TEXT)")
        db.execute("INSERT INTO moz_places (url) VALUES ('https://example.org/')")
        db.execute("CREATE TABLE results (id INTEGER PRIMARY KEY, score REAL)")  # a name
    before = path.read_bytes()
    for create in (True, False):
        with pytest.raises(ArchiveError, match="not a netprobe archive"):
            open_archive(str(path), create=create)
    assert path.read_bytes() == before  # nothing created in someone else's database
    text = tmp_path / "notes.db"
    text.write_text("just some text, long enough to be a header of something " * 4)
    with pytest.raises(ArchiveError, match="not a netprobe archive"):
        open_archive(str(text), create=False)
    for command in (["fleet", "matrix", "--archive", str(path)],
                    ["report", "--archive", str(path)]):
        run = subprocess.run([*NETPROBE, *command], capture_output=True, text=True,
                             timeout=60)
        assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
        assert "not a netprobe archive" in run.stderr and run.stderr.count("\n") == 1


def test_an_archive_with_a_users_own_table_is_still_one(tmp_path: Path,
                                                        result: Result) -> None:
    path = tmp_path / "f.db"
    _archive_with_rows(path, result)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE dashboard_notes (note TEXT)")
    with open_archive(str(path), create=False) as archive:
        assert len(archive.records()) == 3


def test_a_lock_held_too_long_is_one_error(tmp_path: Path, result: Result,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from netprobe.archives import sqlite as sqlite_archive

    monkeypatch.setattr(sqlite_archive, "BUSY_TIMEOUT_S", 0.3)
    path = tmp_path / "f.db"
    _archive_with_rows(path, result)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        with open_archive(str(path), create=False) as archive, \
                pytest.raises(ArchiveError, match="locked"):
            archive.add(_record(9, result))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with open_archive(str(path), create=False) as archive:
        assert len(archive.records()) == 3


def test_a_wal_archive_on_a_read_only_mount_is_read(tmp_path: Path, result: Result) -> None:
    with _tmpfs(tmp_path / "disk", "8m") as disk:
        path = disk / "f.db"
        _archive_with_rows(path, result)
        with _read_only(disk, tmp_path / "ro") as ro:  # the writer gone: no -shm to map
            assert not (disk / "f.db-shm").exists()
            for create in (False, True):  # report/matrix, and the exporter
                with open_archive(str(ro / "f.db"), create=create) as archive:
                    assert len(archive.records()) == 3 and archive.runs()
        # a runner still has it open, so its WAL and -shm files are there
        with open_archive(str(path)) as writer:
            writer.add(_record(7, result))
            assert (disk / "f.db-wal").exists()
            with _read_only(disk, tmp_path / "ro2") as ro:
                for create in (False, True):
                    with open_archive(str(ro / "f.db"), create=create) as archive:
                        assert len(archive.records()) == 4 and archive.runs()
                run = subprocess.run([*NETPROBE, "fleet", "matrix", "--json", "--archive",
                                      str(ro / "f.db")], capture_output=True, text=True,
                                     timeout=60)
                assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
                assert '"s7"' in run.stdout
                with pytest.raises(ArchiveError, match="read-only"), \
                        open_archive(str(ro / "f.db")) as archive:
                    archive.start_run(Run("run-2", "x", "2026-12-01T10:00:00Z", 1, 1))


def test_postgres_takes_text_with_nul(postgres_url: str, result: Result) -> None:
    bad = attrs_evolve_errors(result, ["agent said \x00 mid\x00line"])
    with open_archive(postgres_url) as archive:
        archive.start_run(Run("run-nul", "fleet\x00.toml", "2026-12-01T10:00:00.000+00:00",
                              1, 2))
        archive.add(PairRecord("run-nul", "core", 1, "a", "b", "2026-12-01T10:00:01.000+00:00",
                           "failed", "stderr: \x00\x00 boom", bad))
        archive.add(PairRecord("run-nul", "core", 1, "b", "a", "2026-12-01T10:00:02.000+00:00",
                           "ok", None, result))
        archive.finish_run("run-nul", "2026-12-01T10:00:09.000+00:00", "done")
        records = archive.records("run-nul")
        (run,) = [r for r in archive.runs() if r.run_id == "run-nul"]
    assert run.status == "done" and len(records) == 2
    first = records[0]
    assert first.error == "stderr: \ufffd\ufffd boom"
    assert first.result is not None
    assert first.result.errors == ("agent said \ufffd mid\ufffdline",)


def attrs_evolve_errors(result: Result, errors: list[str]) -> Result:
    import attrs

    return attrs.evolve(result, status="failed", errors=errors)

