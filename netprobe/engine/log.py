"""netprobe server's event log: one line per event, with an ISO 8601 UTC timestamp.

Events (the ``event`` name, with the fields a line carries):

==============  =========================================================================
``listening``   address, port
``accepted``    client (``address:port``): a control connection passed the allow-list
``refused``     client, reason (``acl``, ``per-address limit``, ``handshakes``, ``busy``,
                ``auth``, ``limit``, ``spec``, ``threads``, ...): said to the client too
                where it can be
``reopened``    the log file, reopened on SIGHUP (after logrotate moved it)
``test``        client, tool, spec (in short): a test was accepted and starts
``test-end``    client, status (``ok`` / ``failed``), what this end measured
``far-end``     client, tool, pid, state (``started`` / ``stopped``): the agent's servers
``closed``      client, reason (``no-hello``, ``timeout``, ``protocol``): a connection
                closed before its hello (a port scan, a connect-and-close), at most
                10 lines a second
``session``     client: a session that ended on an error
``error``       reason (``internal``): a fault of the server's own that cost one
                connection (the accept loop goes on), at most 10 lines a second
``note``        anything else
==============  =========================================================================

Text lines are ``TIME EVENT MESSAGE``; ``--log-format json`` writes one JSON object per
line (``time``, ``event``, ``message`` and the fields) for log shippers. Whatever a client
sent that reaches a line is escaped (control characters as ``\\xNN``) and cut to
:data:`MAX_VALUE_CHARS`, so a client can neither forge lines nor send a terminal escape
sequences through the log.

Only the CLI decides where lines go (stdout, ``--logfile``); the engine calls its
:class:`Log`. A ``Log`` is also a plain ``Callable[[str], None]``: a bare message is a
``note``.
"""
from __future__ import annotations

import collections
import contextlib
import json
import re
import threading
import time
from typing import Any, Callable, Protocol

MAX_VALUE_CHARS = 256
"""Longest text taken from outside (a client's value, an error) into one log field."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\x1b"}


def escape(text: object, limit: int = MAX_VALUE_CHARS) -> str:
    """``text`` safe for one log line: control characters escaped, at most ``limit``
    characters (the rest counted, not shown)."""
    value = str(text)
    cut = ""
    if len(value) > limit:
        cut = f"... ({len(value) - limit} more characters)"
        value = value[:limit]
    return _CONTROL.sub(lambda m: _NAMED.get(m.group(), f"\\x{ord(m.group()):02x}"),
                        value) + cut


def utc_timestamp() -> str:
    """Now, as ``2026-12-01T10:30:00.123Z``."""
    # Imported here: the client escapes a server's text with this module, and a run's
    # start-up need not load datetime for that.
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Log(Protocol):
    """Where the server's events go (see the module docstring)."""

    def __call__(self, message: str, /, event: str = "note", **fields: Any) -> None:
        """Log one event: a message for people, and the fields for machines."""


def null_log(message: str, /, event: str = "note", **fields: Any) -> None:
    """A Log that drops everything (a server embedded in a self-test)."""


class EventLog:
    """A :class:`Log` writing one line per event through ``write`` (text or JSON).

    Safe to call from every server thread: lines are written whole, one at a time. A
    ``write`` that fails (a closed pipe, a full disk) loses the line, never the serving.
    """

    def __init__(self, write: Callable[[str], None], fmt: str = "text",
                 clock: Callable[[], str] = utc_timestamp) -> None:
        if fmt not in ("text", "json"):
            raise ValueError(f"log format must be text or json, not {fmt!r}")
        self._write = write
        self._json = fmt == "json"
        self._clock = clock
        self._lock = threading.Lock()

    def __call__(self, message: str, /, event: str = "note", **fields: Any) -> None:
        """Log one event."""
        line = self.line(message, event, **fields)
        with self._lock, contextlib.suppress(OSError, ValueError):
            self._write(line)

    def line(self, message: str, event: str = "note", **fields: Any) -> str:
        """The line for one event, without its newline."""
        when = self._clock()
        if self._json:
            record = {"time": when, "event": event, "message": escape(message, 4096)}
            record.update({k: _field(v) for k, v in fields.items() if v is not None})
            return json.dumps(record, ensure_ascii=True)
        return f"{when} {event} {escape(message, 4096)}"


def _field(value: Any) -> Any:
    if isinstance(value, (bool, int, float)):
        return value
    return escape(value)


class Throttle:
    """At most ``per_second`` events in any one second pass; ``take()`` says whether this
    one does.

    The window slides (the last ``per_second`` passes are remembered): counted by whole
    seconds of its own clock, a throttle lets twice the limit through in a second of the
    log's clock that straddles two of them. ``take()`` returns None for an event held
    back, else how many were held back since the last that passed (so the line that
    passes can say so). Thread-safe."""

    def __init__(self, per_second: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._passes: collections.deque[float] = collections.deque(maxlen=per_second)
        self._held = 0

    def take(self) -> int | None:
        """None if this event is held back, else the count held back before it."""
        with self._lock:
            now = self._clock()
            full = len(self._passes) == self._passes.maxlen
            if full and now - self._passes[0] < 1.0:
                self._held += 1
                return None
            self._passes.append(now)
            held, self._held = self._held, 0
            return held


def client(peer: tuple | None) -> str:
    """``address:port`` of a peer tuple (``[v6]:port`` for IPv6)."""
    if not peer:
        return "unknown"
    address, port = str(peer[0]), peer[1] if len(peer) > 1 else None
    shown = f"[{address}]" if ":" in address else address
    return escape(f"{shown}:{port}" if port is not None else shown)


__all__ = ["MAX_VALUE_CHARS", "EventLog", "Log", "Throttle", "client", "escape", "null_log",
           "utc_timestamp"]
