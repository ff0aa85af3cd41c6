"""netprobe: measure what a network path can carry, with one result schema for every tool.

The Python API (docs/api.md): ``netprobe.run(host, tool=..., duration_s=..., ...)`` runs
one test the way ``netprobe run`` does and returns its :class:`netprobe.schema.Result`.
Importing this package stays cheap: ``run`` loads the plugins only when it is called.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from netprobe.session import run as run

from netprobe.version import __version__ as __version__


def __getattr__(name: str) -> Any:
    # ``netprobe.run`` without importing the plugin machinery for ``netprobe --version``.
    if name == "run":
        from netprobe.session import run

        return run
    raise AttributeError(f"module 'netprobe' has no attribute {name!r}")
