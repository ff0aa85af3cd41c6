"""Issue 16, round four: every interval of every stream at a high stream count, and the
server's memory flat over many tests (its allocator's arenas bounded)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

import netprobe
from netprobe import core
from netprobe.engine import protocol, side
from netprobe.engine.server import ALLOCATOR_ARENAS

from .budget import FRACTION
from .servers import NETPROBE, netprobe_server

# --- every interval at -P 64 and -P 128 (the default --max-streams) --------------------------


def _streamed_run(port: int, streams: int, seconds: float) -> tuple[list[dict], dict]:
    """A real `netprobe run --json-stream` over loopback: its interval events and result."""
    done = subprocess.run(
        [*NETPROBE, "run", "--tool", "native", "127.0.0.1", "-p", str(port),
         "-P", str(streams), "-t", str(seconds), "-i", "0.1", "--json-stream"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    intervals = [e["data"] for e in events if e["event"] == "interval"]
    ends = [e["data"] for e in events if e["event"] == "end"]
    assert len(ends) == 1
    return intervals, ends[0]


def _every_interval_of_every_stream(intervals: list[dict], streams: int, seconds: float) -> None:
    # Each end (the client's senders here, the server's receivers, sent over the control
    # connection) reads every stream and a sum at each step, all over one span, and its
    # steps follow each other from the start to the end with no gap or overlap (the last
    # of each stream ends where its own data did). A sampler that was late read a longer
    # step (its true span: see Side._read_at), never a partial one: how many steps it
    # read depends on the CPU it got, not asserted here.
    for role in ("sender", "receiver"):
        steps: dict[float, list[tuple[int | None, float]]] = {}
        for i in intervals:
            if i["role"] == role:
                steps.setdefault(i["start_s"], []).append((i["stream_id"], i["end_s"]))
        starts = sorted(steps)
        assert starts and starts[0] == 0.0, (role, starts[:1])
        for start in starts:
            ids = sorted((-1 if s is None else s) for s, _ in steps[start])
            assert ids == [-1, *range(1, streams + 1)], (role, start, len(ids))
        for start, after in zip(starts, starts[1:]):
            assert {end for _, end in steps[start]} == {after}, (role, start, after)
        last = steps[starts[-1]]
        assert max(end for _, end in last) >= seconds - 0.05, (role, starts[-1], last[:3])


# A rate test: 128 busy data threads beside the samplers (and the CPU they leave them).
@pytest.mark.rate
@pytest.mark.skipif(FRACTION < 1, reason="a budgeted run (the ARM wheels under qemu-user, "
                    "where the interpreter is 10-20x slower): a Python sampler at -i 0.1 "
                    "beside 128 data threads needs a native-speed interpreter")
@pytest.mark.parametrize("streams", [64, 128])
def test_every_interval_of_every_stream_at_many_streams(streams: int) -> None:
    """-P 64 -i 0.1 streamed a fraction of its samples (10 of 50 steps on each end): the
    sampler, a Python thread, got 1/130 of the CPU beside 128 busy data threads and fell
    seconds behind, so the steps left at the end became one tail. -P 128 failed outright:
    its final report is over the 64 KiB frame limit, so neither end ever got the other's."""
    with netprobe_server() as server:
        intervals, result = _streamed_run(server.port, streams, 2.0)
    assert result["status"] == "ok", result["errors"]
    assert not [w for w in result["warnings"] if "interval samples" in w]
    assert len(result["streams"]) == streams
    _every_interval_of_every_stream(intervals, streams, 2.0)


def _hold_the_interpreter(after_s: float, for_s: float) -> threading.Thread:
    """A thread that, ``after_s`` from now, keeps Python's interpreter lock ``for_s``: a
    busy loop with a switch interval that long. The data loops, in C without the lock, go
    on; the sampler, a Python thread, waits (as beside a CPU-heavy host of the API)."""
    def hold() -> None:
        time.sleep(after_s)
        before = sys.getswitchinterval()
        sys.setswitchinterval(for_s)
        try:
            end = time.perf_counter() + for_s
            while time.perf_counter() < end:
                pass
        finally:
            sys.setswitchinterval(before)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    return thread


@pytest.mark.host_timing
def test_a_step_read_late_spans_the_time_its_bytes_took() -> None:
    """A sampler held 0.5 s read its next step's counters 0.5 s late and labelled them with
    the step's boundary: at a paced 200 Mbit/s, a 0.2 s step read 0.7 s of bytes (about
    700 Mbit/s) and the next ones too little. Each step's rate is now its bytes over its
    span, the late one's included: every one reads the pace."""
    with netprobe_server() as server:
        holder = _hold_the_interpreter(0.8, 0.5)
        result = netprobe.run("127.0.0.1", port=server.port, duration_s=2.0, interval_s=0.2,
                              rate_bits_per_second=200e6)
        holder.join(5)
    mine = [i for i in result.intervals if i.role == "sender" and i.stream_id is None
            and i.end_s - i.start_s >= 0.1]
    rates = [(i.start_s, i.end_s, round(i.bytes * 8 / (i.end_s - i.start_s) / 1e6))
             for i in mine]
    assert any(end - start > 0.3 for start, end, _ in rates), rates  # the late step
    assert all(170 <= mbps <= 230 for _, _, mbps in rates), rates


def test_stream_loops_together_weigh_about_a_cpu_each() -> None:
    """The nice level of the loops: none while there are no more streams than CPUs; past
    that, all of them together weigh within one nice step (x1.25) of ``cpus`` ordinary
    threads, so a control thread always weighs as much as a CPU's worth of loops."""
    for cpus in (1, 2, 4, 16):
        assert side.data_nice(cpus, cpus) == 0
        for streams in (cpus * 2, 64, 128, 256):
            if streams <= cpus:
                continue
            nice = side.data_nice(streams, cpus)
            weight = streams * side.NICE_STEP_WEIGHT ** -nice  # an ordinary thread weighs 1
            assert 0 < nice <= side.MAX_NICE
            if nice < side.MAX_NICE:
                assert cpus / side.NICE_STEP_WEIGHT <= weight <= cpus * side.NICE_STEP_WEIGHT
    assert side.data_nice(100_000, 1) == side.MAX_NICE


def test_stream_threads_run_at_that_nice_level() -> None:
    """The level is applied to each stream loop's own thread (read back from /proc): while
    a test runs, the server has exactly one thread per stream at that level, and its other
    threads (accept loop, session, sampler, control reader) keep the process's own."""
    cpus = side._cpus()
    streams = cpus * 8
    with netprobe_server() as server:
        # Levels are relative to the server's own (a suite run under `nice` starts it nicer).
        base = _nice_of(f"/proc/{server.pid}/stat")
        expected = min(side.MAX_NICE, base + side.data_nice(streams, cpus))
        if expected == base:  # a suite run at nice 19 (the emulated ARM suites' runs)
            pytest.skip(f"the server runs at nice {base} already: its loops can go no "
                        "nicer, so nothing tells them from its other threads")
        proc = subprocess.Popen(
            [*NETPROBE, "run", "--tool", "native", "127.0.0.1", "-p", str(server.port),
             "-P", str(streams), "-t", "1.5", "--json"], stdout=subprocess.DEVNULL)
        try:
            levels = _thread_nice_levels(server.pid, streams, expected)
        finally:
            proc.wait(30)
    assert levels[expected] == streams and levels[base] >= 2, (base, levels)


def _nice_of(stat_path: str) -> int:
    # /proc/.../stat: the 19th field is the nice value (after the parenthesised name).
    with open(stat_path) as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[16])


def _thread_nice_levels(pid: int, streams: int, expected: int) -> Counter:
    # /proc/PID/task/TID/stat: the 19th field is the thread's nice value.
    end = time.monotonic() + 10
    levels: Counter = Counter()
    while time.monotonic() < end:
        levels = Counter()
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                levels[_nice_of(f"/proc/{pid}/task/{tid}/stat")] += 1
            except OSError:
                continue
        if levels[expected] >= streams:
            break
        time.sleep(0.05)
    return levels


# --- samples for a peer a step behind are queued, for one that stopped reading dropped -------


def _channel_pair() -> tuple[protocol.Channel, socket.socket]:
    ours, theirs = socket.socketpair()
    return protocol.Channel(ours), theirs


def test_samples_wait_for_a_peer_that_reads_late() -> None:
    """try_send used to drop a sample whenever the socket could not take it at once: a
    client that read a step late lost samples. Now what the socket does not take waits in
    the channel's queue and goes out, in order, with the next send."""
    channel, peer = _channel_pair()
    count = 2000  # ~0.7 MB: well past what a socketpair's buffers hold unread
    try:
        for n in range(count):
            assert channel.try_send({"type": "interval", "n": n, "pad": "x" * 300})
        received: list[dict] = []
        reader = threading.Thread(target=_read_all, args=(peer, received, count + 1))
        reader.start()
        channel.send({"type": "report"})  # flushes the queue first
        reader.join(30)
        assert [m.get("n") for m in received] == [*range(count), None]
    finally:
        channel.close()
        peer.close()


def test_samples_for_a_peer_that_stopped_reading_are_bounded() -> None:
    """A peer that reads nothing costs at most QUEUE_BYTES: past it samples are dropped
    (counted by the conductor), and no call waits."""
    channel, peer = _channel_pair()
    try:
        message = {"type": "interval", "pad": "x" * 4000}
        results = [channel.try_send(message) for _ in range(2 * protocol.QUEUE_BYTES // 4000)]
        assert results[0] and not results[-1]
        assert len(channel._queued) <= protocol.QUEUE_BYTES
    finally:
        channel.close()
        peer.close()


def _read_all(sock: socket.socket, into: list[dict], count: int) -> None:
    reader = protocol.FrameReader()
    while len(into) < count:
        chunk = sock.recv(65536)
        if not chunk:
            return
        into.extend(reader.feed(chunk))


# --- the server's allocator: its arenas bounded, so memory stays flat test after test --------

ARENAS_SCRIPT = """
import sys, threading
from netprobe import core
from netprobe.engine import server
from netprobe.engine.client import run_test
from netprobe.plugin import NullReporter
from netprobe.schema import TestSpec

ready = threading.Event()
port = []
config = server.ServerConfig(bind_address="127.0.0.1", port=0)
threading.Thread(target=server.serve, daemon=True,
                 args=(config, server.null_log, lambda p: (port.append(p), ready.set()))).start()
ready.wait(10)
for kind in ({"streams": 8}, {"direction": "bidir", "streams": 4}, {"streams": 8}):
    spec = TestSpec(duration_s=0.3, interval_s=0.1, port=port[0], **kind)
    assert run_test(spec, NullReporter(), "127.0.0.1").status == "ok"
print(core.allocator_arenas())
"""


@pytest.mark.skipif(core.allocator_arenas() is None,
                    reason="no way to count the allocator's arenas here (not glibc, or no C core)")
def test_a_server_process_keeps_its_allocator_arenas_bounded() -> None:
    """Each test's threads (session, 8 stream loops, sampler, control reader) got malloc
    arenas of their own, up to 8 a core, each keeping what its threads freed: the soak's
    RSS grew test after test with threads and fds flat. serve() bounds them first thing
    (read back from glibc's malloc_info, in the process that served the tests)."""
    done = subprocess.run([sys.executable, "-c", ARENAS_SCRIPT], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert 1 <= int(done.stdout.split()[-1]) <= ALLOCATOR_ARENAS
