"""``netprobe exporter``: /probe runs a real test (a netprobe server on loopback) and a
failed one gives netprobe_up 0 and why, no figures; /metrics serves an archive's
latest fleet figures. Read with prometheus_client's own text parser, and by a real
Prometheus for a few scrape intervals when Debian's prometheus is installed."""
from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from netprobe import convert
from netprobe.archives import PairRecord, Run, open_archive

from .servers import NETPROBE, exporter_process, free_port, netprobe_server

prometheus_client = pytest.importorskip("prometheus_client",
                                        reason="pip install 'netprobe-meter[exporter]'")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

FIGURES = ["netprobe_receiver_bits_per_second", "netprobe_sender_bits_per_second",
           "netprobe_received_bytes", "netprobe_retransmits", "netprobe_rtt_seconds",
           "netprobe_lost_packets", "netprobe_jitter_seconds"]


@contextlib.contextmanager
def exporter(*args: str) -> Iterator[str]:
    with exporter_process(*args) as (base, _):
        yield base


def _samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(family.name, []).extend(family.samples)
    return out


def _get(url: str, timeout: float = 30) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def archive_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fleet archive with one ok pair (a real loopback result) and one unreachable."""
    run = subprocess.run([*NETPROBE, "run", "-t", "0.5", "--json"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    result = convert.from_json(run.stdout)
    path = tmp_path_factory.mktemp("exp") / "fleet.db"
    with open_archive(str(path)) as archive:
        archive.start_run(Run("r1", "f.toml", "2026-12-01T10:00:00.000+00:00", 1, 2))
        archive.add(PairRecord("r1", "core", 1, "a", "b", "2026-12-01T10:00:01.000+00:00", "ok",
                           None, result))
        archive.add(PairRecord("r1", "core", 1, "c", "d", "2026-12-01T10:00:01.000+00:00",
                           "unreachable", "no agent"))
    return path


def test_probe_runs_a_test_and_a_failure_says_why(tmp_path: Path) -> None:
    with netprobe_server() as server:
        config = tmp_path / "exporter.toml"  # /probe tests only what its modules name
        config.write_text(f'[modules.default]\ntargets = ["127.0.0.1"]\nport = {server.port}\n'
                          f'[modules.dead]\ntargets = ["127.0.0.1"]\nport = {free_port()}\n')
        with exporter("--config", str(config)) as base:
            _probe_and_fail(base)


def _probe_and_fail(base: str) -> None:
    status, text = _get(f"{base}/probe?target=127.0.0.1&duration=1")
    assert status == 200, text
    got = _samples(text)
    assert got["netprobe_up"][0].value == 1
    assert got["netprobe_up"][0].labels == {"module": "default", "tool": "native",
                                            "protocol": "tcp", "target": "127.0.0.1"}
    assert got["netprobe_receiver_bits_per_second"][0].value > 1e8  # loopback
    assert got["netprobe_received_bytes"][0].value > 0
    assert 0 < got["netprobe_probe_duration_seconds"][0].value < 10
    status, text = _get(f"{base}/probe?target=127.0.0.1&module=dead&duration=1")
    failed = _samples(text)
    assert status == 200 and failed["netprobe_up"][0].value == 0
    for name in FIGURES:  # unknown is absent, never a 0 that min() would take
        assert name not in failed, name
    assert failed["netprobe_probe_failed_info"][0].labels["reason"]
    status, text = _get(f"{base}/probe?duration=1")
    assert status == 400 and "needs a target" in text
    status, text = _get(f"{base}/probe?target=x&bogus=1")
    assert status == 400 and "unknown /probe parameter 'bogus'" in text


def test_metrics_serves_the_archive(archive_path: Path, tmp_path: Path) -> None:
    """By default per host (series grow with the fleet's hosts); per pair when asked."""
    with exporter("--archive", str(archive_path)) as base:
        status, text = _get(f"{base}/metrics")
    assert status == 200, text
    got = _samples(text)
    assert "netprobe_fleet_up" not in got
    up = {s.labels["agent"]: s.value for s in got["netprobe_fleet_agent_up"]}
    assert up == {"a": 1.0, "b": 1.0, "c": 0.0, "d": 0.0}
    rate = {(s.labels["agent"], s.labels["role"], s.labels["stat"]): s.value
            for s in got["netprobe_fleet_agent_receiver_bits_per_second"]}
    assert rate[("a", "source", "min")] > 1e8 and rate[("b", "target", "median")] > 1e8
    assert not [key for key in rate if key[0] in "cd"]  # unreachable: no figure, not a 0
    assert [s.value for s in got["netprobe_fleet_pairs_failed"]] == [1.0]
    _conventions(text)
    config = tmp_path / "exporter.toml"
    config.write_text("[metrics]\npair_series = true\n")
    with exporter("--archive", str(archive_path), "--config", str(config)) as base:
        status, text = _get(f"{base}/metrics")
    assert status == 200, text
    got = _samples(text)
    up = {(s.labels["source"], s.labels["target"]): s.value for s in got["netprobe_fleet_up"]}
    assert up == {("a", "b"): 1.0, ("c", "d"): 0.0}
    rate = {s.labels["source"]: s.value for s in got["netprobe_fleet_receiver_bits_per_second"]}
    assert rate["a"] > 1e8 and "c" not in rate  # unreachable: no figure, not a 0
    stamp = got["netprobe_fleet_test_timestamp_seconds"][0].value
    assert stamp == pytest.approx(1796119201.0)  # 2026-12-01T10:00:01Z
    _conventions(text)


def _conventions(text: str) -> None:
    for family in text_string_to_metric_families(text):  # Prometheus naming conventions
        assert family.name.startswith("netprobe_") and family.type == "gauge"
        assert not family.name.endswith("_total")


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("prometheus"), reason="Debian's prometheus is not installed")
def test_a_real_prometheus_scrapes_it(archive_path: Path) -> None:
    with exporter("--archive", str(archive_path)) as base, \
            tempfile.TemporaryDirectory(prefix="netprobe-prom-") as folder:
        config = Path(folder) / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                          "scrape_configs:\n  - job_name: netprobe\n    static_configs:\n"
                          f"      - targets: ['{base.split('//')[1]}']\n")
        port = free_port()
        prom = subprocess.Popen(["prometheus", f"--config.file={config}",
                                 f"--storage.tsdb.path={folder}/data",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            value = _query_until(port, "netprobe_fleet_agent_up{agent='a'}", timeout=30)
        finally:
            prom.terminate()
            prom.wait(20)
    assert value == "1"


def _query_until(port: int, query: str, timeout: float) -> str | None:
    url = f"http://127.0.0.1:{port}/api/v1/query?query={urllib.request.quote(query)}"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(OSError):
            status, text = _get(url, timeout=5)
            found = json.loads(text)["data"]["result"] if status == 200 else []
            if found:
                return str(found[0]["value"][1])
        time.sleep(0.5)
    return None
