"""The suite's own Ctrl-C (tests/interrupts.py): it reaches the code under test, and never
stops the suite when that code lets it through or has already finished."""
from __future__ import annotations

import signal
import threading
import time

import pytest

from tests.interrupts import ctrl_c_after


def test_ctrl_c_reaches_the_block() -> None:
    caught = False
    with ctrl_c_after(0.05) as sent:
        try:
            time.sleep(5)
        except KeyboardInterrupt:
            caught = True
    assert caught and sent.sent_at is not None


def test_an_escaping_ctrl_c_fails_the_test_instead_of_stopping_the_suite() -> None:
    # A bare os.kill(getpid(), SIGINT) escaping here would end pytest with exit 2.
    escaped = pytest.raises(pytest.fail.Exception, match="escaped the code under test")
    with escaped, ctrl_c_after(0.05):
        time.sleep(5)


def test_no_ctrl_c_after_the_block_has_ended() -> None:
    before = signal.getsignal(signal.SIGINT)
    with ctrl_c_after(0.2) as sent:
        pass
    time.sleep(0.4)  # a stray KeyboardInterrupt would stop the suite here
    assert sent.sent_at is None
    assert signal.getsignal(signal.SIGINT) is before


def test_ctrl_c_waits_for_the_run_to_start() -> None:
    started = threading.Event()
    with ctrl_c_after(0.0, started=started) as sent:
        time.sleep(0.3)
        assert sent.sent_at is None  # nothing before the run said it started
        started.set()
        with pytest.raises(KeyboardInterrupt):
            time.sleep(5)
    assert sent.sent_at is not None
