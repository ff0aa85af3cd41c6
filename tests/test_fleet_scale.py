"""The scale simulation's logic (bench/fleet_scale.py) at 50 simulated agents on a real
PostgreSQL: the shared schedule, its rounds queued as the queue runs low, gives a directed
mesh the theory's 2(N-1) rounds with no
host twice in a round, every pair archived once; with a claim abandoned each round (its
runner dead) every abandoned pair is re-queued once and done, still each pair once; with
three runners claiming each wave together on connections of their own, the same."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "fleet_scale.py"


@pytest.fixture(scope="module")
def scale() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fleet_scale", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fleet_scale"] = module
    spec.loader.exec_module(module)
    return module


def test_a_50_agent_mesh_takes_the_theorys_rounds(postgres_url: str,
                                                  scale: ModuleType) -> None:
    out = scale.simulate(postgres_url, 50)
    # queued as the queue ran low: the first top-up held 4 x 50 pairs, not the 2,450
    assert out["pairs"] == 50 * 49 and out["queued"] == 200
    assert out["theory_rounds"] == 98 and out["rounds"] == 98 and out["rounds_queued"] == 98
    assert out["witness_overlaps"] == 0 and out["db_overlaps"] == 0
    assert out["remaining"] == 0 and out["requeues"] == 0
    assert out["results"] == out["done"] == out["done_distinct"] == 50 * 49
    assert scale.violations(out) == []
    # the same figures with a host twice, a pair twice, a round too many: each is named
    broken = scale.violations({**out, "db_overlaps": 1, "done_distinct": 50 * 49 - 1,
                               "rounds": 99})
    assert len(broken) == 3 and "overlapping slots" in broken[0], broken


def test_abandoned_claims_are_requeued_once_and_done(postgres_url: str,
                                                     scale: ModuleType) -> None:
    out = scale.simulate(postgres_url, 12, dead=1)
    assert out["abandoned"] > 0 and out["requeues"] == out["abandoned"]
    assert out["rounds"] > out["theory_rounds"] == 22  # the re-runs take rounds of their own
    assert out["witness_overlaps"] == 0 and out["db_overlaps"] == 0
    assert out["remaining"] == 0
    assert out["results"] == out["done"] == out["done_distinct"] == 12 * 11


def test_runners_claiming_together_keep_the_rounds(postgres_url: str,
                                                  scale: ModuleType) -> None:
    out = scale.simulate(postgres_url, 30, runners=3, dead=1)
    # every runner took part: claims of one wave raced each other through SKIP LOCKED
    assert len(out["claims_by_runner"]) == 3 and all(out["claims_by_runner"])
    assert sum(out["claims_by_runner"]) == out["claims"]
    assert out["witness_overlaps"] == 0 and out["db_overlaps"] == 0
    assert out["remaining"] == 0 and out["requeues"] == out["abandoned"] > 0
    assert out["results"] == out["done"] == out["done_distinct"] == 30 * 29
    assert scale.violations(out) == []
    # and without abandoned claims, each wave a full round: the theory's rounds
    whole = scale.simulate(postgres_url, 30, runners=3)
    assert whole["rounds"] == whole["theory_rounds"] == 58 and scale.violations(whole) == []
