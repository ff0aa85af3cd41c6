#!/usr/bin/env python3
"""Scale simulation: a mesh of ``--agents`` simulated agents through the shared schedule's
real claim, lease and archive paths on a real PostgreSQL (netprobe.fleet.claims), the
tests' time simulated.

The fleet file's mesh is planned by the real planner (rounds made as they are reached)
and queued as a shared runner queues it, rounds added as the queue runs low
(ClaimStore.top_up); the simulation runs in waves of simulated time: at each wave's
start the runner claims pairs until no pair can be taken or every host is held, the
claimed tests "run" for ``--test-s`` simulated seconds, and all complete together (each
archiving a record with a real Result, made once by a loopback test). So the waves a mesh
takes are the rounds the database's schedule gives it, to compare with the theory, 2(N-1)
rounds for an even N (N for an odd one). ``--dead K`` abandons K first claims a wave, as
a runner that died would (their leases made to end at once, through renew), so that the
expiry and re-queue paths run too: each abandoned pair is re-queued and done later.
``--runners R`` has R simulated runners, each on a connection of its own, claim each wave
together and complete their own claims together (threads: the database does the work, and
psycopg lets the others run while one waits), as R shared runners of one fleet would.

Reports: rounds vs theory; host overlaps (the witness: a host claimed twice in one wave,
and the database's own slot history) which must be 0; claims and completions per second;
how long one claim that finds nothing takes (what every idle worker of a real runner asks
each poll); the time spent topping the queue up; the database's size per 1,000 results
and per 1,000 queued pairs.

    python bench/fleet_scale.py [--url postgresql://...] [--agents 1000] [--rounds 40]

``--rounds`` stops after that many waves; without ``--url`` a throwaway server is started
as the tests do.
A benchmark, not a test: its figures are not asserted, but a broken invariant (a host
twice in a wave or in overlapping slots, a pair archived twice, a whole mesh in other than
the theory's rounds) ends it with status 1 (tests/test_fleet_scale.py checks its logic).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from netprobe import convert
from netprobe.archives import PairRecord, Run, open_archive
from netprobe.fleet import config
from netprobe.fleet.claims import Claim, claim_store
from netprobe.fleet.schedule import plan
from netprobe.fleet.shared import AHEAD_MIN_PAIRS, AHEAD_PER_AGENT, RoundQueue
from netprobe.schema import Result

LEASE_GRACE_S = 86_400.0
"""The simulated claims' grace past the test: no lease ends by itself while the bench runs."""
EPOCH = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
"""Simulated time zero."""


@contextlib.contextmanager
def server(url: str | None, bench: str = "fleet_scale") -> Iterator[str]:
    """``url``, or a throwaway PostgreSQL server's (tests/pgserver.py); the benches of
    this directory share it (``bench`` names the one that could not start one)."""
    if url:
        yield url
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests import pgserver

    reason = pgserver.why_not()
    if reason:
        raise SystemExit(f"{bench}: {reason}")
    with pgserver.postgres_server() as started:
        yield started


def loopback_result() -> Result | None:
    """One real Result (a 0.3 s TCP test over loopback) for every simulated record, so
    that the database's size per result is a real one's; None if it cannot be made."""
    run = subprocess.run([sys.executable, "-m", "netprobe", "run", "-t", "0.3", "--json"],
                         capture_output=True, text=True, timeout=60)
    return convert.from_json(run.stdout) if run.returncode == 0 else None


def mesh_fleet(agents: int, test_s: float) -> config.Fleet:
    """A fleet file of ``agents`` agents (never contacted) and one mesh group."""
    text = "".join(f'[agents.h{i:05d}]\naddress = "192.0.2.1"\n' for i in range(agents))
    text += f'[groups.mesh]\ntype = "mesh"\nspec = {{ duration = {test_s} }}\n'
    return config.parse(config.tomllib.loads(text), f"scale-{agents}.toml")


def theory_rounds(agents: int) -> int:
    """The fewest rounds of a directed mesh with no host twice in a round."""
    return 2 * (agents - 1) if agents % 2 == 0 else agents


def simulate(url: str, agents: int, *, test_s: float = 30.0, rounds: int | None = None,
             dead: int = 0, result: Result | None = None, progress: int = 0,
             runners: int = 1) -> dict[str, Any]:
    """Run the simulation (see the module's text); the figures as a dict. ``progress``:
    a line on stderr every that many waves (0: none)."""
    fleet = mesh_fleet(agents, test_s)
    planned = plan(fleet, ["mesh"], 1)
    run_id = f"scale-{agents}-{uuid.uuid4().hex[:8]}"
    out: dict[str, Any] = {"agents": agents, "pairs": planned.tests, "runners": runners,
                           "theory_rounds": theory_rounds(agents)}
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(runners) as pool:
        archives = [stack.enter_context(open_archive(url)) for _ in range(runners)]
        archive = archives[0]
        # a lease that outlasts any wave: the simulated tests take no wall time, and the
        # leases end only when the bench ends them (--dead, and _empty_claim_s). A grace
        # of a minute ran out while one 10,000-agent wave (5,000 claims) was still
        # being claimed, and its first claims were expired under the bench
        stores = [claim_store(each, claimer=f"scale-sim-{i}", grace_s=LEASE_GRACE_S)
                  for i, each in enumerate(archives)]
        store = stores[0]
        archive.start_run(Run(run_id, fleet.path, EPOCH.isoformat(), len(planned),
                              planned.tests))
        # The rounds go into the queue as it runs low, as a shared runner's do.
        queue = RoundQueue(planned, {"mesh": test_s})
        ahead = max(AHEAD_MIN_PAIRS, AHEAD_PER_AGENT * agents)
        started = time.monotonic()
        out["queued"] = store.top_up(run_id, queue, ahead)
        out["queue_s"] = time.monotonic() - started
        out["empty_claim_s"] = _empty_claim_s(store, run_id, agents)
        waves = witness = abandoned = claims = 0
        by_runner = [0] * runners
        claim_s = complete_s = top_up_s = 0.0
        while ((store.rounds_queued(run_id) < len(queue) or store.remaining(run_id))
               and (rounds is None or waves < rounds)):
            begun = time.monotonic()
            store.top_up(run_id, queue, ahead)
            top_up_s += time.monotonic() - begun
            begun = time.monotonic()
            held = _claim_waves(pool, stores, run_id, agents)
            claim_s += time.monotonic() - begun
            wave = [claim for own in held for claim in own]
            by_runner = [n + len(own) for n, own in zip(by_runner, held)]
            claims += len(wave)
            witness += _twice(wave)
            if not wave:
                break  # nothing can be taken and nothing is held: cannot happen
            at = (EPOCH + datetime.timedelta(seconds=waves * test_s)).isoformat()
            begun = time.monotonic()
            # the first ``dead`` first attempts' runner died: their leases end now
            lost = [claim for claim in wave if claim.attempt == 1][:dead]
            for claim in lost:
                store.renew(claim, 0.001)
            kept = [[claim for claim in own if claim not in lost] for own in held]
            list(pool.map(functools.partial(_complete, at=at, result=result), stores, kept))
            complete_s += time.monotonic() - begun
            abandoned += len(lost)
            waves += 1
            if progress and waves % progress == 0:  # a long run shows it is alive
                print(f"wave {waves}: {claims:,} claims, {time.monotonic() - started:.0f} s",
                      file=sys.stderr, flush=True)
            if dead:
                time.sleep(0.01)  # past the abandoned leases' end, on the server's clock
        out.update(rounds=waves, claims=claims, claims_by_runner=by_runner,
                   abandoned=abandoned, witness_overlaps=witness,
                   claims_per_s=claims / claim_s if claim_s else 0.0,
                   completions_per_s=(claims - abandoned) / complete_s if complete_s else 0.0,
                   top_up_s=top_up_s, rounds_queued=store.rounds_queued(run_id),
                   remaining=store.remaining(run_id),
                   refused=sum(each.refused for each in stores),
                   rechecked=sum(each.rechecked for each in stores))
        out.update(_database(archive, run_id))
    return out


def violations(out: dict[str, Any]) -> list[str]:
    """What in ``out`` (simulate's figures) breaks the schedule's invariants: a host twice
    in one wave or in overlapping slots, a pair archived twice, and, for a whole mesh run
    without abandoned claims, rounds other than the theory's."""
    found = [f"{out[k]} {what}" for k, what in (
        ("witness_overlaps", "hosts claimed twice in one wave"),
        ("db_overlaps", "overlapping slots of one host in fleet_slots")) if out[k]]
    if out["done"] != out["done_distinct"] or out["results"] != out["done"]:
        found.append(f"{out['done']} pairs done, {out['done_distinct']} distinct, "
                     f"{out['results']} results")
    whole = out["remaining"] == 0 and out["rounds_queued"] == out["theory_rounds"]
    if whole and not out["abandoned"] and out["rounds"] != out["theory_rounds"]:
        found.append(f"{out['rounds']} rounds, the theory's {out['theory_rounds']}")
    return found


def _claim_wave(store: Any, run_id: str, agents: int) -> list[Claim]:
    """Claims until none can be taken or every host is held (the last claim of a full
    wave would only scan the whole queue to find nothing)."""
    return _claim_waves(None, [store], run_id, agents)[0]


def _claim_waves(pool: ThreadPoolExecutor | None, stores: list[Any], run_id: str,
                 agents: int) -> list[list[Claim]]:
    """Each store's claims of one wave, the stores claiming at once (one thread each),
    until none can be taken or every host is held. A claimer that found nothing while
    another's claim was in flight may have passed over a pair that claim then let go
    (SKIP LOCKED): once all have stopped, the first looks once more, so a wave ends
    only when the database has nothing to give."""
    lock = threading.Lock()
    taken = 0
    full = agents - agents % 2

    def claims(store: Any) -> list[Claim]:
        nonlocal taken
        own: list[Claim] = []
        while True:
            with lock:
                if 2 * taken >= full:
                    return own
                taken += 1  # a place in the wave, given back if nothing is found
            claim = store.claim(run_id)
            if claim is None:
                with lock:
                    taken -= 1
                return own
            own.append(claim)

    if pool is None or len(stores) == 1:
        return [claims(stores[0])]
    held = list(pool.map(claims, stores))
    held[0].extend(claims(stores[0]))
    return held


def _complete(store: Any, claims: list[Claim], at: str, result: Result | None) -> None:
    """Each of ``claims`` completed by ``store`` with a record of an ok test at ``at``."""
    for claim in claims:
        store.complete(claim, PairRecord(claim.run_id, claim.group, claim.round, claim.source,
                                         claim.target, at, "ok", None, result))


def _twice(wave: list[Claim]) -> int:
    """Hosts claimed twice in one wave (every claim of a wave is held at once)."""
    hosts = [h for c in wave for h in (c.source, c.target)]
    return len(hosts) - len(set(hosts))


def _empty_claim_s(store: Any, run_id: str, agents: int) -> float:
    """How long a claim takes that finds no free host with the whole queue behind it: a
    wave of claims held, then one more, then the wave given back (renewed to end now and
    expired by the next claim, as a dead runner's would)."""
    wave = _claim_wave(store, run_id, agents)
    begun = time.monotonic()
    extra = store.claim(run_id)
    took = time.monotonic() - begun
    for claim in [*wave, *([extra] if extra else [])]:
        store.renew(claim, 0.001)
    time.sleep(0.01)
    store.expire()
    # undo the re-queue's count: the measurement is not part of the simulated run
    with store._transaction() as cursor:
        cursor.execute("UPDATE fleet_pairs SET attempts = 0, requeues = 0, notes = '{}' "
                       "WHERE run_id = %s", (run_id,))
    return took


def _database(archive: Any, run_id: str) -> dict[str, Any]:
    """Overlapping slots of one host in the database's history (must be 0), and sizes."""
    read = archive._read
    overlaps = read("SELECT count(*) FROM fleet_slots a JOIN fleet_slots b ON a.host = b.host "
                    "AND a.id < b.id AND a.during && b.during")[0][0]
    sizes = dict(read("SELECT c, pg_total_relation_size(c) FROM unnest(ARRAY['results', "
                      "'fleet_pairs', 'fleet_slots', 'fleet_hosts']) AS c"))
    results = read("SELECT count(*) FROM results WHERE run_id = ?", (run_id,))[0][0]
    pairs = read("SELECT count(*) FROM fleet_pairs WHERE run_id = ?", (run_id,))[0][0]
    done = read("SELECT count(*), count(DISTINCT (source, target)), sum(requeues) "
                "FROM fleet_pairs WHERE run_id = ? AND state = 'done'", (run_id,))[0]
    per_result = (sizes["results"] + sizes["fleet_slots"]) / max(results, 1) * 1000
    return {"db_overlaps": int(overlaps), "results": int(results), "done": int(done[0]),
            "done_distinct": int(done[1]), "requeues": int(done[2] or 0),
            "mb_per_1000_results": per_result / 1e6,
            "mb_per_1000_queued": sizes["fleet_pairs"] / max(pairs, 1) * 1000 / 1e6}


def main() -> None:
    """Run the simulation and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url")
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--rounds", type=int, help="stop after this many waves")
    parser.add_argument("--test-s", type=float, default=30.0)
    parser.add_argument("--dead", type=int, default=0)
    parser.add_argument("--runners", type=int, default=1,
                        help="simulated runners claiming together, each on its own connection")
    parser.add_argument("--progress", type=int, default=0,
                        help="a line on stderr every this many waves")
    args = parser.parse_args()
    with server(args.url) as url:
        began = time.monotonic()
        out = simulate(url, args.agents, test_s=args.test_s, rounds=args.rounds,
                       dead=args.dead, result=loopback_result(), progress=args.progress,
                       runners=args.runners)
        out["wall_s"] = time.monotonic() - began
    for key, value in out.items():
        print(f"{key:22} {value:.3f}" if isinstance(value, float) else f"{key:22} {value}")
    broken = violations(out)
    if broken:
        raise SystemExit("fleet_scale: invariant broken: " + "; ".join(broken))


if __name__ == "__main__":
    main()
