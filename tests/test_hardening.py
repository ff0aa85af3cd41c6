"""A netprobe server left running must survive hostile input, idle and slow clients,
clients that die, and thousands of tests, without growing; access control must hold.

Each test runs a real ``netprobe server`` process and talks to it over loopback."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import struct
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from netprobe.engine import protocol
from netprobe.engine.client import run_test
from netprobe.errors import TestFailed
from netprobe.plugin import NullReporter
from netprobe.schema import TestSpec

from .budget import scaled
from .servers import NETPROBE, ServerProcess, netprobe_server

pytestmark = pytest.mark.slow


def quick_test(server: ServerProcess, secret: bytes | None = None, **kw: object) -> str:
    spec = TestSpec(**{"duration_s": 0.3, "interval_s": None, "port": server.port, **kw})  # type: ignore[arg-type]
    return run_test(spec, NullReporter(), "127.0.0.1", secret).status


# --- malformed input -------------------------------------------------------------------

HELLO = protocol.pack_hello(protocol.KIND_CONTROL)


def frame(body: bytes) -> bytes:
    return struct.pack("!I", len(body)) + body


def malformed_inputs(rng: random.Random) -> list[tuple[str, bytes]]:
    """One round of every kind of bad input, some of them randomised."""
    junk = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300)))
    mutated = bytearray(HELLO + frame(b'{"type":"test","spec":{"duration_s":1}}'))
    mutated[rng.randrange(len(mutated))] = rng.getrandbits(8)
    specs = [
        {"streams": "many"},
        {"duration_s": -1},
        {"protocol": "sctp"},
        [],
        "x",
        None,
        {"streams": 10**9},
        {"duration_s": 1e308},
        {"port": 0},
        {"unknown": 1},
    ]
    return [
        ("random bytes", junk),
        ("mutated frame", bytes(mutated)),
        ("truncated hello", HELLO[: rng.randint(1, 7)]),
        ("wrong magic", b"HTTP" + HELLO[4:]),
        ("wrong version", protocol.pack_hello(protocol.KIND_CONTROL, version=rng.randint(2, 255))),
        ("unknown kind", HELLO[:5] + bytes([rng.randint(4, 255)]) + HELLO[6:]),
        ("truncated frame", HELLO + struct.pack("!I", 100) + b"{"),
        ("huge length", HELLO + b"\xff\xff\xff\xff"),
        ("not json", HELLO + frame(b"\x00\xff" * rng.randint(1, 50))),
        ("json not object", HELLO + frame(b"[1,2,3]")),
        ("type not string", HELLO + frame(b'{"type": 5}')),
        ("unknown type", HELLO + frame(b'{"type": "shutdown"}')),
        ("test without spec", HELLO + frame(b'{"type": "test"}')),
        (
            "bad spec",
            HELLO + frame(json.dumps({"type": "test", "spec": rng.choice(specs)}).encode()),
        ),
        ("nested json", HELLO + frame(b"[" * 30000 + b"]" * 30000)),
        (
            "bad cookie",
            protocol.pack_data_hello(
                protocol.KIND_DATA, protocol.DataHello(os.urandom(16), 1, "client_to_server")
            ),
        ),
        ("auth unasked", HELLO + frame(b'{"type":"auth","response":"00"}')),
    ]


def send_one(port: int, payload: bytes) -> bool:
    """Send one bad input; True if the server answered or closed (it may reset us: fine)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(2)
            while sock.recv(65536):
                pass  # read whatever the server answers until it closes
    except ConnectionRefusedError:
        return False
    except OSError:
        pass  # reset or timed out on a hostile input: the server's right
    return True


def send_udp(port: int, payloads: list[bytes]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for payload in payloads:
            sock.sendto(payload, ("127.0.0.1", port))


def test_server_survives_thousands_of_malformed_inputs() -> None:
    rng = random.Random(20261130)
    with netprobe_server("--handshake-timeout", "2", "--idle-timeout", "2") as server:
        assert quick_test(server) == "ok"
        threads, fds = server.settle(threads=1_000, fds=1_000, timeout=0)
        rounds = scaled(125)
        inputs = [item for _ in range(rounds) for item in malformed_inputs(rng)]
        assert len(inputs) == rounds * len(malformed_inputs(rng)) >= 170
        with ThreadPoolExecutor(max_workers=8) as pool:
            answered = list(pool.map(lambda item: send_one(server.port, item[1]), inputs))
        assert all(answered), "the server stopped accepting connections"
        udp = [payload for _, payload in inputs[:500]]
        send_udp(server.port, udp)
        assert server.proc.poll() is None, server.log()
        assert quick_test(server) == "ok"
        assert quick_test(server, protocol="udp", rate_bits_per_second=10e6) == "ok"
        after = server.settle(threads, fds + 2)
        assert after[0] <= threads and after[1] <= fds + 2, (threads, fds, after)
        _record(
            "malformed inputs",
            f"{len(inputs)} TCP + {len(udp)} UDP; threads {threads}->"
            f"{after[0]}, fds {fds}->{after[1]}",
        )


# --- idle and slow clients ---------------------------------------------------------------


def test_idle_and_slow_clients_do_not_block_a_test() -> None:
    with netprobe_server("--handshake-timeout", "2") as server:
        idle = []
        for n in range(200):  # ten source addresses, twenty each: under the per-address limit
            sock = socket.socket()
            sock.bind((f"127.0.0.{2 + n % 10}", 0))
            sock.connect(("127.0.0.1", server.port))
            idle.append(sock)
        started = time.monotonic()
        dribble = threading.Thread(target=_dribble, args=(idle[:20],), daemon=True)
        dribble.start()  # slow clients: a byte of the hello every 0.4 s, never all eight
        assert quick_test(server) == "ok"
        for sock in idle:
            sock.settimeout(10)
            assert sock.recv(1) == b"", "the server must close a connection that never says hello"
        closed_after = time.monotonic() - started
        assert closed_after < 2 + 1.5  # the handshake deadline is absolute, not per byte
        for sock in idle:
            sock.close()
        _record(
            "idle/slow connections",
            f"200 held, a test ran meanwhile, all closed "
            f"{closed_after:.1f} s after (handshake timeout 2 s)",
        )


def _dribble(socks: list[socket.socket]) -> None:
    for byte in HELLO[:7]:
        for sock in socks:
            try:
                sock.send(bytes([byte]))
            except OSError:
                return  # closed by the server: what the test waits for
        time.sleep(0.4)


def test_per_address_limit_refuses_at_once() -> None:
    with netprobe_server("--max-connections-per-address", "5") as server:
        held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(5)]
        extra = socket.create_connection(("127.0.0.1", server.port))
        extra.settimeout(5)
        data = b""
        while chunk := extra.recv(4096):  # refused at once: told why, then closed
            data += chunk
        [refusal] = protocol.FrameReader().feed(data)
        assert refusal["type"] == "error" and "too many connections" in refusal["message"]
        for sock in [*held, extra]:
            sock.close()
        assert server.settle(threads=1_000, fds=1_000, timeout=0)
        time.sleep(0.2)
        assert quick_test(server) == "ok"


# --- access control --------------------------------------------------------------------


def test_allow_list_is_checked_first() -> None:
    with netprobe_server("--allow", "10.0.0.0/8") as server, pytest.raises(TestFailed):
        quick_test(server)
    with netprobe_server("--allow", "127.0.0.0/8") as server:
        assert quick_test(server) == "ok"


def test_shared_secret(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text("correct horse battery staple\n")
    with netprobe_server("--secret-file", str(secret_file)) as server:
        with pytest.raises(TestFailed, match="requires a shared secret"):
            quick_test(server)
        with pytest.raises(TestFailed, match="authentication failed"):
            quick_test(server, secret=b"wrong")
        assert quick_test(server, secret=b"correct horse battery staple") == "ok"
        # The CLI takes the secret from the environment too.
        run = subprocess.run(
            [*NETPROBE, "run", "127.0.0.1", "-p", str(server.port), "-t", "0.5", "--json"],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "NETPROBE_SECRET": "correct horse battery staple"},
        )
        assert run.returncode == 0, run.stderr
        assert "authentication failed" in server.log()


def test_secret_never_on_the_command_line() -> None:
    run = subprocess.run(
        [*NETPROBE, "server", "--secret", "x"], capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 2


def test_limits_refuse_with_a_reason() -> None:
    with netprobe_server(
        "--max-duration", "2", "--max-streams", "2", "--max-rate", "100M"
    ) as server:
        for kw, reason in (
            ({"duration_s": 5.0}, "duration"),
            ({"streams": 3}, "streams"),
            ({"rate_bits_per_second": 1e9}, "rate"),
            ({}, "unlimited"),
        ):
            with pytest.raises(TestFailed, match=reason):
                quick_test(server, **kw)
        assert quick_test(server, rate_bits_per_second=50e6, streams=2) == "ok"


# --- faults and leaks ------------------------------------------------------------------


def test_killed_client_frees_the_slot_within_two_seconds() -> None:
    with netprobe_server("--max-tests", "1") as server:
        client = subprocess.Popen(
            [*NETPROBE, "run", "127.0.0.1", "-p", str(server.port), "-t", "30", "--json"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.5)
        client.send_signal(signal.SIGKILL)
        client.wait(5)
        killed = time.monotonic()
        while True:
            try:
                assert quick_test(server) == "ok"
                break
            except TestFailed as exc:
                assert "busy" in str(exc)
                assert time.monotonic() - killed < 2.0, "slot still taken 2 s after the kill"
                time.sleep(0.05)
        _record("client killed", f"slot free {time.monotonic() - killed:.2f} s after SIGKILL")


def test_no_leaks_over_repeated_tests() -> None:
    with netprobe_server() as server:
        assert quick_test(server, duration_s=0.1) == "ok"
        threads, fds = server.threads(), server.fds()
        count = scaled(200, floor=40)
        for n in range(count):
            protocol_ = "udp" if n % 4 == 3 else "tcp"
            assert (
                quick_test(
                    server,
                    duration_s=0.1,
                    protocol=protocol_,
                    rate_bits_per_second=20e6 if protocol_ == "udp" else None,
                )
                == "ok"
            )
        after = server.settle(threads, fds)
        assert after == (threads, fds) or (after[0] <= threads and after[1] <= fds)
        _record(f"{count} tests", f"threads {threads}->{after[0]}, fds {fds}->{after[1]}")


# --- figures for docs/reliability.md ------------------------------------------------------

FIGURES = Path(os.environ.get("NETPROBE_RELIABILITY_LOG", "/tmp/netprobe-reliability.log"))


def _record(what: str, text: str) -> None:
    with FIGURES.open("a") as log:
        log.write(f"{what}: {text}\n")
