#!/usr/bin/env python3
"""Benchmark: the shared schedule's claim, complete and expire paths against PostgreSQL.

A mesh of ``--hosts`` simulated agents is queued as one run; ``--claimers`` threads, each
on its own connection, claim pairs, hold them ``--hold`` seconds (the simulated test) and
complete them, archiving one result each, until none is left. Prints claims per second,
how many claims found a host held on the second look or were refused by the database
(and were retried), the most pairs held
at once, and the size the schedule's tables and the results take per 1,000 results.

    python bench/fleet_claims.py [--url postgresql://...] [--hosts 32] [--claimers 8]

Without ``--url`` it starts a throwaway server as the tests do (tests/pgserver.py). This
is a benchmark, not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import threading
import time
import uuid

from fleet_scale import server  # this directory's: one throwaway-server helper

from netprobe.archives import PairRecord, Run, open_archive
from netprobe.fleet.claims import QueuedPair, claim_store
from netprobe.host import utc_now_iso


def _claimer(url: str, run_id: str, hold: float, stats: dict, lock: threading.Lock) -> None:
    with open_archive(url) as archive:
        store = claim_store(archive)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            claim = store.claim(run_id)
            if claim is None:
                if store.remaining(run_id) == 0:
                    break
                time.sleep(0.005)
                continue
            with lock:
                stats["held"] += 1
                stats["most"] = max(stats["most"], stats["held"])
            time.sleep(hold)
            with lock:
                stats["held"] -= 1
            store.complete(claim, PairRecord(run_id, claim.group, claim.round, claim.source,
                                             claim.target, utc_now_iso(), "failed",
                                             "simulated test"))
            with lock:
                stats["claims"] += 1
        with lock:
            stats["refused"] += store.refused
            stats["rechecked"] += store.rechecked


def main() -> None:
    """Run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url")
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--claimers", type=int, default=8)
    parser.add_argument("--hold", type=float, default=0.0)
    args = parser.parse_args()
    hosts = [f"h{i}" for i in range(args.hosts)]
    pairs = [QueuedPair("mesh", 1, a, b, 10.0) for a in hosts for b in hosts if a != b]
    with server(args.url, 'fleet_claims') as url:
        run_id = f"bench-{uuid.uuid4().hex[:8]}"
        with open_archive(url) as archive:
            archive.start_run(Run(run_id, "bench", utc_now_iso(), 1, len(pairs)))
            started = time.monotonic()
            claim_store(archive).enqueue(run_id, pairs)
            queued_s = time.monotonic() - started
        stats = {"claims": 0, "refused": 0, "rechecked": 0, "held": 0, "most": 0}
        lock = threading.Lock()
        threads = [threading.Thread(target=_claimer, args=(url, run_id, args.hold, stats, lock))
                   for _ in range(args.claimers)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.monotonic() - started
        with open_archive(url) as archive:
            size = archive._read(  # type: ignore[attr-defined]
                "SELECT sum(pg_total_relation_size(c)) FROM unnest(ARRAY['results', "
                "'fleet_pairs', 'fleet_slots', 'fleet_hosts']) AS c")[0][0]
        print(f"{len(pairs)} pairs of {args.hosts} hosts queued in {queued_s:.2f} s; "
              f"{stats['claims']} claimed and completed by {args.claimers} claimers in "
              f"{took:.2f} s: {stats['claims'] / took:.0f} claims/s; a host found held on "
              f"the second look: {stats['rechecked']}; refused by the database and retried: "
              f"{stats['refused']}; most pairs at once: "
              f"{stats['most']} (of {args.hosts // 2}); tables: {int(size) / 1e6:.1f} MB, "
              f"{int(size) / len(pairs) * 1000 / 1e6:.2f} MB per 1,000 results")


if __name__ == "__main__":
    main()
