"""Was the tester starved of CPU? What the kernel knows, read at a test's start and end.

A tester need not use a whole core to be the limit: a cgroup CPU quota stops its threads
while they still have work, and a busy neighbour on the same core keeps them waiting on a
run queue. Neither shows as a busy thread or a busy host (a client under a 0.2-core quota
ran at 36% of its free rate with its threads at 20% of a core). The kernel counts both:

- the cgroup's ``cpu.stat``: ``throttled_usec`` (cgroup v2) or ``throttled_time`` (v1, ns),
  the time its quota held it back, for the process's own cgroup and each ancestor (a quota
  set higher up is counted there);
- ``/proc/.../schedstat``: its second field is the nanoseconds a thread spent runnable but
  waiting on a run queue;
- ``/proc/stat``'s per-CPU counters, for the CPUs the threads were seen on (``/proc/.../stat``
  field 39): how busy the core a waiting thread shared was, while the host as a whole may
  have been idle (a client pinned beside a busy loop: its CPU 100% busy, the host 35-85%
  idle). It is the evidence given with a wait, not a reason on its own: a core busy with
  our own thread, or shared by a thread that only waited for the link, lost nothing.

Both are read outside the data path (a few small files at the start and end). A side is
flagged when either is at least ``STARVED_SHARE`` of the test: below that the time lost
is within the spread of repeated throughput runs, and an unloaded thread on an idle link
waits well under 1% (it sleeps until data or room comes and then finds a free core).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

import attrs

__all__ = ["DEMAND_SHARE", "STARVED_SHARE", "WATCH_EVERY_S", "ProcessWatch", "Starvation",
           "cgroup_throttled_s", "cpu_stat_files", "cpu_times", "run_wait_s",
           "starvation_warning", "task_cpu", "tasks_wait_s"]

STARVED_SHARE = 0.10
"""Share of a test's wall time, throttled or waiting for a CPU, that is flagged."""

DEMAND_SHARE = 0.5
"""A thread's wait counts only when it wanted a CPU (ran or waited) for this share of its
life or more. One that wanted less was blocked (on the link, on its pacing) the rest of
the time, so what it waited did not set the pace: on a 100 Mbit/s link with this 2-CPU
host at a load of 8, ntttcp's sender waited 9-16% of the test while it ran 1.5%, and no
byte was lost to it; a starved thread wants a CPU nearly all the time (a loopback sender
held to a 0.2-core quota or sharing its core with a busy loop: 95-100%)."""


def run_wait_s(path: str = "/proc/thread-self/schedstat") -> float | None:
    """Seconds the task of ``path`` (a schedstat file) spent waiting on a run queue."""
    try:
        fields = Path(path).read_text().split()
        return int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def task_cpu(path: str = "/proc/thread-self/stat") -> int | None:
    """The CPU the task of ``path`` (a /proc stat file) last ran on (field 39)."""
    try:
        text = Path(path).read_text()
        # The command name (field 2) may hold spaces and parentheses: count after its end.
        return int(text[text.rindex(")") + 1:].split()[36])
    except (OSError, ValueError, IndexError):
        return None


def cpu_times(path: str = "/proc/stat") -> dict[int, tuple[int, int]]:
    """Each CPU (by number; -1 for all of them): its busy and total clock ticks since boot.
    Busy is everything but idle and iowait."""
    found: dict[int, tuple[int, int]] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        name, *values = line.split()
        if not name.startswith("cpu") or len(values) < 5:
            continue
        try:
            ticks = [int(v) for v in values[:8]]  # guest time is already in user
            cpu = int(name[3:]) if name != "cpu" else -1
        except ValueError:
            continue
        found[cpu] = (sum(ticks) - ticks[3] - ticks[4], sum(ticks))
    return found


def _busy_percent(start: dict[int, tuple[int, int]], end: dict[int, tuple[int, int]],
                  cpu: int) -> float | None:
    """Percent of the time CPU ``cpu`` (-1: all) was busy between two :func:`cpu_times`."""
    if cpu not in start or cpu not in end:
        return None
    busy, total = end[cpu][0] - start[cpu][0], end[cpu][1] - start[cpu][1]
    return 100.0 * busy / total if total > 0 else None


def tasks_wait_s(pid: int) -> dict[int, tuple[float, float]]:
    """Each thread of process ``pid`` (by thread id): seconds it spent waiting on a run
    queue, and seconds it ran on a CPU."""
    found: dict[int, tuple[float, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
            found[int(tid)] = (int(fields[1]) / 1e9, int(fields[0]) / 1e9)
        except (OSError, ValueError, IndexError):
            continue
    return found


def _cgroup_mounts() -> tuple[str | None, str | None]:
    """The cgroup v2 mount point and the v1 mount holding the cpu controller, if any."""
    v2 = v1 = None
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        left, _, right = line.partition(" - ")
        parts, tail = left.split(), right.split()
        if len(parts) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup2" and v2 is None:
            v2 = parts[4]
        elif tail[0] == "cgroup" and "cpu" in tail[2].split(",") and v1 is None:
            v1 = parts[4]
    return v2, v1


def cpu_stat_files(pid: str = "self") -> list[Path]:
    """The ``cpu.stat`` files that count throttling of process ``pid``: its cgroup's and
    each ancestor's (v1 cpu controller, else v2 with the cpu controller)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return []
    v2, v1 = _cgroup_mounts()
    where: tuple[str, str] | None = None
    for line in lines:
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if v1 and "cpu" in controllers.split(","):
            where = (v1, path)
            break
        if v2 and controllers == "" and line.startswith("0:"):
            where = (v2, path)
    if where is None:
        return []
    mount, path = where
    files = []
    node = Path(mount + path) if path != "/" else Path(mount)
    while True:
        stat = node / "cpu.stat"
        if stat.is_file():
            files.append(stat)
        if node == Path(mount) or node.parent == node:
            break
        node = node.parent
    return files


def cgroup_throttled_s(files: Iterable[Path]) -> dict[str, tuple[float, int, int]]:
    """Each of ``files`` (cpu.stat, by path): seconds its cgroup was throttled, the periods
    it was throttled in, and the periods it ran in."""
    found: dict[str, tuple[float, int, int]] = {}
    for stat in files:
        try:
            text = stat.read_text()
        except OSError:
            continue
        values = {}
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                values[key] = int(value)
        seconds = (values["throttled_usec"] / 1e6 if "throttled_usec" in values
                   else values.get("throttled_time", 0) / 1e9)
        if "nr_throttled" in values:
            found[str(stat)] = (seconds, values["nr_throttled"], values.get("nr_periods", 0))
    return found


@attrs.define
class Starvation:
    """CPU starvation of one side over a test: the cgroups' throttling, and the run-queue
    wait of the threads that did its work, each read at the start and the end."""

    files: list[Path] = attrs.field(factory=list)
    throttled_start: dict[str, tuple[float, int, int]] = attrs.field(factory=dict)
    throttled_end: dict[str, tuple[float, int, int]] = attrs.field(factory=dict)
    waits: list[tuple[float, float, float]] = attrs.field(factory=list)
    """Each working thread: (seconds it waited for a CPU, seconds it lived for, seconds
    it ran on a CPU)."""
    ran_on: list[frozenset[int]] = attrs.field(factory=list)
    """The CPUs each thread of ``waits`` was seen on (same order; empty where unknown)."""
    cpus_start: dict[int, tuple[int, int]] = attrs.field(factory=dict)
    cpus_end: dict[int, tuple[int, int]] = attrs.field(factory=dict)

    @classmethod
    def begin(cls, pid: str = "self") -> Starvation:
        """Read the cgroups of process ``pid`` and the CPUs' counters now (the start)."""
        files = cpu_stat_files(pid)
        return cls(files=files, throttled_start=cgroup_throttled_s(files),
                   cpus_start=cpu_times())

    def end(self) -> None:
        """Read the cgroups and the CPUs' counters again (the end of the test)."""
        self.throttled_end = cgroup_throttled_s(self.files)
        self.cpus_end = cpu_times()

    def throttling(self, wall_s: float) -> tuple[float, int, int]:
        """The most throttled of the cgroups over the test: the share of ``wall_s`` it was
        throttled, the periods it was throttled in and the periods it ran in."""
        most = (0.0, 0, 0)
        for key, (seconds, throttled, periods) in self.throttled_start.items():
            if key not in self.throttled_end or wall_s <= 0:
                continue
            end_s, end_throttled, end_periods = self.throttled_end[key]
            seen = (min(1.0, (end_s - seconds) / wall_s), end_throttled - throttled,
                    end_periods - periods)
            most = max(most, seen, key=lambda t: (t[1], t[0]))
        return most

    def _most_waiting(self) -> int | None:
        """Index in ``waits`` of the thread that waited the largest share of its life, of
        those that wanted a CPU (ran or waited) for ``DEMAND_SHARE`` of it or more."""
        wanting = [(wait / wall, i) for i, (wait, wall, ran) in enumerate(self.waits)
                   if wall > 0 and (wait + ran) >= DEMAND_SHARE * wall]
        return max(wanting)[1] if wanting else None

    def wait_share(self) -> float:
        """The largest share of its life a working thread spent waiting for a CPU, of the
        threads that wanted one (ran or waited) for ``DEMAND_SHARE`` of it or more."""
        most = self._most_waiting()
        if most is None:
            return 0.0
        wait, wall, _ = self.waits[most]
        return min(1.0, wait / wall)

    def busiest_cpu(self) -> tuple[int, float, float | None] | None:
        """Of the CPUs the most-waiting thread was seen on, the busiest over the test: its
        number, its busy percent, and the whole host's idle percent; None if unknown."""
        most = self._most_waiting()
        if most is None or most >= len(self.ran_on) or not self.cpus_end:
            return None
        seen = [(busy, cpu) for cpu in self.ran_on[most]
                if (busy := _busy_percent(self.cpus_start, self.cpus_end, cpu)) is not None]
        if not seen:
            return None
        busy, cpu = max(seen)
        host = _busy_percent(self.cpus_start, self.cpus_end, -1)
        return cpu, busy, None if host is None else 100.0 - host

    def warning(self, wall_s: float, who: str) -> str | None:
        """The warning for ``who`` (e.g. "tester") when it was starved."""
        share, throttled, periods = self.throttling(wall_s)
        return starvation_warning(share, self.wait_share(), who, throttled, periods,
                                  self.busiest_cpu())


def starvation_warning(throttled: float, waited: float, who: str,
                       throttled_periods: int = 0, periods: int = 0,
                       core: tuple[int, float, float | None] | None = None
                       ) -> str | None:
    """The warning for ``who`` whose cgroup was throttled a ``throttled`` share of the test
    (in ``throttled_periods`` of ``periods`` quota periods) and whose most-waiting data
    thread waited for a CPU a ``waited`` share of its run; None below the limit. ``core``
    (:meth:`Starvation.busiest_cpu`), where known, is given as the evidence of a wait:
    the CPU the thread shared, how busy it was, and how idle the host was meanwhile.

    A throttled thread stays runnable, so the kernel counts its time held by the quota as
    run-queue wait too; and some kernels (6.18's per-task throttling) count in
    ``throttled_time`` only part of it (0.26 s of a 1 s busy loop at 0.2 of a core, whose
    wait was 0.97 s). So when the cgroup was throttled in a tenth or more of its periods,
    the wait is put down to the quota, and the larger of the two shares is given."""
    limit = "the tester's CPU, not the path, may have set this throughput"
    by_quota = throttled_periods > 0 and throttled_periods * 10 >= max(periods, 1)
    if by_quota and max(throttled, waited) >= STARVED_SHARE:
        return (f"{who} CPU-starved: throttled by its cgroup's CPU quota for "
                f"{100 * max(throttled, waited):.0f}% of the test (in {throttled_periods} of "
                f"{periods} quota periods); {limit}")
    if throttled >= STARVED_SHARE:
        return (f"{who} CPU-starved: throttled by its cgroup's CPU quota for "
                f"{100 * throttled:.0f}% of the test; {limit}")
    if waited >= STARVED_SHARE:
        return (f"{who} CPU-starved: a data thread waited for a CPU {100 * waited:.0f}% of "
                f"the time (another process shares its core{_core_evidence(core)}); {limit}")
    return None


def _core_evidence(core: tuple[int, float, float | None] | None) -> str:
    """': CPU 0, where it ran, was 100% busy while the host was 48% idle', or ''."""
    if core is None:
        return ""
    cpu, busy, idle = core
    host = "" if idle is None else f" while the host was {idle:.0f}% idle"
    return f": CPU {cpu}, where it ran, was {busy:.0f}% busy{host}"


WATCH_EVERY_S = 0.2
"""How often a driven tool's threads are looked at (a few small /proc files each time)."""


@attrs.define
class ProcessWatch:
    """The CPU starvation of another process (a driven tool) while it runs: its cgroup's
    throttling from its start to the end of the run, and the run-queue wait of each of its
    threads from when it was first seen to when it was last seen (a thread's schedstat is
    gone once it exits, so it is looked at while the run is waited for)."""

    pid: int
    cgroups: Starvation
    first: dict[int, tuple[float, float, float]] = attrs.field(factory=dict)
    last: dict[int, tuple[float, float, float]] = attrs.field(factory=dict)
    seen_on: dict[int, set[int]] = attrs.field(factory=dict)
    """Each thread: the CPUs it was seen on, one look at a time."""
    started: float = attrs.field(factory=time.monotonic)
    looked: float = 0.0

    @classmethod
    def begin(cls, pid: int) -> ProcessWatch:
        """Watch process ``pid`` from now."""
        watch = cls(pid=pid, cgroups=Starvation.begin(str(pid)))
        watch.sample()
        return watch

    def sample(self, every_s: float = 0.0) -> None:
        """Look at the process's threads now (at most once per ``every_s``)."""
        now = time.monotonic()
        if now - self.looked < every_s:
            return
        self.looked = now
        for tid, (wait, ran) in tasks_wait_s(self.pid).items():
            self.first.setdefault(tid, (wait, now, ran))
            self.last[tid] = (wait, now, ran)
            cpu = task_cpu(f"/proc/{self.pid}/task/{tid}/stat")
            if cpu is not None:
                self.seen_on.setdefault(tid, set()).add(cpu)

    def warning(self, who: str) -> str | None:
        """The warning for ``who`` (e.g. "nuttcp client") when it was starved."""
        if not self.cgroups.throttled_end and not self.cgroups.cpus_end:
            self.cgroups.end()
        self.cgroups.waits = [
            (self.last[tid][0] - wait, self.last[tid][1] - at, self.last[tid][2] - ran)
            for tid, (wait, at, ran) in self.first.items()]
        self.cgroups.ran_on = [frozenset(self.seen_on.get(tid, ())) for tid in self.first]
        wall = max((at for _, at, _ in self.last.values()), default=self.started) - self.started
        return self.cgroups.warning(wall, who)
