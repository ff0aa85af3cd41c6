"""Ctrl-C sent to the test process itself, the way a user's reaches a run, without ever
stopping the suite.

A bare ``threading.Timer(t, os.kill, (os.getpid(), SIGINT))`` is a KeyboardInterrupt at
whatever the test happens to be doing at ``t``: before the run under test has started (a
slow or loaded machine), or after it has ended. Escaping the test, it stops pytest there
(exit 2) with every later test unrun. :func:`ctrl_c_after` sends it only while the block
runs, and a KeyboardInterrupt of its own that escapes the block fails the one test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from netprobe.schema import Interval
from netprobe.testing import RecordingReporter


class Measuring(RecordingReporter):
    """A RecordingReporter whose ``measuring`` event is set by the first interval: Ctrl-C
    timed from it lands in the measurement, however long the run took to start."""

    def __init__(self) -> None:
        super().__init__()
        self.measuring = threading.Event()

    def interval(self, sample: Interval) -> None:
        """Record the sample; the run is measuring."""
        super().interval(sample)
        self.measuring.set()


class CtrlC:
    """What :func:`ctrl_c_after` did: ``sent_at`` (time.monotonic) or None."""

    def __init__(self) -> None:
        self.armed = True
        self.sent_at: float | None = None


@contextlib.contextmanager
def ctrl_c_after(seconds: float, *, started: threading.Event | None = None,
                 wait_s: float = 30.0) -> Iterator[CtrlC]:
    """Send SIGINT to this process ``seconds`` after the block starts (after ``started`` is
    set, when given; it is waited for up to ``wait_s``), and only while the block runs.

    The signal raises KeyboardInterrupt only while the block runs; one arriving later is
    dropped. A KeyboardInterrupt that this sent and the block let escape fails the test
    (the code under test should have turned it into a result) instead of ending the run.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("Ctrl-C can only be simulated in the main thread")
    state = CtrlC()
    stop = threading.Event()

    def on_sigint(signum: int, frame: Any) -> None:
        if state.armed:
            raise KeyboardInterrupt

    def send() -> None:
        if started is not None and not started.wait(wait_s):
            return
        if stop.wait(seconds) or not state.armed:
            return
        state.sent_at = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, on_sigint)
    sender = threading.Thread(target=send, name="ctrl-c", daemon=True)
    sender.start()
    try:
        yield state
    except KeyboardInterrupt:
        if state.sent_at is None:
            raise  # not ours: a real Ctrl-C stops the suite as usual
        pytest.fail(f"the Ctrl-C sent {seconds:g} s in escaped the code under test as a "
                    "bare KeyboardInterrupt")
    finally:
        state.armed = False
        stop.set()
        sender.join(5.0)
        signal.signal(signal.SIGINT, previous)
