"""The shared schedule against a real PostgreSQL (started by the test, as test_archives'):
many claimers, each on its own connection, never hold a host twice at once (read back
from the database's own history of slot intervals and from a witness the claimers keep),
every pair is done exactly once; a claimer that dies (its connection closed, or its
process killed with SIGKILL) has its pairs re-queued after the lease and done by the
others; the exclusion constraint itself refuses an overlapping row written by hand."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from netprobe import convert
from netprobe.archives import ArchiveError, PairRecord, Run, open_archive
from netprobe.fleet.claims import Claim, LeaseLost, QueuedPair, claim_store
from netprobe.host import utc_now_iso
from netprobe.schema import Result

from .servers import NETPROBE


@pytest.fixture(scope="module")
def result() -> Result:
    """One real result (TCP over loopback), archived with every simulated pair."""
    run = subprocess.run([*NETPROBE, "run", "-t", "0.3", "--json"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return convert.from_json(run.stdout)


def _mesh(prefix: str, n: int, duration_s: float) -> list[QueuedPair]:
    hosts = [f"{prefix}{i}" for i in range(n)]
    return [QueuedPair("mesh", 1, a, b, duration_s) for a in hosts for b in hosts if a != b]


def _new_run(url: str, pairs: list[QueuedPair]) -> str:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with open_archive(url) as archive:
        archive.start_run(Run(run_id, "fleet.toml", utc_now_iso(), 1, len(pairs)))
        assert claim_store(archive).enqueue(run_id, pairs) == len(pairs)
        assert claim_store(archive).enqueue(run_id, pairs) == 0  # a second runner joining
    return run_id


def _record(claim: Claim, result: Result) -> PairRecord:
    return PairRecord(claim.run_id, claim.group, claim.round, claim.source, claim.target,
                      utc_now_iso(), "ok", None, result)


class Witness:
    """What the claimers themselves saw: a host taken while another claimer held it is a
    violation (a host is marked before the claimer completes, unmarked before it does,
    so the witness can only under-report holding, never invent an overlap)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: dict[str, str] = {}
        self.violations: list[str] = []
        self.most_pairs = 0

    def take(self, claim: Claim) -> None:
        with self.lock:
            for host in (claim.source, claim.target):
                if host in self.held:
                    self.violations.append(f"{host} held by {self.held[host]} and {claim.lease}")
                self.held[host] = claim.lease
            self.most_pairs = max(self.most_pairs, len(self.held) // 2)

    def give(self, claim: Claim) -> None:
        with self.lock:
            for host in (claim.source, claim.target):
                if self.held.get(host) == claim.lease:
                    del self.held[host]


def _work(url: str, run_id: str, name: str, result: Result, witness: Witness,
          counts: dict[str, int], hold_s: float, grace_s: float) -> None:
    """One claimer on its own connection: claim, hold the hosts a while, complete; until
    the run has nothing left (bounded in claims and in time). A failure is counted."""
    try:
        _claim_loop(url, run_id, name, result, witness, counts, hold_s, grace_s)
    except Exception as exc:
        with witness.lock:
            witness.violations.append(f"{name} failed: {exc}")


def _claim_loop(url: str, run_id: str, name: str, result: Result, witness: Witness,
                counts: dict[str, int], hold_s: float, grace_s: float) -> None:
    with open_archive(url) as archive:
        store = claim_store(archive, name, grace_s)
        deadline = time.monotonic() + 60
        for _ in range(2000):
            if time.monotonic() > deadline:
                break
            claim = store.claim(run_id)
            if claim is None:
                if store.remaining(run_id) == 0:
                    break
                time.sleep(0.01)
                continue
            witness.take(claim)
            time.sleep(hold_s)  # the "test"
            witness.give(claim)
            store.complete(claim, _record(claim, result))
            counts[name] = counts.get(name, 0) + 1
        counts[f"{name}:refused"] = store.refused
        counts[f"{name}:rechecked"] = store.rechecked


def _overlaps(url: str, prefix: str) -> list[tuple]:
    """Any two slot intervals of one host that overlap, from the database's history."""
    with open_archive(url) as archive:
        rows = archive._read(  # type: ignore[attr-defined]
            "SELECT a.host, a.id, b.id FROM fleet_slots a JOIN fleet_slots b "
            "ON a.host = b.host AND a.id < b.id AND a.during && b.during "
            "WHERE a.host LIKE ?", (prefix + "%",))
    return [tuple(r) for r in rows]


def _results_per_pair(url: str, run_id: str) -> dict[tuple[str, str], int]:
    with open_archive(url) as archive:
        out: dict[tuple[str, str], int] = {}
        for record in archive.records(run_id):
            key = (record.source, record.target)
            out[key] = out.get(key, 0) + 1
    return out


def _workers(url: str, run_id: str, n: int, result: Result, witness: Witness,
             counts: dict[str, int], hold_s: float, grace_s: float) -> float:
    threads = [threading.Thread(target=_work, args=(url, run_id, f"claimer-{i}", result,
                                                     witness, counts, hold_s, grace_s))
               for i in range(n)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert not any(t.is_alive() for t in threads)
    return time.monotonic() - started


def test_many_claimers_never_hold_a_host_twice(postgres_url: str, result: Result) -> None:
    pairs = _mesh("m", 8, 0.05)
    run_id = _new_run(postgres_url, pairs)
    witness, counts = Witness(), {}  # type: ignore[var-annotated]
    took = _workers(postgres_url, run_id, 6, result, witness, counts, 0.01, 5.0)
    done = sum(v for k, v in counts.items() if ":" not in k)
    print(f"\n{done} pairs by 6 claimers in {took:.2f} s: {done / took:.0f} claims/s; "
          f"refused: {sum(v for k, v in counts.items() if k.endswith(':refused'))}; "
          f"rechecked: {sum(v for k, v in counts.items() if k.endswith(':rechecked'))}; "
          f"most pairs at once: {witness.most_pairs}")
    assert done == len(pairs) == 56
    assert witness.violations == []
    assert witness.most_pairs >= 2  # the claimers did run side by side
    assert _overlaps(postgres_url, "m") == []
    assert set(_results_per_pair(postgres_url, run_id).values()) == {1}
    assert len(_results_per_pair(postgres_url, run_id)) == 56
    with open_archive(postgres_url) as archive:
        listed = claim_store(archive).pairs(run_id)
    assert {(p["state"], p["attempts"], p["requeues"]) for p in listed} == {("done", 1, 0)}
    assert all(p["result_id"] is not None for p in listed)


_DIES = textwrap.dedent("""
    import sys, time
    from netprobe.archives import open_archive
    from netprobe.fleet.claims import claim_store
    archive = open_archive(sys.argv[1])
    claim = claim_store(archive, "killed", float(sys.argv[3])).claim(sys.argv[2])
    print(claim.source, claim.target, flush=True)
    time.sleep(60)
""")


def test_a_dead_claimers_pairs_are_requeued_and_done_once(postgres_url: str,
                                                          result: Result) -> None:
    pairs = _mesh("d", 6, 0.2)
    run_id = _new_run(postgres_url, pairs)
    grace = 0.6
    # one claimer's process is killed with SIGKILL holding a pair
    proc = subprocess.Popen([sys.executable, "-c", _DIES, postgres_url, run_id, str(grace)],
                            stdout=subprocess.PIPE, text=True, env={**os.environ})
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "the claimer that is to die never claimed"
        killed = tuple(proc.stdout.readline().split())  # type: ignore[union-attr]
        assert len(killed) == 2
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    # another closes its connection holding one
    with open_archive(postgres_url) as archive:
        closed = claim_store(archive, "closed", grace).claim(run_id)
        assert closed is not None
    witness, counts = Witness(), {}  # type: ignore[var-annotated]
    _workers(postgres_url, run_id, 3, result, witness, counts, 0.01, grace)
    assert witness.violations == []
    assert _overlaps(postgres_url, "d") == []
    per_pair = _results_per_pair(postgres_url, run_id)
    assert len(per_pair) == 30 and set(per_pair.values()) == {1}
    with open_archive(postgres_url) as archive:
        listed = {(p["source"], p["target"]): p for p in claim_store(archive).pairs(run_id)}
        slots = archive._read(  # type: ignore[attr-defined]
            "SELECT s.how, p.source, p.target FROM fleet_slots s JOIN fleet_pairs p "
            "ON p.id = s.pair_id WHERE p.run_id = ? ORDER BY s.id", (run_id,))
    for key, who in ((killed, "killed"), ((closed.source, closed.target), "closed")):
        pair = listed[key]
        assert (pair["state"], pair["attempts"], pair["requeues"]) == ("done", 2, 1), pair
        (note,) = pair["notes"]
        assert f"attempt 1 by {who}" in note and "re-queued" in note
        assert [s[0] for s in slots if (s[1], s[2]) == key] == ["expired"] * 2 + ["done"] * 2
    others = [p for k, p in listed.items() if k not in (killed, (closed.source, closed.target))]
    assert {(p["state"], p["attempts"], p["requeues"]) for p in others} == {("done", 1, 0)}


def test_a_late_result_is_refused_and_renewal_keeps_a_lease(postgres_url: str,
                                                            result: Result) -> None:
    pairs = _mesh("l", 2, 0.05)
    run_id = _new_run(postgres_url, pairs)
    with open_archive(postgres_url) as one, open_archive(postgres_url) as two:
        slow, other = claim_store(one, "slow", 0.3), claim_store(two, "other", 0.3)
        first = slow.claim(run_id)
        assert first is not None
        assert other.claim(run_id) is None  # l0 -> l1 and l1 -> l0 share both hosts
        time.sleep(0.2)
        slow.renew(first, 2.0)  # renewed: it outlives its first end
        time.sleep(0.4)
        assert other.claim(run_id) is None
        slow.complete(first, _record(first, result))
        second = other.claim(run_id)
        assert second is not None and second.attempt == 1
        time.sleep(0.5)  # past its lease: the next claim (or expire) takes it back
        assert other.expire() == 1
        with pytest.raises(LeaseLost):
            other.renew(second)
        with pytest.raises(LeaseLost, match="not kept"):
            other.complete(second, _record(second, result))
        again = slow.claim(run_id)
        assert again is not None and again.attempt == 2 and "attempt 1 by other" in again.notes[0]
        slow.complete(again, _record(again, result))
        assert slow.remaining(run_id) == 0
    assert _results_per_pair(postgres_url, run_id) == {("l0", "l1"): 1, ("l1", "l0"): 1}


def test_the_database_refuses_an_overlapping_slot(postgres_url: str, result: Result) -> None:
    import psycopg

    pairs = _mesh("x", 2, 5.0)
    run_id = _new_run(postgres_url, pairs)
    with open_archive(postgres_url) as archive:
        claim = claim_store(archive, "holder").claim(run_id)
        assert claim is not None
    with psycopg.connect(postgres_url) as plain:
        insert = ("INSERT INTO fleet_slots (host, pair_id, lease, during) VALUES "
                  "(%s, %s, 'by-hand', tstzrange(now(), now() + interval '1 minute'))")
        with pytest.raises(psycopg.errors.ExclusionViolation, match="one_test_a_host"):
            plain.execute(insert, (claim.target, claim.pair_id))
        plain.rollback()
    with open_archive(postgres_url) as archive:
        claim_store(archive).complete(claim, _record(claim, result))
    # the past too: the history of a host's intervals cannot be made to overlap
    with psycopg.connect(postgres_url) as plain, \
            pytest.raises(psycopg.errors.ExclusionViolation):
        plain.execute("INSERT INTO fleet_slots (host, pair_id, lease, during) "
                      "SELECT host, pair_id, 'by-hand', tstzrange(lower(during) - "
                      "interval '1 second', upper(during)) FROM fleet_slots "
                      "WHERE lease = %s LIMIT 1", (claim.lease,))


def test_sqlite_keeps_the_schedule_in_one_runner(tmp_path: Path) -> None:
    with open_archive(str(tmp_path / "fleet.db")) as archive, \
            pytest.raises(ArchiveError, match="only through a PostgreSQL archive"):
        claim_store(archive)


def test_a_role_that_cannot_add_btree_gist_is_told_what_to_do(postgres_url: str) -> None:
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS np_noext")
        admin.execute("CREATE DATABASE np_noext")
        admin.execute("DROP ROLE IF EXISTS np_plain")
        admin.execute("CREATE ROLE np_plain LOGIN")  # no CREATE on the database
    other = postgres_url.replace("/postgres?", "/np_noext?")
    with psycopg.connect(other, autocommit=True) as admin:
        admin.execute("GRANT CREATE ON SCHEMA public TO np_plain")  # tables, not extensions
    plain_url = other.replace("user=netprobe", "user=np_plain")
    with open_archive(plain_url) as archive, \
            pytest.raises(ArchiveError, match=r"needs the btree_gist extension.*CREATE EXTENSION"):
        claim_store(archive)
    with psycopg.connect(other, autocommit=True) as admin:  # added by its owner: it works
        admin.execute("CREATE EXTENSION btree_gist")
    with open_archive(plain_url) as archive:
        assert claim_store(archive).remaining("none") == 0


def test_runners_joining_at_once_queue_a_run_once(postgres_url: str) -> None:
    pairs = _mesh("j", 12, 1.0)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with open_archive(postgres_url) as archive:
        archive.start_run(Run(run_id, "fleet.toml", utc_now_iso(), 1, len(pairs)))
    added: list[int] = []

    def join() -> None:
        with open_archive(postgres_url) as archive:
            added.append(claim_store(archive).enqueue(run_id, iter(pairs)))

    threads = [threading.Thread(target=join) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(added) == [0, 0, 0, len(pairs)]
    with open_archive(postgres_url) as archive:
        listed = claim_store(archive).pairs(run_id)
    assert [(p["source"], p["target"]) for p in listed] == [(p.source, p.target) for p in pairs]


def test_runners_opening_a_fresh_archive_at_once_all_get_it(postgres_url: str) -> None:
    """Runners started together on a new database: CREATE TABLE IF NOT EXISTS alone races
    (two find no table, both create it, one fails on the catalogue's unique key)."""
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS np_fresh")
        admin.execute("CREATE DATABASE np_fresh")
    fresh = postgres_url.replace("/postgres?", "/np_fresh?")
    failures: list[str] = []
    gate = threading.Barrier(6)

    def open_one() -> None:
        gate.wait(timeout=30)
        try:
            with open_archive(fresh) as archive:
                claim_store(archive)
        except ArchiveError as exc:
            failures.append(str(exc))

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert failures == []


def test_a_pair_that_keeps_losing_its_lease_is_given_up_as_a_timeout(postgres_url: str) -> None:
    pairs = _mesh("g", 2, 0.05)[:1]
    run_id = _new_run(postgres_url, pairs)
    with open_archive(postgres_url) as archive:
        store = claim_store(archive, "stuck", 0.05, max_attempts=2)
        for attempt in (1, 2):
            claim = store.claim(run_id)
            assert claim is not None and claim.attempt == attempt
            time.sleep(0.2)  # the lease (0.1 s) ends with no result
        assert store.expire() == 1
        assert store.claim(run_id) is None and store.remaining(run_id) == 0
        (pair,) = store.pairs(run_id)
        (record,) = archive.records(run_id)
    assert (pair["state"], pair["attempts"], pair["requeues"]) == ("done", 2, 1)
    assert pair["notes"][1].endswith("given up") and pair["result_id"] is not None
    assert (record.source, record.target, record.outcome) == ("g0", "g1", "timeout")
    assert "no result after 2 attempts" in str(record.error) and "attempt 2 by stuck" in str(
        record.error)


def test_a_runner_that_waited_for_the_creator_does_not_lock_the_new_tables(
        postgres_url: str) -> None:
    """A runner that found no tables and waited while another created them must not run
    the DDL again: CREATE INDEX IF NOT EXISTS takes its table's SHARE lock before it finds
    the index there, so it waits on every claim in flight, and with a claim that then
    writes the table it locked first PostgreSQL broke the deadlock by failing a runner
    (three `fleet run --shared` started together on a new database)."""
    import psycopg

    from netprobe.fleet import claims

    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS np_waited")
        admin.execute("CREATE DATABASE np_waited")
    fresh = postgres_url.replace("/postgres?", "/np_waited?")
    with open_archive(fresh):  # runs and results, as a runner's archive makes them
        pass
    opened: list[object] = []

    def second_runner() -> None:
        try:
            with open_archive(fresh) as archive:
                opened.append(claim_store(archive))
        except BaseException as exc:
            opened.append(exc)

    with psycopg.connect(fresh, autocommit=True) as gate, \
            psycopg.connect(fresh, autocommit=True) as creator, \
            psycopg.connect(fresh) as claimer:
        # the first runner mid-creation holds the DDL lock (here a session's, so that
        # the tables can be committed while it is held)
        gate.execute("SELECT pg_advisory_lock(%s)", (claims._DDL_LOCK,))
        waiter = threading.Thread(target=second_runner)
        waiter.start()  # finds no tables, waits for the lock
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not gate.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND NOT granted").fetchone()[0]:
            time.sleep(0.02)
        creator.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
        for statement in [*claims._TABLES, *claims._INDEXES]:
            creator.execute(statement)
        # a claim in flight on the new tables, as the first runner's are at once
        claimer.execute("LOCK TABLE fleet_pairs, fleet_slots IN ROW EXCLUSIVE MODE")
        gate.execute("SELECT pg_advisory_unlock(%s)", (claims._DDL_LOCK,))
        waiter.join(timeout=5)
        blocked = waiter.is_alive()
        claimer.rollback()
        waiter.join(timeout=30)
    assert not blocked, "the second runner waited on a claim to re-run the DDL"
    assert len(opened) == 1 and isinstance(opened[0], claims.ClaimStore), opened


def _schedule_series(url: str) -> dict[tuple[str, str], float]:
    """netprobe_fleet_schedule_* samples (name, group) from a real exporter's /metrics over
    the archive at ``url``."""
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from .servers import exporter_process

    with exporter_process("--archive", url) as (base, _proc), \
            urllib.request.urlopen(f"{base}/metrics", timeout=30) as page:
        text = page.read().decode()
    return {(sample.name.removeprefix("netprobe_fleet_schedule_"), sample.labels["group"]):
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name.startswith("netprobe_fleet_schedule_")}


def _fresh_database(url: str) -> str:
    """A new empty database on the test's server: its URL."""
    import psycopg

    name = f"health_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    parts = urllib.parse.urlsplit(url)
    query = f"?{parts.query}" if parts.query else ""
    return f"{parts.scheme}://{parts.netloc}/{name}{query}"


def test_the_exporter_shows_the_schedules_health(postgres_url: str, result: Result) -> None:
    url = _fresh_database(postgres_url)
    with open_archive(url) as archive:  # an archive, but no shared run: no queue to tell of
        archive.start_run(Run("solo", "fleet.toml", utc_now_iso(), 1, 1))
    assert _schedule_series(url) == {}  # not zeros: nobody keeps a queue here
    run_id = _new_run(url, _mesh("h", 4, 0.05))  # 12 pairs; two claims hold all 4 hosts
    with open_archive(url) as one, open_archive(url) as two:
        a, b = claim_store(one, "runner-a", 4.0), claim_store(two, "runner-b", 4.0)
        assert a.claim(run_id) is not None and b.claim(run_id) is not None
        claimed = time.monotonic()
        assert _schedule_series(url) == {
            ("queued_pairs", "mesh"): 10, ("leases", "mesh"): 2, ("runners", "mesh"): 2,
            ("late_leases", "mesh"): 0, ("requeued_pairs", "mesh"): 0,
            ("given_up_pairs", "mesh"): 0}
        # Both leases past their end (0.05 s test + 4 s grace); no claimer released them.
        time.sleep(max(0.0, claimed + 4.5 - time.monotonic()))
        assert _schedule_series(url)[("late_leases", "mesh")] == 2
        assert a.expire() == 2
        assert _schedule_series(url) == {
            ("queued_pairs", "mesh"): 12, ("leases", "mesh"): 0, ("runners", "mesh"): 0,
            ("late_leases", "mesh"): 0, ("requeued_pairs", "mesh"): 2,
            ("given_up_pairs", "mesh"): 0}
        last = claim_store(one, "runner-c", 0.0, max_attempts=1)  # one lost lease: given up
        assert last.claim(run_id) is not None
        time.sleep(0.2)
        assert last.expire() == 1
        assert _schedule_series(url)[("given_up_pairs", "mesh")] == 1
    with open_archive(url) as archive:
        archive.finish_run(run_id, utc_now_iso(), "done")
    assert _schedule_series(url) == {}  # a finished run's queue is history, not health


def test_rounds_are_queued_as_the_queue_runs_low_and_each_pair_once(postgres_url: str,
                                                                   result: Result) -> None:
    """A run's rounds go into the queue as it runs low, not whole (a 1,000-agent mesh is
    999,000 pairs, a 10,000-agent one 10^8): two claimers topping up as they work through
    a 10-agent mesh (90 pairs in 18 rounds of 5) never see more than the low-water mark and
    a round waiting, and do every pair once."""
    from netprobe.fleet import config
    from netprobe.fleet.schedule import plan
    from netprobe.fleet.shared import RoundQueue

    text = "".join(f'[agents.q{i}]\naddress = "127.0.0.1"\n' for i in range(10))
    fleet = config.parse(config.tomllib.loads(text + '[groups.m]\ntype = "mesh"\n'), "q.toml")
    queue = RoundQueue(plan(fleet, None, 1), {"m": 5.0})
    assert len(queue) == 18 and sum(len(r) for r in queue) == 90
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with open_archive(postgres_url) as one, open_archive(postgres_url) as two:
        one.start_run(Run(run_id, "q.toml", utc_now_iso(), 18, 90))
        a, b = claim_store(one, "a"), claim_store(two, "b")
        assert a.top_up(run_id, queue, 12) == 15 and a.rounds_queued(run_id) == 3
        assert b.top_up(run_id, queue, 12) == 0  # 15 wait already: nothing more
        most = 15
        for step in range(400):  # bounded: 90 pairs, each claimed and completed once
            store = (a, b)[step % 2]
            claim = store.claim(run_id)
            if claim is not None:
                store.complete(claim, _record(claim, result))
            store.top_up(run_id, queue, 12)
            waiting = len([p for p in store.pairs(run_id) if p["state"] == "queued"])
            most = max(most, waiting)
            if store.rounds_queued(run_id) == 18 and store.remaining(run_id) == 0:
                break
        assert a.rounds_queued(run_id) == 18 and a.remaining(run_id) == 0
    assert most <= 12 + 5, most
    per_pair = _results_per_pair(postgres_url, run_id)
    assert len(per_pair) == 90 and set(per_pair.values()) == {1}


def test_a_schedule_made_before_busy_is_brought_up_to_date(postgres_url: str) -> None:
    """Tables made by a runner from before ``fleet_hosts.busy`` get the column and the
    indexes from the first newer runner, with ``busy`` taken from the slots held then, so
    that a claim reading it never takes a host an older runner holds."""
    import psycopg

    from netprobe.fleet import claims

    fresh = _fresh_database(postgres_url)
    with open_archive(fresh):  # runs and results
        pass
    with psycopg.connect(fresh, autocommit=True) as old:
        old.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
        for statement in claims._TABLES:  # the schema as the older runner made it
            old.execute(statement)
        old.execute("INSERT INTO runs (run_id, fleet, started, rounds, pairs, status) "
                    "VALUES ('r', 'f.toml', now(), 1, 2, 'incomplete')")
        old.execute("INSERT INTO fleet_hosts (host) VALUES ('a'), ('b'), ('c')")
        row = old.execute("INSERT INTO fleet_pairs (run_id, grp, round, source, target, seq, "
                          "duration_s, state, lease) VALUES ('r', 'g', 0, 'a', 'b', 1, 10, "
                          "'claimed', 'L') RETURNING id").fetchone()
        assert row is not None
        pair = row[0]
        old.execute("INSERT INTO fleet_pairs (run_id, grp, round, source, target, seq, "
                    "duration_s) VALUES ('r', 'g', 0, 'b', 'c', 2, 10), "
                    "('r', 'g', 0, 'c', 'a', 3, 10)")
        old.execute("INSERT INTO fleet_slots (host, pair_id, lease, during) SELECT h, %s, 'L', "
                    "tstzrange(now(), now() + interval '1 hour') FROM unnest(ARRAY['a', 'b']) h",
                    (pair,))
    with open_archive(fresh) as archive:
        store = claim_store(archive, claimer="new")
        with store._transaction() as cursor:
            busy = dict(cursor.execute("SELECT host, busy FROM fleet_hosts").fetchall())
        assert busy == {"a": True, "b": True, "c": False}
        assert store.claim("r") is None  # b-c and c-a each need a host the old runner holds


def test_a_host_an_older_runner_released_is_claimed_again(postgres_url: str) -> None:
    """During an upgrade, a runner from before ``busy`` may expire a newer runner's lease
    (the next claim of any runner does) and release its slots without clearing ``busy``:
    a newer runner whose claim finds nothing then frees such hosts, instead of never
    taking them again."""
    pairs = [QueuedPair("g", 0, "u0", "u1", 10.0), QueuedPair("g", 1, "u1", "u0", 10.0)]
    run_id = _new_run(postgres_url, pairs)
    with open_archive(postgres_url) as archive:
        store = claim_store(archive, claimer="new")
        held = store.claim(run_id)
        assert held is not None and (held.source, held.target) == ("u0", "u1")
        store.renew(held, 0.001)  # the lease ends at once, as a dead runner's does
        time.sleep(0.05)
        with store._transaction() as cursor:  # the older runner's expiry of it
            cursor.execute("UPDATE fleet_slots SET released = upper(during), how = 'expired' "
                           "WHERE lease = %s", (held.lease,))
            cursor.execute("UPDATE fleet_pairs SET state = 'queued', lease = NULL, "
                           "requeues = requeues + 1 WHERE id = %s", (held.pair_id,))
        again = store.claim(run_id)
        assert again is not None and (again.source, again.target) == ("u0", "u1")
        assert again.attempt == 2 and store.unstuck == 2
