#!/usr/bin/env python3
"""Benchmark: what netprobe costs a small router. Sizes, idle memory, start-up time.

Measures, for one installed netprobe:

- wheel size (with ``--wheel``) and installed size on disk: netprobe alone, and with the
  runtime dependencies it pulls in (bytecode included: that is what the flash holds);
- resident memory of an idle ``netprobe server`` (VmRSS, and PSS: RSS with shared pages
  divided among their users), one second after it listens;
- resident memory during a 4-stream loopback test: the server's peak (VmHWM) and the
  client's (ru_maxrss of the ended process), and which packages the server imported
  from start to the test's end beyond the standard library (a router installs each);
- wall time of ``netprobe --version`` (median of ``--reps``), next to a bare
  ``python -c pass``: under emulation only the ratio means anything;
- what the CLI imports: module count for ``--version`` and for a 1 s loopback ``run``
  (``--json``, and drawn live), and whether rich and which tool plugins came in.

    python bench/footprint.py [--wheel WHEEL] [--reps 10] [--json]

With ``--wheel`` it installs the wheel into a fresh venv (dependencies from the index, or
``PIP_FIND_LINKS``) and measures there; without, it measures the netprobe that this
interpreter imports. This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run by the measured interpreter: bytes on disk per installed distribution, and which
# distributions netprobe needs at run time (its requirements, recursively; extras left out).
SIZES_SNIPPET = r"""
import json, re
from importlib import metadata

def size(dist):
    total = 0
    for file in dist.files or ():
        path = file.locate()
        if path.is_file():
            total += path.stat().st_size
    return total

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

dists = {norm(d.metadata["Name"]): d for d in metadata.distributions()}
# the distribution that installs the netprobe package (netprobe-meter on PyPI)
root = norm(metadata.packages_distributions().get("netprobe", ["netprobe"])[0])
needed, todo = set(), [root]
while todo:
    name = todo.pop()
    if name in needed or name not in dists:
        continue
    needed.add(name)
    for req in dists[name].requires or ():
        if "extra ==" not in req:
            todo.append(norm(re.match(r"[A-Za-z0-9._-]+", req).group(0)))
print(json.dumps({"netprobe" if name == root else name: size(dists[name])
                  for name in sorted(needed)}))
"""

IDLE_S = 1.0
START_TIMEOUT_S = 120.0  # generous: an emulated interpreter starts slowly


def run_python(python: str, *args: str, timeout: float = 120, **kwargs: Any) -> str:
    """Run ``python ARGS`` from a neutral directory (never the checkout) and return stdout."""
    done = subprocess.run([python, *args], capture_output=True, text=True, timeout=timeout,
                          check=True, cwd=tempfile.gettempdir(), **kwargs)
    return str(done.stdout)


def install_wheel(wheel: Path, where: Path) -> str:
    """A fresh venv in ``where`` with ``wheel`` installed; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=300)
    python = str(where / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    str(wheel)], check=True, timeout=1200)
    return python


def installed_sizes(python: str) -> dict[str, int]:
    """Bytes on disk of netprobe and of each runtime dependency, by distribution name."""
    return dict(json.loads(run_python(python, "-c", SIZES_SNIPPET)))


def listening(port: int) -> bool:
    """Whether something listens on TCP ``port`` (read from /proc: no probe connection)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            next(rows)
            for row in rows:
                fields = row.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                    return True
    return False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM from /proc/PID/status, Pss from smaps_rollup where the kernel has it."""
    found: dict[str, int] = {}
    for name in (f"/proc/{pid}/status", f"/proc/{pid}/smaps_rollup"):
        try:
            with open(name) as lines:
                for line in lines:
                    key, _, value = line.partition(":")
                    if key in ("VmRSS", "VmHWM", "Pss"):
                        found[key] = int(value.split()[0])
        except OSError:
            continue
    return found


TEST_S = 2
TEST_STREAMS = 4


def start_server(python: str, stderr: Any, *extra: str) -> tuple[subprocess.Popen, int, float]:
    """``netprobe server`` on a free loopback port, once it listens: (process, port,
    seconds it took to listen)."""
    port = free_port()
    server = subprocess.Popen([python, *extra, "-m", "netprobe", "server", "-B", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=stderr, cwd=tempfile.gettempdir())
    started = time.monotonic()
    while not listening(port):
        if server.poll() is not None or time.monotonic() - started > START_TIMEOUT_S:
            stop(server)
            raise RuntimeError("netprobe server did not start listening")
        time.sleep(0.05)
    return server, port, time.monotonic() - started


def stop(server: subprocess.Popen) -> None:
    """Stop a server this benchmark started (SIGINT: it ends as after Ctrl-C)."""
    if server.poll() is None:
        server.send_signal(signal.SIGINT)
    try:
        server.wait(10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def server_idle_memory(python: str) -> dict[str, Any]:
    """Start ``netprobe server`` on loopback, let it idle, read its memory, stop it."""
    server, _, listen_s = start_server(python, subprocess.DEVNULL)
    try:
        time.sleep(IDLE_S)
        return {"listen_s": round(listen_s, 3), **memory_kib(server.pid)}
    finally:
        stop(server)


# Run by the measured interpreter: the distributions that provide the given top-level
# names; a name no installed file provides (an import that was tried and failed, such as
# pickle's probe for Jython's org.python) is left out, one outside any distribution (the
# site's own hooks) kept as it is.
PROVIDERS_SNIPPET = r"""
import importlib.util, json, sys
from importlib import metadata

by_name = metadata.packages_distributions()
found = set()
for name in json.loads(sys.argv[1]):
    if name in by_name:
        found.update(by_name[name])
    elif importlib.util.find_spec(name) is not None:
        found.add(name)
print(json.dumps(sorted(found)))
"""


def imported_packages(python: str, importtime: str) -> list[str]:
    """The distributions (or bare modules) outside the standard library that ``-X
    importtime`` output shows imported."""
    names = set()
    for line in importtime.splitlines():
        if line.startswith("import time:") and "|" in line:
            top = line.rsplit("|", 1)[1].strip().split(".")[0]
            if top and top not in sys.stdlib_module_names and top != "imported package":
                names.add(top)
    return list(json.loads(run_python(python, "-c", PROVIDERS_SNIPPET,
                                      json.dumps(sorted(names)))))


def under_test(python: str) -> dict[str, Any]:
    """A ``-P 4`` loopback test against a fresh server: the server's peak memory, the
    client's, and what the server imported up to the test's end."""
    with tempfile.TemporaryFile(mode="w+") as log:
        server, port, _ = start_server(python, log, "-X", "importtime")
        try:
            client = subprocess.Popen([python, "-m", "netprobe", "run", "127.0.0.1", "-p",
                                       str(port), "-P", str(TEST_STREAMS), "-t", str(TEST_S),
                                       "--json"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, cwd=tempfile.gettempdir())
            # wait4 gives the ended client's peak RSS (KiB on Linux); Popen is told the
            # status so that it does not wait for the reaped process again
            _, status, usage = os.wait4(client.pid, 0)
            client.returncode = os.waitstatus_to_exitcode(status)
            server_memory = memory_kib(server.pid)
            log.seek(0)  # read before the stop: what serving needed, not what stopping does
            imported = imported_packages(python, log.read())
        finally:
            stop(server)
        return {"client_exit": client.returncode,
                "client_maxrss_kib": usage.ru_maxrss,
                "server": server_memory,
                "server_imports": imported}


def wall_times(argv: list[str], reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, timeout=120,
                       cwd=tempfile.gettempdir())
        times.append(time.perf_counter() - start)
    return times


def imports(python: str, *args: str) -> dict[str, Any]:
    """Modules ``python -X importtime -m netprobe ARGS`` imported, summarised."""
    done = subprocess.run([python, "-X", "importtime", "-m", "netprobe", *args],
                          capture_output=True, text=True, timeout=300,
                          cwd=tempfile.gettempdir(), check=False)
    modules = [line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
               if line.startswith("import time:") and "|" in line]
    modules = [m for m in modules if m != "imported package"]
    return {
        "exit": done.returncode,
        "modules": len(modules),
        "rich": any(m == "rich" or m.startswith("rich.") for m in modules),
        "tools": sorted(m for m in modules if m.startswith("netprobe.tools.")
                        and not m.rsplit(".", 1)[1].startswith("_")),
    }


def measure(python: str, reps: int, wheel: Path | None) -> dict[str, Any]:
    version = run_python(python, "-m", "netprobe", "--version").strip()
    sizes = installed_sizes(python)
    bare = wall_times([python, "-c", "pass"], reps)
    cli = wall_times([python, "-m", "netprobe", "--version"], reps)
    return {
        "machine": platform.machine(),
        "python": python,
        "version": version,
        "wheel": {"name": wheel.name, "bytes": wheel.stat().st_size} if wheel else None,
        "installed_bytes": {"netprobe": sizes.get("netprobe", 0),
                            "with_dependencies": sum(sizes.values()),
                            "by_distribution": sizes},
        "server_idle": server_idle_memory(python),
        "under_test": under_test(python),
        "version_s": {"median": statistics.median(cli), "min": min(cli)},
        "python_pass_s": {"median": statistics.median(bare), "min": min(bare)},
        "imports": {"--version": imports(python, "--version"),
                    "run --json": imports(python, "run", "-t", "1", "--json"),
                    "run": imports(python, "run", "-t", "1")},
    }


def report(r: dict[str, Any]) -> str:
    kib = 1024
    size = r["installed_bytes"]
    idle = r["server_idle"]
    test = r["under_test"]
    cli, bare = r["version_s"], r["python_pass_s"]
    lines = [f"{r['version']} on {r['machine']}"]
    if r["wheel"]:
        lines.append(f"  wheel                     {r['wheel']['bytes'] / kib:8.0f} KiB"
                     f"  {r['wheel']['name']}")
    lines += [
        f"  installed: netprobe       {size['netprobe'] / kib:8.0f} KiB",
        f"  installed: with deps      {size['with_dependencies'] / kib:8.0f} KiB  ("
        + ", ".join(f"{n} {b / kib:.0f}" for n, b in sorted(
            size["by_distribution"].items(), key=lambda kv: -kv[1])) + ")",
        f"  server idle: VmRSS        {idle.get('VmRSS', 0):8d} KiB"
        f"  (PSS {idle.get('Pss', '?')} KiB, listening after {idle['listen_s']:.2f} s)",
        f"  -P {TEST_STREAMS} test: server peak   {test['server'].get('VmHWM', 0):8d} KiB"
        f"  (client peak {test['client_maxrss_kib']} KiB"
        + ("" if test["client_exit"] == 0 else f"; client exit {test['client_exit']}") + ")",
        f"  server imported           {', '.join(test['server_imports']) or 'nothing'}"
        " (beyond the standard library)",
        f"  netprobe --version        {cli['median'] * 1000:8.0f} ms median"
        f"  (min {cli['min'] * 1000:.0f} ms; python -c pass {bare['median'] * 1000:.0f} ms:"
        f" x{cli['median'] / bare['median']:.1f})",
    ]
    for what, seen in r["imports"].items():
        lines.append(f"  imports for {what:<13} {seen['modules']:5d} modules, rich "
                     f"{'yes' if seen['rich'] else 'no'}, tools {seen['tools'] or 'none'}"
                     + ("" if seen["exit"] == 0 else f" (exit {seen['exit']})"))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--wheel", type=Path, help="install this wheel in a fresh venv first")
    parser.add_argument("--reps", type=int, default=10, help="runs of --version (default 10)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="np-footprint-") as tmp:
        python = (install_wheel(args.wheel.resolve(), Path(tmp) / "venv") if args.wheel
                  else sys.executable)
        figures = measure(python, max(1, args.reps), args.wheel)
    print(json.dumps(figures, indent=2) if args.json else report(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
