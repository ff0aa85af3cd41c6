"""Several runners share one fleet run through the PostgreSQL schedule, on loopback: real
agents (``netprobe server --allow-third-party``), each runner on its own connection; every
pair is tested and archived exactly once, by one runner or another, no host's slot
intervals overlap; with SQLite a shared run is refused."""
from __future__ import annotations

import contextlib
import datetime
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from netprobe.archives import ArchiveError, open_archive
from netprobe.fleet import config
from netprobe.fleet.runner import FleetRunner, QuietProgress, RunSummary
from netprobe.fleet.shared import run_shared

from .servers import NETPROBE, free_port, netprobe_server


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


def _two_runners(url: str, fleet: config.Fleet, run: int,
                 progress: dict[str, Any] | None = None) -> dict[str, RunSummary]:
    """Runners r1 and r2, each on its own connection (and with its ``progress``, default
    quiet), working through shared run ``run`` together; their summaries (every runner
    ended, none failed)."""
    summaries: dict[str, RunSummary] = {}
    failures: list[BaseException] = []

    def runner(name: str) -> None:
        try:
            with open_archive(url) as archive:
                shown = (progress or {}).get(name, QuietProgress())
                summaries[name] = run_shared(FleetRunner(fleet, archive, shown),
                                             run=run, claimer=name, poll_s=0.05)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=runner, args=(n,)) for n in ("r1", "r2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures and len(summaries) == 2
    return summaries


def test_two_runners_share_a_mesh_each_pair_once(postgres_url: str,
                                                 agents: dict[str, int]) -> None:
    fleet = _fleet(agents)
    summaries = _two_runners(postgres_url, fleet, run=1)
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


class FleetCount(QuietProgress):
    """A progress that keeps what it is told of the whole fleet's pairs, and its own."""

    def __init__(self) -> None:
        self.own = 0
        self.fleet: list[tuple[int, int]] = []

    def pair_done(self, record: object) -> None:
        self.own += 1

    def fleet_done(self, done: int, total: int) -> None:
        self.fleet.append((done, total))


def test_each_shared_runners_progress_counts_every_runners_pairs(
        postgres_url: str, agents: dict[str, int]) -> None:
    shown = {"r1": FleetCount(), "r2": FleetCount()}
    summaries = _two_runners(postgres_url, _fleet(agents), run=11, progress=shown)
    assert sum(s.total for s in summaries.values()) == 12
    for name, progress in shown.items():
        # its own pairs are its share; what it shows is the fleet's, up to all 12
        assert progress.own == summaries[name].total
        assert progress.fleet and progress.fleet[-1] == (12, 12), (name, progress.fleet)
        assert all(0 <= done <= total == 12 for done, total in progress.fleet)
        assert [d for d, _ in progress.fleet] == sorted(d for d, _ in progress.fleet)


def test_a_shared_run_needs_postgresql(agents: dict[str, int], tmp_path: Path) -> None:
    with open_archive(str(tmp_path / "f.db")) as archive, \
            pytest.raises(ArchiveError, match="only through a PostgreSQL archive"):
        run_shared(FleetRunner(_fleet(agents), archive, QuietProgress()), run=1)


def test_a_runner_killed_mid_run_leaves_its_pairs_to_the_others(
        postgres_url: str, agents: dict[str, int], tmp_path: Path) -> None:
    """Three ``fleet run --shared`` processes; one is killed with SIGKILL while it holds a
    pair. Its pairs are re-run by the two others once its lease (the round limit, 4 s)
    ends: each pair archived once, none on a host that was in another test."""
    import psycopg

    fleet = tmp_path / "killed.toml"
    fleet.write_text(f'[fleet]\narchive = "{postgres_url}"\n' + "".join(
        f'[agents.{n}]\naddress = "127.0.0.1"\nport = {p}\n' for n, p in agents.items())
        + '[groups.mesh]\ntype = "mesh"\nround_timeout = "4s"\n'
        + 'spec = { duration = 1 }\n')
    def start() -> subprocess.Popen[str]:
        return subprocess.Popen([*NETPROBE, "fleet", "run", str(fleet), "--shared", "-q"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    # the one to be killed first, so that it holds a pair however slowly the others start
    runners = [start()]
    victim = runners[0]
    try:
        with psycopg.connect(postgres_url, autocommit=True) as db:
            deadline = time.monotonic() + 60
            held = None
            while held is None and time.monotonic() < deadline and victim.poll() is None:
                # UndefinedTable: the runner has not made the tables yet
                with contextlib.suppress(psycopg.errors.UndefinedTable):
                    held = db.execute("SELECT run_id, source, target FROM fleet_pairs "
                                      "WHERE state = 'claimed' AND claimer LIKE %s LIMIT 1",
                                      (f"%:{victim.pid}:%",)).fetchone()
                time.sleep(0.05)
            assert held is not None, "the runner to be killed never held a pair"
            runners += [start(), start()]
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=10)
            for runner in runners[1:]:
                _, err = runner.communicate(timeout=120)
                assert runner.returncode == 0, err
            run_id = held[0]
            pairs = db.execute("SELECT source, target, state, attempts, requeues, notes "
                               "FROM fleet_pairs WHERE run_id = %s", (run_id,)).fetchall()
            overlaps = db.execute(
                "SELECT a.host FROM fleet_slots a JOIN fleet_slots b ON a.host = b.host "
                "AND a.id < b.id AND a.during && b.during").fetchall()
            status = db.execute("SELECT status FROM runs WHERE run_id = %s",
                                (run_id,)).fetchone()
    finally:
        for runner in runners:
            if runner.poll() is None:
                runner.kill()
                runner.wait(timeout=10)
    with open_archive(postgres_url) as archive:
        records = archive.records(run_id)
    assert sorted((r.source, r.target) for r in records) == sorted(
        (s, t) for s in agents for t in agents if s != t)  # each pair once
    assert all(r.outcome == "ok" for r in records), [r.error for r in records]
    assert {p[2] for p in pairs} == {"done"} and overlaps == [] and status == ("done",)
    killed = next(p for p in pairs if (p[0], p[1]) == (held[1], held[2]))
    assert killed[3:5] == (2, 1) and f":{victim.pid}:" in killed[5][0]


@pytest.mark.parametrize(("extra", "says"), [
    (["--forever"], "only through a PostgreSQL archive"),  # at once, not at the first slot
    ([], "only through a PostgreSQL archive")])
def test_shared_cli_refusals_are_one_line(tmp_path: Path, extra: list[str], says: str) -> None:
    fleet = tmp_path / "f.toml"
    fleet.write_text('[agents.a]\naddress = "127.0.0.1"\n[agents.b]\naddress = "127.0.0.1"\n'
                     '[groups.m]\ntype = "mesh"\n')
    run = subprocess.run([*NETPROBE, "fleet", "run", str(fleet), "--shared", "-q", *extra],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and says in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr


def test_an_absent_agent_is_unreachable_in_a_shared_run(postgres_url: str,
                                                         agents: dict[str, int]) -> None:
    ports = {"a": agents["a"], "b": agents["b"], "gone": free_port()}
    with open_archive(postgres_url) as archive:
        summary = run_shared(FleetRunner(_fleet(ports), archive, QuietProgress()), run=2,
                             poll_s=0.05)
        records = archive.records(summary.run_id)
    gone = [r for r in records if "gone" in (r.source, r.target)]
    rest = [r for r in records if "gone" not in (r.source, r.target)]
    assert len(gone) == 4 and {r.outcome for r in gone} == {"unreachable"}
    assert all("agent gone (127.0.0.1) is unreachable" in str(r.error) for r in gone)
    assert len(rest) == 2 and {r.outcome for r in rest} == {"ok"}
    assert summary.status == "done" and summary.count("unreachable") == 4


def _pairs_of(url: str, run_id: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        return db.execute("SELECT source, target, state, attempts, requeues, notes "
                          "FROM fleet_pairs WHERE run_id = %s", (run_id,)).fetchall()


def _overlaps(url: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        return db.execute(
            "SELECT a.host FROM fleet_slots a JOIN fleet_slots b ON a.host = b.host "
            "AND a.id < b.id AND a.during && b.during").fetchall()


def test_a_lease_shorter_than_the_test_is_renewed_so_each_pair_runs_once(
        postgres_url: str, agents: dict[str, int]) -> None:
    """Leases of 1 s, tests of 1.5 s, two runners: each runner renews the leases it
    holds while their tests run, so neither re-queues a pair the other is still running
    (without the renewal every claim expires mid-test and its result is refused)."""
    text = ('[fleet]\nlease = "1s"\n' + "".join(
        f'[agents.{n}]\naddress = "127.0.0.1"\nport = {p}\n' for n, p in agents.items())
        + '[groups.mesh]\ntype = "mesh"\nspec = { duration = 1.5, rate = "200M" }\n')
    fleet = config.parse(config.tomllib.loads(text), "renewed.toml")
    assert fleet.lease_s == 1.0
    summaries = _two_runners(postgres_url, fleet, run=3)
    (run_id,) = {s.run_id for s in summaries.values()}
    with open_archive(postgres_url) as archive:
        records = archive.records(run_id)
    assert sorted((r.source, r.target) for r in records) == sorted(
        (s, t) for s in agents for t in agents if s != t)  # each pair archived once
    assert all(r.outcome == "ok" for r in records), [r.error for r in records]
    pairs = _pairs_of(postgres_url, run_id)
    assert len(pairs) == 12 and {p[2] for p in pairs} == {"done"}
    assert [p for p in pairs if p[3:5] != (1, 0)] == []  # no lease ended, none re-queued
    assert _overlaps(postgres_url) == []


def test_a_killed_runner_stops_renewing_and_its_pair_is_run_by_another(
        postgres_url: str, agents: dict[str, int], tmp_path: Path) -> None:
    """Leases of 1 s, tests of 2 s, three `fleet run --shared` processes: the one killed
    with SIGKILL while it holds a pair stops renewing, so its pair is re-queued once its
    lease ends (the pair's notes name the dead runner) and run by another; every other
    pair, renewed by a live runner, runs once on its first claim."""
    import psycopg

    fleet = tmp_path / "renew-killed.toml"
    fleet.write_text(f'[fleet]\narchive = "{postgres_url}"\nlease = "1s"\n' + "".join(
        f'[agents.{n}]\naddress = "127.0.0.1"\nport = {p}\n' for n, p in agents.items())
        + '[groups.mesh]\ntype = "mesh"\nspec = { duration = 2, rate = "200M" }\n')

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen([*NETPROBE, "fleet", "run", str(fleet), "--shared", "-q"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    runners = [start()]
    victim = runners[0]
    try:
        with psycopg.connect(postgres_url, autocommit=True) as db:
            deadline = time.monotonic() + 60
            held = None
            while held is None and time.monotonic() < deadline and victim.poll() is None:
                with contextlib.suppress(psycopg.errors.UndefinedTable):
                    held = db.execute("SELECT p.run_id, p.source, p.target FROM fleet_pairs p "
                                      "JOIN runs r USING (run_id) WHERE r.fleet = %s "
                                      "AND p.state = 'claimed' AND p.claimer LIKE %s LIMIT 1",
                                      (str(fleet), f"%:{victim.pid}:%")).fetchone()
                time.sleep(0.05)
            assert held is not None, "the runner to be killed never held a pair"
            time.sleep(1.3)
            # past the first lease's end: the victim's renewals keep its slots live
            live = db.execute("SELECT count(*) FROM fleet_slots s JOIN fleet_pairs p "
                              "ON p.id = s.pair_id WHERE p.run_id = %s AND p.source = %s "
                              "AND p.target = %s AND s.released IS NULL "
                              "AND upper(s.during) > clock_timestamp()", held).fetchone()
            assert live == (2,), "the victim's lease was not renewed"
            runners += [start(), start()]
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=10)
            for runner in runners[1:]:
                _, err = runner.communicate(timeout=120)
                assert runner.returncode == 0, err
    finally:
        for runner in runners:
            if runner.poll() is None:
                runner.kill()
                runner.wait(timeout=10)
    run_id = held[0]
    with open_archive(postgres_url) as archive:
        records = archive.records(run_id)
    assert sorted((r.source, r.target) for r in records) == sorted(
        (s, t) for s in agents for t in agents if s != t)  # each pair once
    assert all(r.outcome == "ok" for r in records), [r.error for r in records]
    pairs = _pairs_of(postgres_url, run_id)
    # the victim held one pair, or two (n/2 workers): each re-queued once, its notes
    # naming the dead runner; every pair a live runner held ran on its first claim
    killed = [p for p in pairs if p[3:5] != (1, 0)]
    assert (held[1], held[2]) in [(p[0], p[1]) for p in killed] and len(killed) <= 2
    for pair in killed:
        assert pair[2:5] == ("done", 2, 1), pair
        assert f":{victim.pid}:" in pair[5][0] and "re-queued" in pair[5][0], pair
    assert _overlaps(postgres_url) == []


@pytest.mark.parametrize(("lease", "says"), [
    ('"0s"', "must be more than 0 seconds"), ('"2h"', "must be at most 3600 s"),
    ('"soon"', "fleet.lease")])
def test_a_bad_lease_is_one_line_naming_the_key(lease: str, says: str) -> None:
    text = (f'[fleet]\nlease = {lease}\n[agents.a]\naddress = "127.0.0.1"\n'
            '[agents.b]\naddress = "127.0.0.1"\n[groups.m]\ntype = "mesh"\n')
    with pytest.raises(config.FleetFileError, match=says) as caught:
        config.parse(config.tomllib.loads(text), "f.toml")
    assert "fleet.lease" in str(caught.value) and "\n" not in str(caught.value)


def test_the_heartbeat_does_not_renew_a_test_past_its_round_limit(
        postgres_url: str, agents: dict[str, int]) -> None:
    """A test that outruns its round limit (round_timeout 0.5 s, a 1.2 s test) is not kept
    alive by the heartbeat: its lease lapses at the limit, as a round would time it out,
    and after MAX_ATTEMPTS such ends the pair is given up as a timeout."""
    ports = {"a": agents["a"], "b": agents["b"]}
    text = ('[fleet]\nlease = "0.3s"\n' + "".join(
        f'[agents.{n}]\naddress = "127.0.0.1"\nport = {p}\n' for n, p in ports.items())
        + '[groups.mesh]\ntype = "mesh"\nround_timeout = "0.5s"\n'
        + 'spec = { duration = 1.2, rate = "200M" }\n')
    fleet = config.parse(config.tomllib.loads(text), "hung.toml")
    with open_archive(postgres_url) as archive:
        summary = run_shared(FleetRunner(fleet, archive, QuietProgress()), run=4,
                             poll_s=0.05)
        records = archive.records(summary.run_id)
    pairs = _pairs_of(postgres_url, summary.run_id)
    assert sorted((r.source, r.target, r.outcome) for r in records) == [
        ("a", "b", "timeout"), ("b", "a", "timeout")]
    assert sorted(p[3:5] for p in pairs) == [(3, 2), (3, 2)]


def test_shared_runners_kept_forever_join_the_same_runs(postgres_url: str,
                                                        agents: dict[str, int],
                                                        tmp_path: Path) -> None:
    """Two `fleet run --shared --forever`, started 0.7 s apart, on a 2-agent group due
    every second: they compute each run's number from the group's grid, so they join the
    same runs; every run's two pairs are archived once, no host held twice at once."""
    fleet = tmp_path / "forever.toml"
    fleet.write_text("".join(f'[agents.{n}]\naddress = "127.0.0.1"\nport = {agents[n]}\n'
                             for n in ("a", "b"))
                     + '[groups.pair]\ntype = "mesh"\nevery = "1s"\n'
                       'spec = { duration = 0.2 }\n')
    argv = [*NETPROBE, "fleet", "run", str(fleet), "--shared", "--forever",
            "--archive", postgres_url]
    procs = [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)]
    time.sleep(0.7)
    procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True))
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end and len(_forever_runs(postgres_url, fleet)) < 4:
            time.sleep(0.2)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        errors = [proc.communicate(timeout=20)[1] for proc in procs]
    assert all("Traceback" not in e for e in errors), errors
    # Each says which shared run it works on: the second joined runs the first started.
    joined = [set(re.findall(r"shared run ([0-9a-f]{32})", e)) for e in errors]
    assert joined[0] & joined[1], errors
    runs = _forever_runs(postgres_url, fleet)
    assert joined[0] | joined[1] <= set(runs)
    done = {run_id: pairs for run_id, (status, pairs) in runs.items() if status == "done"}
    assert len(done) >= 3, runs
    assert all(sorted(pairs) == [("a", "b"), ("b", "a")] for pairs in done.values()), done
    assert _overlaps(postgres_url) == []


def _forever_runs(url: str, fleet: Path) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """The shared runs of ``fleet`` in the archive: run id -> (status, archived pairs)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        rows = db.execute("SELECT r.run_id, r.status, p.source, p.target FROM runs r "
                          "LEFT JOIN results p ON p.run_id = r.run_id WHERE r.fleet = %s",
                          (str(fleet),)).fetchall()
    runs: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    for run_id, status, source, target in rows:
        runs.setdefault(run_id, (status, []))
        if source is not None:
            runs[run_id][1].append((source, target))
    return runs


def test_a_host_busy_with_a_test_not_the_fleets_is_waited_for(postgres_url: str,
                                                              agents: dict[str, int]) -> None:
    """A test someone else runs to agent a (not the fleet's: the database does not know
    it) makes the shared runner wait, as a round does, instead of testing beside it."""
    outside = subprocess.Popen([*NETPROBE, "run", "127.0.0.1", "-p", str(agents["a"]),
                                "-t", "2.5", "-q"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    ended: list[datetime.datetime] = []
    watch = threading.Thread(target=lambda: (outside.wait(30), ended.append(
        datetime.datetime.now(datetime.timezone.utc))), daemon=True)
    watch.start()
    try:
        fleet = _fleet({"a": agents["a"], "b": agents["b"]})
        with open_archive(postgres_url) as archive:
            runner = FleetRunner(fleet, archive, QuietProgress())
            deadline = time.monotonic() + 10
            while runner.status(runner.agent("a")).get("state") != "busy":
                assert time.monotonic() < deadline, "the outside test never started"
                time.sleep(0.05)
            summary = run_shared(runner, run=7, poll_s=0.05)
            records = archive.records(summary.run_id)
        watch.join(30)
    finally:
        if outside.poll() is None:
            outside.kill()
            outside.wait(5)
    assert outside.returncode == 0 and ended
    assert sorted((r.source, r.target) for r in records) == [("a", "b"), ("b", "a")]
    assert {r.outcome for r in records} == {"ok"}, [r.error for r in records]
    started = [datetime.datetime.fromisoformat(r.time.replace("Z", "+00:00")) for r in records]
    # Every fleet test began once the outside one was over (its agent idle a moment before
    # its client's process ended; the runner asks every 0.5 s). Before, the first began at
    # once, beside it, 2 s before its end.
    assert min(started) > ended[0] - datetime.timedelta(seconds=0.5), (started, ended)
