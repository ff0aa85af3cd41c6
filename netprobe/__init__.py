"""netprobe: measure what a network path can carry, with one result schema for every tool.

The Python API (docs/api.md): ``netprobe.run(host, tool=..., duration_s=..., ...)`` runs
one test the way ``netprobe run`` does (``latency=True``: as ``run --latency``) and returns
its :class:`netprobe.schema.Result`; ``netprobe.run_bufferbloat`` and ``netprobe.run_rrul``
return the Result of ``netprobe bufferbloat`` and ``netprobe rrul``; ``netprobe.run_trials``
runs trials interleaved, as ``run --repeat`` and ``compare`` do. Importing this package
stays cheap: each loads the plugins only when it is called.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from netprobe.api import run as run
    from netprobe.api import run_bufferbloat as run_bufferbloat
    from netprobe.api import run_rrul as run_rrul
    from netprobe.api import run_trials as run_trials

from netprobe.version import __version__ as __version__

_API = ("run", "run_bufferbloat", "run_rrul", "run_trials")
"""The public functions, in :mod:`netprobe.api`."""


def __getattr__(name: str) -> Any:
    # The API without importing the plugin machinery for ``netprobe --version``.
    if name in _API:
        from netprobe import api

        return getattr(api, name)
    raise AttributeError(f"module 'netprobe' has no attribute {name!r}")
