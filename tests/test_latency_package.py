"""Latency is one package (issue 36 item 5): one runner of a probed run's lifecycle, which
``--latency``, ``bufferbloat`` and ``rrul`` call; before, loadlatency.py and bufferbloat.py
each opened the probe session, paused for idle, marked phases and stopped the probes."""

from __future__ import annotations

import ast
from pathlib import Path

import netprobe

PACKAGE = Path(netprobe.__file__).resolve().parent  # the package as imported (a wheel's too)
LIFECYCLE = {"open_prober", "mark", "pause"}
"""What a probed run's lifecycle calls: the session opened at the far end, idle spans, the
phases marked on the probes' clock."""


def _callers() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", None))
                if name in LIFECYCLE:
                    found.setdefault(str(path.relative_to(PACKAGE)), set()).add(name)
    return found


def test_one_module_runs_the_probed_lifecycle() -> None:
    callers = _callers()
    assert set(callers) == {"latency/phases.py"}, callers
    assert callers["latency/phases.py"] == LIFECYCLE


def test_the_front_doors_call_the_one_runner() -> None:
    for door in ("beside.py", "bufferbloat.py"):
        text = (PACKAGE / "latency" / door).read_text()
        assert "run_probed(" in text, door
