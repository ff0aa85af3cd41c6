#!/usr/bin/env python3
"""Soak: does a long-running ``netprobe server`` stay flat? Memory, threads, open files.

Starts one ``netprobe server`` on loopback and runs a bounded number of short mixed tests
against it, in turn: native TCP, UDP, reverse, bidir and 8 streams, and a far end through
the agent for every driven tool installed (iperf3, iperf2, nuttcp, ntttcp). Every
``--every`` tests it prints the server's resident memory (VmRSS), thread count and open
file descriptors, read from /proc once the server is idle again; at the end, the first and
last figures side by side.

    flock /tmp/netprobe-heavy.lock python bench/hard_soak.py [--tests 1000] [--every 100]
        [--parallel 2] [--native-seconds 0.2] [--driven-seconds 0.5]

Bounded in count (``--tests``) and time (``--max-seconds``). This is a benchmark, not a
test: it asserts nothing (tests/test_hardening.py checks leaks over 200 native tests).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

import attrs

from netprobe.driven import is_listening
from netprobe.engine.client import run_test
from netprobe.errors import NetprobeError
from netprobe.farend import AgentConnection
from netprobe.plugin import NullReporter
from netprobe.registry import load_registry
from netprobe.schema import TestSpec

NATIVE = [
    {},
    {"protocol": "udp", "rate_bits_per_second": 50e6},
    {"direction": "reverse"},
    {"direction": "bidir"},
    {"streams": 8},
]
DRIVEN = {"iperf3": "iperf3", "iperf2": "iperf", "nuttcp": "nuttcp", "ntttcp": "ntttcp"}
WHOLE_SECONDS = {"iperf3", "ntttcp"}  # their -t takes whole seconds


def figures(pid: int) -> tuple[int, int, int]:
    """(VmRSS KiB, threads, open fds) of ``pid``."""
    rss = threads = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, threads, len(os.listdir(f"/proc/{pid}/fd"))


def settled(pid: int, timeout: float = 5.0) -> tuple[int, int, int]:
    """The figures once threads and fds have stopped falling (the last test wound down)."""
    end = time.monotonic() + timeout
    seen = figures(pid)
    while time.monotonic() < end:
        time.sleep(0.2)
        now = figures(pid)
        if now[1:] == seen[1:]:
            return now
        seen = now
    return seen


def native_test(port: int, extra: dict[str, Any], seconds: float) -> Callable[[], str]:
    def run() -> str:
        spec = TestSpec(**{"duration_s": seconds, "interval_s": None, "port": port, **extra})
        return run_test(spec, NullReporter(), "127.0.0.1").status
    return run


def agent_test(port: int, name: str, seconds: float) -> Callable[[], str]:
    tool = load_registry(only=name).get(name)({"start_server": False})  # the agent starts it

    def run() -> str:
        agent = AgentConnection.open("127.0.0.1", port, None)
        if agent is None:
            return "no agent"
        try:
            spec = TestSpec(tool=name, host="127.0.0.1", duration_s=seconds, interval_s=None)
            far = agent.far_end(name, spec)
            result = tool.run(attrs.evolve(spec, port=far), NullReporter())
            agent.finish()
            return result.status if result.status == "ok" else f"{result.status}: {result.errors}"
        finally:
            agent.close()
    return run


def plan(port: int, native_s: float = 0.3,
         driven_s: float = 1.0) -> list[tuple[str, Callable[[], str]]]:
    kinds = [(f"native {extra or 'tcp'}", native_test(port, extra, native_s))
             for extra in NATIVE]
    for name, binary in DRIVEN.items():
        if shutil.which(binary):
            seconds = max(1.0, round(driven_s)) if name in WHOLE_SECONDS else driven_s
            kinds.append((f"{name} via agent", agent_test(port, name, seconds)))
    return kinds


def start_server() -> tuple[subprocess.Popen, int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "netprobe", "server", "-B", "127.0.0.1",
                             "-p", str(port), "--max-tests", "4"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 10
    while not is_listening(port) and time.monotonic() < end:
        time.sleep(0.05)
    return proc, port


def _one(kind: tuple[str, Callable[[], str]]) -> tuple[str, str]:
    name, run = kind
    try:
        return name, run()
    except NetprobeError as exc:
        return name, f"error: {exc}"


def _next_mark(done: int, every: int, warm_up: int) -> int:
    """Where the next figures are read: the next multiple of ``every``, or the warm-up."""
    mark = (done // every + 1) * every
    return warm_up if done < warm_up < mark else mark


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _last_half(marks: dict[int, int], warm_up: int, done: int, rss: int) -> str:
    """The slope over the second half of the tests after the warm-up: where the first
    half's fill of reused memory no longer counts."""
    middle = max((m for m in marks if m <= (warm_up + done) / 2), default=warm_up)
    if middle not in marks or middle >= done:
        return "no second half to measure"
    slope = (rss - marks[middle]) / (done - middle)
    return (f"second half (tests {middle}-{done}): rss {marks[middle]} -> {rss} KiB, "
            f"{slope:+.2f} KiB a test")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=1000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--max-seconds", type=float, default=1800.0)
    parser.add_argument("--warm-up", type=int, default=100,
                        help="tests after which the slope is measured from (plugins loaded, "
                             "the allocator's arenas in use)")
    parser.add_argument("--native-seconds", type=float, default=0.3)
    parser.add_argument("--driven-seconds", type=float, default=1.0)
    parser.add_argument("--parallel", type=int, default=1,
                        help="tests at once (the server runs up to 4)")
    args = parser.parse_args(argv)
    proc, port = start_server()
    started = time.monotonic()
    try:
        kinds = plan(port, args.native_seconds, args.driven_seconds)
        print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cores, "
              f"{platform.system()} {platform.release()}; load {_load()}")
        print("kinds: " + ", ".join(name for name, _ in kinds))
        first = settled(proc.pid)
        print(f"{'tests':>6} {'rss KiB':>9} {'threads':>8} {'fds':>5} {'failed':>7}")
        print(f"{0:>6} {first[0]:>9} {first[1]:>8} {first[2]:>5} {0:>7}")
        failed: dict[str, int] = {}
        marks: dict[int, int] = {}  # tests done -> rss KiB
        warm: Optional[tuple[int, int, int]] = None
        done = 0
        with ThreadPoolExecutor(args.parallel) as pool:
            while done < args.tests and time.monotonic() - started < args.max_seconds:
                # A batch runs up to --parallel tests at once; between batches the server
                # is idle and its figures are read.
                stop = min(args.tests, _next_mark(done, args.every, args.warm_up))
                for name, status in pool.map(lambda i: _one(kinds[i % len(kinds)]),
                                             range(done, stop)):
                    if status != "ok":
                        if name not in failed:
                            print(f"{name} first not ok: {status}", flush=True)
                        failed[name] = failed.get(name, 0) + 1
                done = stop
                now = settled(proc.pid)
                warm = now if done == args.warm_up else warm
                marks[done] = now[0]
                print(f"{done:>6} {now[0]:>9} {now[1]:>8} {now[2]:>5} {sum(failed.values()):>7}",
                      flush=True)
        last = settled(proc.pid)
        print(f"after {done} tests in {time.monotonic() - started:.0f} s: rss {first[0]} -> "
              f"{last[0]} KiB, threads {first[1]} -> {last[1]}, fds {first[2]} -> {last[2]}; "
              f"not ok: {failed or 'none'}")
        if warm is not None and done > args.warm_up:
            slope = (last[0] - warm[0]) / (done - args.warm_up)
            print(f"after the warm-up ({args.warm_up} tests): rss {warm[0]} -> {last[0]} KiB, "
                  f"{slope:+.2f} KiB a test over the {done - args.warm_up} after it; threads "
                  f"{warm[1]} -> {last[1]}, fds {warm[2]} -> {last[2]}")
            print(_last_half(marks, args.warm_up, done, last[0]))
        print(f"load {_load()}")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
