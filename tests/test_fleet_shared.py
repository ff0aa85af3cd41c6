"""Several runners share one fleet run through the PostgreSQL schedule, on loopback: real
agents (``netprobe server --allow-third-party``), each runner on its own connection; every
pair is tested and archived exactly once, by one runner or another, no host's slot
intervals overlap; with SQLite a shared run is refused."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from netprobe.archives import ArchiveError, open_archive
from netprobe.fleet import config
from netprobe.fleet.runner import FleetRunner, QuietProgress, RunSummary
from netprobe.fleet.shared import run_shared

from . import pgserver
from .servers import netprobe_server


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    reason = pgserver.why_not()
    if reason:
        pytest.skip(reason)
    with pgserver.postgres_server() as url:
        yield url


@pytest.fixture(scope="module")
def agents() -> Iterator[dict[str, int]]:
    with ExitStack() as stack:
        yield {name: stack.enter_context(netprobe_server("--allow-third-party",
                                                         "--max-tests", "4")).port
               for name in ("a", "b", "c", "d")}


def _fleet(ports: dict[str, int]) -> config.Fleet:
    agents = "".join(f'[agents.{n}]\naddress = "127.0.0.1"\nport = {p}\n'
                     for n, p in ports.items())
    text = f'{agents}[groups.mesh]\ntype = "mesh"\nspec = {{ duration = 0.3 }}\n'
    return config.parse(config.tomllib.loads(text), "shared.toml")


def test_two_runners_share_a_mesh_each_pair_once(postgres_url: str,
                                                 agents: dict[str, int]) -> None:
    fleet = _fleet(agents)
    summaries: dict[str, RunSummary] = {}
    failures: list[BaseException] = []

    def runner(name: str) -> None:
        try:
            with open_archive(postgres_url) as archive:
                summaries[name] = run_shared(FleetRunner(fleet, archive, QuietProgress()),
                                             run=1, claimer=name, poll_s=0.05)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=runner, args=(n,)) for n in ("r1", "r2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures and len(summaries) == 2
    (run_id,) = {s.run_id for s in summaries.values()}  # both joined one run
    assert sum(s.total for s in summaries.values()) == 12
    assert {s.status for s in summaries.values()} == {"done"}
    with open_archive(postgres_url) as archive:
        records = archive.records(run_id)
        (run,) = [r for r in archive.runs() if r.run_id == run_id]
        overlaps = archive._read(  # type: ignore[attr-defined]
            "SELECT a.host FROM fleet_slots a JOIN fleet_slots b ON a.host = b.host "
            "AND a.id < b.id AND a.during && b.during")
    assert run.status == "done" and run.pairs == 12
    assert sorted((r.source, r.target) for r in records) == sorted(
        (s, t) for s in agents for t in agents if s != t)
    assert all(r.outcome == "ok" for r in records), [r.error for r in records]
    for record in records:
        assert record.result is not None and record.result.run_id == run_id
        flow = record.result.summary()
        assert flow is not None and flow.receiver is not None and flow.receiver.bytes > 0
    assert overlaps == []


def test_a_shared_run_needs_postgresql(agents: dict[str, int], tmp_path: Path) -> None:
    with open_archive(str(tmp_path / "f.db")) as archive, \
            pytest.raises(ArchiveError, match="only through a PostgreSQL archive"):
        run_shared(FleetRunner(_fleet(agents), archive, QuietProgress()), run=1)
