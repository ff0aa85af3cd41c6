"""A fleet run shared by several runners through the PostgreSQL schedule
(:mod:`netprobe.fleet.claims`): each runner queues the run (once, whoever comes first),
then its workers claim pairs whose two hosts are free, run each pair's test and complete
it (the record archived, the hosts freed) until the run has nothing left. The rule "no
host in two tests at once" is the database's; a runner that dies leaves its pairs to the
others once their leases end.

Leases are short (:data:`LEASE_S`, or the fleet file's ``lease``) and renewed: while a
worker's test runs, the runner's heartbeat moves the lease's end every third of a lease,
so a test longer than its lease keeps its hosts, and a runner that dies (its heartbeat with
it) has its pairs re-queued at most one lease after its last renewal. The heartbeat stops
renewing a claim held past its group's round limit: a test that hangs loses its lease and
its pair is re-run, as a round would time it out.

Every runner of one run must name the same run: the fleet file's name, the groups chosen
and each group's run number make its id, so runners started from one file in the same
period of the groups' ``every`` grid join one run.
"""
from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Sequence
from typing import overload

import attrs

from netprobe.archives import ArchiveError, PairRecord, Run
from netprobe.errors import NetprobeError
from netprobe.fleet.claims import Claim, ClaimStore, LeaseLost, QueuedPair, claim_store
from netprobe.fleet.runner import FleetRunner, RunSummary, _tally, check_groups
from netprobe.fleet.schedule import Plan, plan, run_number
from netprobe.host import utc_now_iso
from netprobe.schema import Result

POLL_S = 0.5
"""How long a worker that found no free pair waits before it looks again."""
MAX_WORKERS = 64
"""The most tests one runner runs at once (the hosts bound it first: n/2 pairs)."""
AHEAD_PER_AGENT = 4
AHEAD_MIN_PAIRS = 64
"""A shared run's queue holds at least max(AHEAD_MIN_PAIRS, AHEAD_PER_AGENT x agents)
pairs while rounds are left (about 8 mesh rounds: enough that a free host finds a pair,
few enough that a claim never scans a whole mesh's queue)."""
LEASE_S = 20.0
"""A claim's lease unless the fleet file sets ``lease`` (or the round limit, if shorter):
how long a dead runner's pairs wait. It is renewed every third of itself while the test
runs. Longer than an agent's DEAD_PEER_S (11 s, netprobe.agent.liveness): a runner whose
host vanished (no FIN) may leave its test running on the agents that long, and its hosts
must not be given to another test before it stops. A runner killed on a live host closes
its connections at once, and its agents stop its tests within a fraction of a second."""
BUSY_POLL_S = 0.5
"""How often a host busy with a test that is not the fleet's is asked again."""
FLEET_PROGRESS_S = 1.0
"""How often, at most, a runner asks the database how many of a shared run's pairs all its
runners have done (for its progress)."""
RENEWALS_PER_LEASE = 3
"""How many times a lease is renewed within its length: two renewals may fail (a slow or
briefly unreachable database) before it ends."""


class RoundQueue(Sequence[list[QueuedPair]]):
    """A plan's rounds as the pairs to queue, each made when it is asked for (a plan's
    rounds are made as they are reached: a 10,000-agent mesh is never held whole)."""

    def __init__(self, rounds: Plan, limits: dict[str, float]) -> None:
        self.rounds = rounds
        self.limits = limits
        """Each group's round limit: a pair's ``duration_s`` in the queue (its lease
        renewals stop there)."""
        self._sizes = [0]
        """Pairs in the first k rounds, for the k worked out so far."""

    def __len__(self) -> int:
        return len(self.rounds)

    @overload
    def __getitem__(self, index: int) -> list[QueuedPair]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[list[QueuedPair]]: ...

    def __getitem__(self, index: int | slice
                    ) -> list[QueuedPair] | Sequence[list[QueuedPair]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        r = self.rounds[index]
        return [QueuedPair(r.group, r.index, s, t, self.limits[r.group]) for s, t in r.pairs]

    def pairs_in(self, count: int) -> int:
        """How many pairs the first ``count`` rounds hold (each round made once)."""
        sizes = self._sizes
        while len(sizes) <= min(count, len(self)):
            sizes.append(sizes[-1] + len(self.rounds[len(sizes) - 1].pairs))
        return sizes[min(count, len(self))]


def _pairs_in(queue: Sequence[Sequence[QueuedPair]], count: int) -> int:
    """How many pairs the first ``count`` rounds of ``queue`` hold."""
    if isinstance(queue, RoundQueue):
        return queue.pairs_in(count)
    return sum(len(r) for r in queue[:count])


def shared_run_id(fleet_path: str, groups: Sequence[str], numbers: Sequence[int]) -> str:
    """The id every runner of one shared run computes alike."""
    key = f"{os.path.basename(fleet_path)}|{','.join(groups)}|{','.join(map(str, numbers))}"
    return uuid.uuid5(uuid.NAMESPACE_URL, f"netprobe-fleet:{key}").hex


@attrs.define
class SharedRun:
    """One runner's share of a shared run."""

    runner: FleetRunner
    store: ClaimStore
    run_id: str
    stop: threading.Event = attrs.field(factory=threading.Event)
    """The caller's: set, the workers end (it is never set here: a caller keeping the
    schedule passes the one that ends its whole loop)."""
    poll_s: float = POLL_S
    ended: threading.Event = attrs.field(factory=threading.Event)
    """This run's own end for its workers (the first archive failure, or the run over)."""
    queue: Sequence[Sequence[QueuedPair]] = ()
    """The run's rounds, queued as the queue runs low (ClaimStore.top_up)."""
    ahead: int = 0
    """How many pairs to keep waiting in the queue."""
    total: int = 0
    """How many pairs the run has (its plan's tests)."""
    records: list[PairRecord] = attrs.field(factory=list)
    counts: dict[str, int] = attrs.field(factory=dict)
    failure: BaseException | None = None
    renewals: int = 0
    """Leases this runner's heartbeat renewed."""
    _held: dict[str, tuple[Claim, float]] = attrs.field(factory=dict)
    """The claims whose tests run now, by lease, with when each was claimed (monotonic)."""
    _lock: threading.Lock = attrs.field(factory=threading.Lock)
    _shown: tuple[float, int] = (float("-inf"), 0)
    """When the fleet's progress was last asked for, and the most pairs it has shown done."""

    def work(self) -> None:
        """Claim, test and complete pairs until none is left or ``stop`` is set; the
        first archive failure stops every worker of this runner."""
        try:
            while not (self.stop.is_set() or self.ended.is_set()):
                claim = self.store.claim(self.run_id)
                if claim is None:
                    if self.store.top_up(self.run_id, self.queue, self.ahead):
                        continue  # more rounds queued: look again at once
                    if self.finished():
                        return
                    self.show_fleet()
                    self.ended.wait(self.poll_s)
                    continue
                with self._lock:
                    self._held[claim.lease] = (claim, time.monotonic())
                try:
                    down = self.unreachable(claim.source, claim.target)
                    tested: tuple[str, str, str | None, Result | None] = (
                        (utc_now_iso(), "unreachable", down, None) if down is not None
                        else self.runner.test_pair(self.runner.group(claim.group),
                                                   claim.source, claim.target))
                finally:
                    # before complete(): a renewal racing it would find the lease released
                    with self._lock:
                        self._held.pop(claim.lease, None)
                started, outcome, error, result = tested
                if result is not None:
                    result = attrs.evolve(result, run_id=self.run_id)
                record = PairRecord(self.run_id, claim.group, claim.round, claim.source,
                                    claim.target, started, outcome, error, result)
                try:
                    self.store.complete(claim, record)
                except LeaseLost as exc:
                    self.runner.progress.note(str(exc))
                    continue
                with self._lock:
                    _tally(record, self.records, self.counts)
                self.runner.progress.pair_done(record)
                self.store.top_up(self.run_id, self.queue, self.ahead)  # keep it fed
                self.show_fleet()
        except BaseException as exc:  # an archive failure: this runner stops
            with self._lock:
                self.failure = self.failure or exc
            self.ended.set()

    def show_fleet(self, now: bool = False) -> None:
        """Tell the progress how many of the run's pairs every runner has done (the pairs
        of the rounds queued less those waiting or held), at most once a FLEET_PROGRESS_S
        unless ``now``: this runner's own pairs are only its share."""
        with self._lock:
            asked, shown = self._shown
            if not now and time.monotonic() - asked < FLEET_PROGRESS_S:
                return
            self._shown = (time.monotonic(), shown)
        queued = self.store.rounds_queued(self.run_id)
        total = self.total
        done = min(total, max(0, _pairs_in(self.queue, queued)
                              - self.store.remaining(self.run_id)))
        with self._lock:  # never back: two reads a top-up apart may undercount a moment
            done = max(done, self._shown[1])
            self._shown = (self._shown[0], done)
        self.runner.progress.fleet_done(done, total)

    def finished(self) -> bool:
        """Whether every round of the run is queued and every pair done."""
        return (self.store.rounds_queued(self.run_id) >= len(self.queue)
                and self.store.remaining(self.run_id) == 0)

    def heartbeat(self, done: threading.Event, lease_s: float) -> None:
        """Renew every held lease each ``lease_s / RENEWALS_PER_LEASE`` seconds until
        ``done``, never past the claim's round limit (``duration_s``, from its claim), and
        a lease found ended is noted (its result will be refused, the pair re-run)."""
        while not done.wait(lease_s / RENEWALS_PER_LEASE):
            with self._lock:
                held = list(self._held.values())
            now = time.monotonic()
            for claim, since in held:
                # never past the round limit (the pair's duration_s): a test that hangs
                # loses its lease there, as a round would time it out
                left = claim.duration_s - (now - since)
                if left <= 0:
                    continue
                try:
                    self.store.renew(claim, min(lease_s, left))
                    self.renewals += 1
                except LeaseLost as exc:
                    with self._lock:
                        gone = claim.lease in self._held
                    if gone:  # not a completion that came between the copy and now
                        self.runner.progress.note(str(exc))
                except ArchiveError as exc:  # the database away a moment: try next beat
                    self.runner.progress.note(f"lease of {claim.source} -> {claim.target} "
                                              f"not renewed: {exc}")

    def unreachable(self, *hosts: str) -> str | None:
        """Why the first of ``hosts`` whose agent does not answer the status request is
        unreachable (None: all answer), as a round says it. A host busy with a test that
        is not the fleet's (the database keeps the fleet's own apart) is waited for, up to
        the runner's busy_wait_s, as a round waits (the heartbeat holds the lease
        meanwhile, up to the round limit); then its test is tried, and its agent refuses
        it with "busy" if it still has no free slot."""
        for host in hosts:
            agent = self.runner.agent(host)
            end = self.runner.clock() + self.runner.busy_wait_s
            try:
                status = self.runner.status(agent)
                while status.get("state") == "busy" and self.runner.clock() < end:
                    if self.stop.wait(BUSY_POLL_S) or self.ended.is_set():
                        break
                    status = self.runner.status(agent)
            except (NetprobeError, OSError) as exc:
                why = f"agent {host} ({agent.address}) is unreachable: {exc}"
                self.runner.progress.note(why)
                return why
        return None


def run_shared(runner: FleetRunner, groups: Sequence[str] | None = None,
               run: int | None = None, *, workers: int | None = None,
               claimer: str | None = None, stop: threading.Event | None = None,
               poll_s: float = POLL_S) -> RunSummary:
    """Join (or start) the shared run of ``groups`` (default: all) and work on it until
    nothing is left; the summary holds this runner's records. The runner's archive must
    be PostgreSQL (ArchiveError otherwise)."""
    if runner.archive is None:
        raise ArchiveError("a shared run needs a PostgreSQL archive")
    chosen = [g for g in runner.fleet.groups if groups is None or g.name in groups]
    check_groups(chosen)
    numbers = [run if run is not None else run_number(g) for g in chosen]
    rounds = plan(runner.fleet, [g.name for g in chosen], run)
    run_id = shared_run_id(runner.fleet.path, [g.name for g in chosen], numbers)
    # a pair is queued with its group's round limit (the test's length + ROUND_MARGIN_S,
    # or round_timeout): what a round of the single runner would wait for it. Its lease
    # is shorter (LEASE_S or the file's lease), renewed by the heartbeat up to that limit
    lease_s = runner.fleet.lease_s or LEASE_S
    store = claim_store(runner.archive, claimer, grace_s=0.0, lease_s=lease_s)
    store.join_run(Run(run_id, runner.fleet.path, utc_now_iso(), len(rounds), rounds.tests))
    queue = RoundQueue(rounds, {g.name: g.round_limit_s() for g in chosen})
    ahead = max(AHEAD_MIN_PAIRS, AHEAD_PER_AGENT * len(runner.fleet.agents))
    queued = store.top_up(run_id, queue, ahead)
    runner.progress.note(f"shared run {run_id}: {queued:,} pairs queued here, "
                         f"{store.remaining(run_id):,} waiting, {rounds.tests:,} in all")
    count = workers or max(1, min(MAX_WORKERS, len(runner.fleet.agents) // 2))
    share = SharedRun(runner, store, run_id, stop or threading.Event(), poll_s,
                      queue=queue, ahead=ahead, total=rounds.tests)
    threads = [threading.Thread(target=share.work, daemon=True, name=f"np-shared-{i}")
               for i in range(count)]
    beating = threading.Event()
    heart = threading.Thread(target=share.heartbeat, args=(beating, lease_s), daemon=True,
                             name="np-shared-heartbeat")
    heart.start()
    for thread in threads:
        thread.start()
    status = "interrupted"
    try:
        for thread in threads:
            thread.join()
        beating.set()
        heart.join()
        if share.failure is not None:
            status = "failed"
            raise share.failure
        if share.finished():
            share.show_fleet(now=True)
            status = "done"
            runner.archive.finish_run(run_id, utc_now_iso(), "done")
    finally:
        share.ended.set()
        beating.set()
    return RunSummary(run_id, tuple(share.records), status, dict(share.counts))



def run_shared_forever(runner: FleetRunner, stop: threading.Event,
                       rng: random.Random | None = None, *, claimer: str | None = None,
                       poll_s: float = POLL_S) -> None:
    """Keep the fleet's schedule as :meth:`FleetRunner.run_forever` does, each run a shared
    one: every runner kept so computes a run's number from its group's ``every`` grid, so
    runners started at different times join the same runs; one that comes to a run the
    others finished finds nothing left and waits for the next. Until ``stop``."""
    if runner.archive is None:
        raise ArchiveError("a shared run needs a PostgreSQL archive")
    claim_store(runner.archive)  # not PostgreSQL: refused now, not at the first slot

    def one(groups: list[str], number: int) -> object:
        return run_shared(runner, groups, number, claimer=claimer, stop=stop, poll_s=poll_s)

    runner.run_forever(stop, rng, one)
