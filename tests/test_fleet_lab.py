"""A real fleet: six namespaces on a bridge, each a ``netprobe server --allow-third-party``
agent behind its own veth shaped to 100 Mbit/s both ways (tbf, overhead 24, as a wire),
each started with ``--secret-file`` as every shipped deployment starts them.

A mesh run must start no two tests of one host within a test's span of each other, and
give every ordered pair well over the 47 Mbit/s two tests sharing a link would read, and
94.1 +/- 1 Mbit/s (100 x 1448/1538) at the median. Then one agent is stopped:
its pairs come back unreachable, the others still run, the run ends on its own. Last the
runner is killed (SIGKILL) mid-round: every test it saw end is in the archive, whole, and
nothing half-written is there."""
from __future__ import annotations

import datetime
import itertools
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netprobe import convert
from netprobe.archives import figures, open_archive
from netprobe.schema import Result

from .netlab import Lab, switched_hosts, wait_listening

pytestmark = [pytest.mark.root, pytest.mark.slow]
why_not = Lab.available()
if why_not:
    pytestmark.append(pytest.mark.skip(reason=why_not))

NETPROBE = [sys.executable, "-m", "netprobe"]
NAMES = ["h1", "h2", "h3", "h4", "h5", "h6"]
WIRE_MBIT = 100 * 1448 / 1538  # 94.1: TCP payload of a 100 Mbit/s Ethernet
SHARED_MBIT = WIRE_MBIT / 2  # what each of two tests sharing one host's link would read


def _agent(lab: Lab, ns: str, address: str, secret: Path) -> subprocess.Popen:
    # With the secret: an agent is then the client of another in each of its tests, and
    # once used no secret there (every pair of such a fleet failed).
    return lab.start(ns, [*NETPROBE, "server", "-B", address, "--allow-third-party",
                          "--secret-file", str(secret)],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _fleet_file(path: Path, hosts: dict, duration: str, omit: str,
                secret: Path | None = None) -> None:
    """The mesh's fleet file; ``secret``: its [fleet] secret_file (None: the runner is
    given it with ``fleet run --secret-file``)."""
    agents = "".join(f'[agents.{name}]\naddress = "{address}"\n'
                     for name, (_, address) in hosts.items())
    secret_line = f'secret_file = "{secret}"\n' if secret else ""
    path.write_text(f'[fleet]\narchive = "sqlite://{path.with_suffix(".db")}"\n{secret_line}'
                    f'{agents}'
                    '[groups.mesh]\ntype = "mesh"\n'
                    f'spec = {{ duration = "{duration}", omit = "{omit}" }}\n')


def _mbit(records: list) -> dict[tuple[str, str], float]:
    return {(r.source, r.target): figures(r.result)["receiver_bits_per_second"] / 1e6
            for r in records if r.outcome == "ok"}


@pytest.mark.host_timing
def test_fleet_mesh_on_shaped_links(tmp_path: Path) -> None:
    with switched_hosts(NAMES, subnet="10.77.9", rate_mbit=100, prefix="flt") as (lab, hosts):
        switch = lab.namespaces[0]
        secret = tmp_path / "secret"
        secret.write_text("the fleet's shared secret\n")
        agents = {}
        for name, (ns, address) in hosts.items():
            agents[name] = _agent(lab, ns, address, secret)
        for ns, _ in hosts.values():
            wait_listening(lab, ns, 5301)
        fleet = tmp_path / "mesh.toml"
        archive_path = tmp_path / "mesh.db"

        # 1. The whole mesh: 30 ordered pairs in 10 rounds of 3, each at the wire's rate.
        # (4 s after a 1 s warm-up. On a machine loaded by other work a sender starved of
        # CPU leaves the link idle for a moment and its pair reads 1-3 Mbit/s low: re-run
        # this test alone before concluding anything from that.)
        _fleet_file(fleet, hosts, duration="4s", omit="1s", secret=secret)
        started = time.monotonic()
        run = lab.run(switch, [*NETPROBE, "fleet", "run", str(fleet), "--json"], timeout=120)
        mesh_s = time.monotonic() - started
        assert run.returncode == 0, run.stderr + _errors(run.stdout)
        with open_archive(str(archive_path)) as archive:
            (first,) = archive.runs()
            records = archive.records(first.run_id)
        assert first.status == "done" and first.rounds == 10 and first.pairs == 30
        mbit = _mbit(records)
        assert sorted(mbit) == sorted(itertools.permutations(NAMES, 2))
        # The schedule, from the runner's own clock: no host in two tests at once.
        overlapping = _overlapping(records, span_s=5.0)
        assert not overlapping, f"a host in two tests at once: {overlapping}"
        # And from the figures: a shared link reads about 47. Each pair must be clear of
        # that; a sender starved of CPU for a moment by other work on the machine leaves
        # its link idle and reads 1-3 Mbit/s low (a CI run: all three pairs of rounds 9
        # and 10 at 92.4-92.9; another, all three of round 5 at 88.2-89.1, the machine
        # stalled for a moment), so the wire's 94.1 +/- 1 is asked of the median, and of
        # each pair only to be clear of a shared link's 47, as in the checks below.
        low = {pair: _detail(records, pair) for pair, v in mbit.items()
               if not SHARED_MBIT * 1.7 < v < WIRE_MBIT + 1.0}
        assert not low, f"pairs far off 94.1 Mbit/s (a host in two tests at once?): {low}"
        middle = statistics.median(mbit.values())
        assert abs(middle - WIRE_MBIT) <= 1.0, (middle, {p: _detail(records, p) for p in mbit})
        print(f"mesh of 6: 30 pairs in {mesh_s:.1f} s, "
              f"{min(mbit.values()):.2f}..{max(mbit.values()):.2f} Mbit/s")

        # 2. One agent stopped: its 10 pairs unreachable, the other 20 run; the run ends.
        # The secret given on the command line this time, not in the file.
        lab.stop(agents["h4"])
        _fleet_file(fleet, hosts, duration="1s", omit="0s")
        started = time.monotonic()
        run = lab.run(switch, [*NETPROBE, "fleet", "run", str(fleet), "--json",
                               "--secret-file", str(secret)], timeout=120)
        down_s = time.monotonic() - started
        assert run.returncode == 5, run.stderr  # not every pair ran
        done = json.loads(run.stdout)
        by_outcome = {o: [r for r in done["records"] if r["outcome"] == o]
                      for o in ("ok", "unreachable")}
        assert len(by_outcome["unreachable"]) == 10 and len(by_outcome["ok"]) == 20
        assert all("h4" in (r["source"], r["target"]) for r in by_outcome["unreachable"])
        # Short tests here: well clear of the 47 Mbit/s of a shared link is what counts.
        assert all(r["receiver_bits_per_second"] / 1e6 > SHARED_MBIT * 1.7
                   for r in by_outcome["ok"])
        print(f"with h4 stopped: 20 ok, 10 unreachable in {down_s:.1f} s")

        # 3. h4 back; the runner killed mid-round: what it saw end is archived whole, and
        # nothing half-written is there.
        ns4, address4 = hosts["h4"]
        agents["h4"] = _agent(lab, ns4, address4, secret)
        wait_listening(lab, ns4, 5301)
        _fleet_file(fleet, hosts, duration="1.5s", omit="0s", secret=secret)
        runner = lab.start(switch, [*NETPROBE, "fleet", "run", str(fleet), "-q"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seen = _wait_for_records(archive_path, run_count=3, at_least=4)
        os.killpg(runner.pid, signal.SIGKILL)
        runner.wait(10)
        _check_killed_archive(archive_path, seen)


def _errors(stdout: str) -> str:
    """The distinct errors of a ``fleet run --json``'s failed pairs, for a failure message."""
    try:
        records = json.loads(stdout)["records"]
    except (ValueError, KeyError):
        return stdout[-500:]
    return "; ".join(sorted({str(r.get("error")) for r in records if r["outcome"] != "ok"}))


def _overlapping(records: list, span_s: float) -> list[tuple[str, str, str]]:
    """(host, one test, another) for each two tests of a host that started less than
    ``span_s`` (a test's warm-up and duration) apart."""
    found = []
    for host in NAMES:
        mine = sorted((datetime.datetime.fromisoformat(r.time.replace("Z", "+00:00")),
                       f"{r.source}->{r.target}") for r in records if host in (r.source, r.target))
        for (start, one), (later, other) in zip(mine, mine[1:]):
            if (later - start).total_seconds() < span_s:
                found.append((host, one, other))
    return found


def _detail(records: list, pair: tuple[str, str]) -> str:
    """receiver Mbit/s, sender Mbit/s, receiver's window in s, round: for a failure message."""
    record = next(r for r in records if (r.source, r.target) == pair)
    flow = record.result.summary()
    window = flow.receiver.end_s - flow.receiver.start_s
    return (f"{flow.receiver.bits_per_second / 1e6:.2f} rx, "
            f"{flow.sender.bits_per_second / 1e6:.2f} tx, {window:.3f} s, round {record.round}")


def _records_of_run(path: Path, run_count: int) -> int:
    try:
        with sqlite3.connect(path, timeout=5) as db:
            runs = db.execute("SELECT run_id FROM runs ORDER BY started").fetchall()
            if len(runs) < run_count:
                return 0
            return int(db.execute("SELECT COUNT(*) FROM results WHERE run_id = ?",
                                  runs[run_count - 1]).fetchone()[0])
    except sqlite3.Error:
        return 0


def _wait_for_records(path: Path, run_count: int, at_least: int) -> int:
    # Round 1 of the run has 3 pairs: a 4th record means round 2 is under way.
    end = time.monotonic() + 60
    seen = 0
    while seen < at_least and time.monotonic() < end:
        time.sleep(0.05)
        seen = _records_of_run(path, run_count)
    assert seen >= at_least, "the runner archived too little before the kill"
    return seen


def _check_killed_archive(path: Path, seen: int) -> None:
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with open_archive(str(path)) as archive:
        killed = archive.runs()[-1]
        records = archive.records(killed.run_id)
    assert killed.finished is None and killed.status == "incomplete"  # it never ended
    assert seen <= len(records) < killed.pairs  # everything seen, the run cut short
    for record in records:  # each one whole: a full Result with the wire's figure
        assert record.outcome == "ok" and isinstance(record.result, Result)
        assert convert.structure(convert.unstructure(record.result), Result) == record.result
        mbit = figures(record.result)["receiver_bits_per_second"] / 1e6
        assert mbit > SHARED_MBIT * 1.7
    print(f"killed mid-round: {len(records)} whole records of {killed.pairs}")
