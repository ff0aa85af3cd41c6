"""One external binary: find it, run it, read its output as it comes, stop it by PID.

A driven tool finds its binary (:func:`find_binary`), runs it as a :class:`DrivenProcess`
whose merged stdout/stderr is read continuously by a thread (so a chatty child never blocks
on a full pipe) and handed over line by line as it arrives, and stops it, with everything it
started, by its process group. :func:`run_once` runs a short command (a version probe);
:func:`run_captured` runs one whose stdout and stderr are wanted apart.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Callable

from netprobe.errors import ToolUnavailable
from netprobe.schema import RawOutput

_POLL_S = 0.02
"""How often waiting loops look again (short: tests and probes wait on these)."""
_READER_JOIN_S = 2.0
"""How long to wait for the output reader to reach end of file after the process exits."""
OUTPUT_HEAD_CHARS = 24 << 20
"""Characters of a tool's output kept from its start. Adapters that read the whole text at
the end need it: iperf3 before 3.17 prints one ``-J`` document, about 370 bytes per stream
and interval (3.12, ``-P 4``: 1,855 bytes an interval with the sum), so this holds the
document of a test three times as long as the intervals the Result keeps
(``reporting.MAX_INTERVALS_KEPT``, 20,000 samples: about 7.4 MB)."""
OUTPUT_TAIL_CHARS = 8 << 20
"""Characters kept from the end of a longer output (whole lines): where every tool prints
its whole-test summary, so a cut in the middle costs intervals, never the totals."""


def find_binary(name: str, override: str | None = None, env_var: str | None = None) -> str | None:
    """The executable to run for ``name``: an explicit path, else ``$env_var``, else PATH.

    A given ``override`` (or a set ``env_var``) that does not name an executable gives None
    rather than silently falling back to another binary the user did not ask for.
    """
    if override:
        return _resolve(override)
    if env_var and os.environ.get(env_var):
        return _resolve(os.environ[env_var])
    return shutil.which(name)


def _resolve(candidate: str) -> str | None:
    if os.sep in candidate:
        ok = os.path.isfile(candidate) and os.access(candidate, os.X_OK)
        return os.path.abspath(candidate) if ok else None
    return shutil.which(candidate)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _parent_death_signal() -> Callable[[], None] | None:
    """A preexec function that has the child killed when its parent thread ends (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the child
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return preexec


def not_found(name: str, override: str | None, env_var: str | None, hint: str) -> str:
    """Why :func:`find_binary` found no executable, in one line: the ``path`` option or
    ``$env_var`` names none, else it is not on PATH (``hint`` says how to get it)."""
    if override:
        return f"{name}: {override!r} (option path) is not an executable"
    if env_var and os.environ.get(env_var):
        return f"{name}: {os.environ[env_var]!r} (${env_var}) is not an executable"
    return f"{name} not found on PATH ({hint}{f', or set ${env_var}' if env_var else ''})"


class KeptOutput:
    """A process's output as the lines it printed, bounded: the first
    :data:`OUTPUT_HEAD_CHARS` characters and the last :data:`OUTPUT_TAIL_CHARS` (whole
    lines, line endings kept), and a count of the lines and characters between, not kept
    (a tool that prints without end cannot grow memory without limit). Not thread-safe:
    its process guards it."""

    def __init__(self, head_chars: int | None = None, tail_chars: int | None = None) -> None:
        self.head_chars = OUTPUT_HEAD_CHARS if head_chars is None else head_chars
        self.tail_chars = OUTPUT_TAIL_CHARS if tail_chars is None else tail_chars
        self.head: list[str] = []
        self.tail: collections.deque[str] = collections.deque()
        self.added = 0
        """Lines given so far, kept or not."""
        self.dropped_lines = 0
        self.dropped_chars = 0
        self._head_size = self._tail_size = 0

    def add(self, chunk: str) -> None:
        """Keep ``chunk`` (one line); past the head, the oldest tail lines make room."""
        self.added += 1
        if self._head_size + len(chunk) <= self.head_chars and not self.tail:
            self.head.append(chunk)
            self._head_size += len(chunk)
            return
        self.tail.append(chunk)
        self._tail_size += len(chunk)
        while self._tail_size > self.tail_chars and self.tail:
            gone = self.tail.popleft()
            self._tail_size -= len(gone)
            self.dropped_lines += 1
            self.dropped_chars += len(gone)

    def chunks(self) -> list[str]:
        """The lines kept, in order."""
        return [*self.head, *self.tail]

    def since(self, seen: int) -> list[str]:
        """The lines kept among those given after the first ``seen``."""
        found = self.head[seen:]
        first_tail = self.added - len(self.tail)  # the number of the oldest tail line
        return [*found, *itertools.islice(self.tail, max(0, seen - first_tail), None)]

    def note(self, name: str) -> str | None:
        """What was not kept, for a warning naming the process ``name`` (None: all was)."""
        if not self.dropped_lines:
            return None
        return (f"{name} output: {self.dropped_lines} lines ({self.dropped_chars} "
                f"characters) in the middle not kept, of {self.added}; the first "
                f"{self._head_size} and the last {self._tail_size} characters are")


class DrivenProcess:
    """Runs one external tool: stdout+stderr merged, read continuously by a thread (never
    blocks on a full pipe), each line passed to ``on_line`` as it arrives; own process group
    (``start_new_session=True``) so :meth:`stop` kills the whole group.

    ``env`` is the complete environment, as for :mod:`subprocess` (None inherits ours).
    An exception raised by ``on_line`` does not stop the reading; the first one is kept in
    :attr:`callback_error`. Use as a context manager to be sure the tool is stopped.
    """

    def __init__(
        self,
        argv: Sequence[str],
        on_line: Callable[[str], None] | None = None,
        name: str = "client",
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        die_with_parent: bool = False,
    ) -> None:
        """``die_with_parent``: the kernel kills the tool (SIGKILL) when the thread that
        started it ends, however this process ends (a SIGKILL of it included); for an
        agent's far ends. Only for a tool started and stopped by one thread."""
        self.argv: tuple[str, ...] = tuple(argv)
        self._die_with_parent = die_with_parent
        self.name = name
        self.callback_error: BaseException | None = None
        self._on_line = on_line
        self._env = dict(env) if env is not None else None
        self._cwd = cwd
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self.output = KeptOutput()
        """What it printed, as lines with their endings, bounded (:class:`KeptOutput`)."""
        self._eof = False
        self._cond = threading.Condition()

    def start(self) -> DrivenProcess:
        """Start the tool; raise ToolUnavailable if the binary cannot be executed."""
        if self._proc is not None:
            raise RuntimeError(f"{self.name} already started")
        try:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=self._env,
                cwd=self._cwd,
                start_new_session=True,  # own process group: stop() reaches its children
                preexec_fn=_parent_death_signal() if self._die_with_parent else None,
            )
        except OSError as exc:
            raise ToolUnavailable(f"cannot run {self.argv[0]}: {exc.strerror or exc}") from None
        self._reader = threading.Thread(
            target=self._read, name=f"netprobe-{self.name}-reader", daemon=True
        )
        self._reader.start()
        return self

    @property
    def pid(self) -> int:
        """Process id of the tool (also its process group id)."""
        if self._proc is None:
            raise RuntimeError(f"{self.name} not started")
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """Exit code once the tool has exited (negative: killed by that signal), else None."""
        return None if self._proc is None else self._proc.poll()

    @property
    def text(self) -> str:
        """What the tool printed so far (all of it, unless it printed more than
        :class:`KeptOutput` keeps: :meth:`output_note` says so then)."""
        with self._cond:
            return "".join(self.output.chunks())

    @property
    def lines(self) -> list[str]:
        """The complete lines printed so far (as :attr:`text`), without line endings."""
        with self._cond:
            return [chunk.rstrip("\r\n") for chunk in self.output.chunks()]

    def output_note(self) -> str | None:
        """A warning saying what of its output was not kept (None: all of it was)."""
        with self._cond:
            return self.output.note(f"the {self.name}'s")

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        stream = self._proc.stdout
        try:
            for raw in iter(stream.readline, b""):
                self._add(raw.decode("utf-8", errors="replace"))
        finally:
            stream.close()
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    def _add(self, chunk: str) -> None:
        line = chunk.rstrip("\r\n")
        with self._cond:
            self.output.add(chunk)
            self._cond.notify_all()
        if self._on_line is not None:
            try:
                self._on_line(line)
            except Exception as exc:  # a parser bug must not stop the pipe being drained
                if self.callback_error is None:
                    self.callback_error = exc

    def wait(self, timeout: float | None) -> int | None:
        """Wait for the tool to exit: its exit code, or None on timeout (it is not killed)."""
        if self._proc is None:
            raise RuntimeError(f"{self.name} not started")
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._join_reader()
        return code

    def _join_reader(self) -> None:
        # A grandchild can keep the pipe open after the tool exits: wait for EOF, bounded.
        if self._reader is not None:
            self._reader.join(_READER_JOIN_S)

    def wait_for_line(self, predicate: Callable[[str], bool], timeout: float) -> bool:
        """Wait until a line satisfying ``predicate`` has been printed (True), or until
        ``timeout`` passes or the output ends without one (False)."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for chunk in self.output.since(seen):
                    if predicate(chunk.rstrip("\r\n")):
                        return True
                seen = self.output.added
                remaining = deadline - time.monotonic()
                if self._eof or remaining <= 0:
                    return False
                self._cond.wait(remaining)

    def stop(self, grace_s: float = 1.0) -> int | None:
        """Stop the tool and everything in its process group: SIGINT, then SIGTERM, then
        SIGKILL, each sent by group id and only while something is left; waits ``grace_s``
        between steps. Idempotent. Returns the tool's exit code (None if never started)."""
        if self._proc is None:
            return None
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            if not self._group_alive():
                break
            self._signal_group(sig)
            self._wait_group_gone(grace_s if sig != signal.SIGKILL else 5.0)
        self._join_reader()
        return self._proc.poll()

    def _group_alive(self) -> bool:
        assert self._proc is not None
        if self._proc.poll() is None:
            return True
        return _group_has_live_members(self._proc.pid)

    def _signal_group(self, sig: int) -> None:
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def _wait_group_gone(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self._group_alive() and time.monotonic() < deadline:
            time.sleep(_POLL_S)

    def raw(self) -> RawOutput:
        """The tool's output as a schema record: name, text, command and exit code."""
        return RawOutput(
            name=self.name, text=self.text, command=self.argv, exit_code=self.returncode
        )

    def __enter__(self) -> DrivenProcess:
        if self._proc is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _group_has_live_members(pgid: int) -> bool:
    """Is any process of group ``pgid`` still running? Zombies do not count: an orphan
    killed by us may wait a while for init to reap it, but it no longer runs."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    if not os.path.isdir("/proc/self"):
        return True  # no /proc: trust killpg, zombies included
    for entry in os.listdir("/proc"):
        found = _stat_group_state(entry) if entry.isdigit() else None
        if found is not None and found[0] == pgid and found[1] not in "ZX":
            return True
    return False


def _stat_group_state(pid: str) -> tuple[int, str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[2]), fields[0]  # (process group, state)


def run_once(argv: Sequence[str], timeout: float) -> tuple[int, str]:
    """Run a short command (e.g. a version probe) and return its exit code and merged output.

    Raises ToolUnavailable if it cannot be executed or does not finish within ``timeout``
    seconds (it is then stopped with its whole process group).
    """
    proc = DrivenProcess(argv, name="probe").start()
    code = proc.wait(timeout)
    if code is None:
        proc.stop(grace_s=0.2)
        raise ToolUnavailable(f"{argv[0]} did not finish within {timeout:g} s")
    return code, proc.text


def run_captured(argv: Sequence[str], timeout: float,
                 input: str | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)``
    that waits for the process, and for no pipe at all.

    Output goes to unnamed temporary files, and the command is started with
    ``os.posix_spawn`` (glibc reports a failed exec through memory it shares with the
    child; ``subprocess`` waits for a pipe to close). A pipe reaches its end only once
    every holder of its write end has closed it, and three CI runs lost a test to one
    that did not: ``ip netns add`` twice (ended with status 0, its stdout pipe never at
    its end: 30 s, then 120 s) and once ``nft`` (ended, and Popen still reading the pipe
    that reports the exec, 5 minutes and on), each from a test process whose other
    threads start processes. Raises ``subprocess.TimeoutExpired`` (the command killed)
    as ``run`` does, and OSError when it cannot be started.
    """
    with (tempfile.TemporaryFile() if input is not None else open(os.devnull, "rb")) as source, \
            tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        if input is not None:
            source.write(input.encode())
            source.seek(0)
        actions = [(os.POSIX_SPAWN_DUP2, source.fileno(), 0),
                   (os.POSIX_SPAWN_DUP2, out.fileno(), 1),
                   (os.POSIX_SPAWN_DUP2, err.fileno(), 2)]
        # every other descriptor of this process is close-on-exec (PEP 446)
        pid = os.posix_spawn(_executable(argv[0]), list(argv), dict(os.environ),
                             file_actions=actions)
        status = _wait_for(pid, timeout)
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise subprocess.TimeoutExpired(list(argv), timeout)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(list(argv), os.waitstatus_to_exitcode(status),
                                           out.read().decode(errors="replace"),
                                           err.read().decode(errors="replace"))


def _executable(name: str) -> str:
    """The file ``name`` runs, searched on PATH as exec does; FileNotFoundError when there
    is none. Looked up here and not left to the spawn: under qemu-user emulation (the ARM
    wheel suites) the child cannot share memory with its parent, so a failed exec comes
    back as exit status 127 instead of an OSError."""
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(errno.ENOENT, "command not found", name)
    return found


def _wait_for(pid: int, timeout: float) -> int | None:
    """The wait status of child ``pid`` once it ends, None if it has not within
    ``timeout`` seconds (looked at every few milliseconds: these commands are short)."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= deadline:
            return None
        time.sleep(pause)
        pause = min(pause * 2, _POLL_S)


__all__ = ["OUTPUT_HEAD_CHARS", "OUTPUT_TAIL_CHARS", "DrivenProcess", "KeptOutput",
           "find_binary", "not_found", "run_captured", "run_once"]
