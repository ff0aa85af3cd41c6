"""Helpers for tool plugins that drive an external binary (part of the public plugin API).

:mod:`netprobe.driven.process` runs one binary (:class:`DrivenProcess`, :func:`find_binary`,
:func:`run_once`); :mod:`netprobe.driven.net` knows the ports and hosts (:func:`free_port`,
:func:`free_port_block`, :func:`is_listening`, :func:`is_local_host`, ...);
:mod:`netprobe.driven.run` owns a run's lifecycle (:class:`DrivenRun`: start, wait until
ready, deadline, Ctrl-C, stop by PID, intervals delivered on the caller's thread);
:mod:`netprobe.driven.session` is the glue from a plan to a Result (:class:`Plan`,
:class:`DrivenSession`: server then client, one policy for interrupted, failed and ok);
:mod:`netprobe.driven.figures` is the one way a tool's figures become a Result
(:class:`Figures`, :func:`to_result`: every session and saved-output reader ends there);
:mod:`netprobe.driven.tool` is the Tool side (:class:`DrivenTool`: the binary found once,
:func:`read_version`, :func:`readable_sources`); :mod:`netprobe.driven.verdict` says
whether a run that ended content broke or ran short (:func:`run_faults`). Every name is
re-exported here: plugins import ``netprobe.driven``. docs/plugins.md shows a whole plugin
built on them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from netprobe.driven.figures import Figures, interval_order, to_result
    from netprobe.driven.net import (
        family_for,
        free_port,
        free_port_block,
        is_listening,
        is_local_host,
        is_numeric,
        loopback,
        port_is_free,
        system_name,
        wait_port,
    )
    from netprobe.driven.process import (
        DrivenProcess,
        KeptOutput,
        find_binary,
        not_found,
        run_once,
    )
    from netprobe.driven.run import DrivenRun, Ready, listening, printed
    from netprobe.driven.session import (
        HANG_GRACE_S,
        SERVER_READY_S,
        SERVER_REPORT_S,
        DrivenSession,
        Plan,
        client_deadline,
        local_server_wanted,
    )
    from netprobe.driven.tool import DrivenTool, read_version, readable_sources
    from netprobe.driven.verdict import run_faults

# Each name is imported from its module on first use (PEP 562), not all at once: the
# native engine's client needs is_local_host only, and the whole package (subprocess,
# ctypes, the session glue) was ~10 ms of every `netprobe run`'s start-up on a router.
_MODULE_OF = {
    "figures": ("Figures", "interval_order", "to_result"),
    "net": ("family_for", "free_port", "free_port_block", "is_listening", "is_local_host",
            "is_numeric", "loopback", "port_is_free", "system_name", "wait_port"),
    "process": ("DrivenProcess", "KeptOutput", "find_binary", "not_found", "run_once"),
    "run": ("DrivenRun", "Ready", "listening", "printed"),
    "session": ("HANG_GRACE_S", "SERVER_READY_S", "SERVER_REPORT_S", "DrivenSession", "Plan",
                "client_deadline", "local_server_wanted"),
    "tool": ("DrivenTool", "read_version", "readable_sources"),
    "verdict": ("run_faults",),
}
_WHERE = {name: module for module, names in _MODULE_OF.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'netprobe.driven' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"netprobe.driven.{module}"), name)
    globals()[name] = value  # once: later lookups find it as a plain global
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


__all__ = [
    "HANG_GRACE_S",
    "SERVER_READY_S",
    "SERVER_REPORT_S",
    "DrivenProcess",
    "DrivenRun",
    "DrivenSession",
    "DrivenTool",
    "Figures",
    "KeptOutput",
    "Plan",
    "Ready",
    "client_deadline",
    "family_for",
    "find_binary",
    "free_port",
    "free_port_block",
    "interval_order",
    "is_listening",
    "is_local_host",
    "is_numeric",
    "listening",
    "local_server_wanted",
    "loopback",
    "not_found",
    "port_is_free",
    "printed",
    "read_version",
    "readable_sources",
    "run_faults",
    "run_once",
    "system_name",
    "to_result",
    "wait_port",
]
