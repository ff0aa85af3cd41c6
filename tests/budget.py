"""How much work the long property and load tests do: all of it, unless told otherwise.

``NETPROBE_TEST_BUDGET`` (a fraction, default 1) scales the example counts of the
hypothesis tests and the lengths of the load loops. The ARM wheels' suite runs under
qemu-user, where the interpreter is ten to twenty times slower: there the same tests run
with a fraction of their examples (pyproject.toml sets it for those wheels), so each
still runs, on the emulated architecture, but the whole suite fits a CI run.
"""

from __future__ import annotations

import functools
import os
import socket

import pytest


def _fraction() -> float:
    text = os.environ.get("NETPROBE_TEST_BUDGET", "1")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"NETPROBE_TEST_BUDGET must be a number in (0, 1], not {text!r}") from None
    if not 0 < value <= 1:
        raise ValueError(f"NETPROBE_TEST_BUDGET must be in (0, 1], not {value}")
    return value


FRACTION = _fraction()


@functools.cache
def tcp_info_is_full() -> bool:
    """False where the kernel's TCP_INFO figures come back cut to 4 bytes: qemu-user (the
    emulated ARM suites) copies every TCP socket option out as an int, so a sender's
    retransmits, RTT and cwnd are unknown there however the code reads them."""
    with socket.socket() as sock:
        return len(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)) > 4


def scaled(count: int, floor: int = 10) -> int:
    """``count`` scaled by the budget, but never below ``floor`` (nor above ``count``)."""
    return max(min(count, floor), round(count * FRACTION))


def full_budget_only(why: str) -> pytest.MarkDecorator:
    """Skip a test under a reduced budget. For the few whose point is their size (plans of
    10,000 agents, a list of 499,500 pairs: pure Python, the same on every architecture,
    tested natively), where a fraction of the size would test nothing and the whole size
    would take minutes of the emulated suite; ``why`` says what it costs."""
    return pytest.mark.skipif(FRACTION < 1, reason=f"test budget {FRACTION:g} (the "
                              f"emulated ARM suites): {why}; runs at the full budget")
