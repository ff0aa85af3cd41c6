"""The data path, on real loopback sockets, against both implementations.

Every test runs on the compiled core ("c") and on the pure-Python one ("python"); the
compiled one is skipped only when it cannot be built here.
"""
from __future__ import annotations

import contextlib
import errno
import importlib
import os
import re
import select
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import netprobe.core
import netprobe.core.wrapper
from netprobe.core import contract, pure
from netprobe.core.records import HostCpu, TcpInfo, pattern
from netprobe.errors import CoreError

from .budget import FRACTION

ROOT = Path(__file__).resolve().parent.parent
HEADER = struct.Struct("!QQ")
MIB = 1 << 20
PURE = contract.DataPath(pure)  # netprobe.core's functions over the pure-Python path


@pytest.fixture(scope="session")
def compiled() -> Any:
    """netprobe.core on the C data path, building the extension in place if need be."""
    if netprobe.core.DATA_PATH != "c":
        if os.environ.get("NETPROBE_PURE") == "1":
            pytest.skip("NETPROBE_PURE=1")
        build = subprocess.run([sys.executable, "csrc/build_core.py"], cwd=ROOT,
                               capture_output=True, text=True, check=False)
        importlib.reload(netprobe.core.wrapper)
        importlib.reload(netprobe.core)
        if netprobe.core.DATA_PATH != "c":
            pytest.skip(f"the C core cannot be built here: {build.stderr[-500:]}")
    return netprobe.core


@pytest.fixture(params=["c", "python"])
def impl(request: pytest.FixtureRequest) -> Any:
    """Each implementation in turn: the compiled core, then the pure-Python one."""
    if request.param == "c":
        return request.getfixturevalue("compiled")
    return PURE


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=2) as executor:
        yield executor


@contextlib.contextmanager
def tcp_pair(family: int = socket.AF_INET) -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected (client, server) TCP pair on loopback."""
    host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    with socket.socket(family, socket.SOCK_STREAM) as listener:
        listener.bind((host, 0))
        listener.listen(1)
        client = socket.create_connection(listener.getsockname()[:2], timeout=5)
        client.settimeout(None)
        server, _ = listener.accept()
    with client, server:
        yield client, server


def send_within(sock: socket.socket, data: bytes, seconds: float = 10.0) -> None:
    """``sock.sendall(data)``, but never blocked past ``seconds``: a loop under test that
    stopped reading fails its test instead of hanging the suite (an armv7l run sat in
    sendall for minutes once the receiving loop had raised)."""
    deadline = time.monotonic() + seconds
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([], [sock], [], left)[1]:
            raise AssertionError(f"nothing read for {seconds:g} s: the receiver stopped")
        try:
            view = view[sock.send(view, socket.MSG_DONTWAIT):]
        except BlockingIOError:
            continue


@contextlib.contextmanager
def udp_pair(family: int = socket.AF_INET) -> Iterator[tuple[socket.socket, socket.socket]]:
    """A (sender connected to receiver, receiver) UDP pair on loopback."""
    host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    rx = socket.socket(family, socket.SOCK_DGRAM)
    tx = socket.socket(family, socket.SOCK_DGRAM)
    with rx, tx:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MIB)
        rx.bind((host, 0))
        tx.connect(rx.getsockname()[:2])
        yield tx, rx


def datagram(seq: int, sent_ns: int = 0, length: int = 64) -> bytes:
    return HEADER.pack(seq, sent_ns) + bytes(length - HEADER.size)


def drain(sock: socket.socket) -> int:
    """Read a stream socket to EOF with plain Python; returns the byte count."""
    total = 0
    while chunk := sock.recv(1 << 16):
        total += len(chunk)
    return total


def finish(future: Future[Any], within: float) -> Any:
    return future.result(timeout=within)


def soon(seconds: float) -> float:
    return time.monotonic() + seconds


# --- TCP -------------------------------------------------------------------------------


@pytest.mark.parametrize("zerocopy", [False, True])
def test_tcp_send_stops_exactly_at_max_bytes(impl: Any, pool: ThreadPoolExecutor,
                                              zerocopy: bool) -> None:
    with tcp_pair() as (client, server):
        received = pool.submit(drain, server)
        counters = impl.Counters()
        sent = impl.tcp_send(client.fileno(), counters, length=65536, max_bytes=3_000_017,
                             zerocopy=zerocopy, deadline=soon(10))
        client.shutdown(socket.SHUT_WR)
        assert sent == 3_000_017
        assert finish(received, 10) == 3_000_017
    assert counters.bytes == 3_000_017
    assert counters.calls >= 3_000_017 // 65536 + 1
    assert counters.packets == 0


@pytest.mark.parametrize("zerocopy", [False, True])
def test_tcp_send_payload_is_the_pattern(impl: Any, zerocopy: bool) -> None:
    with tcp_pair() as (client, server):
        impl.tcp_send(client.fileno(), impl.Counters(), length=1000, max_bytes=1000,
                      zerocopy=zerocopy)
        client.shutdown(socket.SHUT_WR)
        data = b"".join(iter(lambda: server.recv(4096), b""))
    assert data == pattern(1000)
    assert data != bytes(1000)


@pytest.mark.parametrize("skip_copy", [False, True])
def test_tcp_recv_counts_to_eof(impl: Any, pool: ThreadPoolExecutor,
                                skip_copy: bool) -> None:
    with tcp_pair() as (client, server):
        counters = impl.Counters()
        got = pool.submit(impl.tcp_recv, server.fileno(), counters, length=131072,
                          skip_copy=skip_copy, deadline=soon(10))
        send_within(client, b"x" * 2_500_001)
        client.shutdown(socket.SHUT_WR)
        assert finish(got, 10) == 2_500_001
    assert counters.bytes == 2_500_001


def test_tcp_recv_stops_exactly_at_max_bytes(impl: Any) -> None:
    with tcp_pair() as (client, server):
        send_within(client, b"y" * 300_000)
        client.shutdown(socket.SHUT_WR)
        assert impl.tcp_recv(server.fileno(), impl.Counters(), length=65536,
                             max_bytes=100_001, deadline=soon(5)) == 100_001
        assert drain(server) == 199_999


def test_tcp_loops_accumulate_on_the_same_counters(impl: Any) -> None:
    counters = impl.Counters()
    with tcp_pair() as (client, server):
        for _ in range(3):
            impl.tcp_send(client.fileno(), counters, length=4096, max_bytes=10_000)
        client.shutdown(socket.SHUT_WR)
        assert drain(server) == 30_000
    assert counters.bytes == 30_000


def test_tcp_send_ends_at_deadline(impl: Any, pool: ThreadPoolExecutor) -> None:
    with tcp_pair() as (client, server):
        received = pool.submit(drain, server)
        start = time.monotonic()
        sent = impl.tcp_send(client.fileno(), impl.Counters(), length=131072,
                             deadline=start + 0.3)
        elapsed = time.monotonic() - start
        client.shutdown(socket.SHUT_WR)
        assert finish(received, 10) == sent > 0
    assert 0.29 <= elapsed < 0.6


def test_nonblocking_sockets_work_without_spinning(impl: Any,
                                                   pool: ThreadPoolExecutor) -> None:
    with tcp_pair() as (client, server):
        client.setblocking(False)
        server.setblocking(False)
        counters = impl.Counters()
        idle = pool.submit(impl.tcp_recv, server.fileno(), counters, length=65536,
                           deadline=soon(0.3))
        assert finish(idle, 5) == 0
        assert counters.calls <= 10  # one poll per 100 ms tick, not a busy loop
        got = pool.submit(impl.tcp_recv, server.fileno(), counters, length=65536,
                          max_bytes=5_000_000, deadline=soon(10))
        assert impl.tcp_send(client.fileno(), impl.Counters(), length=65536,
                             max_bytes=5_000_000, deadline=soon(10)) == 5_000_000
        assert finish(got, 10) == 5_000_000
        assert not os.get_blocking(server.fileno())


def _timeval() -> str:
    """struct timeval's layout: 2 x 8 bytes, or 2 x 4 with a 32-bit time_t (glibc armv7l
    before Debian trixie), which CPython shows by refusing a time past 2038. musl 1.2 on
    armv7l has a 64-bit time_t: there getsockopt's length said "2 x 4" under qemu (4 bytes
    back), and setting 8 bytes was EINVAL."""
    try:
        time.gmtime(2**31)
    except (OverflowError, OSError, ValueError):
        return "=2i"
    return "=2q"


def test_loops_restore_the_socket_timeout(impl: Any) -> None:
    with tcp_pair() as (client, server):
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack(_timeval(), 7,
                                                                             250_000))
        saved = server.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16)  # in jiffies
        impl.tcp_recv(server.fileno(), impl.Counters(), length=1024, deadline=soon(0.05))
        assert server.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16) == saved
        assert client.fileno() >= 0 and server.fileno() >= 0  # and the fds stay open


_TRACED_LOOPS = """
import socket, sys, threading
from netprobe import core
length, path = int(sys.argv[1]), sys.argv[2]
assert core.DATA_PATH == path, core.DATA_PATH
with socket.create_server(("127.0.0.1", 0)) as listener:
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
sending = threading.Thread(target=core.tcp_send, args=(client.fileno(), core.Counters()),
                           kwargs={"length": length, "max_bytes": 8 * length})
sending.start()
assert core.tcp_recv(server.fileno(), core.Counters(), length=length,
                     max_bytes=8 * length) == 8 * length
sending.join()
"""


@pytest.mark.parametrize("length", [3 << 16, 12_000])
def test_tcp_loops_copy_to_and_from_page_aligned_buffers(impl: Any, length: int,
                                                         tmp_path: Path) -> None:
    # The kernel's copy into a receive buffer a few bytes past a page boundary ran up to 3x
    # slower (np_alloc_data in csrc/np_common.h): 4 loopback streams moved 21-25 Gbit/s with
    # glibc's malloc, whose large blocks start 16 bytes into a page, and 49-73 aligned. The
    # buffer each data call passes is read off the system calls themselves (strace, raw).
    if not shutil.which("strace"):
        pytest.skip("strace is not installed")
    trace = tmp_path / "trace"
    env = {**os.environ, "NETPROBE_PURE": "1" if impl is PURE else "0"}
    proc = subprocess.run(
        ["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=sendto,recvfrom",
         "-e", "raw=sendto,recvfrom", sys.executable, "-c", _TRACED_LOOPS, str(length),
         "python" if impl is PURE else "c"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0 and "ptrace" in proc.stderr:
        pytest.skip(f"strace cannot trace here: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    calls = re.findall(r"(sendto|recvfrom)\(0x[0-9a-f]+, 0x([0-9a-f]+), 0x([0-9a-f]+)",
                       trace.read_text())
    # The loops' calls ask for the whole length (a send's tail call can be shorter).
    buffers = {(name, int(addr, 16)) for name, addr, size in calls if int(size, 16) == length}
    assert {name for name, _ in buffers} == {"sendto", "recvfrom"}, calls[:10]
    assert all(addr % 4096 == 0 for _, addr in buffers), sorted(buffers)


def _lowat(sock: socket.socket) -> int:
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)


def _threshold(length: int, sock: socket.socket, wake_bytes: int | None = None) -> int:
    """The wake threshold of a fast flow (np_tcp.c): the read length or ``wake_bytes`` (1
    MiB when not given), whichever is longer, within a quarter of the receive buffer."""
    return min(max(length, wake_bytes or MIB),
               sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4)


def _until(check: Any, within: float) -> Any:
    """Poll ``check()`` until it is truthy or ``within`` seconds pass; its last value."""
    end = time.monotonic() + within
    while not (value := check()) and time.monotonic() < end:
        time.sleep(0.005)
    return value


def _flowing(impl: Any, pool: ThreadPoolExecutor, client: socket.socket,
             seconds: float) -> tuple[Any, Future[Any]]:
    """A loopback flow for ``seconds``, its counters and future: 400 Mbit/s, 500 KB in
    10 ms, above any threshold here, and slow enough for a 4 KiB pure-Python reader to
    empty the queue (a reader that never does never sleeps, and keeps the caller's)."""
    sender = impl.Counters()
    return sender, pool.submit(impl.tcp_send, client.fileno(), sender, length=64 << 10,
                               deadline=soon(seconds), rate_bps=400e6)


@pytest.mark.host_timing
@pytest.mark.parametrize(("length", "wake_bytes"),
                         [(1 << 20, None), (4096, None), (4096, 32 << 10), (64 << 10, 32 << 10)])
def test_tcp_recv_wakes_once_per_quarter_buffer(impl: Any, pool: ThreadPoolExecutor,
                                                 length: int, wake_bytes: Any) -> None:
    # A receiver faster than its link must not wake for every segment: once data flows the
    # loop asks the kernel (SO_RCVLOWAT) to wake it once wake_bytes (1 MiB unless the
    # caller says) or its read length, whichever is longer, are queued, within a quarter of
    # SO_RCVBUF (this flow brings far more in 10 ms); not before (the flow's rate is not
    # known yet); and puts the caller's setting back afterwards. Short calls do not lower
    # it: the kernel wakes a sleeping reader by the threshold, not by the call's length,
    # and a reader of 4 KiB calls woken per call would wake 64 times as often as one of
    # 256 KiB. The engine shares 1 MiB between a side's receivers (side.wake_bytes).
    with tcp_pair() as (client, server):
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 << 10)  # no autotuning
        before = _lowat(server)
        wanted = _threshold(length, server, wake_bytes)
        counters = impl.Counters()
        running = pool.submit(impl.tcp_recv, server.fileno(), counters, length=length,
                              deadline=soon(5), wake_bytes=wake_bytes)
        time.sleep(0.15)  # more than a tick with the loop waiting and nothing come
        idle = _lowat(server)
        sender, sending = _flowing(impl, pool, client, 1.0)
        seen = _until(lambda: _lowat(server) != before and _lowat(server), 2.0)
        finish(sending, 5)
        client.shutdown(socket.SHUT_WR)
        assert finish(running, 5) == sender.bytes
        assert idle == before
        assert seen == wanted
        assert _lowat(server) == before


@pytest.mark.host_timing
def test_tcp_recv_raises_its_threshold_when_its_calls_divide_the_writes(
        impl: Any, pool: ThreadPoolExecutor) -> None:
    # 16 KiB reads of 64 KiB writes never return less than they ask: the rate's clock once
    # started only at such a short read (the queue then empty), so this loop kept waking
    # per segment for the whole test. It starts once the bytes queued when the loop began
    # (FIONREAD) are read, here the 256 KiB written before it.
    with tcp_pair() as (client, server):
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 << 10)  # no autotuning
        send_within(client, pattern(256 << 10))
        counters, sender = impl.Counters(), impl.Counters()
        running = pool.submit(impl.tcp_recv, server.fileno(), counters, length=16 << 10,
                              deadline=soon(5))
        # 1 Gbit/s is over 64 KiB a millisecond, so the paced writes are whole 64 KiB ones.
        sending = pool.submit(impl.tcp_send, client.fileno(), sender, length=64 << 10,
                              deadline=soon(0.6), rate_bps=1e9)
        wanted = _threshold(16 << 10, server)  # a quarter of the buffer: 10 ms is 1.25 MB
        seen = _until(lambda: _lowat(server) == wanted, 0.5)
        finish(sending, 5)
        client.shutdown(socket.SHUT_WR)
        assert finish(running, 5) == sender.bytes + (256 << 10)
    assert seen, f"the threshold never rose to {wanted}"


@pytest.mark.host_timing
def test_tcp_recv_counts_a_trickle_below_the_wake_threshold(impl: Any,
                                                              pool: ThreadPoolExecutor) -> None:
    # Fewer wake-ups must not mean late counts: bytes below the threshold a fast flow set
    # are counted within a tick (100 ms), not when the threshold or EOF comes.
    with tcp_pair() as (client, server):
        counters = impl.Counters()
        running = pool.submit(impl.tcp_recv, server.fileno(), counters, length=1 << 20,
                              deadline=soon(5))
        sender, sending = _flowing(impl, pool, client, 0.3)
        assert _until(lambda: _lowat(server) > 1000, 2.0)
        finish(sending, 5)
        assert _until(lambda: counters.bytes == sender.bytes, 1.0)
        lowat = _lowat(server)
        send_within(client, b"x" * 1000)
        assert _until(lambda: counters.bytes == sender.bytes + 1000, 1.0)
        client.shutdown(socket.SHUT_WR)
        assert finish(running, 5) == sender.bytes + 1000
        assert lowat > 1000  # the trickle was below the threshold


@pytest.mark.host_timing
def test_tcp_recv_wake_threshold_follows_the_buffer_as_it_grows(impl: Any,
                                                                pool: ThreadPoolExecutor) -> None:
    # The kernel grows an autotuned receive buffer as a flow proves it needs one (across a
    # 100 Mbit/s link with a queue: 128 KiB to ~1.7 MiB). A threshold fixed at the loop's
    # start stayed at a quarter of the first buffer: ~300 wake-ups a second there. Here
    # the buffer is grown by hand (SO_RCVBUF) while a fast flow runs.
    length = 256 << 10
    with tcp_pair() as (client, server):
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 10)
        counters = impl.Counters()
        running = pool.submit(impl.tcp_recv, server.fileno(), counters, length=length,
                              deadline=soon(10))
        first = sent = 0
        end = time.monotonic() + 3
        while first <= 1 and time.monotonic() < end:  # data, until its rate is judged
            send_within(client, b"x" * (64 << 10))
            sent += 64 << 10
            first = _lowat(server)
        assert first == server.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)  # rmem_max caps it
        grown = _threshold(length, server)
        assert grown > first
        end = time.monotonic() + 3
        while _lowat(server) != grown and time.monotonic() < end:  # a tick or two of data
            send_within(client, b"x" * (1 << 20))
            sent += 1 << 20
        assert _lowat(server) == grown
        client.shutdown(socket.SHUT_WR)
        assert finish(running, 5) == sent
        assert _lowat(server) == 1  # the caller's value is back once the loop returns


@pytest.mark.host_timing
def test_tcp_recv_wake_threshold_keeps_the_count_within_10_ms_of_a_slow_flow(
        impl: Any, pool: ThreadPoolExecutor) -> None:
    # The count moves when a call returns: with a threshold of a quarter buffer (512 KiB
    # here) a 20 Mbit/s flow's count would lag 100 ms (the tick) behind what has arrived.
    rate = 20e6
    with tcp_pair() as (client, server):
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        counters, sender = impl.Counters(), impl.Counters()
        running = pool.submit(impl.tcp_recv, server.fileno(), counters, length=1 << 20,
                              deadline=soon(10))
        sending = pool.submit(impl.tcp_send, client.fileno(), sender, length=64 << 10,
                              deadline=soon(0.8), rate_bps=rate)
        assert _until(lambda: 1 < _lowat(server) <= 1.5 * rate / 8 * 0.010, 2.0), _lowat(server)
        finish(sending, 5)
        client.shutdown(socket.SHUT_WR)
        assert finish(running, 5) == sender.bytes


@pytest.mark.host_timing
def test_tcp_recv_count_keeps_within_10_ms_of_a_slow_flow_from_its_first_byte(
        impl: Any, pool: ThreadPoolExecutor) -> None:
    # Before the flow's rate is known the threshold may not wait for more than that rate
    # brings in 10 ms either. One set at the start from the read length and the buffer
    # alone (512 KiB here) held 250 KB uncounted for the first tick of every loop: a
    # warm-up base taken then was low, and a 100 Mbit/s link read 98-99 in half the runs.
    rate, write = 20e6, 16 << 10
    per_10_ms = rate / 8 * 0.010
    with tcp_pair() as (client, server):
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        counters, sender = impl.Counters(), impl.Counters()
        running = pool.submit(impl.tcp_recv, server.fileno(), counters, length=1 << 20,
                              deadline=soon(10))
        time.sleep(0.05)  # the loop is waiting before the first byte comes
        sending = pool.submit(impl.tcp_send, client.fileno(), sender, length=write,
                              deadline=soon(0.6), rate_bps=rate)
        lags = []
        while not sending.done():
            lags.append(sender.bytes - counters.bytes)
            time.sleep(0.002)
        finish(sending, 5)
        client.shutdown(socket.SHUT_WR)
        assert finish(running, 5) == sender.bytes
    assert len(lags) > 50
    # 10 ms of data twice over (the rate is first judged from 10 ms of it) and one write
    assert max(lags) <= 3 * per_10_ms + write, (max(lags), per_10_ms)


# --- stop flag ---------------------------------------------------------------------------


def _stop_after(counters: Any, delay: float) -> threading.Timer:
    timer = threading.Timer(delay, counters.stop)
    timer.start()
    return timer


def test_stop_ends_a_blocked_recv(impl: Any) -> None:
    with tcp_pair() as (_client, server):
        counters = impl.Counters()
        _stop_after(counters, 0.2)
        start = time.monotonic()
        assert impl.tcp_recv(server.fileno(), counters, length=65536, deadline=soon(10)) == 0
        assert time.monotonic() - start < 0.2 + 0.3
    assert counters.stopped


def test_stop_ends_a_blocked_send(impl: Any) -> None:
    with tcp_pair() as (client, _server):  # nobody reads: the send buffer fills up
        counters = impl.Counters()
        _stop_after(counters, 0.3)
        start = time.monotonic()
        sent = impl.tcp_send(client.fileno(), counters, length=65536, deadline=soon(10))
        assert time.monotonic() - start < 0.3 + 0.3
        assert sent == counters.bytes > 0


def test_stop_ends_udp_loops(impl: Any) -> None:
    with udp_pair() as (tx, rx):
        rx_counters, tx_counters = impl.Counters(), impl.Counters()
        _stop_after(rx_counters, 0.2)
        start = time.monotonic()
        assert impl.udp_recv(rx.fileno(), rx_counters, length=2048, deadline=soon(10)) == 0
        assert time.monotonic() - start < 0.5
        _stop_after(tx_counters, 0.2)
        impl.udp_send(tx.fileno(), tx_counters, length=64, rate_pps=0.5, deadline=soon(10))
        assert time.monotonic() - start < 0.2 + 0.5 + 0.3
        assert tx_counters.packets == 1  # the first datagram is due at once, the next in 2 s


def test_stop_before_start_returns_at_once(impl: Any) -> None:
    counters = impl.Counters()
    counters.stop()
    with tcp_pair() as (client, _server):
        assert impl.tcp_send(client.fileno(), counters, length=1024) == 0
    assert counters.calls == 0


def test_counters_are_readable_while_the_loop_runs(impl: Any,
                                                   pool: ThreadPoolExecutor) -> None:
    with tcp_pair() as (client, server):
        counters = impl.Counters()
        running = pool.submit(impl.tcp_recv, server.fileno(), counters, length=65536,
                              deadline=soon(10))
        sender = pool.submit(impl.tcp_send, client.fileno(), impl.Counters(), length=65536,
                             deadline=soon(0.4))
        samples = []
        while not sender.done():
            samples.append(counters.bytes)
            time.sleep(0.02)
        client.shutdown(socket.SHUT_WR)
        total = finish(running, 10)
    assert samples == sorted(samples)
    assert len({s for s in samples if 0 < s < total}) >= 3  # saw it grow mid-run
    assert counters.bytes == total == sender.result()


# --- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("zerocopy", [False, True])
def test_send_to_a_reset_connection_names_the_syscall(impl: Any, zerocopy: bool) -> None:
    with tcp_pair() as (client, server):
        server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        server.close()  # RST
        time.sleep(0.05)
        with pytest.raises(CoreError) as info:
            impl.tcp_send(client.fileno(), impl.Counters(), length=65536, zerocopy=zerocopy,
                          deadline=soon(5))
    assert info.value.syscall == ("sendfile" if zerocopy else "send")
    assert info.value.errno in (errno.EPIPE, errno.ECONNRESET)
    assert isinstance(info.value, OSError)


def test_recv_on_a_reset_connection_names_the_syscall(impl: Any) -> None:
    with tcp_pair() as (client, server):
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        time.sleep(0.05)
        with pytest.raises(CoreError) as info:
            impl.tcp_recv(server.fileno(), impl.Counters(), length=1024, deadline=soon(5))
    assert (info.value.syscall, info.value.errno) == ("recv", errno.ECONNRESET)
    assert str(info.value).startswith("[Errno") and "recv: " in str(info.value)


def test_bad_descriptors_name_the_first_syscall(impl: Any) -> None:
    read_end, write_end = os.pipe()
    os.close(write_end)
    try:
        with pytest.raises(CoreError) as info:
            impl.tcp_send(read_end, impl.Counters(), length=1024)
        assert (info.value.syscall, info.value.errno) == (
            "getsockopt(SO_SNDTIMEO)", errno.ENOTSOCK)
    finally:
        os.close(read_end)
    with pytest.raises(CoreError) as info:
        impl.udp_recv(read_end, impl.Counters(), length=64)  # now closed
    assert (info.value.syscall, info.value.errno) == ("getsockopt(SO_RCVTIMEO)", errno.EBADF)


def test_udp_send_on_an_unconnected_socket_names_the_syscall(impl: Any) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx, \
            pytest.raises(CoreError) as info:
        impl.udp_send(tx.fileno(), impl.Counters(), length=64, max_packets=1, deadline=soon(5))
    # One datagram per send() in pure Python, batches per sendmmsg() in C.
    assert info.value.syscall == ("send" if impl is PURE else "sendmmsg")
    assert info.value.errno == errno.EDESTADDRREQ


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"length": 15}, ValueError),
    ({"length": 65508}, ValueError),
    ({"length": 64, "batch": 0}, ValueError),
    ({"length": 64, "batch": 1025}, ValueError),
    ({"length": 64, "rate_bps": 1e6, "rate_pps": 10.0}, ValueError),
    ({"length": 64, "rate_pps": 0.0}, ValueError),
    ({"length": 64, "max_packets": -1}, ValueError),
    ({"length": 64, "deadline": float("nan")}, ValueError),
    ({"length": 64.0}, TypeError),
])
def test_udp_arguments_are_checked(impl: Any, kwargs: dict[str, Any],
                                   error: type[Exception]) -> None:
    with pytest.raises(error):
        impl.udp_send(0, impl.Counters(), **kwargs)


def test_foreign_counters_and_fds_are_refused(impl: Any) -> None:
    with pytest.raises(ValueError):
        impl.tcp_recv(-1, impl.Counters(), length=1024)
    with pytest.raises(TypeError):
        impl.tcp_recv(0, object(), length=1024)
    if impl is not PURE:
        with pytest.raises(TypeError):
            impl.tcp_recv(0, PURE.Counters(), length=1024)


# --- UDP ------------------------------------------------------------------------------


def _recv_all(impl: Any, rx: socket.socket, counters: Any, count: int) -> int:
    return int(impl.udp_recv(rx.fileno(), counters, length=2048, max_packets=count,
                             deadline=soon(3)))


def test_udp_sequence_accounting(impl: Any) -> None:
    with udp_pair() as (tx, rx):
        for seq in (0, 1, 2, 5, 3, 3, 4, 9, 7):
            tx.send(datagram(seq))
        tx.send(b"not ours")  # too short to carry a sequence number
        counters = impl.Counters()
        got = _recv_all(impl, rx, counters, 10)
    assert got == counters.bytes == 9 * 64 + 8
    assert counters.packets == 10
    assert counters.duplicates == 1          # the second 3
    assert counters.out_of_order == 3        # 3, 4 after 5; 7 after 9
    assert counters.lost == 2                # 6 and 8 never came


def test_udp_late_arrivals_reduce_loss_across_calls(impl: Any) -> None:
    counters = impl.Counters()
    with udp_pair() as (tx, rx):
        for seq in (0, 1, 4):
            tx.send(datagram(seq))
        _recv_all(impl, rx, counters, 3)
        assert (counters.lost, counters.out_of_order) == (2, 0)
        for seq in (2, 3, 3):
            tx.send(datagram(seq))
        _recv_all(impl, rx, counters, 3)
    assert (counters.lost, counters.out_of_order, counters.duplicates) == (0, 2, 1)
    assert counters.packets == 6


def test_udp_duplicate_window_is_64k(impl: Any) -> None:
    with udp_pair() as (tx, rx):
        for seq in (0, 70_000, 69_999, 69_999, 0):
            tx.send(datagram(seq))
        counters = impl.Counters()
        _recv_all(impl, rx, counters, 5)
    assert counters.duplicates == 1          # 69_999 twice, inside the window
    assert counters.out_of_order == 2        # 69_999 once, and 0 from beyond the window
    assert counters.lost == 70_001 - 4


@pytest.mark.host_timing
def test_udp_jitter_follows_rfc3550(impl: Any) -> None:
    # Send times 100 ms apart, all five queued before the loop reads them: each of the 4
    # transitions has |D| = 100 ms less the gap between two reads, so J is at most
    # 100 ms * (1 - (15/16)**4) (RFC 3550's gain of 1/16; 1/8 would give 41.4) and falls
    # short of it by the reads' gaps times 0.2275. Those gaps are microseconds natively; the
    # pure loop under qemu-user took about 0.3 ms each (2.208 where 10 ms apart wanted
    # 2.275 +/- 0.05), so up to 5 ms each is allowed and the bound does not rest on timing.
    with udp_pair() as (tx, rx):
        for i in range(5):
            tx.send(datagram(i, sent_ns=1_000_000_000 + i * 100_000_000))
        counters = impl.Counters()
        _recv_all(impl, rx, counters, 5)
    gain = 1 - (15 / 16) ** 4
    assert (100 - 5) * gain <= counters.jitter_ms <= 100 * gain + 1e-6


@pytest.mark.host_timing
def test_udp_stream_end_to_end(impl: Any, pool: ThreadPoolExecutor) -> None:
    with udp_pair() as (tx, rx):
        rx_counters, tx_counters = impl.Counters(), impl.Counters()
        got = pool.submit(_recv_all, impl, rx, rx_counters, 3000)
        start_ns = time.monotonic_ns()
        sent = impl.udp_send(tx.fileno(), tx_counters, length=100, max_packets=3000,
                             rate_pps=20_000, deadline=soon(5))
        assert finish(got, 5) == sent == 300_000
    assert tx_counters.packets == rx_counters.packets == 3000
    assert tx_counters.bytes == rx_counters.bytes == 300_000
    assert (rx_counters.lost, rx_counters.out_of_order, rx_counters.duplicates) == (0, 0, 0)
    assert 0 <= rx_counters.jitter_ms < 50
    assert 3000 / 32 <= tx_counters.calls <= 3000 * 1.05
    assert time.monotonic_ns() > start_ns


def test_udp_datagram_format(impl: Any) -> None:
    with udp_pair() as (tx, rx):
        before = time.monotonic_ns()
        impl.udp_send(tx.fileno(), impl.Counters(), length=40, max_packets=5)
        after = time.monotonic_ns()
        rx.settimeout(2)
        frames = [rx.recv(2048) for _ in range(5)]
    assert [len(f) for f in frames] == [40] * 5
    seqs, stamps = zip(*(HEADER.unpack_from(f) for f in frames))
    assert list(seqs) == [0, 1, 2, 3, 4]
    assert all(before <= s <= after for s in stamps)
    assert frames[0][16:] == pattern(40)[16:]


def test_udp_sequence_continues_across_send_calls(impl: Any) -> None:
    counters = impl.Counters()
    with udp_pair() as (tx, rx):
        impl.udp_send(tx.fileno(), counters, length=16, max_packets=2)
        impl.udp_send(tx.fileno(), counters, length=16, max_packets=2)
        rx.settimeout(2)
        seqs = [HEADER.unpack(rx.recv(64))[0] for _ in range(4)]
    assert seqs == [0, 1, 2, 3]
    assert counters.packets == 4


def test_udp_max_bytes_counts_whole_datagrams(impl: Any) -> None:
    with udp_pair() as (tx, _rx):
        counters = impl.Counters()
        assert impl.udp_send(tx.fileno(), counters, length=100, max_bytes=1050) == 1000
    assert counters.packets == 10


@pytest.mark.host_timing
def test_udp_to_a_closed_port_is_not_an_error(impl: Any) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as gone:
        gone.bind(("127.0.0.1", 0))
        address = gone.getsockname()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        tx.connect(address)
        counters = impl.Counters()
        sent = impl.udp_send(tx.fileno(), counters, length=64, max_packets=200,
                             rate_pps=4000, deadline=soon(3))
    assert sent == 200 * 64
    assert counters.calls > 200  # refused sends were retried, not fatal


def test_udp_over_ipv6(impl: Any, pool: ThreadPoolExecutor) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        pair = udp_pair(socket.AF_INET6)
        tx, rx = pair.__enter__()
    except OSError as exc:
        pytest.skip(f"no ::1: {exc}")
    try:
        counters = impl.Counters()
        got = pool.submit(_recv_all, impl, rx, counters, 500)
        impl.udp_send(tx.fileno(), impl.Counters(), length=1200, max_packets=500,
                      rate_pps=10_000)
        assert finish(got, 5) == 500 * 1200
        assert counters.lost == 0
    finally:
        pair.__exit__(None, None, None)


# --- pacing ----------------------------------------------------------------------------


def _paced_tcp(impl: Any, pool: ThreadPoolExecutor, rate: float,
               seconds: float) -> tuple[float, float]:
    """(achieved rate / asked rate, sender thread's CPU seconds)."""
    with tcp_pair() as (client, server):
        received = pool.submit(drain, server)
        cpu_before = impl.rusage("thread")
        sent = impl.tcp_send(client.fileno(), impl.Counters(), length=131072,
                             rate_bps=rate, deadline=soon(seconds))
        cpu_after = impl.rusage("thread")
        client.shutdown(socket.SHUT_WR)
        assert finish(received, 10) == sent
    cpu = (cpu_after.user_s - cpu_before.user_s) + (cpu_after.system_s - cpu_before.system_s)
    return sent * 8 / seconds / rate, cpu


@pytest.mark.host_timing
def test_tcp_pacing_is_accurate_and_sleeps(impl: Any, pool: ThreadPoolExecutor) -> None:
    ratio, cpu = _paced_tcp(impl, pool, 100e6, 0.5)
    assert ratio == pytest.approx(1.0, abs=0.02)
    assert cpu < 0.5 * 0.5  # sleeps between writes, never spins


@pytest.mark.host_timing
def test_tcp_pacing_at_a_gigabit(compiled: Any, pool: ThreadPoolExecutor) -> None:
    ratio, _cpu = _paced_tcp(compiled, pool, 1e9, 0.5)
    assert ratio == pytest.approx(1.0, abs=0.02)


def _paced_udp(impl: Any, pool: ThreadPoolExecutor, seconds: float,
               **rate: float) -> tuple[int, Any]:
    with udp_pair() as (tx, rx):
        counters = impl.Counters()
        got = pool.submit(impl.udp_recv, rx.fileno(), counters, length=2048,
                          deadline=soon(seconds + 0.3))
        sent = impl.udp_send(tx.fileno(), impl.Counters(), length=1400,
                             deadline=soon(seconds), **rate)
        finish(got, 5)
    return sent, counters


# How close a paced sender must come to its rate over 0.5 s. The deadline is taken before
# the call; the loop's own set-up comes out of it. Natively that is microseconds; under
# qemu-user (a budgeted run: the ARM wheels' suite), where the interpreter is 10-20x
# slower, the pure loop's set-up took ~13 ms of the 500 (973 of 1000 datagrams at 2000/s).
PACE_TOLERANCE = 0.02 if FRACTION == 1 else 0.05


@pytest.mark.host_timing
def test_udp_pacing_by_bits(impl: Any, pool: ThreadPoolExecutor) -> None:
    # 100 Mbit/s of 1400-byte datagrams is ~9k sends/s: more than pure Python sustains
    # next to a pure-Python receiver on a busy 2-core box, so it is asked for less.
    rate = 20e6 if impl is PURE else 100e6
    sent, counters = _paced_udp(impl, pool, 0.5, rate_bps=rate)
    assert sent * 8 / 0.5 == pytest.approx(rate, rel=PACE_TOLERANCE)
    assert counters.bytes == sent and counters.lost == 0


@pytest.mark.host_timing
def test_udp_pacing_by_packets(impl: Any, pool: ThreadPoolExecutor) -> None:
    sent, counters = _paced_udp(impl, pool, 0.5, rate_pps=2000)
    assert sent // 1400 == pytest.approx(1000, rel=PACE_TOLERANCE)
    assert counters.packets == sent // 1400


@pytest.mark.host_timing
def test_udp_pacing_at_a_gigabit(compiled: Any, pool: ThreadPoolExecutor) -> None:
    sent, _counters = _paced_udp(compiled, pool, 0.5, rate_bps=1e9)
    assert sent * 8 / 0.5 == pytest.approx(1e9, rel=0.02)


# --- system figures -------------------------------------------------------------------


def test_tcp_info_after_a_transfer(impl: Any, full_tcp_info: None) -> None:
    with tcp_pair() as (client, server):
        impl.tcp_send(client.fileno(), impl.Counters(), length=65536, max_bytes=1_000_000)
        client.shutdown(socket.SHUT_WR)
        assert drain(server) == 1_000_000
        time.sleep(0.05)
        info = impl.tcp_info(client.fileno())
    assert isinstance(info, TcpInfo)
    assert None not in (info.rtt_us, info.snd_mss_bytes, info.retransmits, info.bytes_acked)
    assert info.bytes_acked >= 1_000_000
    assert info.snd_mss_bytes > 0 and info.snd_cwnd_bytes >= info.snd_mss_bytes
    assert info.pmtu_bytes >= 1280 and info.delivery_rate_bps > 0


def test_both_paths_read_tcp_info_alike(compiled: Any) -> None:
    with tcp_pair() as (client, server):
        send_within(client, b"z" * 10_000)
        server.recv(10_000, socket.MSG_WAITALL)
        time.sleep(0.05)
        assert compiled.tcp_info(client.fileno()) == PURE.tcp_info(client.fileno())


def test_tcp_info_on_udp_names_the_call(impl: Any) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock, \
            pytest.raises(CoreError) as info:
        impl.tcp_info(sock.fileno())
    assert info.value.syscall == "getsockopt(TCP_INFO)"
    assert info.value.errno in (errno.EOPNOTSUPP, errno.ENOPROTOOPT)


def test_tcp_info_short_kernel_struct_gives_none() -> None:
    raw = bytes(104)  # a kernel whose struct tcp_info ends after tcpi_total_retrans
    assert pure._tcpi(raw, "total_retrans") == 0
    assert pure._tcpi(raw, "bytes_acked") is None
    assert pure._tcpi(raw, "delivery_rate") is None


def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_rusage_counts_this_thread(impl: Any) -> None:
    before_t, cpu_before = impl.rusage("thread"), time.thread_time()
    end = time.monotonic() + 5  # on a busy host, 0.1 s of CPU may take longer
    while time.thread_time() - cpu_before < 0.1 and time.monotonic() < end:
        _burn(0.01)
    after_t, after_p = impl.rusage("thread"), impl.rusage("process")
    assert after_t.user_s + after_t.system_s - before_t.user_s - before_t.system_s >= 0.08
    assert after_p.user_s >= after_t.user_s
    with pytest.raises(ValueError):
        impl.rusage("host")


def test_host_cpu(impl: Any) -> None:
    earlier = impl.host_cpu()
    _burn(0.1)
    later = impl.host_cpu()
    assert isinstance(later, HostCpu)
    assert later.ticks_total >= earlier.ticks_total > 0
    assert 0.0 <= later.busy_fraction_since(earlier) <= 1.0
    assert later.busy_fraction_since(later) == 0.0


def test_both_paths_read_host_cpu_and_rusage_alike(compiled: Any) -> None:
    for _ in range(5):  # a tick may land between the two reads
        if compiled.host_cpu() == PURE.host_cpu():
            break
    else:
        pytest.fail("host_cpu differs between data paths")
    record = compiled.rusage()
    assert type(record) is type(PURE.rusage())


def test_monotonic_is_time_monotonic(impl: Any) -> None:
    before = time.monotonic()
    now = impl.monotonic()
    assert before <= now <= time.monotonic()


# --- selection -------------------------------------------------------------------------


def test_data_path_names_the_implementation(impl: Any) -> None:
    assert impl.DATA_PATH in ("c", "python")
    assert (impl is PURE) == (impl.DATA_PATH == "python")


def test_every_public_name_has_a_docstring(impl: Any) -> None:
    # The functions are written once (contract.DataPath), whichever path runs them.
    for name in netprobe.core.__all__:
        public = getattr(netprobe.core, name)
        if callable(public):
            assert (public.__doc__ or "").strip(), name
            if name != "Counters":  # each path has its own, on the one BaseCounters
                assert getattr(impl, name, public).__doc__ == public.__doc__, name
    counters = impl.Counters()
    assert isinstance(counters, contract.BaseCounters)
    for figure in ("bytes", "calls", "packets", "lost", "out_of_order", "duplicates",
                   "jitter_ms", "foreign", "stopped", "sequence_base"):
        assert (getattr(type(counters), figure).__doc__ or "").strip(), figure
        if figure != "sequence_base":
            with pytest.raises(AttributeError, match="read-only"):
                setattr(counters, figure, 1)
    counters.sequence_base = (1 << 64) + 5  # 64-bit, wrapping
    assert counters.sequence_base == 5 and counters.bytes == 0 and counters.stopped is False
    counters.stop()
    assert counters.stopped is True
    assert "Counters(bytes=0," in repr(counters)


def test_netprobe_pure_forces_the_python_path() -> None:
    code = ("import netprobe.core as c, netprobe.core.pure as p;"
            "print(c.DATA_PATH, c.Counters is p.Counters)")
    env = dict(os.environ, NETPROBE_PURE="1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert out.split() == ["python", "True"]


def test_only_core_imports_the_compiled_module() -> None:
    imports = re.compile(r"netprobe\._core\b|from netprobe import .*\b_core\b")
    package = Path(netprobe.__file__).parent  # the checkout's, or an installed wheel's
    users = [p.relative_to(package.parent).as_posix() for p in package.rglob("*.py")
             if imports.search(p.read_text())]
    assert users == ["netprobe/core/wrapper.py"]



def test_udp_forged_sequence_numbers_are_foreign(impl: Any) -> None:
    # A datagram whose sequence number lies far beyond what the sender can have sent is
    # not of this test: it is counted as foreign and touches no figure (it once made
    # lost = 2**63 - 346 and wrapped the loss figures).
    with udp_pair() as (tx, rx):
        for seq in (0, 1, 2, 1 << 63, (1 << 64) - 1, 3, 1 << 40):
            tx.send(datagram(seq))
        counters = impl.Counters()
        _recv_all(impl, rx, counters, 7)
    assert (counters.packets, counters.bytes) == (4, 4 * 64)
    assert counters.foreign == 3
    assert (counters.lost, counters.out_of_order, counters.duplicates) == (0, 0, 0)


def test_udp_sequence_base_keys_the_stream(impl: Any, pool: ThreadPoolExecutor) -> None:
    # Both ends of a test share a random base: the sender numbers from it, the receiver
    # counts relative to it, so a forger who does not know it lands outside the window.
    base = (1 << 64) - (1 << 62) + 12345
    with udp_pair() as (tx, rx):
        tx_counters, rx_counters = impl.Counters(), impl.Counters()
        tx_counters.sequence_base = rx_counters.sequence_base = base
        impl.udp_send(tx.fileno(), tx_counters, length=64, max_packets=10, deadline=soon(3))
        for seq in (0, 1, 2):  # an unkeyed forger's guesses
            tx.send(datagram(seq))
        _recv_all(impl, rx, rx_counters, 13)
    assert rx_counters.packets == 10 and rx_counters.lost == 0
    assert rx_counters.foreign == 3 and rx_counters.sequence_base == base
