"""Facts about this host that results record: the time now and the system's name.

On the ground floor (imports nothing of netprobe's): stamped by the engine, the driven tools
and the agent alike.
"""

from __future__ import annotations

import os
import time


def utc_now_iso() -> str:
    """The current time, UTC, ISO 8601 with milliseconds (for ``Result.start_time``), as
    ``datetime.now(timezone.utc).isoformat(timespec="milliseconds")`` writes it:
    ``2024-05-01T12:00:00.123+00:00``."""
    # time, not datetime: importing datetime (a Python module over _datetime) is ~1 ms of
    # every run's start-up, for this one timestamp.
    now_ns = time.time_ns()
    seconds, rest_ns = divmod(now_ns, 1_000_000_000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{stamp}.{rest_ns // 1_000_000:03d}+00:00"


def system_name() -> str:
    """This machine as ``Endpoint.system`` names it: ``uname`` system, release, machine."""
    # os.uname, not platform.uname: the same three fields, without importing platform
    # (it compiles a dozen regular expressions at import, start-up time on a router).
    uname = os.uname()
    return f"{uname.sysname} {uname.release} {uname.machine}"

