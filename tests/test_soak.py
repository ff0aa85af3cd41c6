"""1,000 mixed requests against a real server (native tests, agent requests, malformed
input, stray and spoofed UDP) and a real exporter (metrics, probes, refusals, idle and
hung-up connections): file descriptors, threads and memory stay flat in both.

The baseline is taken after a warm-up round of every kind, so what one-time loading costs
(modules, the first test's buffers, glibc's arenas) is not counted as growth."""

from __future__ import annotations

import os
import random
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from netprobe.engine import protocol
from netprobe.farend import agent_status, remote_tools

from .budget import scaled
from .servers import ServerProcess, netprobe_server
from .test_exporter_guard import exporter, get
from .test_hardening import malformed_inputs, quick_test, send_one, send_udp

REQUESTS = 1_000
FD_SLACK = 6  # a connection or two still closing when counted
THREAD_SLACK = 3
RSS_SLACK_KIB = 24 * 1024  # a heap that settles; growth per request would be far more


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads")


def _half_request(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished: closed by us


def _ok(answer: tuple[int, str], status: int) -> None:
    assert answer[0] == status, f"HTTP {answer[0]}: {answer[1][:200]}"


def _requests(server: ServerProcess, base: str, export_port: int,
              rng: random.Random) -> list[Callable[[], object]]:
    """One shuffled mix of every kind, REQUESTS in all (scaled under emulation)."""
    port = server.port
    bad = [payload for _, payload in malformed_inputs(rng)]
    spoof = protocol.pack_hello(protocol.KIND_DATA) + os.urandom(40)
    named = {
        "native tcp": lambda: quick_test(server),
        "native udp": lambda: quick_test(server, protocol="udp", rate_bits_per_second=10e6),
        "agent status": lambda: agent_status("127.0.0.1", port=port),
        "agent tools": lambda: remote_tools("127.0.0.1", port=port),
        "malformed": lambda: send_one(port, rng.choice(bad)),
        "stray udp": lambda: send_udp(port, [spoof, rng.choice(bad)]),
        "metrics": lambda: _ok(get(f"{base}/metrics"), 200),
        "landing": lambda: _ok(get(f"{base}/"), 200),
        "probe elsewhere": lambda: _ok(get(f"{base}/probe?target=192.0.2.1"), 403),
        "probe nan": lambda: _ok(get(f"{base}/probe?target=127.0.0.1&duration=nan"), 400),
        "probe": lambda: _ok(get(f"{base}/probe?target=127.0.0.1&duration=0.3"), 200),
        "half request": lambda: _half_request(export_port),
    }
    kinds = []
    for name, call in named.items():
        call.__name__ = name
        kinds.append(call)
    count = scaled(REQUESTS, floor=len(kinds) * 4)
    return [kinds[n % len(kinds)] for n in rng.sample(range(count), count)]


def _call(call: Callable[[], object]) -> str | None:
    """None if the request was answered, else what went wrong (named, for the assertion)."""
    try:
        call()
    except Exception as exc:  # every kind is counted, not one raised over the others
        return f"{getattr(call, '__name__', 'request')}: {type(exc).__name__}: {exc}"
    return None


def _state(pids: tuple[int, int]) -> list[tuple[int, int, int]]:
    return [(_fds(pid), _threads(pid), _rss_kib(pid)) for pid in pids]


def test_server_agent_and_exporter_stay_flat_over_a_thousand_mixed_requests(
        tmp_path: Path) -> None:
    rng = random.Random(20261205)
    # Slots for twice the 4 workers: a worker's next test can reach the server before
    # the slot of its last is given back (the client has its results a moment before
    # the server's connection ends): a CI run under load was told "busy" once in 1,000.
    with netprobe_server("--handshake-timeout", "2", "--idle-timeout", "2",
                         "--max-tests", "8") as server:
        config = (f'[exporter]\nidle_timeout = "2s"\nmax_connections = 16\n'
                  f'[modules.default]\ntool = "native"\nprotocol = "tcp"\n'
                  f'targets = ["127.0.0.1"]\nport = {server.port}\nagent_port = {server.port}\n'
                  f'duration = "0.3s"\nmax_duration = "1s"\n')
        with exporter(tmp_path, config) as (base, proc):
            export_port = int(base.rsplit(":", 1)[1])
            pids = (server.pid, proc.pid)
            mix = _requests(server, base, export_port, rng)
            warm = mix[:len(mix) // 10]
            with ThreadPoolExecutor(max_workers=4) as pool:
                failed = [f for f in pool.map(_call, warm) if f]
            server.settle(threads=_threads(server.pid), fds=_fds(server.pid), timeout=3)
            before = _state(pids)
            with ThreadPoolExecutor(max_workers=4) as pool:
                failed += [f for f in pool.map(_call, mix[len(warm):]) if f]
            server.settle(threads=before[0][1], fds=before[0][0], timeout=15)
            assert server.proc.poll() is None and proc.poll() is None
            assert quick_test(server) == "ok"
            assert get(f"{base}/metrics")[0] == 200
            after = _state(pids)
    assert failed == [], f"{len(failed)} of {len(mix)} requests unanswered: {failed[:5]}"
    for name, (fd0, th0, rss0), (fd1, th1, rss1) in zip(("server", "exporter"), before, after):
        assert fd1 <= fd0 + FD_SLACK, f"{name}: fds {fd0} -> {fd1}"
        assert th1 <= th0 + THREAD_SLACK, f"{name}: threads {th0} -> {th1}"
        assert rss1 <= rss0 + RSS_SLACK_KIB, f"{name}: RSS {rss0} -> {rss1} KiB"
