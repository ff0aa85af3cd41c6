#!/usr/bin/env python3
"""Memory of a test with very many intervals: what the client holds, with the bound on
(``plugin.MAX_INTERVALS_KEPT``, 20,000 of each end) and off (as before the bound: every
sample kept), side by side in the same run.

Two cases, each run in a child process of its own so that its peak RSS (ru_maxrss) is
its own:

* ``driven``: a synthetic driven tool (a child printing ``--lines`` interval lines as fast
  as it can, default 1,000,000) through :class:`netprobe.driven.DrivenRun`, one Interval
  emitted per line, as every driven adapter does;
* ``native``: ``netprobe run -P STREAMS -i 0.1 -t SECONDS --format json-stream -o FILE``
  over loopback (both ends in the client's process), every interval streamed to the file.

    flock /tmp/netprobe-heavy.lock python bench/interval_memory.py [--lines N] [--seconds S]

Bounded in count and time. A benchmark, not a test: it asserts nothing
(tests/test_hardening_round3.py checks the held counts).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

DRIVEN = """
import resource, sys, time
from netprobe import plugin
from netprobe.driven import process, run as driven_run
if sys.argv[2] == "off":  # every bound off: samples kept, samples waiting, output kept
    plugin.MAX_INTERVALS_KEPT = driven_run.MAX_PENDING = 10**12
    process.OUTPUT_HEAD_CHARS = 10**15
from netprobe.driven import DrivenRun
from netprobe.plugin import NullReporter
from netprobe.schema import Interval
lines, pad = int(sys.argv[1]), " " * int(sys.argv[3])
tool = f"import sys\\nw = sys.stdout.write\\nfor i in range({lines}): w(f'{{i}}{pad}\\\\n')"
delivered = 0
class Counting(NullReporter):
    def interval(self, sample):
        global delivered
        delivered += 1
def on_line(line):
    n = int(line)
    run.emit(Interval(direction="client_to_server", role="sender", stream_id=None,
                      start_s=n * 0.1, end_s=n * 0.1 + 0.1, bytes=1000, bits_per_second=8e4))
started = time.monotonic()
with DrivenRun(Counting(), tool="synthetic") as run:
    client = run.start("client", [sys.executable, "-c", tool], on_line=on_line)
    run.wait_exit(client, 600.0)
print(len(run.intervals), delivered, time.monotonic() - started)
"""

NATIVE = """
import sys
from netprobe import plugin
if sys.argv[2] == "off":
    plugin.MAX_INTERVALS_KEPT = 10**12
from netprobe.cli.main import main
sys.exit(main(["run", "-P", sys.argv[4], "-i", "0.1", "-t", sys.argv[1], "--format",
               "json-stream", "-q", "-o", sys.argv[3]]))
"""


def child(code: str, *args: str) -> tuple[str, int, float]:
    """Run ``code`` in a child: (its stdout, its peak RSS in KiB, wall seconds); a child
    that fails is said, and its figures kept (a failed run still streamed its intervals)."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _pid, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        print(f"  (the child exited with status {status >> 8})")
    return out, usage.ru_maxrss, time.monotonic() - started


def driven(lines: int, pad: int) -> dict[str, tuple[int, int, int]]:
    found = {}
    for bound in ("on", "off"):
        out, peak, took = child(DRIVEN, str(lines), bound, str(pad))
        held, delivered, _ = out.split()
        found[bound] = (int(held), int(delivered), peak)
        print(f"driven, bounds {bound:>3}: {lines} lines (+{pad}), {delivered} delivered, "
              f"{held} held, peak RSS {peak / 1024:.0f} MiB, {took:.1f} s", flush=True)
    return found


def native(seconds: float, streams: int) -> None:
    for bound in ("on", "off"):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "run.jsonl")
            _out, peak, took = child(NATIVE, str(seconds), bound, path, str(streams))
            streamed = kept = 0
            with open(path) as stream:
                for line in stream:
                    event = json.loads(line)
                    streamed += event["event"] == "interval"
                    if event["event"] == "end":
                        kept = len(event["data"]["intervals"])
        print(f"native -P {streams} -i 0.1 -t {seconds:g}, bound {bound:>3}: {streamed} intervals "
              f"streamed, {kept} in the result, peak RSS {peak / 1024:.0f} MiB, {took:.1f} s",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--pad", type=int, default=0,
                        help="characters added to each driven line (a longer output)")
    parser.add_argument("--no-native", action="store_true", help="the driven case only")
    args = parser.parse_args(argv)
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cores, "
          f"{platform.system()} {platform.release()}, Python {platform.python_version()}")
    found = driven(args.lines, args.pad)
    on, off = found["on"][2], found["off"][2]
    print(f"driven: peak RSS with the bounds {on / off:.2f}x without them")
    if not args.no_native:
        native(args.seconds, args.streams)
    return 0


if __name__ == "__main__":
    sys.exit(main())
