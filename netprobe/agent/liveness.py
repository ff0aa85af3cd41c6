"""Whether the client that asked for a test is still there.

A far end already ends when its control connection does (its serving loop reads it). A
third-party test did not: the agent ran it to its end without reading the connection, so a
fleet runner killed with SIGKILL left its tests running on every agent. Now a
:class:`RequesterWatch` looks at the connection while the test runs and, when it closes,
stops the test as Ctrl-C does, on the test's own thread (its tool processes are then
stopped by PID, as on every way out of a run).

A requester whose host vanishes sends no FIN: :func:`keep_alive` makes the kernel probe the
connection, so it is seen as gone within :data:`DEAD_PEER_S`.
"""
from __future__ import annotations

import ctypes
import socket
import threading

from netprobe.engine.protocol import readable

LOOK_S = 0.2
"""How often the watch looks at the connection."""
KEEPIDLE_S, KEEPINTVL_S, KEEPCNT = 5, 2, 3
DEAD_PEER_S = KEEPIDLE_S + KEEPINTVL_S * KEEPCNT
"""How long a requester that went silent (its host gone) may keep its test: 11 s."""


def keep_alive(sock: socket.socket) -> None:
    """Have the kernel probe ``sock`` when it is idle (where it can be: quietly if not)."""
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", KEEPIDLE_S), ("TCP_KEEPINTVL", KEEPINTVL_S),
                        ("TCP_KEEPCNT", KEEPCNT)):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, option, value in options:
        try:
            sock.setsockopt(level, option, value)
        except OSError:
            return


def gone(sock: socket.socket) -> str | None:
    """Why the peer of ``sock`` is gone (closed, reset, timed out), None if it is not:
    looked at without taking anything from the connection."""
    try:
        if not readable(sock, 0):
            return None
        data = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return None
    except (OSError, ValueError) as exc:
        return f"its connection failed ({exc})"
    return "its connection closed" if data == b"" else None


class RequesterWatch:
    """While the block runs, a thread looks at the requester's connection every
    :data:`LOOK_S`; when it is gone, KeyboardInterrupt is raised in the block's thread (the
    way a run is stopped: see :class:`netprobe.driven.run.DrivenRun`). Never after the
    block: one raised but not yet delivered is withdrawn on the way out."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.gone: str | None = None
        """Why the requester is gone, once it is."""
        self._target = threading.get_ident()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._look, name="requester-watch", daemon=True)

    def _look(self) -> None:
        while not self._done.wait(LOOK_S):
            why = gone(self.sock)
            if why is None:
                continue
            with self._lock:
                if not self._done.is_set():
                    self.gone = why
                    _raise_in(self._target, KeyboardInterrupt)
            return

    def __enter__(self) -> RequesterWatch:
        self._target = threading.get_ident()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._done.set()
            if self.gone is not None:
                _raise_in(self._target, None)  # withdraw it if it has not landed yet
        self._thread.join(LOOK_S * 5)


def _raise_in(thread_id: int, exception: type[BaseException] | None) -> None:
    """Raise ``exception`` in the thread ``thread_id`` at its next bytecode (None: withdraw
    one pending)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exception) if exception else None)


__all__ = ["DEAD_PEER_S", "RequesterWatch", "gone", "keep_alive"]
