"""Issue 16, the rest: intervals streamed and bounded (item 20), the server flat over many
tests (the soak's growth), numbers from the command line that end in nonsense (item 18),
the agent's rate guard seeing every send (item 4 of the round)."""

from __future__ import annotations

import gc
import weakref

import pytest

from netprobe.engine.side import Side

from .test_hardening_round2 import engine_server, run_spec_port

# --- the soak's growth: a finished test's objects are collected --------------------------------


def test_finished_tests_are_collected_not_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test used to gc.freeze() the heap, moving the previous tests' reference cycles
    (Session, Side, Reader, their threads) where the collector never looks: a server grew
    about 40 KiB a test for ever."""
    sides: list[weakref.ref] = []
    real_start = Side.start

    def start(self: Side) -> None:
        sides.append(weakref.ref(self))
        real_start(self)

    monkeypatch.setattr(Side, "start", start)
    with engine_server() as server:
        run_spec_port(server.port)  # the first test may freeze the start-up heap
        frozen = gc.get_freeze_count()
        for kind in ({}, {"protocol": "udp", "rate_bits_per_second": 10e6},
                     {"direction": "bidir"}):
            assert run_spec_port(server.port, **kind).status == "ok"
        assert gc.get_freeze_count() <= frozen  # nothing more out of the collector's sight
    gc.collect()
    alive = [ref() for ref in sides[2:] if ref() is not None]  # past the first test's two
    assert alive == [], f"{len(alive)} finished tests' Side objects still alive"

