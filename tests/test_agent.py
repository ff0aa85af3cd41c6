"""The agent in a three-host lab (namespaces C, A and B on one bridge): from C, every tool
runs against A with A's agent starting the far end; a third-party test A -> B is asked
from C; an agent stops the tool server it started when the client dies; third-party mode
is refused unless the agent allows it."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .netlab import Lab, switched_hosts, wait_listening
from .peers import PeerBinary, tool_version_params

pytestmark = [pytest.mark.root, pytest.mark.slow]
why_not = Lab.available()
if why_not:
    pytestmark.append(pytest.mark.skip(reason=why_not))

NETPROBE = [sys.executable, "-m", "netprobe"]
TOOLS = ("native", "iperf3", "iperf2", "nuttcp", "ntttcp")


class Trio:
    """Namespaces c, a, b; agents on a (third party allowed) and b (not allowed)."""

    def __init__(self, lab: Lab, hosts: dict, logs: Path) -> None:
        self.lab = lab
        self.hosts = hosts
        self.logs = logs
        self.agents: dict[str, subprocess.Popen] = {}

    def start_agent(self, name: str, *extra: str) -> None:
        ns, address = self.hosts[name]
        with self.log(name).open("a") as log:
            self.agents[name] = self.lab.start(
                ns, [*NETPROBE, "server", "-B", address, *extra],
                stdout=subprocess.DEVNULL, stderr=log)
        wait_listening(self.lab, ns, 5301)

    def log(self, name: str) -> Path:
        """Where agent ``name`` writes its log (its stderr), for failure messages."""
        return self.logs / f"agent-{name}.log"

    def address(self, name: str) -> str:
        return str(self.hosts[name][1])

    def run_from_c(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
        return self.lab.run(self.hosts["c"][0], [*NETPROBE, *args], timeout=timeout)


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trio]:
    with switched_hosts(["c", "a", "b"]) as (lab, hosts):
        trio = Trio(lab, hosts, tmp_path_factory.mktemp("agents"))
        trio.start_agent("a", "--allow-third-party")
        trio.start_agent("b")
        yield trio


@pytest.mark.parametrize(("tool", "peer"), tool_version_params(TOOLS))
def test_every_tool_through_the_agent(
    trio: Trio, tool: str, peer: PeerBinary | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent_port = "5301"
    if peer is not None:  # this version at both ends: an agent of its own, started with it
        for name, value in peer.env.items():
            monkeypatch.setenv(name, value)
        agent_port = "5311"
        ns, address = trio.hosts["a"]
        agent = trio.lab.start(ns, [*NETPROBE, "server", "-B", address, "-p", agent_port],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_listening(trio.lab, ns, int(agent_port))
    try:
        run = trio.run_from_c("run", trio.address("a"), "--tool", tool, "-t", "2", "--json",
                              "--agent-port", agent_port)
    finally:
        if peer is not None:
            trio.lab.stop(agent)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    flow = result["summaries"][0]
    assert flow["sender"] and flow["receiver"], f"{tool}: both sides must be filled"
    sent, received = flow["sender"]["bytes"], flow["receiver"]["bytes"]
    assert received > 0
    if sent < received:
        # iperf3 3.21 through the agent: its sender total is often one write short of what
        # its receiver got (a stream thread writes once more after the totals are taken);
        # the figures stay iperf3's, but the result must say which one is short.
        # ntttcp 1.4.3 once too (one 128 KiB write short, in a CI run).
        assert tool in ("iperf3", "ntttcp"), f"{tool}: sender {sent} < receiver {received}"
        assert any("sender total is" in w and str(received - sent) in w
                   for w in result["warnings"]), result["warnings"]
    if peer is not None:  # the far end's own output came back from the agent
        assert result["tool"]["version"] == peer.version
        far = [raw for raw in result["raw"] if raw["name"] in ("server", "receiver")]
        assert far and peer.path in far[0]["command"], "the far end ran another binary"


def test_tools_on_a_remote_agent(trio: Trio) -> None:
    listed = trio.run_from_c("tools", trio.address("a"), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["native"]["status"] == "available"
    assert "iperf3" in rows and "ntttcp" in rows


def test_third_party_from_c(trio: Trio) -> None:
    run = trio.run_from_c("run", "--from", trio.address("a"), "--to", trio.address("b"),
                          "-t", "2", "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["remote"]["address"] == trio.address("b")
    flow = result["summaries"][0]
    assert flow["sender"]["bytes"] > 0 and flow["receiver"]["bytes"] > 0


def test_third_party_refused_unless_allowed(trio: Trio) -> None:
    run = trio.run_from_c("run", "--from", trio.address("b"), "--to", trio.address("a"),
                          "-t", "1", "--json")
    assert run.returncode == 5
    assert "third-party tests are off" in run.stderr


def test_repeat_keeps_from(trio: Trio) -> None:
    # --repeat used to run the trials from this host, dropping --from without a word.
    run = trio.run_from_c("run", "--repeat", "1", "--from", trio.address("a"), "--to",
                          trio.address("b"), "-t", "1", "--json")
    assert run.returncode == 0, run.stderr
    [result] = json.loads(run.stdout)
    assert result["local"]["address"] == trio.address("a")
    assert result["remote"]["address"] == trio.address("b")


def test_repeat_from_an_agent_that_refuses_third_party(trio: Trio) -> None:
    run = trio.run_from_c("run", "--repeat", "1", "--from", trio.address("b"), "--to",
                          trio.address("a"), "-t", "1", "--json")
    assert run.returncode == 5
    assert "third-party tests are off" in run.stderr


@pytest.mark.skipif(not shutil.which("iperf3"), reason="iperf3 is not installed")
@pytest.mark.parametrize("command", [["run", "--tool", "iperf3", "--repeat", "2"],
                                     ["compare", "--tools", "iperf3", "-n", "2"]])
def test_trials_ask_the_agent_for_the_far_end(trio: Trio, command: list[str]) -> None:
    # Trials used to call tool.run directly: nothing started iperf3 -s on the far host.
    run = trio.run_from_c(*command, trio.address("a"), "-t", "1", "--json")
    assert run.returncode == 0, run.stderr
    results = json.loads(run.stdout)
    assert len(results) == 2
    for result in results:
        assert result["status"] == "ok"
        assert "server" in {raw["name"] for raw in result["raw"]}


@pytest.mark.skipif(not shutil.which("iperf"), reason="iperf is not installed")
def test_agent_stops_the_far_end_when_the_client_dies(trio: Trio, tmp_path: Path) -> None:
    agent = trio.agents["a"]
    said = tmp_path / "client.err"  # what the client said, should the far end not start
    with said.open("w") as stderr:
        client = trio.lab.start(trio.hosts["c"][0], [*NETPROBE, "run", trio.address("a"),
                                                     "--tool", "iperf2", "-t", "30", "--json"],
                                stdout=subprocess.DEVNULL, stderr=stderr)
    # The client waits up to 20 s for the agent's far_end_ready: wait longer, so a failure
    # says the client's side of it. (Once in CI nothing had started after 15 s, the client
    # running and silent; the agent's log was not kept then.)
    deadline = time.monotonic() + 30
    while not _iperf_children(agent.pid) and time.monotonic() < deadline \
            and client.poll() is None:
        time.sleep(0.1)
    started = _iperf_children(agent.pid)
    assert started, (f"the agent should have started iperf -s; the client "
                     f"{'runs' if client.poll() is None else f'exited {client.returncode}'}: "
                     f"{said.read_text()[-1000:]}; the agent's log: "
                     f"{trio.log('a').read_text()[-1500:]}")
    time.sleep(1.0)
    client.send_signal(signal.SIGKILL)
    client.wait(5)
    deadline = time.monotonic() + 10
    while _alive(started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(started), "the far end's server must be stopped once its client is gone"


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            if f"\nPPid:\t{pid}\n" in status:
                found.append(int(entry.name))
    return found


def _iperf_children(pid: int) -> list[int]:
    """The children of ``pid`` that run iperf (not, say, a version probe's shell)."""
    found = []
    for child in _children(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"iperf" in argv[0] and b"-s" in argv:
            found.append(child)
    return found


def _alive(pids: list[int]) -> bool:
    return any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) for pid in pids)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"
