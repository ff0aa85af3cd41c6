"""A real PostgreSQL server for a test: initdb in a temporary directory, listening only on
a unix socket there, run as an unprivileged user (``postgres`` when we are root), stopped
and removed afterwards. ``why_not()`` says why it cannot run here."""
from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def _user() -> str | None:
    if os.geteuid() != 0:
        return None  # run as ourselves
    try:
        return pwd.getpwnam("postgres").pw_name
    except KeyError:
        return ""  # root, and no unprivileged user to run it as


def why_not() -> str | None:
    """None when a server can be started here, else the reason."""
    if not _bin("initdb") or not _bin("pg_ctl"):
        return "PostgreSQL is not installed (Debian: apt-get install postgresql)"
    if _user() == "":
        return "running as root and there is no postgres user to run the server as"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'netprobe-meter[postgres]')"
    return None


def _as_user(argv: list[str]) -> list[str]:
    user = _user()
    return ["runuser", "-u", user, "--", *argv] if user else argv


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """Yield a connection URL of a fresh server (database ``postgres``)."""
    folder = tempfile.mkdtemp(prefix="netprobe-pg-")
    user = _user()
    if user:
        shutil.chown(folder, user)
    data = os.path.join(folder, "data")
    run = lambda argv: subprocess.run(_as_user(argv), capture_output=True, text=True,  # noqa: E731
                                      timeout=60, check=True, cwd=folder)
    try:
        run([str(_bin("initdb")), "-D", data, "-U", "netprobe", "--auth=trust", "-E", "UTF8"])
        options = f"-k {folder} -c listen_addresses='' -c fsync=on"
        run([str(_bin("pg_ctl")), "-D", data, "-o", options, "-w", "-t", "30", "-l",
             os.path.join(folder, "log"), "start"])
        try:
            yield f"postgresql:///postgres?host={folder}&user=netprobe"
        finally:
            run([str(_bin("pg_ctl")), "-D", data, "-m", "fast", "-w", "stop"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
