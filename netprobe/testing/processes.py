"""Processes by PID through /proc: what a run started, and whether it is still running."""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

_POLL_S = 0.02
_PR_SET_CHILD_SUBREAPER = 36


# --- processes, by PID through /proc -------------------------------------------------------


@attrs.frozen
class ProcessInfo:
    """One process as /proc shows it."""

    pid: int
    """Process id."""
    ppid: int
    """Parent process id."""
    start_ticks: int
    """Start time in clock ticks since boot: with the pid, names the process uniquely."""
    state: str
    """State letter (R, S, D, Z, ...)."""
    cmdline: str
    """Command line (or ``[comm]`` when it has none)."""


def _read_process(pid: int) -> ProcessInfo | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            head, tail = f.read().rsplit(")", 1)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except (OSError, ValueError):
        return None
    fields = tail.split()
    cmdline = " ".join(a.decode(errors="replace") for a in argv if a)
    comm = head.split("(", 1)[-1]
    return ProcessInfo(pid, int(fields[1]), int(fields[19]), fields[0], cmdline or f"[{comm}]")


def all_processes() -> dict[int, ProcessInfo]:
    """Every process visible in /proc, by pid."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _read_process(int(entry))
            if info is not None:
                found[info.pid] = info
    return found


def descendants(root: int) -> list[ProcessInfo]:
    """The processes below ``root`` (children, grandchildren, ...), from /proc."""
    table = all_processes()
    children: dict[int, list[ProcessInfo]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info)
    found: list[ProcessInfo] = []
    todo = [root]
    while todo and len(found) < 100_000:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.pid)
    return found


def still_running(info: ProcessInfo) -> bool:
    """True if that very process (same pid and start time) is alive and not a zombie."""
    now = _read_process(info.pid)
    return now is not None and now.start_ticks == info.start_ticks and now.state not in "ZX"


class ProcessWatch:
    """Remembers every process that appears below ``root`` while it runs (polled from a
    thread), so that processes that detach or lose their parent are still known by PID."""

    def __init__(self, root: int, ignore: Sequence[ProcessInfo] = ()) -> None:
        self.root = root
        self.seen: dict[tuple[int, int], ProcessInfo] = {}
        self._ignore = {(p.pid, p.start_ticks) for p in ignore}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="netprobe-kit-watch",
                                        daemon=True)
        self.appeared = threading.Event()

    def __enter__(self) -> ProcessWatch:
        self.scan()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self.scan()

    def _poll(self) -> None:
        while not self._stop.wait(_POLL_S * 2.5):
            self.scan()

    def scan(self) -> None:
        """Look once and remember what is new."""
        for info in descendants(self.root):
            key = (info.pid, info.start_ticks)
            if key not in self._ignore and key not in self.seen:
                self.seen[key] = info
                self.appeared.set()

    def reap(self) -> None:
        """Reap the zombies that were reparented to this process (orphans it adopted as a
        subreaper); never a child that this process started itself, which its
        :class:`subprocess.Popen` still waits for."""
        me = os.getpid()
        for info in self.seen.values():
            now = _read_process(info.pid)
            adopted = info.ppid != me and now is not None and now.ppid == me
            if adopted and now is not None and now.state == "Z":
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(info.pid, os.WNOHANG)

    def left_running(self, bound_s: float) -> list[ProcessInfo]:
        """The remembered processes still alive after waiting up to ``bound_s`` for them."""
        deadline = time.monotonic() + bound_s
        while True:
            self.scan()
            alive = [p for p in self.seen.values() if still_running(p) and p.pid != self.root]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(_POLL_S * 5)


@contextlib.contextmanager
def subreaper() -> Iterator[bool]:
    """Make this process a child subreaper (Linux) while the block runs, so that orphans of
    our descendants are reparented to us rather than to init: they stay our descendants and
    can be found. Yields whether that worked. Reap them with :meth:`ProcessWatch.reap`."""
    libc = _libc()
    ok = libc is not None and libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield ok
    finally:
        if ok and libc is not None:
            libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _libc() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _describe(processes: Sequence[ProcessInfo]) -> str:
    return "; ".join(f"pid {p.pid} ({p.cmdline[:120]})" for p in processes)
