"""``netprobe exporter``'s /metrics for big fleets (issue 39 item 4): by default its series
grow with the fleet's hosts, not with its pairs; per-pair series are opt-in and capped.

A real SQLite archive filled through the archive's own write path (``Archive.add``) with
the records of 1,000 simulated agents, each testing a few peers (a sparse design keeps the
test short: 5,000 pairs), from one real loopback result whose figures are varied per pair.
A real exporter process serves it; /metrics is read over HTTP and its series counted with
prometheus_client's parser."""
from __future__ import annotations

import contextlib
import copy
import statistics
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from netprobe import convert
from netprobe.archives import PairRecord, Run, open_archive
from netprobe.exporter_config import ExporterConfigError, load
from netprobe.exporter_fleet import HOST_SERIES_MAX, FleetCollector
from netprobe.schema import Result
from tests.budget import scaled

from .servers import NETPROBE, exporter_process

pytest.importorskip("prometheus_client", reason="pip install 'netprobe-meter[exporter]'")
from prometheus_client.parser import text_string_to_metric_families

AGENTS = scaled(1000, floor=100)  # 200 in the emulated ARM suites (tests/budget.py)
PEERS = 5
RATES = [100e6 + 10e6 * i for i in range(10)]
"""The receiver throughputs the simulated pairs read (10 variants of one real result)."""
START = 1_796_119_200.0  # 2026-12-01T10:00:00Z


@attrs.frozen
class Fleet:
    """What was written: the archive and each pair's outcome and throughput."""

    path: Path
    agents: int
    peers: int
    pairs: dict[tuple[str, str], float | None]
    """(source, target) -> receiver bits/s (None: the pair failed)."""
    times: dict[tuple[str, str], float]


def _variants(result: Result) -> list[Result]:
    """The real result with its receiver throughput set to each of RATES."""
    data = convert.unstructure(result)
    out = []
    for rate in RATES:
        copied = copy.deepcopy(data)
        for summary in copied["summaries"]:
            if summary["receiver"]:
                summary["receiver"]["bits_per_second"] = rate
        out.append(convert.structure(copied, Result))
    return out


def _iso(unix: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(unix, datetime.timezone.utc).isoformat(
        timespec="milliseconds")


def make_fleet(path: Path, result: Result, agents: int, peers: int) -> Fleet:
    """Agent i tests agents i+1 .. i+peers (mod agents); every 97th pair fails."""
    variants = _variants(result)
    pairs: dict[tuple[str, str], float | None] = {}
    times: dict[tuple[str, str], float] = {}
    with open_archive(str(path)) as archive:
        # One fsync per record is the runner's durability, not what is tested here.
        archive.connection.execute("PRAGMA synchronous=OFF")  # type: ignore[attr-defined]
        archive.start_run(Run("r1", "fleet.toml", _iso(START), peers, agents * peers))
        n = 0
        for i in range(agents):
            for step in range(1, peers + 1):
                source, target = f"h{i}", f"h{(i + step) % agents}"
                stamp = START + n
                n += 1
                if n % 97 == 0:
                    archive.add(PairRecord("r1", "mesh", step, source, target, _iso(stamp),
                                           "unreachable", "no agent"))
                    pairs[source, target] = None
                else:
                    archive.add(PairRecord("r1", "mesh", step, source, target, _iso(stamp),
                                           "ok", None, variants[n % len(variants)]))
                    pairs[source, target] = RATES[n % len(RATES)]
                times[source, target] = stamp
    return Fleet(path, agents, peers, pairs, times)


@pytest.fixture(scope="module")
def result() -> Result:
    """One real loopback result (both ends here)."""
    run = subprocess.run([*NETPROBE, "run", "-t", "0.3", "-i", "0.1", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return convert.from_json(run.stdout)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory, result: Result) -> Fleet:
    return make_fleet(tmp_path_factory.mktemp("card") / "fleet.db", result, AGENTS, PEERS)


@contextlib.contextmanager
def exporter(archive: Path, config: str | None = None, folder: Path | None = None
             ) -> Iterator[tuple[str, subprocess.Popen]]:
    """A real exporter process over ``archive`` (``config``: its configuration's text)."""
    args = ["--archive", str(archive)]
    if config is not None:
        assert folder is not None
        (folder / "exporter.toml").write_text(config)
        args += ["--config", str(folder / "exporter.toml")]
    with exporter_process(*args) as found:
        yield found


def scrape(base: str) -> tuple[dict[str, list[Any]], float]:
    """/metrics' samples by family name, and how long the scrape took (reported only)."""
    started = time.monotonic()
    with urllib.request.urlopen(f"{base}/metrics", timeout=120) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    took = time.monotonic() - started
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(family.name, []).extend(family.samples)
    return out, took


def count(samples: dict[str, list[Any]]) -> int:
    return sum(len(found) for found in samples.values())


def count_pairs(samples: dict[str, list[Any]]) -> int:
    """The per-pair series only (labelled by source and target)."""
    return sum("source" in s.labels for found in samples.values() for s in found)


def _by(samples: list[Any], *names: str) -> dict[tuple[str, ...], float]:
    return {tuple(s.labels[n] for n in names): s.value for s in samples}


# --- the tests ------------------------------------------------------------------------


def test_default_series_grow_with_hosts_and_say_what_each_host_saw(
        big: Fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with exporter(big.path) as (base, _):
        got, took = scrape(base)
    series = count(got)
    bound = HOST_SERIES_MAX * big.agents + 10  # 26 per host, and a few per group
    with capsys.disabled():
        print(f"\n{big.agents} agents, {len(big.pairs)} pairs: {series} series by default "
              f"(bound {bound}), scrape {took:.2f} s")
    assert series <= bound
    assert "netprobe_fleet_up" not in got  # per-pair series are opt-in
    # each host as source and as target: its pairs ok and failed, as written
    counts = _by(got["netprobe_fleet_agent_pairs"], "agent", "role", "state")
    for host in ("h0", "h1", f"h{big.agents // 2}", f"h{big.agents - 1}"):
        mine = {"source": [r for (s, _), r in big.pairs.items() if s == host],
                "target": [r for (_, t), r in big.pairs.items() if t == host]}
        for role, rates in mine.items():
            ok = [r for r in rates if r is not None]
            assert counts[host, role, "ok"] == len(ok)
            assert counts[host, role, "failed"] == len(rates) - len(ok)
            stats = _by([s for s in got["netprobe_fleet_agent_receiver_bits_per_second"]
                         if s.labels["agent"] == host and s.labels["role"] == role], "stat")
            assert stats == {("median",): statistics.median(ok), ("min",): min(ok)}
    up = _by(got["netprobe_fleet_agent_up"], "agent")
    assert len(up) == big.agents and set(up.values()) == {1.0}
    newest = _by(got["netprobe_fleet_agent_newest_test_timestamp_seconds"], "agent")
    assert newest[("h0",)] == max(t for pair, t in big.times.items() if "h0" in pair)
    # the fleet's own health
    assert _by(got["netprobe_fleet_pairs"], "group") == {("mesh",): len(big.pairs)}
    failed = sum(r is None for r in big.pairs.values())
    assert failed > 0 and _by(got["netprobe_fleet_pairs_failed"], "group")[("mesh",)] == failed
    assert _by(got["netprobe_fleet_agents"], "group")[("mesh",)] == big.agents
    assert got["netprobe_fleet_newest_test_timestamp_seconds"][0].value == max(big.times.values())
    assert got["netprobe_fleet_oldest_test_timestamp_seconds"][0].value == min(big.times.values())
    assert got["netprobe_fleet_archive_skipped_rows"][0].value == 0
    assert _by(got["netprobe_fleet_runs"], "status") == {
        ("incomplete",): 1, ("done",): 0, ("interrupted",): 0, ("failed",): 0}
    assert got["netprobe_fleet_newest_run_start_timestamp_seconds"][0].value == START
    assert not [name for name in got if "schedule" in name]  # no schedule kept: none invented


def test_per_pair_series_grow_with_pairs_and_the_default_does_not(
        big: Fleet, result: Result, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The old per-pair export, asked for with a cap above the fleet, gives a few series
    per pair (N x k); the default stays O(N) when each host tests four times as many peers."""
    config = "[metrics]\npair_series = true\nmax_pair_series = 1_000_000\n"
    with exporter(big.path, config, tmp_path) as (base, _):
        got, took = scrape(base)
    total, per_pair = count(got), count_pairs(got)
    pairs = len(big.pairs)
    with capsys.disabled():
        print(f"\n{big.agents} agents, {pairs} pairs: {total} series with pair_series, "
              f"{per_pair} of them per pair (scrape {took:.2f} s)")
    assert len(got["netprobe_fleet_up"]) == pairs
    assert per_pair >= 6 * pairs  # up, timestamp and at least four figures per ok pair
    assert got["netprobe_fleet_pair_series_omitted_pairs"][0].value == 0
    # density: 200 hosts against 5 peers and against 20: per pair x4, default the same
    counts = {}
    for peers in (5, 20):
        fleet = make_fleet(tmp_path / f"k{peers}.db", result, 200, peers)
        with exporter(fleet.path) as (base, _):
            default = count(scrape(base)[0])
        with exporter(fleet.path, config, tmp_path) as (base, _):
            wide = count_pairs(scrape(base)[0])
        counts[peers] = (default, wide)
    with capsys.disabled():
        print(f"200 agents, 5 and 20 peers each: default {counts[5][0]} and {counts[20][0]} "
              f"series; per-pair series {counts[5][1]} and {counts[20][1]}")
    assert counts[20][1] > 3.5 * counts[5][1]
    assert counts[20][0] == counts[5][0] <= HOST_SERIES_MAX * 200 + 10


def test_per_pair_series_keep_to_their_cap_and_say_what_they_left_out(
        big: Fleet, tmp_path: Path) -> None:
    cap = 200
    config = f"[metrics]\npair_series = true\nmax_pair_series = {cap}\n"
    with exporter(big.path, config, tmp_path) as (base, proc):
        first, _ = scrape(base)
        second, _ = scrape(base)
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert first == second
    up = _by(first["netprobe_fleet_up"], "source", "target")
    assert len(up) == cap
    assert first["netprobe_fleet_pair_series_omitted_pairs"][0].value == len(big.pairs) - cap
    failed = {pair for pair, rate in big.pairs.items() if rate is None}
    assert failed <= set(up) and all(up[pair] == 0 for pair in failed)  # failed kept first
    kept = [big.pairs[pair] for pair in up if pair not in failed]
    left = [rate for pair, rate in big.pairs.items() if pair not in up]
    assert max(kept) <= min(r for r in left if r is not None)  # then the slowest
    for name in ("netprobe_fleet_receiver_bits_per_second", "netprobe_fleet_rtt_seconds"):
        assert {(s.labels["source"], s.labels["target"]) for s in first[name]} <= set(up)
    assert len(first["netprobe_fleet_agent_up"]) == big.agents  # per host still whole
    lines = [line for line in err.splitlines() if "max_pair_series" in line]
    assert len(lines) == 1, err  # said once, not at every scrape
    assert f"{len(big.pairs) - cap:,} left out" in lines[0]


def test_reference_hosts_give_one_series_per_host_and_reference(big: Fleet) -> None:
    """In a reference design (each host against K reference hosts) the pairs are N x K:
    per host and reference, each way, from the fleet file's ``references``."""
    refs = ("h0", "h1")
    collector = FleetCollector(lambda: open_archive(str(big.path), create=False),
                               references={"mesh": refs})
    got = {family.name: family.samples for family in collector.collect()}
    up = _by(got["netprobe_fleet_reference_up"], "agent", "reference", "direction")
    expected = {}
    for (source, target), rate in big.pairs.items():
        if target in refs:
            expected[source, target, "to_reference"] = 0.0 if rate is None else 1.0
        elif source in refs:
            expected[target, source, "from_reference"] = 0.0 if rate is None else 1.0
    assert up == expected and len(up) <= 2 * len(refs) * big.agents
    rates = _by(got["netprobe_fleet_reference_receiver_bits_per_second"], "agent",
                "reference", "direction")
    assert rates == {key: big.pairs[(key[0], key[1]) if key[2] == "to_reference"
                                    else (key[1], key[0])]
                     for key, value in expected.items() if value == 1.0}


@pytest.mark.parametrize(("text", "said"), [
    ("[metrics]\npair_series = 'yes'\n", "metrics.pair_series: must be true or false"),
    ("[metrics]\nmax_pair_series = 0\n", "metrics.max_pair_series: must be a whole number"),
    ("[metrics]\nmax_pair_series = 10_000_000\n", "metrics.max_pair_series"),
    ("[metrics]\npairs = true\n", "metrics.pairs: unknown key"),
])
def test_bad_metrics_settings_are_one_line(text: str, said: str, tmp_path: Path) -> None:
    (tmp_path / "e.toml").write_text(text)
    with pytest.raises(ExporterConfigError, match=said.replace(".", r"\.")) as caught:
        load(str(tmp_path / "e.toml"))
    assert "\n" not in str(caught.value)


def test_a_configuration_of_metrics_only_leaves_probe_off(tmp_path: Path) -> None:
    path = tmp_path / "e.toml"
    path.write_text("[metrics]\npair_series = true\n")
    config = load(str(path))
    assert config.metrics.pair_series and config.metrics.max_pair_series == 1000
    assert not config.modules  # /probe refuses everything, as with no configuration
    path.write_text("[metrics]\n[modules]\n")
    with pytest.raises(ExporterConfigError, match="no modules"):
        load(str(path))


@pytest.mark.parametrize(("column", "value"), [
    ("time", "not a time"), ("receiver_bits_per_second", "fast"), ("outcome", "great")])
def test_a_damaged_row_is_skipped_and_counted_not_a_failed_scrape(
        result: Result, tmp_path: Path, column: str, value: str) -> None:
    """A row is data: one whose time or figures cannot be read is left out and counted,
    and the other rows still make /metrics (a bad time used to fail the whole scrape: the
    connection closed with no answer)."""
    fleet = make_fleet(tmp_path / "f.db", result, 4, 1)
    _damage(fleet.path, column, value)
    for config in (None, "[metrics]\npair_series = true\n"):
        with exporter(fleet.path, config, tmp_path) as (base, _):
            got, _ = scrape(base)
        assert got["netprobe_fleet_archive_skipped_rows"][0].value == 1
        assert got["netprobe_fleet_pairs"][0].value == 3
        agents = _by(got["netprobe_fleet_agent_pairs"], "agent", "role", "state")
        assert ("h1", "source", "ok") not in agents and agents["h0", "source", "ok"] == 1
        if config:
            assert {s.labels["source"] for s in got["netprobe_fleet_up"]} == {"h0", "h2", "h3"}


def test_metrics_read_the_figure_columns_not_the_whole_result(
        result: Result, tmp_path: Path) -> None:
    """/metrics reads each pair's summary columns, never its whole result (decoding
    results was most of a scrape's time): a row whose result JSON is damaged still gives
    its pair's figures, which the runner wrote beside it."""
    fleet = make_fleet(tmp_path / "f.db", result, 4, 1)
    _damage(fleet.path, "result", "{broken")
    with exporter(fleet.path, "[metrics]\npair_series = true\n", tmp_path) as (base, _):
        got, _ = scrape(base)
    assert got["netprobe_fleet_archive_skipped_rows"][0].value == 0
    rates = _by(got["netprobe_fleet_receiver_bits_per_second"], "source", "target")
    assert rates == {pair: rate for pair, rate in fleet.pairs.items()}


def _damage(path: Path, column: str, value: str) -> None:
    import sqlite3

    with sqlite3.connect(path) as db:
        db.execute(f"UPDATE results SET {column} = ? WHERE source = 'h1'", (value,))


def test_reference_hosts_come_from_the_fleet_file_groups() -> None:
    """A reference group keeps (others, references) as its sides (the fleet file's
    ``type = "reference"``); other designs have no reference hosts."""
    from netprobe.exporter_config import reference_hosts
    from netprobe.fleet.config import Group
    from netprobe.schema import TestSpec

    spec = TestSpec()
    groups = (Group("refs", "reference", (("h2", "h0"), ("h0", "h2")), spec,
                    sides=(("h2", "h3"), ("h0", "h1"))),
              Group("mesh", "mesh", (("h0", "h1"), ("h1", "h0")), spec))
    assert reference_hosts(groups) == {"refs": ("h0", "h1")}


def test_a_fleet_file_without_references_gives_no_reference_series(
        big: Fleet, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[agents.h0]\naddress = "127.0.0.1"\n[agents.h1]\naddress = "127.0.0.2"\n'
                     '[groups.mesh]\ntype = "mesh"\nagents = "*"\n'
                     'spec = { tool = "native", duration = "1s" }\n')
    config = f'[exporter]\nfleet = "{fleet}"\n[metrics]\n'
    assert load_config(tmp_path, config).references == {}
    with exporter(big.path, config, tmp_path) as (base, _):
        got, _ = scrape(base)
    assert not [name for name in got if "reference" in name]
    assert len(got["netprobe_fleet_agent_up"]) == big.agents


def load_config(folder: Path, text: str) -> Any:
    (folder / "check.toml").write_text(text)
    return load(str(folder / "check.toml"))
