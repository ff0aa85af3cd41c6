"""The shared schedule's statements that every runner repeats (topping the queue up after
each completion, asking what is left when idle, claiming) and the exporter's scrape of its
health read what the queue holds, not
every pair the run has done nor every host of the fleet: on a real PostgreSQL, the rows each
statement reads (the server's own counters) stay near the queue's length when a whole
mesh's pairs are done behind it, and a claim's stay the same whatever the hosts.
The planner is told to use indexes, as it does once the table is large (a small
table is scanned whole whatever the statement)."""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from netprobe.archives import PairRecord, Run, open_archive
from netprobe.fleet.claims import Claim, ClaimStore, QueuedPair, claim_store, schedule_health
from netprobe.host import utc_now_iso

HOSTS = 30
AHEAD = 30


def _rounds(n: int) -> list[list[QueuedPair]]:
    """A directed mesh's rounds (circle method), each host at most once a round."""
    hosts = [f"s{i}" for i in range(n)]
    rounds = []
    for r in range(n - 1):
        ring = [hosts[0], *(hosts[1:][r:] + hosts[1:][:r])]
        pairs = [(ring[i], ring[n - 1 - i]) for i in range(n // 2)]
        rounds.append([QueuedPair("mesh", r, a, b, 10.0) for a, b in pairs])
        rounds.append([QueuedPair("mesh", n - 1 + r, b, a, 10.0) for a, b in pairs])
    return rounds


def _rows_read(store: ClaimStore, call: Callable[[], Any],
               tables: tuple[str, ...] = ("fleet_pairs",)) -> int:
    """How many rows of ``tables`` ``call`` read (sequential and index reads), by the
    server's statistics of this connection, flushed before and after."""
    def counted() -> int:
        with store._transaction() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
        time.sleep(0.2)  # the flush happens when the backend goes idle
        with store._transaction() as cursor:
            cursor.execute("SET stats_fetch_consistency = 'none'")
            row = cursor.execute(
                "SELECT (SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_user_tables "
                "WHERE relname = ANY(%s)) + (SELECT coalesce(sum(idx_tup_read), 0) FROM "
                "pg_stat_user_indexes WHERE relname = ANY(%s))",
                (list(tables), list(tables))).fetchone()
        return int(row[0])

    before = counted()
    call()
    return counted() - before


def _started(archive: Any, rounds: list[list[QueuedPair]], prefix: str
             ) -> tuple[str, ClaimStore]:
    """A new run of ``rounds`` in ``archive``, and a claim store on it: (run id, store)."""
    run_id = f"{prefix}-{uuid.uuid4().hex[:8]}"
    archive.start_run(Run(run_id, "scale.toml", utc_now_iso(), len(rounds),
                          sum(map(len, rounds))))
    return run_id, claim_store(archive, claimer="t")


def test_top_up_and_remaining_read_the_queue_not_every_done_pair(postgres_url: str) -> None:
    rounds = _rounds(HOSTS)
    with open_archive(postgres_url) as archive:
        run_id, store = _started(archive, rounds, "scale")
        done = 0
        for _ in range(HOSTS * HOSTS):  # bounded: more than the mesh's pairs
            store.top_up(run_id, rounds, AHEAD)
            claim = store.claim(run_id)
            if claim is None:
                break
            store.complete(claim, PairRecord(run_id, claim.group, claim.round, claim.source,
                                             claim.target, utc_now_iso(), "failed", "sim"))
            done += 1
            if store.rounds_queued(run_id) == len(rounds) - 4:
                break  # four rounds left to queue, a mesh's worth done behind them
        assert done > 500 and store.rounds_queued(run_id) == len(rounds) - 4
        with store._transaction() as cursor:
            cursor.execute("SET enable_seqscan = off")
        store.top_up(run_id, rounds, AHEAD)
        store.remaining(run_id)  # first visits clear dead index entries, as any scan does
        topped = _rows_read(store, lambda: store.top_up(run_id, rounds, AHEAD))
        left = _rows_read(store, lambda: store.remaining(run_id))
        health: list[Any] = []
        scraped = _rows_read(store, lambda: health.append(schedule_health(archive)))
        assert store.remaining(run_id) > 0
    # the queue holds about AHEAD pairs and 15 a round; the run has done over 500
    assert topped < 4 * AHEAD, topped
    assert left < 4 * AHEAD, left
    # the exporter's scrape of the schedule's health: what is queued, not what is done
    assert scraped < 4 * AHEAD, scraped
    assert health[0]["queued_pairs"][1]["mesh"] > 0


CLAIM_HOSTS = 200


def test_a_claim_reads_the_hosts_it_takes_not_every_host(postgres_url: str) -> None:
    """A claim read every host's row to list the free ones (10,000 agents: 51 ms a claim);
    now, with every host busy or with two free among 200, it reads a handful of rows of
    fleet_hosts and fleet_slots, whatever the fleet's size."""
    rounds = _rounds(CLAIM_HOSTS)
    with open_archive(postgres_url) as archive:
        run_id, store = _started(archive, rounds, "claims")
        store.top_up(run_id, rounds, 2 * CLAIM_HOSTS)  # rounds 0-3 queued
        held: list[Claim] = []
        while (claim := store.claim(run_id)) is not None and len(held) <= CLAIM_HOSTS:
            held.append(claim)
        # round 0 held whole: every host busy, rounds 1-3 waiting
        assert len(held) == CLAIM_HOSTS // 2 and {c.round for c in held} == {0}
        with store._transaction() as cursor:
            cursor.execute("SET enable_seqscan = off")
        import psycopg  # the tests' extra; the suites without it skip on postgres_url

        found: list[Any] = []
        reads = []
        for _ in range(5):  # bounded: see below
            # the index entries of the hosts' rows from before they were busy are dead; a
            # scan that meets them marks them so once no transaction may still see them
            # (an autovacuum's ANALYZE holds that back a moment), and VACUUM removes them
            with psycopg.connect(postgres_url, autocommit=True) as other:
                other.execute("VACUUM fleet_hosts, fleet_slots")
            reads.append(_rows_read(store, lambda: found.append(store.claim(run_id)),
                                    ("fleet_hosts", "fleet_slots")))
            if reads[-1] <= 12:
                break
        assert set(found) == {None}
        assert min(reads) <= 12, reads  # the old claim read every host, and every slot held

        # one pair done: its two hosts free, and round 1 holds the same pair reversed
        first = held[0]
        store.complete(first, PairRecord(run_id, first.group, first.round, first.source,
                                         first.target, utc_now_iso(), "failed", "sim"))
        taken: list[Any] = []
        read = _rows_read(store, lambda: taken.append(store.claim(run_id)), ("fleet_slots",))
        (claim,) = taken
        assert claim is not None and (claim.source, claim.target) == (first.target,
                                                                        first.source)
        assert read <= 12, read
        with store._transaction() as cursor:
            busy = cursor.execute("SELECT count(*) FROM fleet_hosts WHERE busy").fetchone()[0]
        assert busy == CLAIM_HOSTS  # the busy flags follow the slots
