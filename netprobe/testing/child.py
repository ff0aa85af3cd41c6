"""The timeout check's child process: one test, SIGTERM turned into SystemExit as a host
should."""
from __future__ import annotations

import json
import signal
import sys
from collections.abc import Sequence
from typing import Any

from netprobe import convert
from netprobe.errors import TestFailed
from netprobe.schema import (
    Interval,
    TestSpec,
)
from netprobe.testing.checks import RecordingReporter

# --- the child process of the timeout check ----------------------------------------------


def _import(target: str) -> Any:
    import importlib

    module, _, qualname = target.partition(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


class _ChildReporter(RecordingReporter):
    """Says ``started`` on stdout at the first sign of life, for the parent to see."""

    def _started(self) -> None:
        if not self.event.is_set():
            sys.stdout.write("started\n")
            sys.stdout.flush()

    def interval(self, sample: Interval) -> None:
        """Record one interval (and say started)."""
        self._started()
        super().interval(sample)

    def note(self, message: str) -> None:
        """Record one note (and say started)."""
        self._started()
        super().note(message)


def _child_main(argv: Sequence[str]) -> int:
    """Run one test as the timeout check's child: SIGTERM becomes SystemExit, as a host
    (the CLI, an agent) should make it, so the tool's cleanup runs."""
    target, options, spec_json = argv

    def on_sigterm(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    tool = _import(target)(json.loads(options))
    spec = convert.structure(json.loads(spec_json), TestSpec)
    sys.stdout.write("running\n")
    sys.stdout.flush()
    try:
        result = tool.run(spec, _ChildReporter())
    except SystemExit:
        sys.stdout.write("stopped: SystemExit reached the host\n")
        raise
    except TestFailed as exc:
        sys.stdout.write(f"stopped: {type(exc).__name__}: {exc}\n")
        return 1
    sys.stdout.write(f"finished: status {result.status}\n")
    return 0
