#!/usr/bin/env python3
"""Benchmark: netprobe speaking iperf3's protocol, against stock iperf3, on loopback.

Two parts, each with the peers side by side in the same run (issue 37):

- server: a stock iperf3 client (3.21 and Debian's 3.12) against ``netprobe server
  --iperf3`` and against ``iperf3 -s`` of the client's own version: the client's receiver
  throughput and the SERVER's CPU seconds per gigabit, TCP -P 1 and -P 4;
- client: ``netprobe run 127.0.0.1 --iperf3`` and the stock clients against the same
  ``iperf3 -s`` (3.21): throughput and the CLIENT's CPU seconds per gigabit.

Each server is started once per case and stays up (a server is normally already running,
so its start-up is left out alike); its CPU is utime + stime from /proc/PID/stat read
before the client starts and after it exits. A client's CPU is its whole process from
wait4 (start-up included, as a user pays it). Runs are interleaved (every contender once,
then again, rotated), medians of --reps, every run bounded (a client that has not exited
by -t + 60 s is stopped by its PID and the run counted as failed). Prints the machine line,
one table per case and the ratios netprobe / stock.

    flock /tmp/netprobe-heavy.lock python bench/iperf3.py [--reps 3] [--time 3] [--only server]

A benchmark, not a test: it asserts nothing and reports what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

from compare import proc_cpu_s
from engine import (
    NATIVE_ENV,
    NEUTRAL_CWD,
    PEERS,
    Where,
    free_port_pair,
    load,
    machine_line,
    netprobe_line,
    reap_or_stop,
    stop,
    wait_listening,
    warm_bytecode,
)

STOCK = {"3.21": os.path.join(PEERS, "iperf3"), "3.12": "/usr/bin/iperf3"}
LOOPBACK = "127.0.0.1"
SETTLE_S = 0.3  # after the client exits, the server finishes its test's teardown


@dataclass
class Run:
    """One measured run: receiver throughput and the measured end's CPU seconds."""

    bits_per_second: float
    cpu_s: float
    seconds: float

    @property
    def cpu_per_gbit(self) -> float:
        return self.cpu_s / (self.bits_per_second * self.seconds / 1e9)


@dataclass(frozen=True)
class Contender:
    """One row of a table: which server and which client."""

    name: str
    server: str  # "netprobe" or a stock version
    client: str  # "netprobe" or a stock version


def available(version: str) -> bool:
    return version == "netprobe" or os.access(STOCK[version], os.X_OK)


@contextlib.contextmanager
def serving(kind: str) -> Iterator[tuple[subprocess.Popen, int]]:
    """A server that stays up for a case: ``netprobe server --iperf3`` or ``iperf3 -s``."""
    port = free_port_pair()
    if kind == "netprobe":
        argv = [sys.executable, "-m", "netprobe", "server", "-B", LOOPBACK, "-p",
                str(port - 1), "--iperf3", "--iperf3-port", str(port), "--max-tests", "2"]
    else:
        argv = [STOCK[kind], "-s", "-B", LOOPBACK, "-p", str(port)]
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=NATIVE_ENV,
                                cwd=NEUTRAL_CWD)
        try:
            wait_listening(Where(), port)
            yield proc, port
        finally:
            stop(proc)


def client_argv(kind: str, port: int, streams: int, seconds: float) -> list[str]:
    common = ["-p", str(port), "-t", f"{seconds:g}", "-P", str(streams)]
    if kind == "netprobe":
        return [sys.executable, "-m", "netprobe", "run", LOOPBACK, "--iperf3", *common,
                "-i", "0", "--json"]
    return [STOCK[kind], "-c", LOOPBACK, *common, "-J"]


def receiver_bps(kind: str, out: str) -> float:
    """The receiver's throughput from the client's JSON (netprobe's Result or iperf3 -J)."""
    doc = json.loads(out)
    if kind == "netprobe":
        return float(doc["summaries"][0]["receiver"]["bits_per_second"])
    if "error" in doc:
        raise RuntimeError(f"iperf3: {doc['error']}")
    return float(doc["end"]["sum_received"]["bits_per_second"])


def measure(c: Contender, server: subprocess.Popen, port: int, streams: int,
            seconds: float, part: str) -> Run:
    """One client run against a running server; the CPU of the end ``part`` measures."""
    before = proc_cpu_s(server.pid)
    with tempfile.TemporaryFile() as out:
        cli = subprocess.Popen(client_argv(c.client, port, streams, seconds), stdout=out,
                               stderr=subprocess.STDOUT, env=NATIVE_ENV, cwd=NEUTRAL_CWD)
        status, client_cpu = reap_or_stop(cli, c.client, seconds + 60)
        time.sleep(SETTLE_S)
        server_cpu = proc_cpu_s(server.pid) - before
        out.seek(0)
        text = out.read().decode(errors="replace")
    if status != 0:
        raise RuntimeError(f"{c.name} exited {status}: {text.strip()[-300:]}")
    cpu = server_cpu if part == "server" else client_cpu
    return Run(receiver_bps(c.client, text), cpu, seconds)


def contenders(part: str) -> list[Contender]:
    if part == "server":
        rows = []
        for v in STOCK:
            rows += [Contender(f"iperf3 {v} -c -> netprobe server --iperf3", "netprobe", v),
                     Contender(f"iperf3 {v} -c -> iperf3 {v} -s", v, v)]
    else:
        rows = [Contender("netprobe run --iperf3 -> iperf3 3.21 -s", "3.21", "netprobe"),
                *(Contender(f"iperf3 {v} -c -> iperf3 3.21 -s", "3.21", v) for v in STOCK)]
    return [r for r in rows if available(r.server) and available(r.client)]


def run_case(part: str, streams: int, reps: int, seconds: float
             ) -> tuple[dict[str, list[Run]], dict[str, str]]:
    """Interleaved runs of every contender; each server kind is started once per case."""
    rows = contenders(part)
    runs: dict[str, list[Run]] = {r.name: [] for r in rows}
    failures: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        servers = {}
        for kind in sorted({r.server for r in rows}):
            try:
                servers[kind] = stack.enter_context(serving(kind))
            except RuntimeError as exc:
                failures[f"server {kind}"] = str(exc)[:200]
        for rep in range(reps):
            shift = rep % len(rows) if rows else 0
            for row in [*rows[shift:], *rows[:shift]]:
                if row.server not in servers:
                    continue
                proc, port = servers[row.server]
                try:
                    runs[row.name].append(measure(row, proc, port, streams, seconds, part))
                except (RuntimeError, KeyError, ValueError, OSError) as exc:
                    failures[row.name] = str(exc)[:200]
    return runs, failures


def report(part: str, streams: int, runs: dict[str, list[Run]],
           failures: dict[str, str]) -> None:
    end = "server" if part == "server" else "client"
    count = max((len(r) for r in runs.values()), default=0)
    print(f"\n### {part}: TCP -P {streams}  (median of {count})\n")
    print(f"| contender | Gbit/s | {end} CPU s/Gbit | {end} CPU s |")
    print("| --- | ---: | ---: | ---: |")
    med: dict[str, tuple[float, float]] = {}
    for name, rs in runs.items():
        if not rs:
            continue
        bps = statistics.median(r.bits_per_second for r in rs)
        per = statistics.median(r.cpu_per_gbit for r in rs)
        med[name] = (bps, per)
        print(f"| {name} | {bps / 1e9:.2f} | {per:.4f} | "
              f"{statistics.median(r.cpu_s for r in rs):.2f} |")
    for name, why in failures.items():
        print(f"| {name} | failed at least once: {why} | | |")
    print()
    for ours, theirs in pairs(part, med):
        (b1, c1), (b2, c2) = med[ours], med[theirs]
        print(f"netprobe/stock: throughput {b1 / b2:.2f}x, {end} CPU s/Gbit {c1 / c2:.2f}x"
              f"  ({ours} over {theirs})")


def pairs(part: str, med: dict[str, tuple[float, float]]) -> list[tuple[str, str]]:
    """(netprobe row, the stock row it is read against) for the ratio lines."""
    found = []
    for name in med:
        if part == "server" and "netprobe server" in name:
            stock = name.replace("netprobe server --iperf3", f"iperf3 {name.split()[1]} -s")
            found += [(name, stock)] if stock in med else []
        elif part == "client" and name.startswith("netprobe"):
            found += [(name, other) for other in med if other.startswith("iperf3")]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="runs per contender and case")
    parser.add_argument("--time", type=float, default=3.0, help="seconds per run (-t)")
    parser.add_argument("--only", default="server,client", help="parts, comma-separated")
    parser.add_argument("--streams", default="1,4", help="-P values, comma-separated")
    args = parser.parse_args()
    parts = args.only.split(",")
    if any(p not in ("server", "client") for p in parts):
        parser.error("parts are: server, client")
    try:
        streams = [int(n) for n in args.streams.split(",")]
    except ValueError:
        parser.error("--streams: integers, comma-separated")
    if args.reps < 1 or not 0 < args.time <= 60 or any(not 0 < n <= 16 for n in streams):
        parser.error("--reps >= 1, 0 < --time <= 60, 0 < -P <= 16")
    print(f"machine: {machine_line()}")
    print(f"netprobe: {netprobe_line()}")
    versions = {v: subprocess.run([p, "--version"], capture_output=True, text=True,
                                  timeout=10).stdout.split("\n", 1)[0]
                for v, p in STOCK.items() if available(v)}
    print(f"stock: {'; '.join(f'{p} ({versions[v]})' for v, p in STOCK.items() if v in versions)}")
    print(f"load average before: {load()}; started {time.strftime('%Y-%m-%d %H:%M:%S')}")
    warm_bytecode()
    began = time.monotonic()
    for part in parts:
        for n in streams:
            runs, failures = run_case(part, n, args.reps, args.time)
            report(part, n, runs, failures)
            sys.stdout.flush()
    print(f"\nload average after: {load()}; took {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
