"""The fleet runner on loopback: real agents (``netprobe server --allow-third-party`` on
their own ports), a mesh run archived as each test ends, an agent that is not there marked
unreachable while the others run, a round that cannot wait forever; and the schedule's
next start (pure)."""
from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from netprobe.archives import open_archive
from netprobe.fleet import config
from netprobe.fleet.runner import FleetRunner
from netprobe.fleet.schedule import PlannedRound, next_start
from netprobe.schema import Result

from .servers import NETPROBE, free_port, netprobe_server


def _fleet(ports: dict[str, int], duration: float = 0.5, **group: str) -> config.Fleet:
    agents = "".join(f'[agents.{n}]\naddress = "127.0.0.1"\nport = {p}\n'
                     for n, p in ports.items())
    extra = "".join(f"{k} = {v}\n" for k, v in group.items())
    text = (f"{agents}[groups.mesh]\ntype = \"mesh\"\n{extra}"
            f"spec = {{ duration = {duration} }}\n")
    return config.parse(config.tomllib.loads(text), "loop.toml")


@pytest.fixture(scope="module")
def agents() -> Iterator[dict[str, int]]:
    with ExitStack() as stack:
        ports = {name: stack.enter_context(netprobe_server("--allow-third-party",
                                                           "--max-tests", "4")).port
                 for name in ("a", "b", "c")}
        yield ports


class Seen:
    def __init__(self) -> None:
        self.rounds: list[tuple[int, int]] = []
        self.notes: list[str] = []
        self.done = 0

    def round_started(self, number: int, total: int, planned: PlannedRound) -> None:
        self.rounds.append((number, total))

    def pair_done(self, record: object) -> None:
        self.done += 1

    def note(self, message: str) -> None:
        self.notes.append(message)


def test_mesh_on_loopback_archives_every_pair(agents: dict[str, int], tmp_path: Path) -> None:
    seen = Seen()
    with open_archive(str(tmp_path / "f.db")) as archive:
        summary = FleetRunner(_fleet(agents), archive, seen).run_once()
        records = archive.records(summary.run_id)
        (run,) = archive.runs()
    assert summary.status == "done" and run.status == "done" and run.finished
    assert seen.rounds == [(k, 6) for k in range(1, 7)]  # 3 hosts: a bye, 3 rounds each way
    assert sorted((r.source, r.target) for r in records) == sorted(
        (s, t) for s in agents for t in agents if s != t)
    assert all(r.outcome == "ok" for r in records), [r.error for r in records]
    for record in records:
        assert record.result is not None and record.result.run_id == summary.run_id
        flow = record.result.summary()
        assert flow is not None and flow.receiver is not None and flow.receiver.bytes > 0
        assert record.result.remote.port == agents[record.target]
    assert seen.done == 6


def test_an_absent_agent_is_unreachable_and_the_rest_run(agents: dict[str, int],
                                                         tmp_path: Path) -> None:
    ports = {**agents, "gone": free_port()}
    seen = Seen()
    started = time.monotonic()
    with open_archive(str(tmp_path / "f.db")) as archive:
        summary = FleetRunner(_fleet(ports), archive, seen).run_once()
        records = archive.records()
    took = time.monotonic() - started
    gone = [r for r in records if "gone" in (r.source, r.target)]
    rest = [r for r in records if "gone" not in (r.source, r.target)]
    assert len(gone) == 6 and {r.outcome for r in gone} == {"unreachable"}
    assert all("agent gone (127.0.0.1) is unreachable" in str(r.error) for r in gone)
    assert len(rest) == 6 and {r.outcome for r in rest} == {"ok"}
    assert summary.count("unreachable") == 6 and any("gone" in n for n in seen.notes)
    assert took < 60, "the run must end on its own"


def test_interrupted_run_is_marked(agents: dict[str, int], tmp_path: Path) -> None:
    class CtrlCInRoundTwo(Seen):
        def round_started(self, number: int, total: int, planned: PlannedRound) -> None:
            if number == 2:
                raise KeyboardInterrupt

    fleet = _fleet({"a": agents["a"], "b": agents["b"]})
    with open_archive(str(tmp_path / "f.db")) as archive:
        with pytest.raises(KeyboardInterrupt):
            FleetRunner(fleet, archive, CtrlCInRoundTwo()).run_once()
        (run,) = archive.runs()
        assert run.status == "interrupted" and run.finished
        assert [r.outcome for r in archive.records()] == ["ok"]  # round 1 is kept


def test_next_start_keeps_the_grid_and_skips_missed_slots() -> None:
    rng = random.Random(7)
    slot, start = next_start(1000.0, 60.0, 10.0, 1020.0, rng)  # ran 20 s of a 60 s period
    assert slot == 1060.0 and 1060.0 <= start <= 1070.0
    slot, start = next_start(1000.0, 60.0, 10.0, 1130.0, rng)  # overran two periods
    assert (slot, start) == (1120.0, 1130.0)  # the latest past slot, at once; 1060 skipped
    starts = [next_start(0.0, 60.0, 30.0, 1.0, rng)[1] for _ in range(200)]
    assert min(starts) >= 60.0 and max(starts) <= 90.0 and max(starts) - min(starts) > 20


def test_forever_runs_again_on_schedule(agents: dict[str, int], tmp_path: Path) -> None:
    fleet = _fleet({"a": agents["a"], "b": agents["b"]}, duration=0.3, every='"1s"')
    stop = threading.Event()
    with open_archive(str(tmp_path / "f.db")) as archive:
        runner = FleetRunner(fleet, archive)
        thread = threading.Thread(target=runner.run_forever, args=(stop,), daemon=True)
        thread.start()
        end = time.monotonic() + 20
        while len(archive.runs()) < 3 and time.monotonic() < end:
            time.sleep(0.2)
        stop.set()
        thread.join(15)
        runs = archive.runs()
    assert not thread.is_alive() and len(runs) >= 3
    assert all(len(r.started) > 0 and r.status in ("done", "incomplete") for r in runs)


def test_a_round_never_waits_past_its_deadline(agents: dict[str, int], tmp_path: Path) -> None:
    # 6 s tests in rounds allowed 2 s: archived as timed out, the run goes on and ends.
    # (Last in the module: its tests go on in the agents for a few seconds.)
    fleet = _fleet({"a": agents["a"], "b": agents["b"]}, duration=6, round_timeout="2")
    started = time.monotonic()
    with open_archive(str(tmp_path / "f.db")) as archive:
        summary = FleetRunner(fleet, archive, busy_wait_s=0.5).run_once()
        records = archive.records()
    assert time.monotonic() - started < 5.5
    assert [r.outcome for r in records] == ["timeout", "timeout"]
    assert all("after 2 s" in str(r.error) for r in records) and summary.status == "done"


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*NETPROBE, *args], capture_output=True, text=True, timeout=timeout)


def test_fleet_commands(agents: dict[str, int], tmp_path: Path) -> None:
    ports = {**agents, "gone": free_port()}
    text = "".join(f'[agents.{n}]\naddress = "127.0.0.1"\nport = {p}\n' for n, p in ports.items())
    fleet_file = tmp_path / "loop.toml"
    fleet_file.write_text(text + '[groups.m]\ntype = "mesh"\nagents = ["a", "b", "c"]\n'
                          'spec = { duration = 0.3 }\n'
                          '[groups.l]\ntype = "list"\npairs = [["a", "gone"]]\n')
    plan = _cli("fleet", "plan", str(fleet_file), "--json")
    assert plan.returncode == 0, plan.stderr
    rounds = json.loads(plan.stdout)
    assert [(r["group"], r["of"]) for r in rounds] == [("m", 6)] * 6 + [("l", 1)]
    run = _cli("fleet", "run", str(fleet_file), "--json")
    assert run.returncode == 5, run.stderr  # one pair unreachable
    done = json.loads(run.stdout)
    outcomes = sorted((r["source"], r["target"], r["outcome"]) for r in done["records"])
    assert outcomes[0] == ("a", "b", "ok") and ("a", "gone", "unreachable") in outcomes
    assert sum(o == "ok" for *_, o in outcomes) == 6 and (tmp_path / "loop.db").exists()
    matrix = _cli("fleet", "matrix", "--archive", str(tmp_path / "loop.db"), "--json")
    assert matrix.returncode == 0, matrix.stderr
    by_group = {m["group"]: m for m in json.loads(matrix.stdout)}
    assert len(by_group["m"]["pairs"]) == 6 and all(
        p["receiver_bits_per_second"] > 0 for p in by_group["m"]["pairs"])
    status = _cli("fleet", "status", str(fleet_file), "--json")
    assert status.returncode == 5
    states = {row["agent"]: row["state"] for row in json.loads(status.stdout)}
    assert states == {"a": "idle", "b": "idle", "c": "idle", "gone": "unreachable"}
    human = _cli("fleet", "matrix", str(fleet_file))
    assert human.returncode == 0 and "unreachable" in human.stdout
    page = tmp_path / "page.html"
    # --html needs the [charts] extra (matplotlib), which a wheel's test run may not have.
    charts = importlib.util.find_spec("matplotlib") is not None
    report = _cli("report", "--archive", str(tmp_path / "loop.db"), "--group-by", "run",
                  "--json", *(["--html", str(page)] if charts else []))
    assert report.returncode == 0, report.stderr
    groups = {g["group"]: g for g in json.loads(report.stdout)}
    label = f"run={done['run_id']}"
    assert set(groups) == {label} and groups[label]["results"] == 6
    if charts:
        text = page.read_text()
        assert "Latest matrix: group m" in text and "Latest matrix: group l" in text
        assert "<td class=bad" in text and "unreachable" in text
    nothing = _cli("report")
    assert nothing.returncode == 2 and "--archive URL" in nothing.stderr


def test_fleet_file_mistakes_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[agents.a]\naddress = "127.0.0.1"\n[agents.b]\naddress = "127.0.0.2"\n'
                   '[groups.g]\ntype = "mesh"\nevery = "often"\n')
    for action in ("plan", "run", "status"):
        run = _cli("fleet", action, str(bad))
        assert run.returncode == 2
        assert run.stderr.strip().splitlines() == [
            f"netprobe: error: {bad}: groups.g.every: not a duration (e.g. 30s, 5m, 1h): "
            "'often'"], run.stderr


def test_unknown_tool_is_refused_before_anything_runs(agents: dict[str, int],
                                                      tmp_path: Path) -> None:
    fleet_file = tmp_path / "t.toml"
    fleet_file.write_text(f'[agents.a]\naddress = "127.0.0.1"\nport = {agents["a"]}\n'
                          f'[agents.b]\naddress = "127.0.0.1"\nport = {agents["b"]}\n'
                          '[groups.g]\ntype = "mesh"\nspec = { tool = "nosuchtool" }\n')
    run = _cli("fleet", "run", str(fleet_file))
    assert run.returncode == 3 and "nosuchtool" in run.stderr, run.stderr
    assert not (tmp_path / "t.db").exists() or not open_archive(str(tmp_path / "t.db")).runs()


def test_a_plugin_bug_fails_its_pair_not_the_round(tmp_path: Path) -> None:
    def broken(source: object, spec: object) -> Result:
        raise ValueError("plugin bug")

    fleet = _fleet({"a": 1, "b": 2}, round_timeout='"2s"')
    with open_archive(str(tmp_path / "f.db")) as archive:
        runner = FleetRunner(fleet, archive, third_party=broken,
                             status=lambda agent: {"state": "idle", "running": []})
        summary = runner.run_once()
    assert [r.outcome for r in summary.records] == ["failed", "failed"]
    assert all("plugin bug" in str(r.error) for r in summary.records)


def test_a_second_runner_on_one_sqlite_file_is_refused_saying_why(agents: dict[str, int],
                                                                  tmp_path: Path) -> None:
    """SQLite keeps one runner's schedule in that runner: a second `fleet run` on the same
    file would put hosts in two tests at once (each figure halved, silently). It is
    refused in one line naming the way to share a fleet; once the first is gone, a runner
    starts again (the kernel drops the lock with the process, even one killed)."""
    text = "".join(f'[agents.{n}]\naddress = "127.0.0.1"\nport = {agents[n]}\n'
                   for n in ("a", "b")) + '[groups.m]\ntype = "mesh"\nevery = "1h"\n'
    fleet = tmp_path / "one.toml"
    fleet.write_text(text + "spec = { duration = 0.3 }\n")
    db = tmp_path / "one.db"
    first = subprocess.Popen([*NETPROBE, "fleet", "run", str(fleet), "--forever", "-q",
                              "--archive", str(db)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "one.db.runner-lock").exists() or not (
                tmp_path / "one.db.runner-lock").read_text().strip():
            assert time.monotonic() < deadline and first.poll() is None, "no lock taken"
            time.sleep(0.1)
        second = _cli("fleet", "run", str(fleet), "-q", "--archive", str(db))
        assert second.returncode != 0
        assert len(second.stderr.strip().splitlines()) == 1, second.stderr
        assert f"another fleet runner (pid {first.pid})" in second.stderr
        assert "PostgreSQL archive and `fleet run --shared`" in second.stderr
    finally:
        first.kill()  # SIGKILL: no chance to let go of anything itself
        first.wait(10)
    again = _cli("fleet", "run", str(fleet), "-q", "--archive", str(db))
    assert again.returncode == 0, again.stderr
