"""Where a server keeps the Results of the tests it served (``netprobe server --iperf3``):
a JSON-lines file, a directory of one file per test, a fleet archive; any of them at once.

A router that runs only ``netprobe server`` keeps a record of what phones and laptops
measured against it. Each keeper writes from the thread that ends the test, so each takes
its own lock; a keeper that fails raises, and the server logs it and goes on serving.
Everything here is bounded: the directory keeps at most ``keep`` of its own files.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Callable

from netprobe.convert import to_json
from netprobe.errors import NetprobeError
from netprobe.host import utc_now_iso
from netprobe.schema import Result

Keeper = Callable[[Result], None]

GROUP = "iperf3-clients"
"""The group an archived served test is filed under (its source is the client's address)."""
SAVED_NAME = re.compile(r"^iperf3-\d{8}T\d{6}(?:\.\d+)?Z-[0-9a-f]{8}\.json$")
"""What a saved file is called: only files of this shape are ever removed from the dir."""


class KeepError(NetprobeError):
    """A keeper cannot be set up (an unwritable file or directory, an archive refused)."""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class JsonLines:
    """Append each Result to one file as a JSON line (netprobe's saved-result readers read
    it back). One ``write`` of the whole line on an O_APPEND descriptor: a reader tailing
    the file never sees half a line."""

    def __init__(self, path: str) -> None:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
        except OSError as exc:
            raise KeepError(f"cannot write the iperf3 results {path}: "
                            f"{exc.strerror or exc}") from None
        self.path = path
        self._lock = threading.Lock()

    def __call__(self, result: Result) -> None:
        data = (to_json(result, indent=None) + "\n").encode()
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)


def _stamp() -> str:
    """Now, UTC, to the millisecond, in a form that sorts as time does and fits a name."""
    now_ns = time.time_ns()
    seconds, rest_ns = divmod(now_ns, 1_000_000_000)
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(seconds)) + f".{rest_ns // 1_000_000:03d}Z"


class SaveDir:
    """One JSON file per test in a directory (``netprobe report DIR/*.json`` reads them),
    the oldest of its own files removed past ``keep`` so that a router's flash does not
    fill. Files are written under a temporary name and renamed: a reader sees whole files."""

    def __init__(self, path: str, keep: int) -> None:
        directory = Path(path)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            probe = directory / f".netprobe-probe-{uuid.uuid4().hex[:8]}"
            probe.touch()
            probe.unlink()
        except OSError as exc:
            raise KeepError(f"cannot save results in {path}: {exc.strerror or exc}") from None
        if keep < 1:
            raise KeepError(f"--save-keep must be at least 1, not {keep}")
        self.directory = directory
        self.keep = keep
        self._lock = threading.Lock()

    def __call__(self, result: Result) -> None:
        name = f"iperf3-{_stamp()}-{uuid.uuid4().hex[:8]}.json"
        data = (to_json(result) + "\n").encode()
        with self._lock:
            part = self.directory / f".{name}.part"
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
            os.replace(part, self.directory / name)
            self._trim()

    def saved(self) -> list[Path]:
        """This keeper's files, oldest first (their names sort by time)."""
        return sorted(p for p in self.directory.iterdir() if SAVED_NAME.match(p.name))

    def _trim(self) -> None:
        files = self.saved()
        for old in files[:max(0, len(files) - self.keep)]:
            with contextlib.suppress(FileNotFoundError):
                old.unlink()


class ArchiveKeeper:
    """Each served test as a record of a fleet archive (SQLite or PostgreSQL): one run per
    server process, group ``iperf3-clients``, the client's address as the source and
    ``target`` (this server's name) as the target, rounds numbered in order."""

    def __init__(self, url: str, target: str, *, label: str) -> None:
        # Imported here, not at the first test: a late import can fail at the open-files
        # limit, when the server is busiest (the server loads what it needs before serving).
        from netprobe.archives import ArchiveError, PairRecord, Run, open_archive

        self._record = PairRecord
        try:
            self.archive = open_archive(url)
            self.run_id = str(uuid.uuid4())
            self.archive.start_run(Run(run_id=self.run_id, fleet=label, started=utc_now_iso(),
                                       rounds=0, pairs=0))
        except (ArchiveError, OSError) as exc:
            raise KeepError(f"cannot keep results in the archive: {exc}") from None
        self.target = target
        self._count = 0
        self._lock = threading.Lock()

    def __call__(self, result: Result) -> None:
        with self._lock:
            self._count += 1
            number = self._count
        source = result.remote.address if result.remote and result.remote.address else "?"
        ok = result.status == "ok"
        self.archive.add(self._record(
            run_id=self.run_id, group=GROUP, round=number, source=source, target=self.target,
            time=result.start_time or utc_now_iso(), outcome="ok" if ok else "failed",
            error=None if ok else (result.errors[0] if result.errors else result.status),
            result=result))

    def close(self, status: str = "done") -> None:
        """The run's end recorded, the archive closed."""
        try:
            self.archive.finish_run(self.run_id, utc_now_iso(), status)
        finally:
            self.archive.close()


def keep_each(keepers: Sequence[Keeper]) -> Keeper | None:
    """One keeper that hands each Result to every one of ``keepers`` (None if there are
    none); one that fails does not stop the others, and the first failure is raised after
    all were tried."""
    if not keepers:
        return None

    def keep(result: Result) -> None:
        failure: BaseException | None = None
        for keeper in keepers:
            try:
                keeper(result)
            except Exception as exc:  # one keeper's disk or database: the others still keep
                failure = failure or exc
        if failure is not None:
            raise failure

    return keep
