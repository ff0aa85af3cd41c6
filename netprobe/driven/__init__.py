"""Helpers for tool plugins that drive an external binary (part of the public plugin API).

:mod:`netprobe.driven.process` runs one binary (:class:`DrivenProcess`, :func:`find_binary`,
:func:`run_once`); :mod:`netprobe.driven.net` knows the ports and hosts (:func:`free_port`,
:func:`is_listening`, :func:`is_local_host`, ...); :mod:`netprobe.driven.run` owns a run's
lifecycle (:class:`DrivenRun`: start, wait until ready, deadline, Ctrl-C, stop by PID,
intervals delivered on the caller's thread). Every name is re-exported here: plugins
import ``netprobe.driven``.
"""

from netprobe.driven.net import (
    family_for,
    free_port,
    is_listening,
    is_local_host,
    is_numeric,
    port_is_free,
    system_name,
    wait_port,
)
from netprobe.driven.process import DrivenProcess, find_binary, not_found, run_once
from netprobe.driven.run import DrivenRun, Ready, listening, printed

__all__ = [
    "DrivenProcess",
    "DrivenRun",
    "Ready",
    "family_for",
    "find_binary",
    "free_port",
    "is_listening",
    "is_local_host",
    "is_numeric",
    "listening",
    "not_found",
    "port_is_free",
    "printed",
    "run_once",
    "system_name",
    "wait_port",
]
