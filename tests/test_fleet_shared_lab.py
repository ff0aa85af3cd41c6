"""Three `netprobe fleet run --shared` runners on one real PostgreSQL (started by the test,
on a unix socket, which every namespace reaches through the file system) share one mesh of
agents in namespaces, each agent behind its own 100 Mbit/s tbf link (tests/netlab.py
switched_hosts). No host is in two tests at once: the archived tests' times of one host do
not overlap, and each pair reads well clear of the 47 Mbit/s two tests sharing a link
would read. One runner is killed with SIGKILL while it holds a pair: its pairs are re-run
by the others once its lease ends, and each pair is archived exactly once.

Kept short for CI (under 60 s in all on a 2-CPU machine): four agents rather than the
issue's six (12 pairs, two at a time) and 1.5 s tests, which read the wire's rate to
within a few Mbit/s, so each pair is asked only to be clear of a shared link's rate, not
to read 94.1 +/- 1 (test_fleet_lab.py asks that of the single runner's longer tests)."""
from __future__ import annotations

import contextlib
import datetime
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from netprobe.archives import PairRecord, figures, open_archive

from . import pgserver
from .netlab import Lab, switched_hosts, wait_listening

pytestmark = [pytest.mark.root, pytest.mark.slow]
why_not = Lab.available() or pgserver.why_not()
if why_not:
    pytestmark.append(pytest.mark.skip(reason=why_not))

NETPROBE = [sys.executable, "-m", "netprobe"]
NAMES = ["fs1", "fs2", "fs3", "fs4"]
WIRE_MBIT = 100 * 1448 / 1538  # 94.1: TCP payload of a 100 Mbit/s Ethernet
SHARED_MBIT = WIRE_MBIT / 2  # what each of two tests sharing one host's link would read
LEASE = "2s"  # shorter than a test with its start-up: the heartbeat must renew it


@pytest.fixture()
def pg_url() -> Iterator[str]:
    with pgserver.postgres_server() as url:
        yield url


def _interval(record: PairRecord) -> tuple[float, float]:
    """When the pair's traffic flowed: the test's own start (the agent's clock, which
    every namespace shares) plus the receiver's first and last second."""
    assert record.result is not None and record.result.start_time is not None
    start = datetime.datetime.fromisoformat(
        record.result.start_time.replace("Z", "+00:00")).timestamp()
    flow = record.result.summary()
    assert flow is not None and flow.receiver is not None
    return start + flow.receiver.start_s, start + flow.receiver.end_s


def _overlapping(records: list[PairRecord]) -> list[tuple[str, str, str]]:
    found = []
    for host in NAMES:
        mine = sorted((*_interval(r), f"{r.source}->{r.target}")
                      for r in records if host in (r.source, r.target))
        for (_, end, one), (later, _, other) in zip(mine, mine[1:]):
            if later < end:
                found.append((host, one, other))
    return found


@pytest.mark.host_timing
def test_three_shared_runners_on_shaped_links_one_killed(tmp_path: Path, pg_url: str) -> None:
    import psycopg

    with switched_hosts(NAMES, subnet="10.78.9", rate_mbit=100, prefix="fs") as (lab, hosts):
        switch = lab.namespaces[0]
        for ns, address in hosts.values():
            lab.start(ns, [*NETPROBE, "server", "-B", address, "--allow-third-party"],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for ns, _ in hosts.values():
            wait_listening(lab, ns, 5301)
        fleet = tmp_path / "shared-mesh.toml"
        fleet.write_text(f'[fleet]\narchive = "{pg_url}"\nlease = "{LEASE}"\n' + "".join(
            f'[agents.{name}]\naddress = "{address}"\n' for name, (_, address) in hosts.items())
            + '[groups.mesh]\ntype = "mesh"\nspec = { duration = "1.5s", omit = "0s" }\n')
        runners = [lab.start(switch, [*NETPROBE, "fleet", "run", str(fleet), "--shared", "-q"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for _ in range(3)]
        by_pid = {r.pid: r for r in runners}  # `ip netns exec` execs: the runner's pid
        with psycopg.connect(pg_url, autocommit=True) as db:
            # the victim: whichever runner is seen first holding a pair (any of the three
            # may win every claim for a while)
            held = None
            deadline = time.monotonic() + 30
            while held is None and time.monotonic() < deadline:
                with contextlib.suppress(psycopg.errors.UndefinedTable):
                    held = db.execute("SELECT run_id, source, target, claimer "
                                      "FROM fleet_pairs WHERE state = 'claimed' "
                                      "LIMIT 1").fetchone()
                time.sleep(0.05)
            assert held is not None, "no runner ever held a pair"
            victim = by_pid[int(held[3].split(":")[-2])]
            time.sleep(0.5)  # mid-test: its agents are sending
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait(timeout=10)
            for runner in (r for r in runners if r is not victim):
                _, err = runner.communicate(timeout=45)
                assert runner.returncode == 0, err
            run_id = held[0]
            pairs = db.execute("SELECT source, target, state, attempts, requeues, notes "
                               "FROM fleet_pairs WHERE run_id = %s", (run_id,)).fetchall()
            status = db.execute("SELECT status FROM runs WHERE run_id = %s",
                                (run_id,)).fetchone()
    with open_archive(pg_url) as archive:
        records = archive.records(run_id)
    every = sorted((s, t) for s in NAMES for t in NAMES if s != t)
    assert sorted((r.source, r.target) for r in records) == every  # each pair once
    assert all(r.outcome == "ok" for r in records), [r.error for r in records]
    assert status == ("done",) and {p[2] for p in pairs} == {"done"}
    # the killed runner's pairs (the one seen held, and any other it held) re-queued once
    # with a note naming it, re-run by the others; every other pair ran on its first claim
    requeued = [p for p in pairs if p[3:5] != (1, 0)]
    assert (held[1], held[2]) in [(p[0], p[1]) for p in requeued]
    for pair in requeued:
        assert pair[3:5] == (2, 1) and f":{victim.pid}:" in pair[5][0], pair
    overlapping = _overlapping(records)
    assert not overlapping, f"a host in two tests at once: {overlapping}"
    mbit = {(r.source, r.target): figures(r.result)["receiver_bits_per_second"] / 1e6
            for r in records}
    low = {pair: v for pair, v in mbit.items() if not SHARED_MBIT * 1.7 < v < WIRE_MBIT + 1}
    assert not low, f"pairs far off 94.1 Mbit/s (a host in two tests at once?): {low}"
    print(f"3 runners, one killed: 12 pairs, {len(requeued)} re-queued, "
          f"{min(mbit.values()):.1f}..{max(mbit.values()):.1f} Mbit/s")
