"""Memory and time of ``netprobe parse`` on a large saved iperf 2 server log.

Generates a log of N tests (by default about 200 MB) from the real 3-test server log in
tests/data, repeated with the transfer ids counting on as a real server's do, then runs
``netprobe parse --tool iperf2 --format jsonl`` on it and reports the peak RSS of that
process (getrusage of the child) and the wall time, with the machine named.

Usage: python bench/parse_memory.py [--megabytes 200] [--keep FILE]
Run it under the heavy lock: flock /tmp/netprobe-heavy.lock python bench/parse_memory.py
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEED = Path(__file__).resolve().parents[1] / "tests" / "data" / "iperf2-server-i1-3tests.txt"
_ID = re.compile(r"^\[\s*(\d+)\]")


def generate(path: Path, megabytes: int) -> int:
    """Write about ``megabytes`` MB of server log to ``path``; return the number of tests."""
    lines = SEED.read_text().splitlines(keepends=True)
    banner, body = lines[:4], lines[4:]
    per_copy = max(int(_ID.match(line).group(1)) for line in body if _ID.match(line))
    target, tests, copy = megabytes * 1_000_000, 0, 0
    with path.open("w") as out:
        out.writelines(banner)
        while out.tell() < target:
            out.writelines(_renumbered(line, copy * per_copy) for line in body)
            copy, tests = copy + 1, tests + 3
    return tests


def _renumbered(line: str, shift: int) -> str:
    return _ID.sub(lambda m: f"[{int(m.group(1)) + shift:3d}]", line)


def measure(path: Path) -> tuple[float, float, int]:
    """(seconds, peak RSS in MiB, results written) of one parse of ``path``."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "netprobe", "parse", "--tool", "iperf2",
                             "--format", "jsonl", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    results = sum(1 for _ in proc.stdout)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.monotonic() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"parse failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return elapsed, usage.ru_maxrss / 1024, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=200)
    parser.add_argument("--keep", type=Path, help="write the log here and keep it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "iperf2-server.log"
        tests = generate(path, args.megabytes)
        size = path.stat().st_size / 1e6
        elapsed, peak, results = measure(path)
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")
    print(f"input: {size:.0f} MB iperf 2 server log, {tests} tests")
    print(f"parse: {results} results in {elapsed:.1f} s ({size / elapsed:.1f} MB/s), "
          f"peak RSS {peak:.0f} MiB ({peak * 1.048576 / size:.2f} x the input)")


if __name__ == "__main__":
    main()
