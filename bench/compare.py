#!/usr/bin/env python3
"""Benchmark: netprobe's native engine against iperf3, nuttcp and iperf (2) on loopback.

Runs every tool on the same cases, interleaved (A B C D A B C D ...) so that drift on the
machine hits all alike, N repetitions each. Each tool's server and client are separate
processes started here; their CPU time comes from the kernel (wait4 rusage, or
/proc/PID/stat for a server that does not exit by itself). Prints, per case and tool, the
median receiver throughput, datagrams per second (UDP), CPU seconds per gigabit (sender +
receiver processes), what each send call carried, and the ratios native/peer.

The call column matters more than it looks: over TCP on loopback the write length alone
moves the rate by tens of percent, and the native UDP sender hands the kernel many
datagrams per call (sendmmsg of GSO messages) where the peers send one. ``tcp1`` runs each
tool at its own default length; ``tcp1eq`` gives every tool 128K writes (``compare``'s
default), the like-for-like figure.

    python bench/compare.py [--reps 3] [--time 5] [--cases tcp1,tcp4,udp64] [--tools ...]

This is a benchmark, not a test: it asserts nothing and only reports what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Optional

CLK_TCK = os.sysconf("SC_CLK_TCK")
HOST_BUSY: list[float] = []  # host busy seconds of the latest measure() (read by timed())
HOST = "127.0.0.1"


@dataclass
class Run:
    """One measured run."""

    bits_per_second: float
    packets_per_second: Optional[float]
    cpu_s: float  # client + server process CPU (rusage)
    host_cpu_s: float = 0.0  # every core's busy time while the client ran (/proc/stat)
    seconds: float = 0.0  # test duration asked for
    call: str = ""  # what one send call carried: the write length, or datagrams per call

    @property
    def gigabits(self) -> float:
        """Data moved, in units of 10^9 bits."""
        return self.bits_per_second * self.seconds / 1e9


@dataclass
class Case:
    """A test case common to every tool."""

    name: str
    udp: bool
    streams: int
    length: Optional[int]
    zerocopy: bool = False


CASES = {
    "tcp1": Case("TCP, 1 stream", False, 1, None),
    "tcp4": Case("TCP, 4 streams", False, 4, None),
    "tcp1eq": Case("TCP, 1 stream, 128K writes for every tool", False, 1, 128 * 1024),
    "udp64": Case("UDP, 64-byte payload, unlimited", True, 1, 64),
    # Zero-copy compared only with zero-copy: iperf3 -Z (sendfile) against native -Z.
    "tcp1z": Case("TCP, 1 stream, zero-copy send (-Z)", False, 1, None, zerocopy=True),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _bound(table: str, port: int, state: Optional[str]) -> bool:
    wanted = f":{port:04X}"
    with open(table) as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if cols[1].endswith(wanted) and (state is None or cols[3] == state):
                return True
    return False


def wait_listening(port: int, udp: bool = False, timeout: float = 10.0) -> None:
    """Wait until something listens on ``port``, read from /proc/net (never by connecting:
    one-shot servers such as iperf3 -1 and nuttcp -1 would take the probe as their test)."""
    tables = ["/proc/net/udp", "/proc/net/udp6"] if udp else ["/proc/net/tcp", "/proc/net/tcp6"]
    state = None if udp else "0A"  # 0A = LISTEN
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(os.path.exists(t) and _bound(t, port, state) for t in tables):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


def host_busy_s() -> float:
    """Busy time of all cores so far (everything but idle and iowait), in seconds."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / CLK_TCK


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a live process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def reap(proc: subprocess.Popen, timeout: float) -> tuple[int, float]:
    """Wait for a child and return (exit status, its CPU seconds) from wait4."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_utime + usage.ru_stime
        time.sleep(0.02)
    raise RuntimeError(f"{proc.args[0]} did not exit")


def stop_server(proc: subprocess.Popen) -> float:
    """CPU seconds of a server that does not exit by itself, then stop it by PID."""
    cpu = proc_cpu_s(proc.pid)
    proc.send_signal(signal.SIGTERM)
    try:
        reap(proc, 5)
    except RuntimeError:
        proc.kill()
        reap(proc, 5)
    return cpu


def measure(
    server_argv: list[str],
    client_argv: list[str],
    ready: Callable[[], None],
    server_exits: bool,
    seconds: float,
) -> tuple[str, str, float]:
    """Run a server and a client; return both outputs and both processes' CPU seconds."""
    with tempfile.TemporaryFile() as server_out:
        server = subprocess.Popen(server_argv, stdout=server_out, stderr=subprocess.DEVNULL)
        try:
            ready()
            busy = host_busy_s()
            client = subprocess.Popen(client_argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out, err = _drain(client)
            status, client_cpu = reap(client, seconds + 30)
            HOST_BUSY.append(host_busy_s() - busy)
            if status != 0:
                raise RuntimeError(f"{client_argv[0]} exited {status}: {err.strip()[:200]}")
            server_cpu = reap(server, 10)[1] if server_exits else stop_server(server)
            server_out.seek(0)
            return out, server_out.read().decode(errors="replace"), client_cpu + server_cpu
        finally:
            if server.returncode is None and server.poll() is None:
                server.kill()
                server.wait(5)


def _drain(client: subprocess.Popen) -> tuple[str, str]:
    # Read both pipes to the end without reaping the child, so wait4 still sees its rusage.
    assert client.stdout is not None and client.stderr is not None
    out = client.stdout.read().decode(errors="replace")
    err = client.stderr.read().decode(errors="replace")
    return out, err


def run_native(case: Case, seconds: float) -> Run:
    port = free_port()
    np = [sys.executable, "-m", "netprobe"]
    args = ["-t", str(seconds), "-P", str(case.streams), "-i", "0"]
    args += ["-Z"] if case.zerocopy else []
    if case.udp:
        args += ["-u", "-b", "0", "-l", str(case.length)]
    elif case.length:
        args += ["-l", str(case.length)]
    out, _, cpu = measure(
        [*np, "server", "-1", "-B", HOST, "-p", str(port)],
        [*np, "run", HOST, "-p", str(port), "--json", *args],
        lambda: wait_listening(port),
        True,
        seconds,
    )
    flow = json.loads(out)["summaries"][0]
    receiver = flow["receiver"]
    span = receiver["end_s"] - receiver["start_s"]
    pps = receiver["packets"] / span if case.udp else None
    call = (f"{case.length} B, many per call (GSO)" if case.udp
            else _writes(flow["sender"]["call_length_bytes"], case))
    return Run(receiver["bits_per_second"], pps, cpu, call=call)


def run_iperf3(case: Case, seconds: float) -> Run:
    port = free_port()
    args = ["-t", str(seconds), "-P", str(case.streams)]
    if case.udp or case.length:
        args += ["-u", "-b", "0"] if case.udp else []
        args += ["-l", str(case.length)]
    out, _, cpu = measure(
        ["iperf3", "-s", "-1", "-p", str(port)],
        ["iperf3", "-c", HOST, "-p", str(port), "-J", *args],
        lambda: wait_listening(port),
        True,
        seconds,
    )
    report = json.loads(out)
    end = report["end"]
    if case.udp:
        total = end["sum"]
        received = total["packets"] - total["lost_packets"]
        return Run(received * case.length * 8 / total["seconds"], received / total["seconds"], cpu,
                   call=ONE_DATAGRAM.format(case.length))
    call = _writes(report["start"]["test_start"]["blksize"], case)
    return Run(end["sum_received"]["bits_per_second"], None, cpu, call=call)


def run_nuttcp(case: Case, seconds: float) -> Run:
    ctl, data = free_port(), free_port()
    args = ["-T", str(seconds), "-N", str(case.streams), "-fparse"]
    if case.udp:
        args += ["-u", "-R", "100g", "-l", str(case.length)]
    elif case.length:
        args += ["-l", str(case.length)]
    # --nofork: "-1" alone forks a detached daemon, whose CPU wait4 would never see.
    out, _, cpu = measure(
        ["nuttcp", "-1", "--nofork", "-P", str(ctl), "-p", str(data)],
        ["nuttcp", "-P", str(ctl), "-p", str(data), *args, HOST],
        lambda: wait_listening(ctl),
        True,
        seconds,
    )
    fields = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
    pps = None
    if case.udp:  # megabytes received are 2^20 bytes; pkt is datagrams received
        pps = (float(fields["megabytes"]) * 2**20 / case.length) / float(fields["real_seconds"])
    # -fparse does not print the buffer length: without -l it is nuttcp's 64K default.
    call = ONE_DATAGRAM.format(case.length) if case.udp else _writes(case.length or 65536, case)
    return Run(float(fields["rate_Mbps"]) * 1e6, pps, cpu, call=call)


def run_iperf2(case: Case, seconds: float) -> Run:
    port = free_port()
    server = ["iperf", "-s", "-p", str(port), "-y", "C"] + (["-u"] if case.udp else [])
    args = ["-t", str(seconds), "-P", str(case.streams), "-y", "C"]
    ready = (lambda: wait_listening(port, udp=True)) if case.udp else (lambda: wait_listening(port))
    if case.udp:
        args += ["-u", "-b", "100000000000", "-l", str(case.length)]
    elif case.length:
        args += ["-l", str(case.length)]
    out, server_out, cpu = measure(
        server, ["iperf", "-c", HOST, "-p", str(port), *args], ready, False, seconds
    )
    if case.udp:  # the receiver's figures are in the server's CSV row
        row = [r.split(",") for r in server_out.splitlines() if r.count(",") >= 12][-1]
        span = float(row[6].split("-")[1]) - float(row[6].split("-")[0])
        return Run(float(row[8]), (int(row[11]) - int(row[10])) / span, cpu,
                   call=ONE_DATAGRAM.format(case.length))
    rows = [r.split(",") for r in out.splitlines() if r.count(",") >= 8]
    summed = [r for r in rows if r[5] == "-1"]
    bps = float(summed[-1][8]) if summed else sum(float(r[8]) for r in rows)
    # -y C does not print the buffer length: without -l it is iperf 2's 128K default.
    return Run(bps, None, cpu, call=_writes(case.length or 128 * 1024, case))


ONE_DATAGRAM = "{} B, one per call"


def _writes(length: Optional[int], case: Case) -> str:
    """A TCP sender's call: its write length, marked when the tool chose it itself."""
    shown = "?" if not length else (f"{length // 1024}K" if length % 1024 == 0 else f"{length} B")
    return f"{shown} writes" + ("" if case.length else " (own)")


ZEROCOPY_TOOLS = ("native", "iperf3")  # nuttcp and iperf 2 have no zero-copy mode
TOOLS: dict[str, tuple[str, Callable[[Case, float], Run]]] = {
    "native": ("netprobe", run_native),
    "iperf3": ("iperf3", run_iperf3),
    "nuttcp": ("nuttcp", run_nuttcp),
    "iperf": ("iperf", run_iperf2),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--time", type=float, default=5.0)
    parser.add_argument("--cases", default="tcp1,tcp1eq,tcp4,udp64,tcp1z")
    parser.add_argument("--tools", default="native,iperf3,nuttcp,iperf")
    args = parser.parse_args()
    wanted = [t for t in args.tools.split(",") if t == "native" or shutil.which(TOOLS[t][0])]
    for name in args.cases.split(","):
        case = CASES[name]
        tools = [t for t in wanted if not case.zerocopy or t in ZEROCOPY_TOOLS]
        runs: dict[str, list[Run]] = {t: [] for t in tools}
        failures: dict[str, str] = {}
        for _ in range(args.reps):
            for tool in tools:  # interleaved: A B C D A B C D ...
                try:
                    run = TOOLS[tool][1](case, args.time)
                    run.host_cpu_s, run.seconds = HOST_BUSY[-1], args.time
                    runs[tool].append(run)
                except (
                    RuntimeError,
                    KeyError,
                    ValueError,
                    IndexError,
                    json.JSONDecodeError,
                ) as exc:
                    failures[tool] = str(exc)
        report(case, runs, failures)
    return 0


def report(case: Case, runs: dict[str, list[Run]], failures: dict[str, str]) -> None:
    count = max((len(r) for r in runs.values()), default=0)
    print(f"\n{case.name}  (median of {count} runs; ratios are native/peer)")
    print(
        f"{'tool':8} {'each call':26} {'Gbit/s':>8} {'Mpkt/s':>7} {'proc CPU s/Gbit':>16}"
        f" {'host CPU s/Gbit':>16} {'thr ratio':>10} {'proc CPU ratio':>15} {'host CPU ratio':>15}"
    )
    med = {t: _medians(r) for t, r in runs.items() if r}
    calls = {t: "/".join(sorted({run.call for run in r})) for t, r in runs.items() if r}
    base = med.get("native")
    for tool, (bps, pps, proc, host) in med.items():
        peer = base is not None and tool != "native"
        speed = (
            (base[1] / pps)
            if (case.udp and peer and pps and base[1])
            else (base[0] / bps if peer else None)
        )
        cells = [
            _ratio(speed),
            _ratio(base[2] / proc if peer else None),
            _ratio(base[3] / host if peer else None),
        ]
        shown_pps = f"{pps / 1e6:7.3f}" if pps else f"{'':7}"
        print(
            f"{tool:8} {calls[tool]:26} {bps / 1e9:8.3f} {shown_pps} {proc:16.4f} {host:16.4f}"
            f" {cells[0]:>10} {cells[1]:>15} {cells[2]:>15}"
        )
    for tool, why in failures.items():
        print(f"{tool:8} failed at least once: {why}")


def _ratio(value: Optional[float]) -> str:
    return f"{value:.2f}" if value else ""


def _medians(runs: list[Run]) -> tuple[float, Optional[float], float, float]:
    bps = statistics.median(r.bits_per_second for r in runs)
    pps_values = [r.packets_per_second for r in runs if r.packets_per_second]
    proc = statistics.median(r.cpu_s / r.gigabits for r in runs)
    host = statistics.median(r.host_cpu_s / r.gigabits for r in runs)
    return bps, (statistics.median(pps_values) if pps_values else None), proc, host


if __name__ == "__main__":
    sys.exit(main())
