"""Start a real ``netprobe server`` process for a test and look at it from outside:
open file descriptors and threads (from /proc), and its log."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence

from netprobe.driven import is_listening

NETPROBE = [sys.executable, "-m", "netprobe"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> None:
    """Wait until something listens on ``port`` (read from /proc/net: a probe connection
    would itself hold a server thread until the handshake timeout)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if is_listening(port, family):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {host}:{port}")


class ServerProcess:
    """A running ``netprobe server`` started by a test, stopped by its PID."""

    def __init__(self, proc: subprocess.Popen, port: int, log_path: str) -> None:
        self.proc = proc
        self.port = port
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def fds(self) -> int:
        """Open file descriptors of the server process."""
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def threads(self) -> int:
        """Threads of the server process."""
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
        raise AssertionError("no Threads line")

    def log(self) -> str:
        """Everything the server printed so far."""
        with open(self.log_path, errors="replace") as handle:
            return handle.read()

    def settle(self, threads: int, fds: int, timeout: float = 10.0) -> tuple[int, int]:
        """Wait until threads and fds drop to at most the given counts; return the last seen."""
        end = time.monotonic() + timeout
        seen = (self.threads(), self.fds())
        while time.monotonic() < end and (seen[0] > threads or seen[1] > fds):
            time.sleep(0.1)
            seen = (self.threads(), self.fds())
        return seen


@contextlib.contextmanager
def exporter_process(*args: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """A real ``netprobe exporter`` on a free loopback port with ``args``: its base URL and
    its process (stderr a text pipe), terminated by PID afterwards."""
    port = free_port()
    proc = subprocess.Popen([*NETPROBE, "exporter", "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(port)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def netprobe_server(
    *args: str, host: str = "127.0.0.1", env: dict | None = None,
    preexec: Callable[[], None] | None = None, command: Sequence[str] = tuple(NETPROBE),
) -> Iterator[ServerProcess]:
    """Run ``netprobe server -B host -p PORT ARGS`` for the duration of the block
    (``preexec`` runs in the child before it starts: e.g. to lower a resource limit;
    ``command`` is how netprobe is started, ``python -m netprobe`` by default)."""
    port = free_port(host)
    with tempfile.NamedTemporaryFile(prefix="netprobe-server-", suffix=".log") as log:
        proc = subprocess.Popen(
            [*command, "server", "-B", host, "-p", str(port), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            preexec_fn=preexec,
        )
        try:
            wait_listening(port, host)
            yield ServerProcess(proc, port, log.name)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
