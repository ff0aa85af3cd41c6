"""``run_captured`` (netprobe.driven.process; the agent's nft calls and the test lab's
commands) waits for the command, not for everything that inherited its output: two CI runs
lost a test each to that wait."""
from __future__ import annotations

import subprocess
import time

import pytest

from netprobe.driven.process import run_captured


def test_a_command_whose_output_another_process_holds_returns_when_it_ends() -> None:
    # The shell ends at once; the sleep it leaves behind holds the shell's stdout and
    # stderr, as a child forked by another thread at the wrong moment holds a pipe.
    started = time.monotonic()
    done = run_captured(["sh", "-c", "echo said; echo warned >&2; sleep 5 & exit 3"],
                        timeout=2.5)
    assert time.monotonic() - started < 2.5
    assert (done.returncode, done.stdout, done.stderr) == (3, "said\n", "warned\n")


def test_a_command_that_does_not_end_is_stopped_at_its_limit() -> None:
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_captured(["sleep", "30"], timeout=0.5)
    assert time.monotonic() - started < 10


def test_input_reaches_the_command() -> None:
    assert run_captured(["cat"], timeout=5, input="table inet x\n").stdout == "table inet x\n"


def test_output_that_is_not_utf8_is_kept_readable() -> None:
    done = run_captured(["printf", "a\\377b"], timeout=5)
    assert done.stdout == "a\ufffdb"


def test_a_command_that_does_not_exist_is_an_os_error() -> None:
    with pytest.raises(OSError):
        run_captured(["netprobe-no-such-command-here"], timeout=5)
