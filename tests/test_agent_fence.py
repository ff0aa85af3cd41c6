"""Issue 33 (items 3, 4 and 6): an agent's limits bind before the bytes leave.

A client tells the agent one test (1 stream at 1 Mbit/s) and runs another through the real
tool (no rate, 8 streams): the agent's far end, in its own cgroup behind an nftables
fence, lets out at most the rate plus one second's worth, accepts no more connections than
the streams told, and sends to no one but the client. A requester killed with SIGKILL
takes its far end and its third-party test with it.

Witnesses are nftables counters in the namespaces the test makes (the client's, the
victim's, and the agent's own after the fence). Needs root, namespaces and nftables with
``socket cgroupv2``: each test skips with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from netprobe.agent import fence
from netprobe.agent.guard import EXTRA_CONNECTIONS

from .netlab import Lab

AGENT, CLIENT, VICTIM = "10.203.1.1", "10.203.1.2", "10.203.2.2"
AGENT_PORT = 5301
TOLD_S = 2.0
RATE_BYTES_S = 1e6 / 8  # --max-rate 1M, one stream, one direction
_LOG = Path(f"/tmp/na-agent-{os.getpid()}.log")
PEERS = Path.home() / ".cache" / "netprobe-peers" / "bin"

# The requester: tells the agent a 1-stream 1 Mbit/s test, runs the tool with the rate
# and streams it likes, prints what happened (JSON) and the seconds the far end ran.
_REQUESTER = r"""
import json, sys, time, attrs
from netprobe.farend import AgentConnection
from netprobe.plugin import NullReporter
from netprobe.registry import load_registry
from netprobe.schema import TestSpec
tool_name, protocol, direction, streams, agent, port, told_streams = sys.argv[1:8]
told = TestSpec(tool=tool_name, host=agent, duration_s=TOLD_S, protocol=protocol,
                direction=direction, streams=int(told_streams),
                rate_bits_per_second=1e6 / int(told_streams))  # the 1M, shared
started = time.monotonic()  # before the fence goes up: its bucket starts full
conn = AgentConnection.open(agent, int(port), None)
far = conn.far_end(tool_name, told)
print("ready", flush=True)
tool = load_registry(only=tool_name).get(tool_name)()
ran = attrs.evolve(told, port=far, streams=int(streams), rate_bits_per_second=1e10)
error = None
try:
    tool.run(ran, NullReporter())
except Exception as exc:
    error = str(exc)
conn.finish()
print(json.dumps({"error": error, "stopped": conn.stopped,
                  "far_s": time.monotonic() - started}), flush=True)
""".replace("TOLD_S", str(TOLD_S))


def _skip_reason() -> str | None:
    missing = Lab.available()
    if missing:
        return missing
    if not shutil.which("nft"):
        return "nftables (nft) is not installed"
    return fence.unavailable()


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


def _nft(ns: str, *script: str) -> None:
    """Load an nftables script in the namespace ``ns``."""
    subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input="\n".join(script),
                   text=True, check=True, timeout=10)


def _counters(lab: Lab, ns: str) -> dict[str, int]:
    """The named counters of the witness table in ``ns``: name -> bytes (and name_packets)."""
    out = lab.run(ns, ["nft", "-j", "list", "counters", "table", "inet", "witness"]).stdout
    found: dict[str, int] = {}
    for item in json.loads(out).get("nftables", []):
        counter = item.get("counter")
        if isinstance(counter, dict) and "bytes" in counter:
            found[counter["name"]] = int(counter["bytes"])
            found[counter["name"] + "_packets"] = int(counter["packets"])
    return found


@pytest.fixture(scope="module")
def lab() -> Iterator[tuple[Lab, str, str, str]]:
    """An agent (--max-rate 1M --max-streams 1, allowing the client's network only), a
    client and a victim, each in a namespace; witness counters in each."""
    with Lab(prefix="na") as lab:
        a, c = lab.host("a"), lab.host("c")
        lab.link(a, f"{AGENT}/24", c, f"{CLIENT}/24")
        v = lab.host("v")  # after the first link: a link's devices are named by the count
        lab.link(a, "10.203.2.1/24", v, f"{VICTIM}/24")
        ctl = f"tcp sport {AGENT_PORT}"
        # Client: what came from the far end (not the agent's control connection), and
        # the client ports it answered (one a connection or UDP flow it accepted).
        _nft(c, "table inet witness {", "counter from_far { }",
             "set answered { type inet_service; size 1024; flags dynamic; }",
             "chain in { type filter hook input priority 10; policy accept;",
             f"ip saddr {AGENT} {ctl} accept", f"ip saddr {AGENT} counter name from_far",
             f"ip saddr {AGENT} meta l4proto {{ tcp, udp }} add @answered {{ th dport }}",
             "}", "}")
        # Agent, after the fence (priority 10 > filter): what reached the far end's
        # sockets (a client may send on to a far end gone: nothing takes that in).
        _nft(a, "table inet witness {", "counter to_far { }",
             "chain in { type filter hook input priority 10; policy accept;",
             f"tcp dport {AGENT_PORT} accept",
             f"ip saddr {CLIENT} socket transparent 0 counter name to_far", "}", "}")
        # Victim: whatever the agent's namespace sends it, and the data among it (packets
        # past 100 bytes: no reset, refusal or bare ack).
        _nft(v, "table inet witness {", "counter from_agent { }", "counter data { }",
             "chain in { type filter hook input priority 10; policy accept;",
             f"ip saddr {{ 10.203.2.1, {AGENT} }} counter name from_agent",
             f"ip saddr {{ 10.203.2.1, {AGENT} }} ip length > 100 counter name data", "}", "}")
        lab.route(v, "10.203.1.0/24", "10.203.2.1")
        lab.route(c, "10.203.2.0/24", AGENT)
        lab.forward(a)
        env = _env()
        log = _LOG
        _start(lab, a, [sys.executable, "-m", "netprobe", "server", "--port", str(AGENT_PORT),
                      "--max-rate", "1M", "--max-streams", "8", "--max-duration", "10",
                      "--allow", "10.203.1.0/24", "--allow-third-party",
                      "--logfile", str(log)], env=env)
        end = time.monotonic() + 15
        while time.monotonic() < end and "listening" not in _read(log):
            time.sleep(0.1)
        assert "listening" in _read(log), _read(log)
        yield lab, a, c, v
        log.unlink(missing_ok=True)


def _enter(ns: str) -> list[str]:
    # Not ``ip netns exec``: it mounts a sysfs of its own, without the cgroup hierarchy
    # the fence needs; an agent on a real host sees it.
    return ["nsenter", f"--net=/run/netns/{ns}"]


def _start(lab: Lab, ns: str, argv: list[str], **kwargs: object) -> subprocess.Popen:
    """Start ``argv`` in the network namespace ``ns``; the lab stops it by PID."""
    proc = subprocess.Popen([*_enter(ns), *argv], start_new_session=True,  # type: ignore[call-overload]
                            **kwargs)
    lab.procs.append(proc)
    return proc


FIGURES = Path(os.environ.get("NETPROBE_RELIABILITY_LOG", "/tmp/netprobe-reliability.log"))


def _record(what: str, text: str) -> None:
    """A measured figure for docs/reliability.md (as test_hardening.py keeps them)."""
    with FIGURES.open("a") as log:
        log.write(f"{what}: {text}\n")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _env() -> dict[str, str]:
    """The environment with the peers built for the suite (ntttcp among them)."""
    env = dict(os.environ, NETPROBE_PEERS_BIN=str(PEERS))
    if (PEERS / "ntttcp").exists():
        env.setdefault("NETPROBE_NTTTCP", str(PEERS / "ntttcp"))
    return env


def _request(lab: Lab, c: str, tool: str, protocol: str, direction: str,
             streams: int, told_streams: int = 1) -> dict:
    done = subprocess.run(["ip", "netns", "exec", c, sys.executable, "-c", _REQUESTER, tool,
                           protocol, direction, str(streams), AGENT, str(AGENT_PORT),
                           str(told_streams)],
                          capture_output=True, text=True, timeout=60, env=_env())
    if "cannot honour" in done.stderr:  # the tool has no such test (ntttcp --reverse)
        pytest.skip(done.stderr.strip().splitlines()[-1])
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"requester failed: {done.stdout[-500:]} {done.stderr[-1500:]}"
    return dict(json.loads(lines[-1]))


def _tool_or_skip(tool: str) -> None:
    from netprobe.registry import load_registry

    if tool == "ntttcp" and "NETPROBE_NTTTCP" not in _env():
        pytest.skip("no ntttcp built")
    if tool != "ntttcp" and not load_registry(only=tool).get(tool)().probe().available:
        pytest.skip(f"{tool} is not installed")


@pytest.mark.parametrize("tool", ["iperf3", "iperf2", "nuttcp", "ntttcp"])
@pytest.mark.parametrize("protocol", ["tcp", "udp"])
@pytest.mark.parametrize("direction", ["normal", "reverse"])
def test_what_leaves_a_far_end_is_held_to_the_rate(lab: tuple[Lab, str, str, str], tool: str,
                                                   protocol: str, direction: str) -> None:
    the_lab, a, c, _v = lab
    _tool_or_skip(tool)
    before_c, before_a = _counters(the_lab, c), _counters(the_lab, a)
    outcome = _request(the_lab, c, tool, protocol, direction, 1)
    sent = _counters(the_lab, c)["from_far"] - before_c["from_far"]
    received = _counters(the_lab, a)["to_far"] - before_a["to_far"]
    moved = sent if direction == "reverse" else received
    allowed = RATE_BYTES_S * outcome["far_s"] + max(RATE_BYTES_S, fence.MIN_BURST_BYTES)
    _record(f"fence {tool} {protocol} {direction}",
            f"{moved} bytes left the far end in {outcome['far_s']:.1f} s (allowed {allowed:.0f})")
    assert moved <= allowed, (f"{moved} bytes left the far end in {outcome['far_s']:.1f} s, "
                              f"more than the {allowed:.0f} the rate allows: {outcome}")
    assert moved > 2000, f"nothing moved: the fence stopped the test itself: {outcome}"


@pytest.mark.parametrize("protocol", ["tcp", "udp"])
def test_more_streams_than_told_are_refused_at_accept(lab: tuple[Lab, str, str, str],
                                                      protocol: str) -> None:
    the_lab, _a, c, _v = lab
    _tool_or_skip("iperf3")
    _nft(c, "flush set inet witness answered")
    _request(the_lab, c, "iperf3", protocol, "normal", 8)
    listing = the_lab.run(c, ["nft", "-j", "list", "set", "inet", "witness", "answered"]).stdout
    sets = [item["set"] for item in json.loads(listing)["nftables"] if "set" in item]
    accepted = len(sets[0].get("elem", []))
    _record(f"fence iperf3 {protocol} -P 8 told 1", f"{accepted} connections or flows")
    assert 1 <= accepted <= 1 + EXTRA_CONNECTIONS, (
        f"the far end accepted {accepted} connections or flows for a test told 1 stream")


_SENDER = r"""
import socket, sys
for address in sys.argv[1:]:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(20):
        try:
            u.sendto(b"x" * 1000, (address, 9))
        except OSError:  # EPERM: the fence dropped it
            pass
    t = socket.socket()
    t.settimeout(1)
    try:
        t.connect((address, 9))
    except OSError:
        pass
print("sent", flush=True)
"""

_FENCED = r"""
import subprocess, sys
from netprobe.agent.fence import Fence
with Fence.put_up(sys.argv[1], 3, None) as held:
    done = subprocess.run(held.argv([sys.executable, "-c", sys.argv[2], *sys.argv[3:]]),
                          capture_output=True, text=True, timeout=20)
print(done.stdout, done.stderr)
"""


def test_a_far_end_sends_to_no_one_but_its_requester(lab: tuple[Lab, str, str, str]) -> None:
    # Every far end runs in its fence, whatever the tool: any process there, any protocol.
    the_lab, a, c, v = lab
    before_v, before_c = _counters(the_lab, v), _counters(the_lab, c)
    done = subprocess.run([*_enter(a), sys.executable, "-c", _FENCED, CLIENT, _SENDER, VICTIM,
                           CLIENT], capture_output=True, text=True, timeout=30)
    assert "sent" in done.stdout, done.stdout + done.stderr
    reached_victim = _counters(the_lab, v)["from_agent"] - before_v["from_agent"]
    reached_client = _counters(the_lab, c)["from_far"] - before_c["from_far"]
    assert reached_victim == 0, f"{reached_victim} bytes reached an address outside --allow"
    assert reached_client >= 20 * 1000, "the requester itself was not reached: no witness"


_HOLDER = r"""
import sys
from netprobe.farend import AgentConnection
from netprobe.schema import TestSpec
conn = AgentConnection.open(sys.argv[1], int(sys.argv[2]), None)
port = conn.far_end("iperf3", TestSpec(tool="iperf3", host=sys.argv[1], duration_s=3,
                                       rate_bits_per_second=1e6))
print(port, flush=True)
sys.stdin.read()  # until the test is done with the far end
conn.finish()
"""


def test_a_far_end_serves_no_one_outside_the_allow_list(lab: tuple[Lab, str, str, str]) -> None:
    # The requester asks for a far end; a host the agent's --allow refuses reaches it
    # first (routed through the agent's host) and asks it to send (-R).
    the_lab, _a, c, v = lab
    _tool_or_skip("iperf3")
    iperf3 = shutil.which("iperf3") or str(PEERS / "iperf3")
    before = _counters(the_lab, v)
    holder = subprocess.Popen(["ip", "netns", "exec", c, sys.executable, "-c", _HOLDER, AGENT,
                               str(AGENT_PORT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=_env())
    try:
        assert holder.stdout is not None and holder.stdin is not None
        port = int(holder.stdout.readline())
        the_lab.run(v, [iperf3, "-c", AGENT, "-p", str(port), "-R", "-b", "0", "-t", "2",
                        "--connect-timeout", "2000"], timeout=20)
        holder.stdin.close()
        holder.wait(20)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(5)
    data = _counters(the_lab, v)["data"] - before["data"]
    _record("far end asked by a host outside --allow", f"{data} bytes of data reached it")
    assert data == 0, f"the far end sent {data} bytes to a host outside --allow"


def _descendants(pid: int) -> list[str]:
    names, todo = [], [pid]
    while todo:
        current = todo.pop()
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                children = [int(x) for x in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            for child in children:
                todo.append(child)
                with contextlib.suppress(OSError, IndexError):
                    stat = Path(f"/proc/{child}/stat").read_text()
                    if stat.rsplit(")", 1)[1].split()[0] not in "ZX":  # not a dead one
                        names.append(Path(f"/proc/{child}/comm").read_text().strip())
    return names


def _agent_pid(lab: Lab) -> int:
    return lab.procs[0].pid  # nsenter execs the agent: the same pid


STOP_BOUND_S = 5.0
"""How long a far end or third-party test may outlive its requester's SIGKILL: the watch
looks every 0.2 s and a run stops its processes within a second or two."""

_THIRD_PARTY = r"""
import sys
from netprobe.farend import third_party
from netprobe.plugin import NullReporter
from netprobe.schema import TestSpec
spec = TestSpec(tool="iperf3", host=sys.argv[2], duration_s=8, streams=1,
                rate_bits_per_second=1e6, port=int(sys.argv[3]))
print("asking", flush=True)
third_party(sys.argv[1], spec, NullReporter(), port=int(sys.argv[4]))
"""


def test_a_killed_requester_takes_its_third_party_test_with_it(
        lab: tuple[Lab, str, str, str]) -> None:
    the_lab, _a, c, _v = lab
    _tool_or_skip("iperf3")
    iperf3 = shutil.which("iperf3") or str(PEERS / "iperf3")
    target = the_lab.start(c, [iperf3, "-s", "-p", "5302"])
    time.sleep(0.5)
    requester = the_lab.start(c, [sys.executable, "-c", _THIRD_PARTY, AGENT, CLIENT, "5302",
                                  str(AGENT_PORT)])
    agent = _agent_pid(the_lab)
    end = time.monotonic() + 10
    while time.monotonic() < end and "iperf3" not in _descendants(agent):
        time.sleep(0.1)
    assert "iperf3" in _descendants(agent), "the third-party test never started"
    os.killpg(requester.pid, signal.SIGKILL)
    requester.wait(5)
    killed = time.monotonic()
    while time.monotonic() - killed < STOP_BOUND_S + 5 and "iperf3" in _descendants(agent):
        time.sleep(0.1)
    took = time.monotonic() - killed
    the_lab.stop(target)
    _record("third-party after its requester's SIGKILL", f"stopped after {took:.1f} s")
    assert "iperf3" not in _descendants(agent), (
        "the third-party test ran on without its requester: " + _read(_LOG)[-1500:])
    assert took <= STOP_BOUND_S, f"it stopped only {took:.1f} s after its requester died"


_FAR_REQUESTER = r"""
import sys, subprocess
from netprobe.farend import AgentConnection
from netprobe.schema import TestSpec
conn = AgentConnection.open(sys.argv[1], int(sys.argv[2]), None)
port = conn.far_end("iperf3", TestSpec(tool="iperf3", host=sys.argv[1], duration_s=8,
                                       rate_bits_per_second=1e6))
print("ready", flush=True)
subprocess.run([sys.argv[3], "-c", sys.argv[1], "-p", str(port), "-t", "8", "-b", "1M"])
"""


def test_a_killed_requester_takes_its_far_end_with_it(lab: tuple[Lab, str, str, str]) -> None:
    the_lab, _a, c, _v = lab
    _tool_or_skip("iperf3")
    iperf3 = shutil.which("iperf3") or str(PEERS / "iperf3")
    requester = the_lab.start(c, [sys.executable, "-c", _FAR_REQUESTER, AGENT,
                                  str(AGENT_PORT), iperf3])
    agent = _agent_pid(the_lab)
    end = time.monotonic() + 10
    while time.monotonic() < end and "iperf3" not in _descendants(agent):
        time.sleep(0.1)
    assert "iperf3" in _descendants(agent), "the far end never started"
    time.sleep(1.0)
    os.killpg(requester.pid, signal.SIGKILL)
    requester.wait(5)
    killed = time.monotonic()
    while time.monotonic() - killed < STOP_BOUND_S + 5 and "iperf3" in _descendants(agent):
        time.sleep(0.1)
    took = time.monotonic() - killed
    _record("far end after its requester's SIGKILL", f"stopped after {took:.1f} s")
    assert "iperf3" not in _descendants(agent), (
        "the far end ran on without its requester: " + _read(_LOG)[-1500:])
    assert took <= STOP_BOUND_S, f"it stopped only {took:.1f} s after its requester died"


def test_the_agent_says_how_it_holds_its_far_ends(lab: tuple[Lab, str, str, str]) -> None:
    log = _LOG
    assert re.search(r"far ends held by the kernel", _read(log)), _read(log)


def test_an_agent_without_a_fence_says_its_limits_bind_only_after_the_fact() -> None:
    # nft is in /usr/sbin: without it on PATH no fence can be put up (as on a host without
    # root or nftables). The agent must say so, not be silently weaker.
    from netprobe.farend import agent_status

    from .servers import netprobe_server

    if shutil.which("nft", path="/usr/bin:/bin"):
        pytest.skip("nft is in /usr/bin or /bin here: it cannot be hidden")
    with netprobe_server("--max-rate", "1M", env={"PATH": "/usr/bin:/bin"}) as server:
        end = time.monotonic() + 10
        while time.monotonic() < end and "after the fact" not in _read(Path(server.log_path)):
            time.sleep(0.1)
        said = _read(Path(server.log_path))
        status = agent_status("127.0.0.1", port=server.port)
    assert "held only after the fact" in said and "nft is not installed" in said, said
    assert "after the fact" in str(status.get("far_end_limits")), status


def test_max_rate_is_the_tests_not_each_streams(lab: tuple[Lab, str, str, str]) -> None:
    # --max-rate bounds a test's streams together, as on the native server: a far end told
    # 4 streams at --max-rate 1M may move 1 Mbit/s in all, not 4 (it was rate x streams).
    # Last in the file: its 4 streams' last packets, answered after it ends, would be
    # counted by the accept test's witness (7 flows "for 1 stream" when it ran first).
    the_lab, a, c, _v = lab
    _tool_or_skip("iperf3")
    before = _counters(the_lab, a)
    outcome = _request(the_lab, c, "iperf3", "tcp", "normal", 4, told_streams=4)
    received = _counters(the_lab, a)["to_far"] - before["to_far"]
    allowed = RATE_BYTES_S * outcome["far_s"] + max(RATE_BYTES_S, fence.MIN_BURST_BYTES)
    assert 2000 < received <= allowed, (received, allowed, outcome)
