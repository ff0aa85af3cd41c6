"""``netprobe exporter``'s /probe is no anonymous traffic generator (issue 33 item 2).

A real exporter process on loopback. The witness of what a probe sent is a UDP socket
bound on a loopback address that counts the datagrams reaching it: iperf2's UDP client
sends to it whether or not a server answers. /probe runs only to the targets its
configuration names, within its caps, with the credentials it asks for; a probe whose
scraper hangs up stops sending; idle half-requests neither spin a CPU nor hold the
exporter's descriptors for ever.
"""
from __future__ import annotations

import base64
import contextlib
import os
import resource
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .servers import NETPROBE, free_port, wait_listening

pytest.importorskip("prometheus_client", reason="pip install 'netprobe-meter[exporter]'")
needs_iperf = pytest.mark.skipif(not shutil.which("iperf"), reason="iperf (2) is not installed")


class UdpSink:
    """A UDP socket on ``host`` counting the bytes that reach it, on its own thread."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._count, daemon=True)
        self._thread.start()

    def _count(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.bytes += len(self.sock.recv(65536))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@contextlib.contextmanager
def sink(host: str = "127.0.0.1") -> Iterator[UdpSink]:
    found = UdpSink(host)
    try:
        yield found
    finally:
        found.close()


@contextlib.contextmanager
def exporter(tmp_path: Path, config: str | None, *args: str, fds: int | None = None
             ) -> Iterator[tuple[str, subprocess.Popen]]:
    """A real exporter process; ``config`` is the text of its configuration file."""
    port = free_port()
    extra: list[str] = []
    if config is not None:
        path = tmp_path / "exporter.toml"
        path.write_text(config)
        extra = ["--config", str(path)]

    def limit() -> None:
        if fds is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (fds, fds))

    proc = subprocess.Popen([*NETPROBE, "exporter", "--port", str(port), *extra, *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=limit)
    try:
        wait_listening(port)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr:
            proc.stderr.close()


def get(url: str, headers: dict | None = None, timeout: float = 30) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def udp_module(port: int, *targets: str, extra: str = "") -> str:
    listed = ", ".join(f'"{t}"' for t in targets)
    return (f'[modules.default]\ntool = "iperf2"\nprotocol = "udp"\ntargets = [{listed}]\n'
            f'port = {port}\nagent = false\nrate = 1_000_000\nmax_rate = 2_000_000\n'
            f'max_duration = "30s"\n'
            f"{extra}")


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
    return found


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- targets --------------------------------------------------------------------------------


@needs_iperf
def test_without_a_config_probe_refuses_and_sends_nothing(tmp_path: Path) -> None:
    # Before: 200 and the probe's datagrams reached any address a scrape named.
    with sink() as victim, exporter(tmp_path, None) as (base, _):
        status, text = get(f"{base}/probe?target=127.0.0.1&tool=iperf2&protocol=udp"
                           f"&rate=1000000&duration=1&port={victim.port}")
        time.sleep(1.5)
        assert status == 403 and "--config" in text, text
        assert victim.bytes == 0


@needs_iperf
def test_probe_runs_only_to_the_configured_targets(tmp_path: Path) -> None:
    with sink("127.0.0.1") as listed, sink("127.0.0.2") as victim, \
            exporter(tmp_path, udp_module(listed.port, "127.0.0.1")) as (base, _):
        status, text = get(f"{base}/probe?target=127.0.0.2&duration=1")
        assert status == 403 and "not one of module default's targets" in text, text
        time.sleep(1.5)
        assert victim.bytes == 0
        status, text = get(f"{base}/probe?target=127.0.0.1&duration=1")  # the witness works
        assert status == 200, text
        assert listed.bytes > 0


# --- caps and bad parameters ----------------------------------------------------------------


@pytest.mark.parametrize(("query", "reason"), [
    ("duration=31", "would not end within 30 s"),
    ("duration=20&omit=11", "would not end within 30 s"),
    ("rate=3000000", "at most 2e+06 bits/s"),
    ("streams=5", "must be 1-4"),
    ("protocol=sctp", "must be one of tcp, udp"),
    ("protocol=tcp", "runs udp only"),
    ("tool=native", "runs iperf2 only"),
    ("duration=nan", "finite"),
    ("rate=inf", "finite"),
    ("duration=-1", "above 0"),
    ("streams=two", "not a int"),
    ("direction=up", "must be one of normal"),
    ("port=99999", "set by the exporter's configuration"),
    ("secret=x", "set by the exporter's configuration"),
    ("module=other", "no module 'other'"),
    ("bogus=1", "unknown /probe parameter 'bogus'"),
])
def test_bad_or_over_the_cap_parameters_are_refused_with_a_reason(
        tmp_path: Path, query: str, reason: str) -> None:
    with sink() as listed, exporter(tmp_path, udp_module(listed.port, "127.0.0.1")) as (base, _):
        status, text = get(f"{base}/probe?target=127.0.0.1&{query}")
        time.sleep(0.3)
    assert status == 400 and reason in text, text
    assert listed.bytes == 0


@pytest.mark.parametrize(("text", "reason"), [
    ('[modules.default]\ntool = "native"\n', "modules.default: no targets"),
    ('[modules.m]\ntargets = ["h"]\nmax_rate = nan\n', "modules.m.max_rate: must be"),
    ('[modules.m]\ntargets = ["h"]\nduration = "20s"\n', "longer than max_duration"),
    ('[modules.m]\ntargets = ["h"]\nfleet_agents = true\n', "needs exporter.fleet"),
    ('[modules.m]\ntargets = ["h"]\nport = 99999\n', "modules.m.port: must be a port"),
    ('[exporter]\nbearer_token_file = "/nonexistent/t"\n[modules.m]\ntargets = ["h"]\n',
     "cannot read the bearer token file"),
    ("[modules]\n", "no modules"),
    ("[modules.m\n", "not valid TOML"),
])
def test_a_bad_config_is_one_line_and_exit_2(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    done = subprocess.run([*NETPROBE, "exporter", "--port", "0", "--config", str(path)],
                          capture_output=True, text=True, timeout=30)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert reason in lines[0] and "Traceback" not in done.stderr


# --- authentication and the bind ------------------------------------------------------------


def test_authentication_is_required_when_configured(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("s3cret-token\n")
    (tmp_path / "pw").write_text("hunter2\n")
    config = (f'[exporter]\nbearer_token_file = "{tmp_path / "token"}"\n'
              f'basic_auth = {{ user = "prom", password_file = "{tmp_path / "pw"}" }}\n'
              + udp_module(9, "127.0.0.1"))
    basic = base64.b64encode(b"prom:hunter2").decode()
    wrong = base64.b64encode(b"prom:hunter3").decode()
    with exporter(tmp_path, config) as (base, _):
        assert get(f"{base}/metrics")[0] == 401
        assert get(f"{base}/probe?target=127.0.0.1")[0] == 401
        assert get(f"{base}/metrics", {"Authorization": "Bearer wrong"})[0] == 401
        assert get(f"{base}/metrics", {"Authorization": f"Basic {wrong}"})[0] == 401
        assert get(f"{base}/metrics", {"Authorization": "Bearer s3cret-token"})[0] == 200
        assert get(f"{base}/metrics", {"Authorization": f"Basic {basic}"})[0] == 200


def test_it_listens_on_loopback_by_default(tmp_path: Path) -> None:
    with exporter(tmp_path, None) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        listening = [line.split()[1] for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
                     if line.split()[3] == "0A"]
        status, text = get(f"{base}/")
    assert f"0100007F:{port:04X}" in listening
    assert f"00000000:{port:04X}" not in listening
    assert status == 200 and "/metrics" in text


# --- a scraper that hangs up ----------------------------------------------------------------


@needs_iperf
def test_a_probe_whose_scraper_hung_up_is_dropped(tmp_path: Path) -> None:
    # Before: 6 probes whose clients left after 1 s all ran, one after another.
    with sink() as listed, \
            exporter(tmp_path, udp_module(listed.port, "127.0.0.1")) as (base, proc):
        port = int(base.rsplit(":", 1)[1])
        scrapers = []
        for _ in range(3):
            client = socket.create_connection(("127.0.0.1", port), timeout=5)
            client.sendall(b"GET /probe?target=127.0.0.1&duration=20 HTTP/1.0\r\n\r\n")
            scrapers.append(client)
        deadline = time.monotonic() + 10
        while listed.bytes == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert listed.bytes > 0  # the first probe is sending
        for client in scrapers:
            client.close()
        deadline = time.monotonic() + 15
        while children(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert children(proc.pid) == []
        time.sleep(0.5)
        before = listed.bytes
        time.sleep(2.5)  # none of the three probes sends any more, nor starts
        assert listed.bytes == before
        assert children(proc.pid) == []


@needs_iperf
def test_probes_asked_at_once_wait_their_turn_and_each_is_answered(tmp_path: Path) -> None:
    # The one waiting must not be taken for a scraper that hung up (a check for a hang-up
    # that waited out the idle timeout did that).
    with sink() as listed, \
            exporter(tmp_path, '[exporter]\nidle_timeout = "3s"\n'
                     + udp_module(listed.port, "127.0.0.1")) as (base, _):
        answers: list[tuple[int, str]] = []
        threads = [threading.Thread(target=lambda: answers.append(
            get(f"{base}/probe?target=127.0.0.1&duration=2"))) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert [status for status, _ in answers] == [200, 200], answers


# --- idle connections -----------------------------------------------------------------------


def test_idle_half_requests_neither_spin_nor_hold_descriptors(tmp_path: Path) -> None:
    # Before: 80 idle half-requests against 64 descriptors spun the exporter at 100% CPU
    # (accept() failed with EMFILE, the listening socket stayed readable) for as long as
    # the clients stayed.
    config = ('[exporter]\nidle_timeout = "5s"\nmax_connections = 32\n'
              + udp_module(9, "127.0.0.1"))
    with exporter(tmp_path, config, fds=64) as (base, proc):
        port = int(base.rsplit(":", 1)[1])
        clients = []
        try:
            for _ in range(80):
                client = socket.create_connection(("127.0.0.1", port), timeout=5)
                clients.append(client)
                with contextlib.suppress(OSError):  # one over the cap may be closed already
                    client.sendall(b"GET /probe?target=127.0.0.1 HTTP/1.1\r\nHost: x")
            time.sleep(0.5)
            used = cpu_seconds(proc.pid)
            time.sleep(3)
            used = cpu_seconds(proc.pid) - used
            assert used < 0.5, f"{used:.2f} s of CPU in 3 s idle"
            assert len(os.listdir(f"/proc/{proc.pid}/fd")) <= 32 + 16
            for client in clients:  # each is closed: unanswered at once, or when idle
                client.settimeout(15)
                with contextlib.suppress(ConnectionResetError):
                    assert client.recv(4096) == b""
        finally:
            for client in clients:
                client.close()
        assert get(f"{base}/metrics")[0] == 200


# --- the fleet's agents ---------------------------------------------------------------------


def test_a_fleet_agent_is_tested_with_the_fleet_files_port_and_secret(tmp_path: Path) -> None:
    from .servers import netprobe_server

    secret = tmp_path / "secret"
    secret.write_text("fleet-secret\n")
    with netprobe_server("--secret-file", str(secret)) as agent:
        fleet = tmp_path / "fleet.toml"
        fleet.write_text(f'[fleet]\nsecret_file = "{secret}"\n'
                         f'[agents.lo]\naddress = "127.0.0.1"\nport = {agent.port}\n'
                         '[agents.other]\naddress = "127.0.0.9"\n'
                         '[groups.g]\ntype = "mesh"\n')
        config = f'[exporter]\nfleet = "{fleet}"\n[modules.default]\nfleet_agents = true\n'
        with exporter(tmp_path, config) as (base, _):
            by_name = get(f"{base}/probe?target=lo&duration=0.5&debug=true")
            by_address = get(f"{base}/probe?target=127.0.0.1&duration=0.5")
            stranger = get(f"{base}/probe?target=127.0.0.3&duration=0.5")
    for status, text in (by_name, by_address):
        assert status == 200 and "netprobe_up{" in text and '"} 1.0' in text.split(
            "netprobe_up{", 1)[1].split("\n", 1)[0], text
    assert stranger[0] == 403


# --- unknown is absent; a failure says why ----------------------------------------------


def _series(text: str) -> dict[str, list[tuple[dict, float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, list[tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def test_figures_a_test_does_not_measure_are_absent_and_a_failure_says_why(
        tmp_path: Path) -> None:
    # Before: a UDP probe exported netprobe_rtt_seconds 0 and a TCP one jitter and loss 0
    # (min(rtt) over a mix was 0); a failed probe gave zeros and no reason.
    from .servers import netprobe_server

    with netprobe_server() as server:
        config = (f'[modules.tcp]\ntargets = ["127.0.0.1"]\nport = {server.port}\n'
                  f'[modules.udp]\nprotocol = "udp"\ntargets = ["127.0.0.1"]\n'
                  f'port = {server.port}\n'
                  f'[modules.dead]\ntargets = ["127.0.0.1"]\nport = {free_port()}\n')
        with exporter(tmp_path, config) as (base, _):
            tcp = _series(get(f"{base}/probe?target=127.0.0.1&module=tcp&duration=0.5")[1])
            udp = _series(get(f"{base}/probe?target=127.0.0.1&module=udp&duration=0.5")[1])
            dead = _series(get(f"{base}/probe?target=127.0.0.1&module=dead&duration=0.5")[1])
    assert tcp["netprobe_up"][0][1] == 1 and udp["netprobe_up"][0][1] == 1
    assert tcp["netprobe_up"][0][0] == {"module": "tcp", "tool": "native", "protocol": "tcp",
                                        "target": "127.0.0.1"}
    assert udp["netprobe_up"][0][0]["protocol"] == "udp"
    assert "netprobe_rtt_seconds" in tcp and "netprobe_jitter_seconds" not in tcp
    assert "netprobe_lost_packets" not in tcp
    assert "netprobe_jitter_seconds" in udp and "netprobe_rtt_seconds" not in udp
    assert dead["netprobe_up"][0][1] == 0
    assert "netprobe_received_bytes" not in dead and "netprobe_rtt_seconds" not in dead
    (labels, value), = dead["netprobe_probe_failed_info"]
    assert value == 1 and labels["reason"] and "\n" not in labels["reason"]


def test_a_request_sent_a_byte_at_a_time_is_cut_off(tmp_path: Path) -> None:
    # Before: each byte inside the idle timeout kept the connection (and one of the
    # max_connections slots) for as long as the client went on.
    config = '[exporter]\nidle_timeout = "2s"\n' + udp_module(9, "127.0.0.1")
    with exporter(tmp_path, config) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            sent = 0
            try:
                for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40:
                    client.sendall(bytes([byte]))
                    sent += 1
                    time.sleep(0.5)
            except OSError:
                pass
    assert sent < 20, f"{sent} bytes over {sent * 0.5:g} s and still connected"


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def _half_request(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no blank line: we hang up


def test_a_burst_of_hung_up_half_requests_leaves_no_handler_stuck(tmp_path: Path) -> None:
    # Before: each hung-up client's ConnectionResetError printed socketserver's traceback
    # on stderr; once the pipe was full (150 of them) 16 handlers blocked in that write
    # for ever, holding every connection slot: /metrics was closed unanswered, 17 threads
    # stayed, and SIGTERM did not end the exporter within 10 s.
    from concurrent.futures import ThreadPoolExecutor

    config = ('[exporter]\nidle_timeout = "2s"\nmax_connections = 16\n'
              + udp_module(9, "127.0.0.1"))
    with exporter(tmp_path, config) as (base, proc):
        port = int(base.rsplit(":", 1)[1])
        baseline = _threads(proc.pid)
        with ThreadPoolExecutor(4) as pool:
            for future in [pool.submit(_half_request, port) for _ in range(150)]:
                with contextlib.suppress(OSError):  # one over the cap may be refused
                    future.result()
        try:
            try:  # within the idle timeout and a second
                status: object = get(f"{base}/metrics", timeout=3)[0]
            except OSError as exc:  # before: closed unanswered (RemoteDisconnected)
                status = repr(exc)
            deadline = time.monotonic() + 3
            while _threads(proc.pid) > baseline and time.monotonic() < deadline:
                time.sleep(0.1)
            threads = _threads(proc.pid)
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
            ended = proc.poll() is not None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        said = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    assert status == 200, status
    assert threads == baseline, f"{threads} threads, {baseline} before the burst"
    assert ended, "SIGTERM did not end the exporter within 5 s"
    assert "Traceback" not in said, said[-2000:]
