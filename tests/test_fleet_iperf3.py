"""A fleet whose targets are stock ``iperf3 -s`` servers (``iperf3_port`` in the fleet
file), run by ``netprobe fleet run`` on loopback into a real SQLite archive: a netprobe
agent is the source, its native engine speaks iperf3's protocol to each stock server
(started by the test, stopped by its PID). Every planned pair is archived once with the
bytes the stock server itself says it received; a stock server held by someone else's
test is archived ``busy``, with no figure. Mistakes in declaring one are one line."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from netprobe.archives import open_archive
from netprobe.driven import free_port
from netprobe.fleet import config
from tests.peers import stock_iperf3
from tests.servers import netprobe_server
from tests.test_iperf3_client import _established, listening

CLI_TIMEOUT_S = 120.0


@contextlib.contextmanager
def stock_servers(logs: dict[str, Path]) -> Iterator[dict[str, int]]:
    """One stock ``iperf3 -s`` per name (its output in its log), on free loopback ports;
    each killed by its PID at the end."""
    binary = stock_iperf3("3.12")
    procs: list[subprocess.Popen] = []
    ports: dict[str, int] = {}
    try:
        for name, log in logs.items():
            ports[name] = port = free_port()
            with open(log, "w") as out:
                procs.append(subprocess.Popen([binary, "-s", "-p", str(port), "--forceflush"],
                                              stdout=out, stderr=subprocess.STDOUT))
        for port in ports.values():
            for _ in range(200):  # 10 s at most
                if listening(port):
                    break
                time.sleep(0.05)
            assert listening(port), f"iperf3 -s did not listen on {port}"
        yield ports
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)


@contextlib.contextmanager
def held(port: int) -> Iterator[None]:
    """A stock iperf3 client's slow test (1 Mbit/s) holding the server on ``port``."""
    proc = subprocess.Popen([stock_iperf3("3.12"), "-c", "127.0.0.1", "-p", str(port),
                             "-t", "60", "-b", "1M"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):  # until its test runs: its control and data connections
            if _established(port) >= 2:
                break
            time.sleep(0.05)
        assert _established(port) >= 2, "the holding client's test did not start"
        yield
    finally:
        proc.kill()
        proc.wait(timeout=10)


def served_bytes(log: Path) -> list[int]:
    """The bytes a stock server says it received, one figure per test it served."""
    found = re.findall(r"sec\s+([\d.]+) (\w?)Bytes .* receiver$", log.read_text(), re.M)
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return [int(float(n) * scale[unit]) for n, unit in found]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "netprobe", "fleet", *args],
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)


def test_stock_iperf3_targets_archived_once_each_and_busy_said(tmp_path: Path) -> None:
    names = ("s1", "s2", "s3", "taken")
    logs = {name: tmp_path / f"{name}.log" for name in names}
    db = tmp_path / "fleet.db"
    with netprobe_server("--allow-third-party") as agent, stock_servers(logs) as ports:
        text = (f'[fleet]\narchive = "{db}"\n'
                f'[agents.src]\naddress = "127.0.0.1"\nport = {agent.port}\n'
                + "".join(f'[agents.{n}]\naddress = "127.0.0.1"\niperf3_port = {p}\n'
                          for n, p in ports.items())
                + '[groups.stock]\ntype = "disjoint"\na = ["src"]\n'
                  f'b = {json.dumps(list(names))}\nunidirectional = true\n'
                  'spec = { duration = 0.5 }\n')
        fleet_file = tmp_path / "stock.toml"
        fleet_file.write_text(text)
        plan = cli("plan", str(fleet_file), "--json")
        assert plan.returncode == 0, plan.stderr
        status = cli("status", str(fleet_file), "--json")
        with held(ports["taken"]):
            run = cli("run", str(fleet_file), "--json")
    assert status.returncode == 0, status.stderr
    rows = {row["agent"]: row for row in json.loads(status.stdout)}
    assert rows["src"]["state"] == "idle"
    assert all(rows[n]["state"] == "iperf3" and rows[n]["port"] == ports[n] for n in names)
    planned = sorted(tuple(pair) for r in json.loads(plan.stdout) for pair in r["pairs"])
    assert planned == sorted(("src", n) for n in names)
    assert run.returncode == 5, run.stderr  # one pair busy: not every pair ok
    run_id = json.loads(run.stdout)["run_id"]
    with open_archive(str(db), create=False) as archive:
        records = archive.records(run_id)
    assert sorted((r.source, r.target) for r in records) == planned  # each once
    by_target = {r.target: r for r in records}
    busy = by_target.pop("taken")
    assert busy.outcome == "busy" and busy.result is None and "busy" in str(busy.error)
    assert served_bytes(logs["taken"]) == []  # it never ran the fleet's test
    for name, record in by_target.items():
        assert record.outcome == "ok", record.error
        assert record.result is not None and record.result.remote.port == ports[name]
        flow = record.result.summary()
        assert flow is not None and flow.receiver is not None
        (theirs,) = served_bytes(logs[name])  # the stock server ran exactly one test
        # iperf3 prints 3 significant digits: its own figure within 1%.
        assert flow.receiver.bytes > 0 and abs(flow.receiver.bytes - theirs) <= theirs * 0.01


def _parse(text: str) -> config.Fleet:
    return config.parse(config.tomllib.loads(text), "f.toml")


STOCK = ('[agents.a]\naddress = "127.0.0.1"\n[agents.b]\naddress = "127.0.0.2"\n'
         '[agents.s]\naddress = "127.0.0.3"\niperf3_port = 5201\n')


@pytest.mark.parametrize(("text", "said"), [
    (STOCK + '[groups.g]\ntype = "mesh"\n',
     "f.toml: groups.g: s is a stock iperf3 server (agents.s.iperf3_port): it can only be "
     "a target, never a source"),
    (STOCK + '[groups.g]\ntype = "disjoint"\na = ["a"]\nb = ["s"]\n',
     "f.toml: groups.g: s is a stock iperf3 server (agents.s.iperf3_port): it can only be "
     "a target, never a source (set unidirectional = true to test only towards it)"),
    (STOCK + '[groups.g]\ntype = "list"\npairs = [["s", "a"]]\n',
     "f.toml: groups.g: s is a stock iperf3 server (agents.s.iperf3_port): it can only be "
     "a target, never a source"),
    (STOCK + '[groups.g]\ntype = "list"\npairs = [["a", "s"]]\nspec = { tool = "iperf3" }\n',
     "f.toml: groups.g.spec.tool: s is a stock iperf3 server: only the native tool tests "
     "one (it speaks iperf3's protocol), not iperf3"),
    ('[agents.s]\naddress = "h"\niperf3_port = 5201\nport = 5301\n',
     "f.toml: agents.s.port: not with iperf3_port (a stock iperf3 server is no netprobe "
     "agent: it has no agent port or secret)"),
    ('[agents.s]\naddress = "h"\niperf3_port = true\n',
     "f.toml: agents.s.iperf3_port: must be a port number 1-65535, got True"),
], ids=["mesh-source", "disjoint-both-ways", "list-source", "other-tool", "agent-port",
        "not-a-port"])
def test_declaring_a_stock_server_wrongly_is_one_line(text: str, said: str) -> None:
    with pytest.raises(config.FleetFileError) as caught:
        _parse(text)
    assert str(caught.value) == said


def test_a_stock_target_in_a_list_or_reference_group_is_taken() -> None:
    fleet = _parse(STOCK + '[groups.l]\ntype = "list"\npairs = [["a", "s"], ["b", "s"]]\n'
                   '[groups.r]\ntype = "reference"\nagents = ["a", "b"]\n'
                   'references = ["s"]\nunidirectional = true\n')
    assert fleet.agents["s"].iperf3_port == 5201 and fleet.agents["s"].secret_file is None
    assert [list(g.pairs) for g in fleet.groups] == [[("a", "s"), ("b", "s")]] * 2


def test_cli_says_the_mistake_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(STOCK + '[groups.g]\ntype = "mesh"\n')
    out = cli("plan", str(bad))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"netprobe: error: {bad}: groups.g: s is a stock iperf3 server (agents.s.iperf3_port):"
        " it can only be a target, never a source"], out.stderr


def test_a_spec_the_iperf3_mode_refuses_is_said_before_anything_runs(tmp_path: Path) -> None:
    # -O with UDP: the native engine takes it, its iperf3 mode does not. The agents are
    # not there: refused before any is asked, not failed pair by pair.
    fleet_file = tmp_path / "udp.toml"
    fleet_file.write_text(STOCK + '[groups.g]\ntype = "list"\npairs = [["a", "s"]]\n'
                          'spec = { protocol = "udp", omit = 1, duration = 1 }\n')
    out = cli("run", str(fleet_file), "--archive", str(tmp_path / "f.db"))
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "groups.g.spec: " in lines[0], out.stderr
    assert "--iperf3: -O is not supported with UDP" in lines[0], out.stderr


def test_the_exporter_probes_a_stock_server_in_its_protocol(tmp_path: Path) -> None:
    """/probe?target=NAME where NAME is a fleet's stock iperf3 server: the exporter's host
    tests it with the native engine's iperf3 mode on its iperf3 port (it has no netprobe
    port to go to); a module of another tool is refused for it, before anything runs."""
    pytest.importorskip("prometheus_client", reason="pip install 'netprobe-meter[exporter]'")
    from tests.test_exporter_guard import exporter, get

    log = tmp_path / "s1.log"
    with stock_servers({"s1": log}) as ports:
        fleet = tmp_path / "fleet.toml"
        fleet.write_text(f'[agents.s1]\naddress = "127.0.0.1"\niperf3_port = {ports["s1"]}\n'
                         '[agents.a]\naddress = "127.0.0.2"\n'
                         '[groups.g]\ntype = "list"\npairs = [["a", "s1"]]\n')
        config = (f'[exporter]\nfleet = "{fleet}"\n[modules.default]\nfleet_agents = true\n'
                  '[modules.other]\ntool = "iperf2"\nfleet_agents = true\n')
        with exporter(tmp_path, config) as (base, _):
            status, text = get(f"{base}/probe?target=s1&duration=1")
            refused = get(f"{base}/probe?target=s1&module=other&duration=1")
    assert status == 200, text
    up = text.split("netprobe_up{", 1)[1].split("\n", 1)[0]
    assert up.endswith(" 1.0"), text
    assert len(served_bytes(log)) == 1 and served_bytes(log)[0] > 0, log.read_text()
    assert refused[0] == 400 and "stock iperf3 server" in refused[1], refused
