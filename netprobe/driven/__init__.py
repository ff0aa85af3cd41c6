"""Helpers for tool plugins that drive an external binary (part of the public plugin API).

:mod:`netprobe.driven.process` runs one binary (:class:`DrivenProcess`, :func:`find_binary`,
:func:`run_once`). Every name is re-exported here: plugins import ``netprobe.driven``.
"""

from netprobe.driven.process import (
    DrivenProcess,
    find_binary,
    free_port,
    is_listening,
    is_local_host,
    port_is_free,
    run_once,
    wait_port,
)

__all__ = [
    "DrivenProcess",
    "find_binary",
    "free_port",
    "is_listening",
    "is_local_host",
    "port_is_free",
    "run_once",
    "wait_port",
]
