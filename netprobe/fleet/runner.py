"""Run a fleet: round after round, each round's pairs at the same time, through the agents.

Before a round, every host in it is asked for its status (a short, bounded request): a
host that does not answer is unreachable for that round, its pairs are archived as such
and the others go on; a host busy with someone else's test is waited for, a bounded
while, then tried (its agent refuses with "busy" if it still has no free slot). Each pair
is a third-party test asked of the source's agent; its record goes to the archive the
moment it ends, so a runner that is killed loses at most the tests in flight. A round
ends when its last test does or when its deadline passes (the tests still running are
archived as timed out): no round waits forever. Nothing here prints; the CLI is handed
progress events.

A host declared with ``iperf3_port`` runs a stock ``iperf3 -s``, not an agent: it is not
asked for a status, and its pairs are run by the source's agent with the native engine
speaking iperf3's protocol to that port. The schedule keeps it in one test at a time, as
every host; a test refused because someone else's test holds it is archived ``busy``.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import random
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Callable, Protocol

import attrs

from netprobe.archives import Archive, ArchiveError, PairRecord, Run
from netprobe.engine.iperf3.client import BUSY_WORDS
from netprobe.engine.protocol import DEFAULT_PORT
from netprobe.errors import NetprobeError, SpecError, TestFailed
from netprobe.fleet.config import BYTES_ROUND_S as BYTES_ROUND_S  # re-exported: a round's
from netprobe.fleet.config import ROUND_MARGIN_S as ROUND_MARGIN_S  # limit is the group's
from netprobe.fleet.config import Agent, Fleet, Group
from netprobe.fleet.schedule import PlannedRound, next_start, plan, run_number
from netprobe.host import utc_now_iso
from netprobe.plugin import Tool
from netprobe.reporting import NullReporter
from netprobe.schema import Result, TestSpec


@contextlib.contextmanager
def one_runner(archive: Archive | None) -> Iterator[None]:
    """Hold a SQLite archive's runner lock for the block (``FILE.runner-lock`` beside it,
    an flock the kernel releases when the process ends, however it ends): a second runner
    on the same file is refused, saying so. SQLite keeps one runner's schedule in that
    runner alone, so a second would put hosts in two tests at once and halve both figures
    without a word. Several runners share a fleet through PostgreSQL (``--shared``). Any
    other archive, or a file that cannot be locked (a read-only mount): nothing held."""
    from netprobe.archives.sqlite import SqliteArchive, path_of

    if not isinstance(archive, SqliteArchive):
        yield
        return
    path = os.path.abspath(path_of(archive.url)) + ".runner-lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield  # nowhere to write the lock: nor the results; the archive says so
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise ArchiveError(
                f"archive {archive.url}: another fleet runner{_pid(holder)} is running on "
                "this SQLite file; one SQLite archive keeps one runner (a second would put "
                "hosts in two tests at once): for several runners use a PostgreSQL archive "
                "and `fleet run --shared`") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # the lock goes with the descriptor


def _pid(text: str) -> str:
    return f" (pid {text})" if text.isdigit() else ""


BUSY_WAIT_S = 30.0
"""How long a round waits for a host busy with a test that is not the fleet's."""
STATUS_TIMEOUT_S = 3.0
"""How long a host has to answer the status request before it counts as unreachable."""

ThirdParty = Callable[[Agent, TestSpec], Result]
Status = Callable[[Agent], dict]


class Progress(Protocol):
    """What a fleet run tells the one watching it (the CLI draws a bar from it)."""

    def round_started(self, number: int, total: int, planned: PlannedRound) -> None:
        """Round ``number`` of ``total`` begins."""

    def pair_done(self, record: PairRecord) -> None:
        """One pair's record has been archived."""

    def note(self, message: str) -> None:
        """Something worth a line (an unreachable host, a wait)."""

    def fleet_done(self, done: int, total: int) -> None:
        """A shared run's pairs done by all its runners, of ``total``."""


class QuietProgress:
    """Progress that nobody watches."""

    def round_started(self, number: int, total: int, planned: PlannedRound) -> None:
        """Ignore it."""

    def pair_done(self, record: PairRecord) -> None:
        """Ignore it."""

    def note(self, message: str) -> None:
        """Ignore it."""

    def fleet_done(self, done: int, total: int) -> None:
        """Ignore it."""


RECORDS_KEPT = 5_000
"""How many of a run's records its summary holds, and how many more that are not ok: a
1,000-agent mesh is 999,000 records, each with its Result, and the archive has them all
already; past that the summary only counts."""


@attrs.frozen
class RunSummary:
    """What one fleet run did."""

    run_id: str
    """The run's id (the archive's and the results' ``run_id``)."""
    records: tuple[PairRecord, ...]
    """The pairs' records in the order they ended: the first RECORDS_KEPT, then only those
    not ok (RECORDS_KEPT more at most); ``counts`` has them all."""
    status: str
    """done, interrupted or failed."""
    counts: Mapping[str, int] = attrs.field(factory=dict)
    """How many records of each outcome the run archived, kept or not."""

    def count(self, outcome: str) -> int:
        """How many records have ``outcome``."""
        return self.counts.get(outcome, 0)

    @property
    def total(self) -> int:
        """How many records the run made."""
        return sum(self.counts.values())


def agent_third_party(source: Agent, spec: TestSpec, target: Agent | None = None) -> Result:
    """Ask ``source``'s agent to run ``spec``, through the one run pipeline
    (:func:`netprobe.session.run_spec`, a third-party test from ``source``); ``target``'s
    agent is reached on its own port (the source's agent uses its own secret there)."""
    from netprobe.engine.auth import load_secret
    from netprobe.session import AgentAccess, run_spec

    access = AgentAccess(secret=load_secret(source.secret_file), port=source.port,
                         target_port=target.port if target is not None else None)
    stock = target is not None and target.iperf3_port is not None
    tool = iperf3_client() if stock else tool_for(spec.tool)
    return run_spec(tool, spec, NullReporter(), from_host=source.address, agent=access)


@functools.cache
def iperf3_client() -> Tool:
    """The native engine in its iperf3 mode: what a source's agent runs against a stock
    ``iperf3 -s`` (the mode travels with the third-party request)."""
    from netprobe.registry import make_tool

    return make_tool("native", {"iperf3": True})




@functools.cache
def tool_for(name: str) -> Tool:
    """The tool plugin called ``name`` (ToolNotFound if none is installed)."""
    from netprobe.registry import make_tool

    return make_tool(name)


def check_groups(groups: Sequence[Group]) -> None:
    """Before anything runs: SpecError for a spec option a group's tool cannot honour,
    ToolNotFound for a tool that is not installed (the agents probe their own tools)."""
    from netprobe.session import prepare

    for group in groups:
        try:
            spec = attrs.evolve(group.spec, host="target")
            prepare(tool_for(group.spec.tool), spec, from_host="source")
            if group.iperf3_targets:  # and as its stock iperf3 targets are tested
                prepare(iperf3_client(), spec, from_host="source")
        except SpecError as exc:
            raise SpecError(f"groups.{group.name}.spec: {exc}") from None


def agent_status(agent: Agent) -> dict:
    """The agent's status reply (TestFailed when it does not answer in time)."""
    if agent.iperf3_port is not None:
        # A stock iperf3 server has no status to ask (a probing connection would even be
        # taken as a client): it is tried by its test, and says busy then if it is.
        return {"state": "iperf3", "running": []}
    from netprobe.engine.auth import load_secret
    from netprobe.farend import agent_status as status

    return status(agent.address, load_secret(agent.secret_file), agent.port, STATUS_TIMEOUT_S)


def pair_spec(group: Group, target: Agent) -> TestSpec:
    """The group's spec aimed at ``target``: the native engine is the target's agent itself,
    so it goes to the agent's port; a driven tool's far end is started by that agent; a
    stock iperf3 server is tested on its own port."""
    if target.iperf3_port is not None:
        return attrs.evolve(group.spec, host=target.address, port=target.iperf3_port)
    port = target.port if group.spec.tool == "native" and target.port != DEFAULT_PORT else None
    return attrs.evolve(group.spec, host=target.address, port=port)


@attrs.define
class FleetRunner:
    """Runs a fleet's rounds; archive, progress and the agent calls can be substituted."""

    fleet: Fleet
    archive: Archive | None = None
    progress: Progress = attrs.field(factory=QuietProgress)
    third_party: ThirdParty | None = None
    """None: the agents themselves (:func:`agent_third_party`, told the target's port)."""
    status: Status = agent_status
    busy_wait_s: float = BUSY_WAIT_S
    clock: Callable[[], float] = time.monotonic

    def run_once(self, groups: Sequence[str] | None = None, run: int | None = None
                 ) -> RunSummary:
        """Every round of the chosen groups once (``run``: the run's number, which a random
        group's peers depend on; default: each group's slot now); KeyboardInterrupt ends
        the run cleanly (what has ended is archived, the run is marked interrupted) and
        propagates."""
        rounds = plan(self.fleet, groups, run)
        check_groups([g for g in self.fleet.groups if groups is None or g.name in groups])
        run_id = uuid.uuid4().hex
        records: list[PairRecord] = []
        counts: dict[str, int] = {}
        if self.archive is not None:
            self.archive.start_run(Run(run_id, self.fleet.path, utc_now_iso(), len(rounds),
                                       rounds.tests))
        status = "interrupted"
        try:
            for number, planned in enumerate(rounds, start=1):
                self.progress.round_started(number, len(rounds), planned)
                for record in RoundRun(self, run_id, planned).run():
                    _tally(record, records, counts)
            status = "done"
        except ArchiveError:
            status = "failed"  # the archive failed (disk full, read-only): not an interrupt
            raise
        finally:
            if self.archive is not None:
                self._finish(run_id, status)
        return RunSummary(run_id, tuple(records), status, counts)

    def _finish(self, run_id: str, status: str) -> None:
        """Record the run's end; when the archive is what failed, it may refuse this too
        (a full disk): the run's row then keeps the "incomplete" it was started with, and
        the error says so (an interrupt goes on as it was)."""
        assert self.archive is not None
        try:
            self.archive.finish_run(run_id, utc_now_iso(), status)
        except ArchiveError as exc:
            if status == "done":
                raise
            if status == "failed":
                raise ArchiveError(f"{exc}; the run's end could not be recorded either: "
                                   f"run {run_id} reads 'incomplete'") from None

    def run_forever(self, stop: threading.Event, rng: random.Random | None = None,
                    run_one: Callable[[list[str], int], object] | None = None) -> None:
        """Keep every group's schedule (``every``, with a random ``slip``) until ``stop``.
        Groups never overlap: one that falls due while another runs starts right after it;
        starts missed while a run overran are skipped, not piled up. ``run_one(groups,
        number)`` runs one (default: :meth:`run_once`; a shared runner joins the shared
        run of that number instead)."""
        rng = rng or random.Random()
        if run_one is None:
            def run_one(names: list[str], number: int) -> object:
                return self.run_once(names, run=number)
        now = self.clock()
        due = {g.name: now + rng.uniform(0, g.slip_s) for g in self.fleet.groups}
        slot = dict.fromkeys(due, now)
        # Each run's number follows its slot (one more per period, the skipped ones
        # counted), not the clock at its slipped start: two starts slipped across a
        # boundary of the epoch grid would share a number, and a random group would test
        # the same peers twice.
        number = {g.name: run_number(g) for g in self.fleet.groups}
        while not stop.is_set():
            name = min(due, key=lambda n: due[n])
            if stop.wait(max(0.0, due[name] - self.clock())):
                return
            run_one([name], number[name])
            group = next(g for g in self.fleet.groups if g.name == name)
            following, due[name] = next_start(slot[name], group.every_s, group.slip_s,
                                              self.clock(), rng)
            number[name] += max(1, round((following - slot[name]) / group.every_s))
            slot[name] = following

    def test_pair(self, group: Group, source: str, target: str
                  ) -> tuple[str, str, str | None, Result | None]:
        """Run one pair's test through the source's agent: when it started, its outcome
        (ok or failed), why not ok, and its result (partial, or None, when it failed)."""
        started = utc_now_iso()
        spec = pair_spec(group, self.agent(target))
        try:
            result: Result | None = (
                agent_third_party(self.agent(source), spec, self.agent(target))
                if self.third_party is None else self.third_party(self.agent(source), spec))
            outcome, error = "ok", None
            if result is not None and result.status != "ok":
                outcome = "failed"
                error = result.errors[0] if result.errors else f"test {result.status}"
        except TestFailed as exc:
            result = exc.partial if isinstance(exc.partial, Result) else None
            outcome, error = "failed", str(exc)
            if self.agent(target).iperf3_port is not None and BUSY_WORDS in error:
                result, outcome = None, "busy"  # no test ran: no figure to keep
        except (NetprobeError, OSError) as exc:
            result, outcome, error = None, "failed", str(exc) or type(exc).__name__
        except Exception as exc:  # a plugin's own bug fails its pair, not the whole round
            result, outcome, error = None, "failed", f"internal error: {exc!r}"
        return started, outcome, error, result

    def agent(self, name: str) -> Agent:
        """The fleet's agent called ``name``."""
        return self.fleet.agents[name]

    def group(self, name: str) -> Group:
        """The fleet's group called ``name``."""
        return next(g for g in self.fleet.groups if g.name == name)


def _tally(record: PairRecord, kept: list[PairRecord], counts: dict[str, int]) -> None:
    """Count ``record``; keep it while fewer than RECORDS_KEPT are kept, or, not ok, while
    fewer than RECORDS_KEPT not-ok records were kept past them."""
    counts[record.outcome] = counts.get(record.outcome, 0) + 1
    if len(kept) < RECORDS_KEPT or (record.outcome != "ok"
                                    and len(kept) < 2 * RECORDS_KEPT):
        kept.append(record)


class RoundRun:
    """One round: check the hosts, start every pair, archive each as it ends, stop waiting
    at the deadline."""

    def __init__(self, runner: FleetRunner, run_id: str, planned: PlannedRound) -> None:
        self.runner = runner
        self.run_id = run_id
        self.planned = planned
        self.group = runner.group(planned.group)
        self.records: list[PairRecord] = []
        self._written: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._failure: ArchiveError | None = None  # an archive write a pair thread lost

    def run(self) -> list[PairRecord]:
        """Run the round; every pair's record, in the order they ended."""
        down = self._unreachable()
        threads = []
        for source, target in self.planned.pairs:
            if source in down or target in down:
                host = source if source in down else target
                self._keep(source, target, utc_now_iso(), "unreachable", down[host])
                continue
            thread = threading.Thread(target=self._pair, args=(source, target), daemon=True,
                                      name=f"np-fleet-{source}-{target}")
            thread.start()
            threads.append(thread)
        deadline = self.runner.clock() + self._timeout()
        for thread in threads:
            thread.join(max(0.0, deadline - self.runner.clock()))
        for source, target in self.planned.pairs:  # still running at the deadline
            self._keep(source, target, utc_now_iso(), "timeout",
                       f"the round ended after {self._timeout():g} s with the test still running")
        if self._failure is not None:
            raise self._failure
        return self.records

    def _timeout(self) -> float:
        return self.group.round_limit_s()  # ROUND_MARGIN_S past the test, BYTES_ROUND_S

    def _unreachable(self) -> dict[str, str]:
        """Hosts of the round that do not answer (name -> why), asked all at once; hosts
        busy with another test are waited for, up to busy_wait_s."""
        hosts = sorted({h for pair in self.planned.pairs for h in pair})
        answers: dict[str, object] = {}
        threads = [threading.Thread(target=self._ask, args=(h, answers), daemon=True)
                   for h in hosts]
        for thread in threads:
            thread.start()
        deadline = self.runner.clock() + STATUS_TIMEOUT_S * 2 + self.runner.busy_wait_s
        for thread in threads:  # one deadline for all: hosts that hang do not add up
            thread.join(max(0.0, deadline - self.runner.clock()))
        down = {}
        for host in hosts:
            answer = answers.get(host, "did not answer the status request in time")
            if isinstance(answer, str):
                agent = self.runner.agent(host)
                down[host] = f"agent {host} ({agent.address}) is unreachable: {answer}"
                self.runner.progress.note(down[host])
        return down

    def _ask(self, host: str, answers: dict[str, object]) -> None:
        agent = self.runner.agent(host)
        end = self.runner.clock() + self.runner.busy_wait_s
        try:
            status = self.runner.status(agent)
            while status.get("state") == "busy" and self.runner.clock() < end:
                time.sleep(0.5)
                status = self.runner.status(agent)
        except (NetprobeError, OSError) as exc:
            answers[host] = str(exc)
            return
        answers[host] = status

    def _pair(self, source: str, target: str) -> None:
        started, outcome, error, result = self.runner.test_pair(self.group, source, target)
        try:
            self._keep(source, target, started, outcome, error, result)
        except ArchiveError as exc:  # raised in the round's own thread once all have ended
            self._failure = exc

    def _keep(self, source: str, target: str, started: str, outcome: str,
              error: str | None, result: Result | None = None) -> None:
        """Archive the pair's record, once: whoever comes first (the test's end, or the
        deadline) writes it."""
        with self._lock:
            if (source, target) in self._written:
                return
            self._written.add((source, target))
        if result is not None:
            result = attrs.evolve(result, run_id=self.run_id)
        record = PairRecord(self.run_id, self.planned.group, self.planned.index, source, target,
                        started, outcome, error, result)
        if self.runner.archive is not None:
            self.runner.archive.add(record)
        with self._lock:
            self.records.append(record)
        self.runner.progress.pair_done(record)
