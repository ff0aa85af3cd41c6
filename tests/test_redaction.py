"""A URL's password is never printed, logged or saved (issue 33 item 8): ``report
--archive postgresql://user:PASSWORD@... --html`` and the error paths, against a real
PostgreSQL server (tests/pgserver.py)."""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from netprobe.archives import PairRecord, Run, open_archive
from netprobe.redact import redact
from tests import pgserver
from tests.servers import NETPROBE
from tests.test_cli import assert_one_error_line, child_env
from tests.test_formats import sample_result

SECRET = "Hunter2-PW"


@pytest.mark.parametrize("text", [
    f"postgresql://netprobe:{SECRET}@db.example/fleet",
    f"postgres://netprobe:{SECRET}@db.example:5432/fleet?sslmode=require",
    f"host=db.example password={SECRET} dbname=fleet",
    f"host=db.example password = '{SECRET} x\\' y' dbname=fleet",
    f"postgresql:///fleet?host=/run/postgresql&password={SECRET}&user=netprobe",
    f"archive postgresql://netprobe:{SECRET}@db.example/fleet: connection refused",
])
def test_redact_every_spelling_of_a_password(text: str) -> None:
    shown = redact(text)
    assert SECRET not in shown and "***" in shown
    assert "db.example" in shown or "/run/postgresql" in shown  # which archive: kept


def test_redact_leaves_urls_without_a_password_alone() -> None:
    for text in ("postgresql://netprobe@db.example/fleet", "sqlite:///var/lib/x.db",
                 "postgresql://db.example:5432/fleet?x=y", "mail a@b.example"):
        assert redact(text) == text
    assert redact(f'bad value "{SECRET}"', f"postgresql://u:{SECRET}@h/d") == 'bad value "***"'


@pytest.fixture(scope="module")
def socket_dir() -> Iterator[str]:
    """A real PostgreSQL server's socket directory (trust auth: any password works)."""
    reason = pgserver.why_not()
    if reason:
        pytest.skip(reason)
    with pgserver.postgres_server() as url:
        yield parse_qs(urlsplit(url).query)["host"][0]


def _urls(folder: str) -> list[str]:
    return [f"postgresql://netprobe:{SECRET}@/postgres?host={folder}",
            f"postgresql:///postgres?host={folder}&user=netprobe&password={SECRET}"]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*NETPROBE, *args], capture_output=True, text=True, timeout=60,
                          env=child_env(COLUMNS="200"), cwd=cwd)


def _leaks(tmp_path: Path, done: subprocess.CompletedProcess) -> list[str]:
    texts = {"stdout": done.stdout, "stderr": done.stderr}
    texts.update({str(p): p.read_text(errors="replace") for p in tmp_path.rglob("*")
                  if p.is_file()})
    return [where for where, text in texts.items() if SECRET in text]


def test_report_archive_html_never_shows_the_password(socket_dir: str,
                                                      tmp_path: Path) -> None:
    with open_archive(_urls(socket_dir)[0]) as archive:
        assert SECRET not in archive.url
        archive.start_run(Run("run-r", "fleet.toml", "2026-12-01T10:00:00.000+00:00", 1, 1))
        archive.add(PairRecord("run-r", "core", 1, "a", "b", "2026-12-01T10:00:01.000+00:00",
                           "ok", None, sample_result()))
        archive.finish_run("run-r", "2026-12-01T10:00:02.000+00:00", "done")
    for n, url in enumerate(_urls(socket_dir)):
        page = tmp_path / f"page{n}.html"
        done = _cli("report", "--archive", url, "--html", str(page), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert page.exists() and "***" in page.read_text()
        assert _leaks(tmp_path, done) == []


def test_archive_errors_never_show_the_password(socket_dir: str, tmp_path: Path) -> None:
    bad = [f"postgresql://netprobe:{SECRET}@127.0.0.1:1/none",
           f"postgresql://netprobe:{SECRET}@/no_such_db?host={socket_dir}",
           f"mongodb://netprobe:{SECRET}@db.invalid/x"]
    for url in bad:
        for args in (["report", "--archive", url], ["fleet", "matrix", "--archive", url],
                     ["report", "--archive", url, "--html", str(tmp_path / "p.html")]):
            done = _cli(*args, cwd=tmp_path)
            assert done.returncode != 0, (args, done.stdout)
            assert_one_error_line(done.stderr)
            assert _leaks(tmp_path, done) == [], (args, done.stderr)
