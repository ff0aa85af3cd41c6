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
    from netprobe.bufferbloat import run_bufferbloat as run_bufferbloat
    from netprobe.bufferbloat import run_rrul as run_rrul
    from netprobe.results.trials import run_trials as run_trials
    from netprobe.session import run as run

from netprobe.version import __version__ as __version__


def __getattr__(name: str) -> Any:
    # The API without importing the plugin machinery for ``netprobe --version``. Plain
    # imports, so that tests/test_import_cycles.py sees each edge.
    if name == "run":
        from netprobe.session import run

        return run
    if name in ("run_bufferbloat", "run_rrul"):
        from netprobe import bufferbloat

        return getattr(bufferbloat, name)
    if name == "run_trials":
        from netprobe.results.trials import run_trials

        return run_trials
    raise AttributeError(f"module 'netprobe' has no attribute {name!r}")
