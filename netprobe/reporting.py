"""Reporter plumbing: what every run uses to keep and relay its live samples, apart from the
Reporter protocol itself (the contract, in :mod:`netprobe.plugin`).

:class:`KeptIntervals` bounds what a Result keeps; :class:`RelayReporter` calls a reporter
from one thread with its errors contained (a reporter's exception becomes one warning);
:class:`NullReporter` ignores everything.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Protocol

from netprobe.schema import Interval


class _Receiver(Protocol):
    # What a relay calls: the Reporter protocol of the contract (netprobe.plugin), named
    # here by its shape so that this module needs nothing of the contract's.
    def interval(self, sample: Interval) -> None: ...

    def note(self, message: str) -> None: ...

MAX_INTERVALS_KEPT = 20_000
"""Interval samples of each end a Result keeps: a one-hour test at the default 1 s interval
with 4 streams and their sum fits. Past it, samples still reach the reporter as they come
(and ``--format json-stream`` writes every one), but the Result holds no more, and says
so; the whole-test summaries never come from the kept samples alone, so they stay exact."""


class KeptIntervals:
    """The interval samples a run keeps for its Result: the first :data:`MAX_INTERVALS_KEPT`,
    and a count of the rest (memory stays bounded, however long the test)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = MAX_INTERVALS_KEPT if limit is None else limit
        """How many samples are kept (the module's limit unless given)."""
        self.samples: list[Interval] = []
        """The samples kept, in arrival order."""
        self.dropped = 0
        """Samples given past the limit, not kept."""

    def add(self, sample: Interval) -> bool:
        """Keep ``sample`` unless the limit is reached (False then: it is only counted)."""
        if len(self.samples) >= self.limit:
            self.dropped += 1
            return False
        self.samples.append(sample)
        return True

    def take(self) -> tuple[list[Interval], int]:
        """The samples kept and the count not kept since the last take; both start afresh
        (a queue bounded the same way: what waits for a consumer)."""
        taken, dropped = self.samples, self.dropped
        self.samples, self.dropped = [], 0
        return taken, dropped

    def __len__(self) -> int:
        return len(self.samples)


def intervals_not_kept(kept: int, dropped: int) -> str | None:
    """The Result's warning for ``dropped`` samples not kept beside ``kept`` (None: none)."""
    if not dropped:
        return None
    return (f"{kept} interval reports kept in the result, {dropped} more not kept (they "
            "went to the live output as they came; --format json-stream writes every one); "
            "the summaries cover the whole test")


class RelayReporter:
    """Calls a reporter from one thread of its own, in the order events were given, with
    the reporter's errors contained (the Reporter contract, for a tool whose events arise
    on several threads). Use as a context manager around the run; :attr:`warnings` then
    says whether the reporter failed."""

    def __init__(self, reporter: _Receiver) -> None:
        self.warnings: list[str] = []
        """One line if the reporter raised (it is not called again after that)."""
        self._reporter: _Receiver | None = reporter
        self._events: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._relay, name="netprobe-reporter",
                                        daemon=True)

    def interval(self, sample: Interval) -> None:
        """Queue ``sample`` for the reporter."""
        self._events.put(("interval", sample))

    def note(self, message: str) -> None:
        """Queue ``message`` for the reporter."""
        self._events.put(("note", message))

    def _relay(self) -> None:
        while True:
            event = self._events.get()
            if event is None:
                return
            if self._reporter is None:
                continue
            try:
                getattr(self._reporter, event[0])(event[1])
            except Exception as exc:  # outside code: it must not cost the test
                self._reporter = None
                self.warnings.append(f"the live reporter failed and was not called again: "
                                     f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> RelayReporter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._events.put(None)
        self._thread.join()  # every event given is delivered before the run returns


class NullReporter:
    """A reporter that ignores everything: for tests and for ``--json`` output."""

    def interval(self, sample: Interval) -> None:
        """Ignore the sample."""

    def note(self, message: str) -> None:
        """Ignore the message."""


