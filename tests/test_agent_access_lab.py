"""Every path where one netprobe is a client of another carries the secret and the agent
port it was given (namespaces c, a and b on one bridge; the agents on a port that is not
netprobe's default, each with the shared secret): ``run --from A --to B --agent-port P``,
``compare --agent-port P`` (and ``--repeat``), the agent's own third-party client; and a
missing secret is said of the side that lacks it."""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .netlab import Lab, switched_hosts, wait_listening

pytestmark = [pytest.mark.root, pytest.mark.slow]
why_not = Lab.available()
if why_not:
    pytestmark.append(pytest.mark.skip(reason=why_not))

NETPROBE = [sys.executable, "-m", "netprobe"]
PORT = 5391  # the agents' port here: not netprobe's 5301, so a dropped --agent-port shows
BARE_PORT = 5392  # a's second agent, which has no secret (b has one there too)


class Hosts:
    """Namespaces c (the user), a and b (agents on PORT with the secret; on BARE_PORT, a
    without it and b with it)."""

    def __init__(self, lab: Lab, hosts: dict, secret: Path) -> None:
        self.lab = lab
        self.hosts = hosts
        self.secret = secret

    def address(self, name: str) -> str:
        return str(self.hosts[name][1])

    def agent(self, name: str, port: int, *extra: str) -> None:
        ns, address = self.hosts[name]
        self.lab.start(ns, [*NETPROBE, "server", "-B", address, "-p", str(port), *extra],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_listening(self.lab, ns, port)

    def from_c(self, *args: str) -> subprocess.CompletedProcess:
        return self.lab.run(self.hosts["c"][0], [*NETPROBE, *args], timeout=90)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    secret = tmp_path_factory.mktemp("secret") / "secret"
    secret.write_text("fleet-wide shared secret\n")
    with switched_hosts(["c", "a", "b"], subnet="10.77.35", prefix="nq") as (lab, found):
        lab_hosts = Hosts(lab, found, secret)
        with_secret = ("--secret-file", str(secret))
        lab_hosts.agent("a", PORT, "--allow-third-party", *with_secret)
        lab_hosts.agent("b", PORT, *with_secret)
        lab_hosts.agent("a", BARE_PORT, "--allow-third-party")
        lab_hosts.agent("b", BARE_PORT, *with_secret)
        yield lab_hosts


def _moved(result: dict) -> int:
    flow = result["summaries"][0]
    return int(flow["receiver"]["bytes"])


@pytest.mark.parametrize("tool", ["native", "iperf3"])
def test_third_party_on_an_agent_port_with_a_secret(hosts: Hosts, tool: str) -> None:
    # a's agent, the client of b here, once went to b on 5301 (nothing there) and, for
    # the native engine, without the secret a was started with.
    run = hosts.from_c("run", "--from", hosts.address("a"), "--to", hosts.address("b"),
                       "--agent-port", str(PORT), "--secret-file", str(hosts.secret),
                       "--tool", tool, "-t", "1", "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["status"] == "ok" and result["remote"]["address"] == hosts.address("b")
    assert _moved(result) > 0


def test_repeat_from_on_an_agent_port(hosts: Hosts) -> None:
    run = hosts.from_c("run", "--repeat", "1", "--from", hosts.address("a"), "--to",
                       hosts.address("b"), "--agent-port", str(PORT), "--secret-file",
                       str(hosts.secret), "--tool", "iperf3", "-t", "1", "--json")
    assert run.returncode == 0, run.stderr
    [result] = json.loads(run.stdout)
    assert result["local"]["address"] == hosts.address("a") and _moved(result) > 0


def test_compare_on_an_agent_port(hosts: Hosts) -> None:
    # compare had no --agent-port: every tool went to an agent on 5301.
    run = hosts.from_c("compare", hosts.address("b"), "--agent-port", str(PORT),
                       "--secret-file", str(hosts.secret), "--tools", "native,iperf3",
                       "-n", "1", "-t", "1", "--json")
    assert run.returncode == 0, run.stderr
    results = json.loads(run.stdout)
    assert sorted(r["tool"]["name"] for r in results) == ["iperf3", "native"]
    assert all(r["status"] == "ok" and _moved(r) > 0 for r in results)


def test_compare_from_an_agent(hosts: Hosts) -> None:
    run = hosts.from_c("compare", "--from", hosts.address("a"), "--to", hosts.address("b"),
                       "--agent-port", str(PORT), "--secret-file", str(hosts.secret),
                       "--tools", "native,iperf3", "-n", "1", "-t", "1", "--json")
    assert run.returncode == 0, run.stderr
    results = json.loads(run.stdout)
    assert all(r["local"]["address"] == hosts.address("a") for r in results)
    assert all(r["status"] == "ok" and _moved(r) > 0 for r in results)


@pytest.mark.parametrize("tool", ["native", "iperf3"])
def test_a_source_agent_without_the_secret_is_named(hosts: Hosts, tool: str) -> None:
    # a's bare agent has no secret, b's wants one: the user, who gave theirs, is told that
    # the agent at a lacks it, not to set the secret they set.
    run = hosts.from_c("run", "--from", hosts.address("a"), "--to", hosts.address("b"),
                       "--agent-port", str(BARE_PORT), "--secret-file", str(hosts.secret),
                       "--tool", tool, "-t", "1")
    assert run.returncode == 5, run.stderr
    message = run.stderr
    assert f"the agent at {hosts.address('a')} has no shared secret" in message, message
    assert f"{hosts.address('b')} requires one" in message, message
    assert "start that agent with --secret-file" in message, message


def test_exporter_probe_from_an_agent_to_another_port(hosts: Hosts, tmp_path: Path) -> None:
    # The source's agent on one port, the target's on another, both with the secret: the
    # exporter told the source only its own port, so it looked for the target's there.
    source_port, target_port, http_port = 5394, 5393, 9135
    hosts.agent("a", source_port, "--allow-third-party", "--secret-file", str(hosts.secret))
    hosts.agent("b", target_port, "--secret-file", str(hosts.secret))
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(f'[fleet]\nsecret_file = "{hosts.secret}"\n'
                     f'[agents.a]\naddress = "{hosts.address("a")}"\nport = {source_port}\n'
                     f'[agents.b]\naddress = "{hosts.address("b")}"\nport = {target_port}\n'
                     '[groups.g]\ntype = "mesh"\n')
    config = tmp_path / "exporter.toml"
    config.write_text(f'[exporter]\nfleet = "{fleet}"\n'
                      '[modules.m]\ntool = "iperf3"\nfleet_agents = true\nsources = ["a"]\n')
    c = hosts.hosts["c"][0]
    hosts.lab.start(c, [*NETPROBE, "exporter", "--port", str(http_port), "--config",
                        str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(hosts.lab, c, http_port)
    got = hosts.lab.run(c, ["curl", "-s", "--max-time", "30", f"http://127.0.0.1:{http_port}"
                            "/probe?module=m&target=b&from=a&duration=1"], timeout=40)
    assert "netprobe_up" in got.stdout, got.stdout + got.stderr
    up = [line for line in got.stdout.splitlines() if line.startswith("netprobe_up")]
    failed = [line for line in got.stdout.splitlines() if "failed_info" in line]
    assert up and up[0].endswith(" 1.0"), (up, failed)


OTHER_PORT = 5395  # a with the secret, b with another one


@pytest.mark.parametrize("tool", ["native", "iperf3"])
def test_two_different_secrets_are_named(hosts: Hosts, tool: str, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.write_text("another secret\n")
    if tool == "native":  # the fixture is the module's: the agents are started once
        hosts.agent("a", OTHER_PORT, "--allow-third-party", "--secret-file", str(hosts.secret))
        hosts.agent("b", OTHER_PORT, "--secret-file", str(other))
    third = hosts.from_c("run", "--from", hosts.address("a"), "--to", hosts.address("b"),
                         "--agent-port", str(OTHER_PORT), "--secret-file", str(hosts.secret),
                         "--tool", tool, "-t", "1")
    assert third.returncode == 5, third.stderr
    assert (f"the agent at {hosts.address('b')} refused the shared secret of the agent at "
            f"{hosts.address('a')}") in third.stderr, third.stderr
    direct = hosts.from_c("run", hosts.address("b"), "--agent-port", str(OTHER_PORT),
                          "--secret-file", str(hosts.secret), "--tool", tool, "-t", "1")
    assert direct.returncode == 5, direct.stderr
    assert (f"at {hosts.address('b')} refused this side's shared secret: the two hold "
            "different secrets") in direct.stderr, direct.stderr
