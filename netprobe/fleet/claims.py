"""The shared schedule: a fleet run's pairs queued in PostgreSQL, claimed by any number of
runners, with the rule "no host in two throughput tests at once" kept by the database.

Tables (created on first use, beside the archive's ``runs`` and ``results``):

* ``fleet_pairs``: one row per pair of a run, ``queued``, ``claimed`` or ``done``, with
  the lease that holds it, its attempts and re-queues, and a note of each re-queue.
* ``fleet_hosts``: one row per host name: what claimers lock (``FOR UPDATE SKIP
  LOCKED``) to take a pair's two hosts without waiting on each other, and ``busy``, true
  while the host holds a slot not released: the index a claim reads instead of every
  host's slots (kept in the transactions that take and release slots).
* ``fleet_slots``: one row per host per claim, its time range ``during`` from the claim
  to the lease's end (cut to the release when the test is done), under the exclusion
  constraint ``EXCLUDE USING gist (host WITH =, during WITH &&)`` (btree_gist): two
  intervals of one host can never overlap, whatever a runner does. The rows stay after
  release, so the table is also the history of every host's busy intervals.

A claim takes the next queued pair whose two hosts hold no slot, locks the pair and both
host rows in one ``SELECT ... FOR UPDATE SKIP LOCKED`` and inserts the two slots, each
ending at now + the test's length + the grace. Completing archives the result and cuts
both slots to now in one transaction; renewing moves a live lease's end; a lease past its
end is released (its slots keep the range they had) and its pair re-queued, with the
attempt counted and a note, by whichever runner claims next; after ``MAX_ATTEMPTS`` such
ends the pair is given up, archived as a ``timeout``.
"""
from __future__ import annotations

import contextlib
import datetime
import itertools
import os
import socket
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from netprobe.archives import Archive, ArchiveError, PairRecord, Run

GRACE_S = 30.0
"""Past a test's length, how long its lease lasts: the agents' start-up and the result's
trip back (the fleet's round margin)."""

MAX_ATTEMPTS = 3
"""How many leases a pair may lose (its runner dead, or its test outrunning the lease)
before it is given up: a pair that kills its runner, or never ends in time, is not
retried forever."""

UNSTICK_S = 60.0
"""At most how often a runner whose claim found nothing looks for hosts marked busy that
hold no slot (:meth:`ClaimStore.free_stale_hosts`): one scan of the busy hosts."""

ENQUEUE_BATCH = 5_000
"""Pairs queued per statement."""
ROUND_SEQ = 1 << 32
"""Queue positions a round queued by :meth:`ClaimStore.top_up` may take: round k's pairs
are numbered from k x ROUND_SEQ (above the numbers a whole run queued at once takes)."""

EXCLUSION_VIOLATION = "23P01"
"""SQLSTATE of a row an exclusion constraint refused."""
DEADLOCK = "40P01"
"""SQLSTATE of a transaction PostgreSQL rolled back to break a deadlock."""


class _Retry(Exception):
    """A claim to give up (rolled back) and try again."""


_DDL_LOCK = 0x6E6574_70726F62
"""The advisory lock key under which the first runner creates the tables."""

_TABLES = [
    "CREATE TABLE IF NOT EXISTS fleet_pairs (id BIGSERIAL PRIMARY KEY, "
    "run_id TEXT NOT NULL REFERENCES runs(run_id), grp TEXT NOT NULL, "
    "round BIGINT NOT NULL, source TEXT NOT NULL, target TEXT NOT NULL, "
    "seq BIGINT NOT NULL, duration_s DOUBLE PRECISION NOT NULL, "
    "state TEXT NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'claimed', 'done')), "
    "lease TEXT, claimer TEXT, attempts INTEGER NOT NULL DEFAULT 0, "
    "requeues INTEGER NOT NULL DEFAULT 0, notes TEXT[] NOT NULL DEFAULT '{}', "
    "result_id BIGINT REFERENCES results(id), CHECK (source <> target), "
    "UNIQUE (run_id, grp, round, source, target))",
    "CREATE INDEX IF NOT EXISTS fleet_pairs_queued ON fleet_pairs (run_id, seq) "
    "WHERE state = 'queued'",
    "CREATE TABLE IF NOT EXISTS fleet_hosts (host TEXT PRIMARY KEY)",
    "CREATE TABLE IF NOT EXISTS fleet_slots (id BIGSERIAL PRIMARY KEY, "
    "host TEXT NOT NULL REFERENCES fleet_hosts(host), pair_id BIGINT NOT NULL "
    "REFERENCES fleet_pairs(id), lease TEXT NOT NULL, during TSTZRANGE NOT NULL, "
    "released TIMESTAMPTZ, how TEXT CHECK (how IN ('done', 'expired')), "
    "CONSTRAINT fleet_slots_one_test_a_host EXCLUDE USING gist "
    "(host WITH =, during WITH &&))",
    "CREATE INDEX IF NOT EXISTS fleet_slots_held ON fleet_slots (host) "
    "WHERE released IS NULL",
    "CREATE INDEX IF NOT EXISTS fleet_slots_lease ON fleet_slots (lease)",
    # how many of a run's rounds are queued (they are queued as the queue runs low)
    "CREATE TABLE IF NOT EXISTS fleet_queue (run_id TEXT PRIMARY KEY REFERENCES runs(run_id), "
    "rounds_queued BIGINT NOT NULL DEFAULT 0)",
]
_BASE_TABLE = "fleet_queue"  # missing: the tables above are made (or the newest added)

# What a claim, a completion and an expiry read instead of every host or every held slot
# (a 10,000-agent fleet's claim listed the free hosts: 51 ms). Added to tables made before
# them; the ALTER first, so that the only lock taken before it waits for claims in flight
# is on fleet_hosts, which every claim and completion also locks first.
_INDEXES = [
    "ALTER TABLE fleet_hosts ADD COLUMN IF NOT EXISTS busy BOOLEAN NOT NULL DEFAULT false",
    "UPDATE fleet_hosts h SET busy = EXISTS (SELECT 1 FROM fleet_slots s "
    "WHERE s.host = h.host AND s.released IS NULL)",
    "CREATE INDEX IF NOT EXISTS fleet_hosts_free ON fleet_hosts (host) WHERE NOT busy",
    "CREATE INDEX IF NOT EXISTS fleet_pairs_claimed ON fleet_pairs (run_id) "
    "WHERE state = 'claimed'",
    "CREATE INDEX IF NOT EXISTS fleet_slots_ends ON fleet_slots (upper(during)) "
    "WHERE released IS NULL",
    # the pairs that lost a lease (re-queued or given up): the health's counts read these,
    # not the whole mesh of done pairs behind them
    "CREATE INDEX IF NOT EXISTS fleet_pairs_troubled ON fleet_pairs (run_id) "
    "WHERE notes <> '{}'",
]
_NEWEST = "fleet_pairs_troubled"  # missing: _INDEXES are run


class LeaseLost(ArchiveError):
    """A lease ended (expired and was released, or is unknown) before its holder
    completed or renewed it: the pair is another runner's now, its result is not kept."""


@attrs.frozen
class QueuedPair:
    """One pair to queue: a test of ``duration_s`` seconds from source to target."""

    group: str
    round: int
    source: str
    target: str
    duration_s: float


@attrs.frozen
class Claim:
    """A pair a runner holds, with both hosts' slots, until ``lease`` ends."""

    pair_id: int
    run_id: str
    group: str
    round: int
    source: str
    target: str
    duration_s: float
    lease: str
    """The lease's id (complete and renew name it)."""
    attempt: int
    """1 for the first claim of the pair, 2 after one re-queue, ..."""
    notes: tuple[str, ...]
    """Why earlier attempts were re-queued."""


def claim_store(archive: Archive, claimer: str | None = None,
                grace_s: float = GRACE_S, max_attempts: int | None = None,
                lease_s: float | None = None) -> ClaimStore:
    """The shared schedule in ``archive``; ArchiveError for an archive that cannot hold it
    (SQLite keeps one runner per file: its runner schedules alone)."""
    from netprobe.archives.postgres import PostgresArchive

    if not isinstance(archive, PostgresArchive):
        raise ArchiveError(f"archive {archive.url}: several runners share a fleet only through a "
                           "PostgreSQL archive (postgresql://...); this one keeps the schedule "
                           "in one runner")
    return ClaimStore(archive, claimer, grace_s,
                      MAX_ATTEMPTS if max_attempts is None else max_attempts, lease_s)


class ClaimStore:
    """Queue, claim, renew, complete and expire a fleet run's pairs in PostgreSQL. One
    store uses its archive's one connection: a runner (or a test's claimer) that works in
    parallel with others opens an archive of its own."""

    def __init__(self, archive: Any, claimer: str | None = None,
                 grace_s: float = GRACE_S, max_attempts: int = MAX_ATTEMPTS,
                 lease_s: float | None = None) -> None:
        self.archive = archive
        self.lease_s = lease_s
        """The longest a claim (and each renewal) holds its hosts, if shorter than the
        pair's test length + the grace (None: that, a lease that needs no renewal). A
        holder that renews while its test runs takes a short one, so that a dead holder's
        pairs come back sooner."""
        self.max_attempts = max_attempts
        """How many leases a pair may lose before it is given up (archived as a timeout)."""
        self.claimer = claimer or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        """This runner's name, kept with each pair it claims (default: host, process id
        and a random tag, so that an operator can tell which runner held a pair)."""
        self.grace_s = grace_s
        self.refused = 0
        """Claims the database refused (the exclusion constraint, or a deadlock it broke)
        and that were retried: none is an error."""
        self.rechecked = 0
        """Claims given up before writing a slot, a host found held on the second look."""
        self.unstuck = 0
        """Hosts found busy with no slot held, and freed (:meth:`free_stale_hosts`)."""
        self._unstuck_at = -UNSTICK_S  # the first claim that finds nothing looks at once
        with self._transaction() as cursor:
            # DDL, even IF NOT EXISTS, locks the tables it names: run it only when a table
            # is missing, one runner at a time, so that a runner joining a busy fleet does
            # not deadlock with the claims in flight
            if not _exists(cursor, _NEWEST):
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
                # look again once the lock is ours: a runner that waited for the creator
                # finds the tables made, and must not run the DDL again (CREATE INDEX IF
                # NOT EXISTS takes its table's SHARE lock before it finds the index, so it
                # would wait on the creator's claims in flight, and deadlock with them)
                if not _exists(cursor, _BASE_TABLE):
                    self._btree_gist(cursor)
                    for statement in _TABLES:
                        cursor.execute(statement)
                if not _exists(cursor, _NEWEST):
                    for statement in _INDEXES:
                        cursor.execute(statement)

    def _btree_gist(self, cursor: Any) -> None:
        """Make sure of btree_gist, which the exclusion constraint needs for its ``host
        WITH =`` part; ArchiveError saying what to do when this role cannot add it."""
        errors = self.archive.errors()
        cursor.execute("SAVEPOINT btree_gist")
        try:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
        except errors as exc:
            cursor.execute("ROLLBACK TO SAVEPOINT btree_gist")
            why = " ".join(str(exc).split())
            raise ArchiveError(
                f"archive {self.archive.url}: the shared schedule needs the btree_gist "
                f"extension (PostgreSQL's contrib) and this role cannot add it ({why}): "
                "run `CREATE EXTENSION btree_gist` in this database as its owner or a "
                "superuser, once") from None

    # -- the queue ------------------------------------------------------------------------

    def enqueue(self, run_id: str, pairs: Iterable[QueuedPair]) -> int:
        """Queue ``pairs`` for ``run_id`` (a run the archive has), in order, in one
        transaction; a pair queued already (a second runner joining the run) is left as it
        is. ``pairs`` is read in batches, never held whole. Returns how many were new."""
        added = 0
        with self._transaction() as cursor:
            # one enqueuer a run at a time: runners started together queue it once
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (run_id,))
            seq = _last_seq(cursor, run_id)
            batches = iter(pairs)
            while batch := list(itertools.islice(batches, ENQUEUE_BATCH)):
                added += _insert(cursor, run_id, batch, seq)
                seq += len(batch)
        return added

    def top_up(self, run_id: str, rounds: Sequence[Sequence[QueuedPair]], ahead: int) -> int:
        """Queue ``run_id``'s next rounds (``rounds[i]``: the i-th round's pairs, in the
        plan's order) until at least ``ahead`` pairs wait or every round is queued. The
        count of rounds queued is kept with the run, under the run's lock, so that runners
        working on it together queue each round once. The pairs this call queued.

        A run's rounds are queued as they are needed, not whole: a 1,000-agent mesh is
        999,000 pairs (22.9 s to queue, and a claim that found nothing scanned them all),
        a 10,000-agent one 10^8."""
        added = 0
        with self._transaction() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (run_id,))
            row = cursor.execute("SELECT rounds_queued FROM fleet_queue WHERE run_id = %s",
                                 (run_id,)).fetchone()
            done = int(row[0]) if row else 0
            if done >= len(rounds):
                return 0
            waiting = _queued(cursor, run_id)
            if waiting >= ahead:
                return 0
            while waiting < ahead and done < len(rounds):
                batch = list(rounds[done])
                # numbered from the round's own place: a look for the run's highest number
                # read every pair it had done (999,000 of a 1,000-agent mesh's, after each
                # completion); a round's numbers are above every earlier round's
                added += _insert(cursor, run_id, batch, done * ROUND_SEQ)
                waiting, done = waiting + len(batch), done + 1
            cursor.execute("INSERT INTO fleet_queue (run_id, rounds_queued) VALUES (%s, %s) "
                           "ON CONFLICT (run_id) DO UPDATE SET rounds_queued = "
                           "EXCLUDED.rounds_queued", (run_id, done))
        return added

    def rounds_queued(self, run_id: str) -> int:
        """How many of ``run_id``'s rounds :meth:`top_up` has queued."""
        with self._transaction() as cursor:
            row = cursor.execute("SELECT rounds_queued FROM fleet_queue WHERE run_id = %s",
                                 (run_id,)).fetchone()
        return int(row[0]) if row else 0

    def join_run(self, run: Run) -> bool:
        """Record ``run`` in the archive's runs unless a runner did already; whether this
        one did."""
        with self._transaction() as cursor:
            cursor.execute("INSERT INTO runs (run_id, fleet, started, finished, rounds, pairs, "
                           "status) VALUES (%s, %s, %s, NULL, %s, %s, %s) "
                           "ON CONFLICT DO NOTHING",
                           (run.run_id, run.fleet, self.archive.time_in(run.started),
                            run.rounds, run.pairs, run.status))
            return bool(cursor.rowcount)

    def claim(self, run_id: str) -> Claim | None:
        """The next queued pair of ``run_id`` whose two hosts are free, taken with both
        hosts' slots until now + its length + the grace; None when no pair can be taken
        now (all done, held by others, or every free pair's host busy)."""
        self.expire()
        claim = self._claim(run_id)
        if claim is None and time.monotonic() - self._unstuck_at >= UNSTICK_S:
            self._unstuck_at = time.monotonic()
            if self.free_stale_hosts():
                claim = self._claim(run_id)
        return claim

    def _claim(self, run_id: str) -> Claim | None:
        for _ in range(8):  # another claimer won a host: look again
            try:
                return self._claim_once(run_id)
            except _Retry:
                continue
            except ArchiveError as exc:
                if getattr(exc, "sqlstate", None) not in (EXCLUSION_VIOLATION, DEADLOCK):
                    raise
                self.refused += 1
        return None

    def free_stale_hosts(self) -> int:
        """Clear ``busy`` of the hosts that hold no slot: a runner from before ``busy``
        releases slots without clearing it (an expiry it ran, during an upgrade), and no
        claim of a newer runner would take such a host again. A host whose row a claim or
        completion holds is left to it. How many were freed."""
        with self._transaction() as cursor:
            stale = [host for (host,) in cursor.execute(
                "SELECT host FROM fleet_hosts h WHERE busy AND NOT EXISTS (SELECT 1 FROM "
                "fleet_slots s WHERE s.host = h.host AND s.released IS NULL) ORDER BY host "
                "FOR UPDATE SKIP LOCKED").fetchall()]
            if not stale:
                return 0
            # looked at again from the slots, in a new statement: a claim committed since
            # the one above began holds its host still
            _settle(cursor, stale)
            freed = int(cursor.execute("SELECT count(*) FROM fleet_hosts WHERE host = ANY(%s) "
                                       "AND NOT busy", (stale,)).fetchone()[0])
        self.unstuck += freed
        return freed

    def _claim_once(self, run_id: str) -> Claim | None:
        lease = uuid.uuid4().hex
        with self._transaction() as cursor:
            # fewer than two hosts free: no pair can be taken, and the answer comes from
            # the free hosts' index (at most two entries read) instead of from a scan of
            # the queue that finds nothing
            if cursor.execute("SELECT count(*) FROM (SELECT 1 FROM fleet_hosts WHERE NOT busy "
                              "LIMIT 2) AS free").fetchone()[0] < 2:
                return None
            # the queue in its order, each pair's hosts looked up by their key, the first
            # pair with both free taken with both host rows in one lock; a row another
            # claimer holds is skipped, so claimers never queue behind each other, and a
            # host a claim committed since this statement began is seen busy when its row
            # is locked (PostgreSQL re-reads a locked row's newest version). What a claim
            # reads grows with the pairs it passes over, never with the fleet: the free
            # hosts listed first and sent back as arrays cost 51 ms at 10,000 agents
            row = cursor.execute(
                "SELECT p.id, p.grp, p.round, p.source, p.target, p.duration_s, "
                "p.attempts, p.notes FROM fleet_pairs p "
                "JOIN fleet_hosts a ON a.host = p.source "
                "JOIN fleet_hosts b ON b.host = p.target "
                "WHERE p.run_id = %s AND p.state = 'queued' AND NOT a.busy AND NOT b.busy "
                "ORDER BY p.seq LIMIT 1 FOR UPDATE OF p, a, b SKIP LOCKED",
                (run_id,)).fetchone()
            if row is None:
                return None
            pair_id, grp, rnd, source, target, duration_s, attempts, notes = row
            # the slots themselves, looked at again in a new statement: a runner of a
            # version before ``busy`` takes slots without setting it. Inserting blind
            # would have the constraint refuse it, or wait on a completion in flight and
            # deadlock with it
            if cursor.execute("SELECT 1 FROM fleet_slots WHERE host IN (%s, %s) "
                              "AND released IS NULL LIMIT 1", (source, target)).fetchone():
                self.rechecked += 1
                raise _Retry
            # the slots: the exclusion constraint refuses them if a host is still held
            # (a claim committed after this statement's snapshot was taken)
            cursor.execute(
                "INSERT INTO fleet_slots (host, pair_id, lease, during) "
                "SELECT host, %s, %s, tstzrange(clock_timestamp(), clock_timestamp() "
                "+ make_interval(secs => %s)) FROM unnest(ARRAY[%s, %s]) AS host",
                (pair_id, lease, self.lease_length(duration_s), source, target))
            cursor.execute("UPDATE fleet_pairs SET state = 'claimed', lease = %s, claimer = %s, "
                           "attempts = attempts + 1 WHERE id = %s",
                           (lease, self.claimer, pair_id))
            cursor.execute("UPDATE fleet_hosts SET busy = true WHERE host IN (%s, %s)",
                           (source, target))
        return Claim(pair_id, run_id, grp, rnd, source, target, duration_s, lease,
                     attempts + 1, tuple(notes))

    def lease_length(self, duration_s: float) -> float:
        """Seconds a claim of a ``duration_s`` test holds its hosts, and a renewal adds."""
        whole = duration_s + self.grace_s
        return whole if self.lease_s is None else min(whole, self.lease_s)

    def renew(self, claim: Claim, seconds: float | None = None) -> None:
        """Move the lease's end to now + ``seconds`` (the store's lease length by
        default); LeaseLost if it ended already."""
        seconds = self.lease_length(claim.duration_s) if seconds is None else seconds
        with self._transaction() as cursor:
            cursor.execute("UPDATE fleet_slots SET during = tstzrange(lower(during), "
                           "clock_timestamp() + make_interval(secs => %s)) "
                           "WHERE lease = %s AND released IS NULL "
                           "AND upper(during) > clock_timestamp()", (seconds, claim.lease))
            if cursor.rowcount != 2:
                raise LeaseLost(f"lease of {claim.source} -> {claim.target} ended before it "
                                "was renewed: the pair is re-queued")

    def complete(self, claim: Claim, record: PairRecord) -> int:
        """Archive ``record`` (the claimed pair's) and free both hosts, in one transaction;
        the result's row id. LeaseLost, with nothing written, if the lease ended first
        (the pair is re-queued and another runner's to run)."""
        for attempt in range(3):
            try:
                return self._complete_once(claim, record)
            except ArchiveError as exc:
                # rolled back whole: PostgreSQL broke a deadlock (none is known, but one
                # would stop the runner and lose the result)
                if getattr(exc, "sqlstate", None) != DEADLOCK or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _complete_once(self, claim: Claim, record: PairRecord) -> int:
        statement, values = self.archive.insert_of(record)
        with self._transaction() as cursor:
            # the hosts first, as a claim takes them (so no claim writes a slot of these
            # hosts while their release is in flight), then the slots and the pair in the
            # order expire() locks them (no deadlock)
            cursor.execute("SELECT host FROM fleet_hosts WHERE host IN (%s, %s) ORDER BY host "
                           "FOR UPDATE", (claim.source, claim.target))
            held = len(cursor.execute(
                "SELECT id FROM fleet_slots WHERE lease = %s AND released IS NULL "
                "AND upper(during) > clock_timestamp() FOR UPDATE", (claim.lease,)).fetchall())
            pair = cursor.execute("SELECT state, lease FROM fleet_pairs WHERE id = %s "
                                  "FOR UPDATE", (claim.pair_id,)).fetchone()
            if held != 2 or pair is None or tuple(pair) != ("claimed", claim.lease):
                raise LeaseLost(f"lease of {claim.source} -> {claim.target} ended before its "
                                "result came: the pair is re-queued, this result not kept")
            result_id = cursor.execute(statement.replace("?", "%s") + " RETURNING id",
                                       values).fetchone()[0]
            cursor.execute("UPDATE fleet_slots SET released = clock_timestamp(), how = 'done', "
                           "during = tstzrange(lower(during), clock_timestamp()) "
                           "WHERE lease = %s", (claim.lease,))
            cursor.execute("UPDATE fleet_pairs SET state = 'done', result_id = %s WHERE id = %s",
                           (result_id, claim.pair_id))
            _settle(cursor, [claim.source, claim.target])
        return int(result_id)

    def expire(self) -> int:
        """Release every lease past its end (its slots keep their range, to the lease's
        end) and re-queue its pair, counting the re-queue and noting it; a pair whose
        ``max_attempts``-th lease ended so is given up instead, archived as a ``timeout``
        whose error gives every attempt. How many pairs."""
        with self._transaction() as cursor:
            # the leases past their end, from their ends' index (not every held slot: a
            # claim asks this first, and a 10,000-agent round holds 10,000)
            # (the clock read first: compared with clock_timestamp(), which is volatile,
            # no index could be used, and every held slot was read)
            at = cursor.execute("SELECT clock_timestamp()").fetchone()[0]
            hosts = [host for (host,) in cursor.execute(
                "SELECT DISTINCT host FROM fleet_slots WHERE released IS NULL "
                "AND upper(during) <= %s", (at,)).fetchall()]
            if not hosts:
                return 0
            # their hosts locked first, in the order a completion locks its two: a
            # completion racing this expiry waits for it or it for the completion, and
            # neither holds what the other waits for
            cursor.execute("SELECT host FROM fleet_hosts WHERE host = ANY(%s) ORDER BY host "
                           "FOR UPDATE", (hosts,))
            rows = cursor.execute(
                "WITH gone AS (UPDATE fleet_slots SET released = upper(during), how = 'expired' "
                "WHERE released IS NULL AND upper(during) <= %(at)s "
                "AND host = ANY(%(hosts)s) "
                "RETURNING pair_id, lease, upper(during) AS ended), "
                "g AS (SELECT DISTINCT pair_id, lease, ended FROM gone) "
                "UPDATE fleet_pairs p SET lease = NULL, "
                "state = CASE WHEN p.attempts >= %(max)s THEN 'done' ELSE 'queued' END, "
                "requeues = requeues + CASE WHEN p.attempts >= %(max)s THEN 0 ELSE 1 END, "
                "notes = notes || ARRAY[format('attempt %%s by %%s: lease ended %%s without a "
                "result; %%s', p.attempts, p.claimer, to_char(g.ended AT TIME ZONE 'UTC', "
                "'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'), CASE WHEN p.attempts >= %(max)s "
                "THEN 'given up' ELSE 're-queued' END)] "
                "FROM g WHERE p.id = g.pair_id AND p.state = 'claimed' AND p.lease = g.lease "
                "RETURNING p.id, p.run_id, p.grp, p.round, p.source, p.target, p.state, "
                "p.notes, g.ended", {"max": self.max_attempts, "hosts": hosts, "at": at}).fetchall()
            _settle(cursor, hosts)
            for pair_id, run_id, grp, rnd, source, target, state, notes, ended in rows:
                if state != "done":
                    continue
                ended_at = ended.astimezone(datetime.timezone.utc).isoformat(
                    timespec="milliseconds")
                record = PairRecord(run_id, grp, int(rnd), source, target, ended_at, "timeout",
                                    f"no result after {len(notes)} attempts: "
                                    + "; ".join(notes))
                statement, values = self.archive.insert_of(record)
                result_id = cursor.execute(statement.replace("?", "%s") + " RETURNING id",
                                           values).fetchone()[0]
                cursor.execute("UPDATE fleet_pairs SET result_id = %s WHERE id = %s",
                               (result_id, pair_id))
            return len(rows)

    def remaining(self, run_id: str) -> int:
        """The pairs of ``run_id`` not done yet (queued or claimed)."""
        with self._transaction() as cursor:
            # the queued and the claimed ones by their partial indexes: what is left, never
            # the done pairs read (every idle worker asks each poll, and a mesh's done
            # pairs are 10^6)
            claimed = int(cursor.execute(
                "SELECT count(*) FROM fleet_pairs WHERE run_id = %s AND state = 'claimed'",
                (run_id,)).fetchone()[0])
            return _queued(cursor, run_id) + claimed

    def pairs(self, run_id: str) -> list[dict[str, Any]]:
        """Every pair of ``run_id`` with its state, attempts, re-queues and notes."""
        with self._transaction() as cursor:
            rows = cursor.execute("SELECT grp, round, source, target, state, attempts, requeues, "
                                  "notes, result_id FROM fleet_pairs WHERE run_id = %s "
                                  "ORDER BY seq", (run_id,)).fetchall()
        keys = ("group", "round", "source", "target", "state", "attempts", "requeues",
                "notes", "result_id")
        return [dict(zip(keys, row)) for row in rows]

    # -- plumbing ---------------------------------------------------------------------------

    def _transaction(self) -> Any:
        return _transaction(self.archive)


# The schedule's health per group, one statement: pairs queued; leases held and by how many
# runners; leases past their end that no claimer has released yet (a dead or stalled
# runner's, waiting for the next claim to re-queue them); pairs re-queued after a lost
# lease, and given up after too many (archived as a timeout), in runs not finished. It reads
# the queued, the claimed and the done pairs that lost a lease, each through its partial
# index (notes are written only when a lease is lost), never the done pairs of a mesh:
# a 1,000-host mesh is 999,000 of them by its end, and every scrape asks.
_HEALTH = (
    "SELECT p.grp, count(*) FILTER (WHERE p.state = 'queued'), "
    "count(*) FILTER (WHERE p.state = 'claimed'), "
    "count(DISTINCT p.claimer) FILTER (WHERE p.state = 'claimed'), "
    "count(*) FILTER (WHERE p.state = 'claimed' AND EXISTS (SELECT 1 FROM fleet_slots s "
    "WHERE s.pair_id = p.id AND s.lease = p.lease AND s.released IS NULL "
    "AND upper(s.during) < now())), "
    "coalesce(sum(p.requeues), 0), "
    "count(*) FILTER (WHERE p.state = 'done' "
    "AND p.notes[array_length(p.notes, 1)] LIKE '%%given up') "
    "FROM (SELECT * FROM fleet_pairs WHERE state = 'queued' "
    "UNION ALL SELECT * FROM fleet_pairs WHERE state = 'claimed' "
    "UNION ALL SELECT * FROM fleet_pairs WHERE state = 'done' AND notes <> '{}') p "
    "JOIN runs r ON r.run_id = p.run_id "
    "WHERE r.status = 'incomplete' GROUP BY p.grp")

HEALTH_SERIES = {
    "queued_pairs": "Pairs of unfinished shared runs waiting in the queue for a runner (a "
                    "run's rounds are queued as the queue runs low).",
    "leases": "Pairs of unfinished shared runs held by a runner's lease now.",
    "runners": "Runners holding at least one lease of the group now.",
    "late_leases": "Leases past their end not yet released (a dead or stalled runner's: "
                   "the next claim re-queues them).",
    "requeued_pairs": "Re-queues after a lost lease, over the pairs of unfinished runs.",
    "given_up_pairs": "Pairs of unfinished runs given up after losing too many leases "
                      "(archived as a timeout).",
}


def schedule_health(archive: Any) -> dict[str, tuple[str, dict[str, float]]]:
    """The shared schedule's health per group, as ``{name: (help, {group: value})}``
    (:data:`HEALTH_SERIES`); empty for an archive that keeps no shared schedule (not
    PostgreSQL, or no shared run yet): nothing is made up for a queue nobody keeps."""
    from netprobe.archives.postgres import PostgresArchive

    if not isinstance(archive, PostgresArchive):
        return {}
    with _transaction(archive) as cursor:
        if not _exists(cursor, "fleet_pairs"):
            return {}
        rows = cursor.execute(_HEALTH).fetchall()
    found: dict[str, tuple[str, dict[str, float]]] = {
        name: (text, {}) for name, text in HEALTH_SERIES.items()}
    for group, *values in rows:
        for name, value in zip(HEALTH_SERIES, values):
            found[name][1][str(group)] = float(value)
    return found


def _exists(cursor: Any, relation: str) -> bool:
    """Whether the database has a table or index of that name."""
    return cursor.execute("SELECT to_regclass(%s)", (relation,)).fetchone()[0] is not None


def _settle(cursor: Any, hosts: Sequence[str]) -> None:
    """Set ``busy`` of ``hosts`` (their rows locked by the caller) from their slots, after
    the caller released some: busy while one is still held, as by another lease."""
    cursor.execute("UPDATE fleet_hosts h SET busy = EXISTS (SELECT 1 FROM fleet_slots s "
                   "WHERE s.host = h.host AND s.released IS NULL) WHERE h.host = ANY(%s)",
                   (list(hosts),))


def _queued(cursor: Any, run_id: str) -> int:
    """How many of ``run_id``'s pairs wait in the queue (read from the queue's index)."""
    return int(cursor.execute("SELECT count(*) FROM fleet_pairs WHERE run_id = %s "
                              "AND state = 'queued'", (run_id,)).fetchone()[0])


def _last_seq(cursor: Any, run_id: str) -> int:
    """The highest queue position ``run_id``'s pairs hold (0 for none)."""
    return int(cursor.execute("SELECT COALESCE(MAX(seq), 0) FROM fleet_pairs WHERE run_id = %s",
                              (run_id,)).fetchone()[0])


def _insert(cursor: Any, run_id: str, batch: list[QueuedPair], seq: int) -> int:
    """Queue ``batch`` after position ``seq`` (its hosts made known); a pair queued
    already is left as it is. How many were new."""
    cursor.execute("INSERT INTO fleet_hosts (host) SELECT DISTINCT unnest(%s::text[]) "
                   "ON CONFLICT DO NOTHING", ([h for p in batch for h in (p.source, p.target)],))
    cursor.execute(
        "INSERT INTO fleet_pairs (run_id, grp, round, source, target, seq, duration_s) "
        "SELECT %s, * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[], "
        "%s::bigint[], %s::float8[]) ON CONFLICT DO NOTHING",
        (run_id, [p.group for p in batch], [p.round for p in batch],
         [p.source for p in batch], [p.target for p in batch],
         list(range(seq + 1, seq + 1 + len(batch))), [p.duration_s for p in batch]))
    return int(cursor.rowcount)


@contextlib.contextmanager
def _transaction(archive: Any) -> Any:
    """A cursor in one transaction on ``archive``'s connection, committed at the end or
    rolled back on any error; the database's errors become ArchiveError (with
    ``sqlstate``)."""
    errors = archive.errors()
    with archive._lock:
        if archive.connection is None:
            raise ArchiveError(f"archive {archive.url} is closed")
        try:
            with archive.connection.cursor() as cursor:
                yield cursor
            archive.connection.commit()
        except BaseException as exc:
            with contextlib.suppress(*errors):
                archive.connection.rollback()
            if isinstance(exc, errors):
                error = ArchiveError(f"archive {archive.url}: {archive.explain(exc)}")
                error.sqlstate = getattr(exc, "sqlstate", None)  # type: ignore[attr-defined]
                raise error from None
            raise


__all__: Sequence[str] = ["GRACE_S", "HEALTH_SERIES", "Claim", "ClaimStore", "LeaseLost",
                          "QueuedPair", "claim_store", "schedule_health"]
