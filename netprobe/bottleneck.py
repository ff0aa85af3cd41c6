"""Was the tester the bottleneck? One rule for every tool, native or driven.

A test tool that runs out of CPU reports its own limit as the path's. So wherever a side's
CPU is known, a result whose sender or receiver was CPU-bound says so in a warning naming
that side. The rule, for each side of each direction:

- its busiest data thread (``CpuUsage.max_thread_percent``) used ``BUSY_PERCENT`` or more
  of one core; where a tool reports only its whole process (nuttcp's %TX/%RX, iperf3's
  ``cpu_utilization_percent``, ntttcp's ``cpu busy``), that process's total stands in for
  it, because a thread cannot use more than its process;
- or its host had less than ``IDLE_PERCENT`` of its cores idle: whatever our threads
  needed, there was no CPU left to give them.

A flow that reached the rate the spec asked for (``--bitrate``, within
``RATE_REACHED``) was limited by that rate, not by CPU, however busy its threads were
(nuttcp spins to pace UDP: 99% %TX at exactly 100 Mbit/s); it gets no warning.

nuttcp paces by busy-waiting: at any set rate its sender spins on a whole core between
writes (99% of a core at 10 Mbit/s with nuttcp 6.1.2). So a nuttcp sender at a set rate
of ``BUSY_WAIT_RATE`` or less per stream (far below what a core sends) that falls short of
the rate gets a warning that says so, not one that calls its CPU the limit. Whether or not
it reached the rate, a sender whose CPU is far above what sending at that rate costs
(``PACING_EXCESS`` times ``SEND_PER_CORE``'s share, and ``PACING_PERCENT`` or more) gets a
note that names its CPU figure as the pacing loop, so that it is not read as the cost of
sending nor as a starved tester; and a run-queue wait of such a sender is not called
starvation (a spinning pacer wants a core the whole test, and waits whenever it shares
one, which says nothing about what it sent). Its cgroup's quota throttling still is.

The starvation warnings (:mod:`netprobe.starvation`: a cgroup quota, a run queue) go
the same way: dropped when every flow reached the rate asked, since the rate held it.

The run road applies :func:`with_cpu_warnings` once to every Result a tool gives
(:func:`netprobe.session.checked`: run, failed run's partial, ``netprobe parse``), so a
plugin need not; calling it again adds nothing (each warning is added once).
"""

from __future__ import annotations

import attrs

from netprobe.schema import Cpu, FlowSummary, Result, SideSummary

__all__ = ["BUSY_PERCENT", "BUSY_WAIT_RATE", "IDLE_PERCENT", "PACING_EXCESS",
           "PACING_PERCENT", "RATE_REACHED", "SEND_PER_CORE", "STARVED", "cpu_warnings",
           "pacing_notes", "side_warning", "with_cpu_warnings"]

BUSY_PERCENT = 90.0
"""A data thread at or above this share of one core may be what limited the figure."""
IDLE_PERCENT = 5.0
"""A host with less than this share of its cores idle had no CPU left to give."""

RATE_REACHED = 0.97
"""Share of the asked rate a flow must reach to count as limited by that rate."""

BUSY_WAIT_RATE = 1e9
"""A set rate per stream at or below which a nuttcp sender's busy CPU is its pacing loop:
nuttcp sent 7-17 Gbit/s on one core on loopback here, so a rate this far below is not
what a spinning core is short of."""

SEND_PER_CORE = 7e9
"""Bits per second one core sends (the least nuttcp sent on one core on loopback here)."""
PACING_EXCESS = 3.0
PACING_PERCENT = 10.0
"""A paced nuttcp sender using ``PACING_EXCESS`` times what sending at its rate costs (its
rate's share of ``SEND_PER_CORE``), and at least ``PACING_PERCENT`` of a core, is spinning:
at 10 Mbit/s sending costs about 0.1% of a core, and nuttcp 6.1.2 used 99% on an idle
host (20-27% on this 2-CPU host at a load of 8, sharing its core)."""

PACED_WAIT = "waited for a CPU"
"""The mark of a starvation warning given for a run-queue wait."""

STARVED = " CPU-starved: "
"""The mark of a warning from :mod:`netprobe.starvation`."""

_WHERE = {
    ("client_to_server", "sender"): "client",
    ("client_to_server", "receiver"): "server",
    ("server_to_client", "sender"): "server",
    ("server_to_client", "receiver"): "client",
}


def side_warning(cpu: Cpu | None, role: str, where: str) -> str | None:
    """The warning for one side whose CPU is ``cpu``, or None when it was not the limit."""
    if cpu is None:
        return None
    limit = "the tester's CPU, not the path, may have set this throughput"
    process = cpu.process
    if process is not None:
        thread = process.max_thread_percent
        if thread is not None and thread >= BUSY_PERCENT:
            return (f"{role} ({where}) CPU-bound: its busiest data thread used {thread:.0f}% "
                    f"of a core; {limit}")
        total = process.total_percent
        if thread is None and total is not None and total >= BUSY_PERCENT:
            return f"{role} ({where}) CPU-bound: its process used {total:.0f}% of a core; {limit}"
    host = cpu.host
    if host is not None and host.idle_percent is not None and host.idle_percent < IDLE_PERCENT:
        return (f"{role} ({where}) CPU-bound: its host had {host.idle_percent:.0f}% idle; "
                f"{limit}")
    return None


def cpu_warnings(result: Result) -> list[str]:
    """A warning for every side of every direction whose CPU may have been the limit."""
    found = []
    for flow in result.summaries:
        if _reached_the_asked_rate(result, flow):
            continue
        sides: tuple[tuple[str, SideSummary | None], ...] = (
            ("sender", flow.sender), ("receiver", flow.receiver))
        for role, side in sides:
            if side is None:
                continue
            where = _WHERE.get((flow.direction, role), "")
            warning = side_warning(side.cpu, role, f"{flow.direction}, {where}")
            if warning is not None and role == "sender" and _busy_wait_paced(result):
                warning = (f"{role} ({flow.direction}, {where}): nuttcp paces by "
                           f"busy-waiting, so its sender uses a whole core at any set rate "
                           f"({warning.split(': ', 1)[1].split(';')[0]}); that is its "
                           "pacing loop, not a CPU limit")
            if warning is not None:
                found.append(warning)
    return found


def pacing_notes(result: Result) -> list[str]:
    """A note for each busy-wait-paced nuttcp sender whose CPU figure is its pacing loop."""
    if not _busy_wait_paced(result):
        return []
    rate = (result.spec.rate_bits_per_second or 0.0) * result.spec.streams
    cost = 100.0 * rate / SEND_PER_CORE  # percent of a core that sending at the rate takes
    found = []
    for flow in result.summaries:
        cpu = flow.sender.cpu if flow.sender else None
        used = _process_percent(cpu)
        if used is None or used < max(PACING_PERCENT, PACING_EXCESS * cost):
            continue
        where = _WHERE.get((flow.direction, "sender"), "")
        found.append(f"sender ({flow.direction}, {where}): nuttcp paces by busy-waiting, so "
                     f"its {used:.0f}% of a core is its pacing loop (sending at the rate set "
                     f"takes about {cost:.1f}%), not a starved tester nor a CPU limit")
    return found


def _process_percent(cpu: Cpu | None) -> float | None:
    """The busiest data thread's percent of a core, else its process's."""
    process = cpu.process if cpu else None
    if process is None:
        return None
    return process.max_thread_percent if process.max_thread_percent is not None \
        else process.total_percent


def _paced_wait(result: Result, warning: str) -> bool:
    """True for a run-queue-wait starvation warning of a busy-wait-paced nuttcp sender."""
    if not _busy_wait_paced(result) or STARVED not in warning or PACED_WAIT not in warning:
        return False
    senders = {_WHERE.get((f.direction, "sender")) for f in result.summaries}
    return any(warning.startswith(f"nuttcp {who}{STARVED}") for who in senders if who)


def _reached_the_asked_rate(result: Result, flow: FlowSummary) -> bool:
    rate = result.spec.rate_bits_per_second
    measured = flow.receiver or flow.sender
    if not rate or measured is None:
        return False
    return measured.bits_per_second >= RATE_REACHED * rate * result.spec.streams


def _busy_wait_paced(result: Result) -> bool:
    """True for nuttcp sending at a set rate far below what a core can send."""
    rate = result.spec.rate_bits_per_second
    return (result.tool.name == "nuttcp" and rate is not None
            and 0 < rate <= BUSY_WAIT_RATE)


def with_cpu_warnings(result: Result) -> Result:
    """``result`` with :func:`pacing_notes` and :func:`cpu_warnings` added to its warnings
    (each only once), without starvation warnings when every flow reached the rate asked,
    and without a busy-wait-paced nuttcp sender's run-queue wait called starvation."""
    notes = pacing_notes(result)
    # A sender whose CPU a note already puts down to its pacing loop needs no other word.
    noted = tuple(n.split(": ", 1)[0] for n in notes)
    kept = tuple(w for w in result.warnings if not _paced_wait(result, w)
                 and (w in notes or not w.startswith(noted)))
    if result.summaries and all(_reached_the_asked_rate(result, f) for f in result.summaries):
        kept = tuple(w for w in kept if STARVED not in w)
    bound = [w for w in cpu_warnings(result) if not w.startswith(noted)]
    new = [w for w in [*notes, *bound] if w not in kept]
    if not new and kept == result.warnings:
        return result
    return attrs.evolve(result, warnings=(*kept, *new))
