"""What a ``/probe`` may run, and running it so that it can be dropped.

:func:`resolve` turns a scrape's query into a test only within the exporter's
configuration (its module's tool, targets, caps, port and secret): anything else is a
:class:`ProbeRefused` with the HTTP status and a one-line reason. :func:`run_watched`
runs the test in a child process (``python -m netprobe.exporter_probe``) and kills it
when the scraper hangs up or the deadline passes: a test on a thread cannot be stopped,
and a probe nobody waits for any more must not go on sending.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

import attrs

from netprobe.errors import NetprobeError, SpecError
from netprobe.exporter_config import DEFAULT_MODULE, ExporterConfig, Module
from netprobe.fleet.config import Agent
from netprobe.schema import DIRECTIONS, PROTOCOLS, Result, TestSpec

SCRAPE_MARGIN_S = 1.5
"""Kept free of Prometheus's scrape timeout for the test's start and the answer."""
START_MARGIN_S = 15.0
"""Past its length, how long a probe's child may take (start-up, the agent's replies)."""
STOP_GRACE_S = 3.0
"""How long a dropped probe's child has to stop its tool before it is killed."""
UDP_DEFAULT_RATE = 1_000_000.0
"""A UDP probe's rate when neither the scrape nor the module names one (as ``run -u``)."""
MAX_REPLY_BYTES = 64 << 20
"""Most a probe's child may answer with (a result, not a stream)."""


class ProbeRefused(SpecError):
    """A /probe the exporter will not run: ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@attrs.frozen
class Probe:
    """One test a /probe may run."""

    module: str
    """The module's name."""
    spec: TestSpec
    """The test."""
    source: str | None = None
    """The agent that runs it as a third-party test (None: the exporter's host)."""
    secret_file: str | None = None
    """The file holding the agents' secret (read by the child, which runs the test)."""
    agent_port: int | None = None
    """The agents' port (``source``'s, with a source)."""
    target_agent_port: int | None = None
    """With a source: the target's agent port, which the source's agent is told."""
    far_end: bool = True
    """The target runs an agent that starts the tool's far end (False: its own server)."""
    iperf3: bool = False
    """The target is a stock ``iperf3 -s`` (a fleet agent with ``iperf3_port``): tested by
    the native engine in its iperf3 mode, on that port."""


_NUMBERS = {"streams": int, "duration": float, "omit": float, "rate": float}
_WORDS = {"tool", "protocol", "direction"}
_FROM_CONFIG = {"port", "agent_port", "secret", "secret_file"}


def resolve(config: ExporterConfig, query: Mapping[str, list[str]],
            scrape_timeout_s: float | None) -> Probe:
    """The probe ``query`` asks for, inside ``config`` (ProbeRefused if not)."""
    if not config.modules:
        raise ProbeRefused(403, "/probe is off: start the exporter with --config FILE, whose "
                                "modules name the targets it may test")
    asked = {key: values[-1] for key, values in query.items()}
    for key in asked:
        if key in _FROM_CONFIG:
            raise ProbeRefused(400, f"/probe parameter {key}: set by the exporter's "
                                    "configuration (the module or the fleet file), not a scrape")
        if key not in _NUMBERS and key not in _WORDS and key not in ("target", "from",
                                                                     "module", "debug"):
            raise ProbeRefused(400, f"unknown /probe parameter {key[:80]!r} (known: target, "
                                    f"module, from, debug, {', '.join([*_WORDS, *_NUMBERS])})")
    name, module, target = module_and_target(config, asked, "/probe")
    fields = _fields(module, asked, scrape_timeout_s)
    agent = _fleet_agent(config, module, target)
    host, port, secret, agent_port, far_end = _target(module, target, agent)
    stock = agent is not None and agent.iperf3_port is not None
    source = asked.get("from")
    if source is not None:
        if source not in module.sources:
            raise ProbeRefused(403, f"/probe parameter from: {source!r} is not one of module "
                                    f"{name}'s sources")
        agent = config.agents[source]
        target_agent_port = agent_port  # the source's agent goes there, not to its own port
        source, secret, agent_port = agent.address, agent.secret_file, agent.port
    else:
        target_agent_port = None
    try:
        spec = TestSpec(host=host, port=port, **fields)
    except (SpecError, TypeError, ValueError) as exc:
        raise ProbeRefused(400, f"/probe: {exc}") from None
    return Probe(name, spec, source, secret, agent_port, target_agent_port, far_end, stock)


def module_and_target(config: ExporterConfig, asked: Mapping[str, str],
                      page: str) -> tuple[str, Module, str]:
    """The module's name, the module and the target a scrape of ``page`` (``/probe``,
    ``/status``) names (ProbeRefused if it names no module of the configuration, or no
    target). The scrape's words are quoted cut short: they are anyone's."""
    name = asked.get("module", DEFAULT_MODULE)
    module = config.modules.get(name)
    if module is None:
        raise ProbeRefused(400, f"{page} parameter module: no module {name[:80]!r} (known: "
                                f"{', '.join(config.modules)})")
    target = asked.get("target", "").strip()
    if not target:
        raise ProbeRefused(400, f"{page} needs a target: {page}?target=HOST")
    return name, module, target


def _fields(module: Module, asked: Mapping[str, str], scrape_timeout_s: float | None
            ) -> dict[str, Any]:
    """The spec's fields from the module and the scrape's numbers, each checked."""
    for word, fixed in (("tool", module.tool), ("protocol", module.protocol)):
        value = asked.get(word)
        if word == "protocol" and value is not None and value not in PROTOCOLS:
            raise ProbeRefused(400, f"/probe parameter protocol: must be one of "
                                    f"{', '.join(PROTOCOLS)}, got {value!r}")
        if value is not None and value != fixed:
            raise ProbeRefused(400, f"/probe parameter {word}: module {module.name} runs "
                                    f"{fixed} only, not {value!r}")
    direction = asked.get("direction", "normal")
    if direction not in DIRECTIONS:
        raise ProbeRefused(400, f"/probe parameter direction: must be one of "
                                f"{', '.join(DIRECTIONS)}, got {direction!r}")
    numbers = {key: _number(key, kind, asked[key]) for key, kind in _NUMBERS.items()
               if key in asked}
    limit = module.max_duration_s if scrape_timeout_s is None else min(
        module.max_duration_s, scrape_timeout_s - SCRAPE_MARGIN_S)
    duration = numbers.get("duration", min(module.duration_s, limit))
    omit = numbers.get("omit", 0.0)
    if duration <= 0 or omit < 0:
        raise ProbeRefused(400, "/probe parameters duration and omit: must be above 0 "
                                "and at least 0 seconds")
    if duration + omit > limit:
        raise ProbeRefused(400, f"/probe: the test ({duration + omit:g} s with omit) would "
                                f"not end within {limit:g} s (module {module.name}'s "
                                "max_duration and the scrape timeout)")
    streams = int(numbers.get("streams", 1))
    if not 1 <= streams <= module.max_streams:
        raise ProbeRefused(400, f"/probe parameter streams: must be 1-{module.max_streams} "
                                f"(module {module.name}), got {streams}")
    rate = numbers.get("rate", module.rate)
    if rate is None and module.protocol == "udp":
        rate = min(UDP_DEFAULT_RATE, module.max_rate)
    if rate is not None and not 0 < rate <= module.max_rate:
        raise ProbeRefused(400, f"/probe parameter rate: must be above 0 and at most "
                                f"{module.max_rate:g} bits/s (module {module.name}), "
                                f"got {rate:g}")
    fields: dict[str, Any] = {"tool": module.tool, "protocol": module.protocol,
                              "direction": direction, "streams": streams,
                              "duration_s": float(duration)}
    if omit:
        fields["omit_s"] = float(omit)
    if rate is not None:
        fields["rate_bits_per_second"] = float(rate)
    return fields


def _number(key: str, kind: type, text: str) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise ProbeRefused(400, f"/probe parameter {key}: not a {kind.__name__}: "
                                f"{text[:80]!r}") from None
    if not math.isfinite(value):
        raise ProbeRefused(400, f"/probe parameter {key}: must be a finite number, "
                                f"got {text[:80]!r}")
    return float(value)


def _fleet_agent(config: ExporterConfig, module: Module, target: str) -> Agent | None:
    """The fleet's agent ``target`` names, if the module may test it (by name, or by
    address where the module takes any fleet agent); None otherwise."""
    agents = config.agents
    agent = agents.get(target)
    if agent is None and module.fleet_agents:
        agent = next((a for a in agents.values() if a.address == target), None)
    if agent is not None and (module.fleet_agents or target in module.targets):
        return agent
    return None


def _target(module: Module, target: str, agent: Agent | None
            ) -> tuple[str, int | None, str | None, int | None, bool]:
    """(host, the tool's port, secret file, agent port, whether an agent is there) of an
    allowed target (``agent``: the fleet's agent it names, from :func:`_fleet_agent`)."""
    if agent is not None:
        if agent.iperf3_port is not None:  # a stock iperf3 -s: no agent, no secret there
            if module.tool != "native":
                raise ProbeRefused(400, f"/probe: {target[:200]!r} is a stock iperf3 server, "
                                        f"tested by the native tool (its iperf3 mode), not "
                                        f"{module.tool}")
            return agent.address, agent.iperf3_port, None, None, False
        port = agent.port if module.tool == "native" else None
        return agent.address, port, agent.secret_file, agent.port, True
    if target not in module.targets:
        raise ProbeRefused(403, f"/probe: target {target[:200]!r} is not one of module "
                                f"{module.name}'s targets (the exporter's configuration)")
    agent_port = module.agent_port
    if agent_port is None and module.tool == "native":
        agent_port = module.port
    return target, module.port, module.secret_file, agent_port, module.agent


# --- running it -----------------------------------------------------------------------------


class ScraperGone(NetprobeError):
    """The scraper hung up before its probe ended: the probe was dropped."""


def run_watched(probe: Probe, client: socket.socket | None) -> Result:
    """Run ``probe`` in a child process; kill it when ``client`` hangs up (ScraperGone)
    or when it overruns (NetprobeError). The test's own failure is a NetprobeError too."""
    request = json.dumps({
        "spec": _unstructure(probe.spec), "from": probe.source,
        "secret_file": probe.secret_file,
        "agent_port": probe.agent_port, "target_agent_port": probe.target_agent_port,
        "far_end": probe.far_end, "iperf3": probe.iperf3})
    deadline = time.monotonic() + (probe.spec.duration_s or 0) + (probe.spec.omit_s or 0) \
        + START_MARGIN_S
    child = subprocess.Popen([sys.executable, "-m", "netprobe.exporter_probe"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, start_new_session=True, cwd=_HOME)
    try:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(request.encode())
        child.stdin.close()
        reply = _read_until_done(child.stdout.fileno(), client, deadline)
    finally:
        _stop(child)
    return _answer(reply)


_HOME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""Where this netprobe package lives: the child runs there, so that ``-m`` (which puts
its working directory first on the path) finds this very netprobe, not another one in
whatever directory the exporter was started from."""


def _read_until_done(fd: int, client: socket.socket | None, deadline: float) -> bytes:
    """The child's whole answer; ScraperGone as soon as ``client`` hangs up."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if client is not None:
        poller.register(client, select.POLLIN | getattr(select, "POLLRDHUP", 0))
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise NetprobeError("the probe overran its time and was stopped")
        for ready, _ in poller.poll(min(left, 1.0) * 1000):
            if ready != fd:
                assert client is not None
                if hung_up(client):
                    raise ScraperGone("the scraper hung up: probe dropped")
                poller.unregister(client)  # it sent more (pipelined): watch the child only
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > MAX_REPLY_BYTES:
                raise NetprobeError("the probe's answer was too long")
            chunks.append(chunk)


def hung_up(client: socket.socket) -> bool:
    """True when the peer of ``client`` has closed (or reset) its side; never waits."""
    # Poll first: on a socket with a timeout (the handler's idle timeout) Python turns an
    # EAGAIN from recv() into a wait of that whole timeout, MSG_DONTWAIT or not.
    poller = select.poll()
    poller.register(client, select.POLLIN | getattr(select, "POLLRDHUP", 0))
    if not poller.poll(0):
        return False
    try:
        return client.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError, TimeoutError):
        return False
    except OSError:
        return True


def _stop(child: subprocess.Popen) -> None:
    """Ask the child to stop its test (SIGTERM, which it turns into Ctrl-C), then kill its
    whole process group if it has not ended after STOP_GRACE_S."""
    if child.poll() is None:
        _signal_group(child.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(STOP_GRACE_S)
    _signal_group(child.pid, signal.SIGKILL)  # whatever of its group is left
    child.wait()
    if child.stdout is not None:
        child.stdout.close()


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def _unstructure(spec: TestSpec) -> Any:
    from netprobe.convert import unstructure

    return unstructure(spec)


def _answer(reply: bytes) -> Result:
    from netprobe.convert import structure

    try:
        data = json.loads(reply)
    except ValueError:
        raise NetprobeError("the probe ended without an answer") from None
    if data.get("error"):
        raise NetprobeError(str(data["error"]))
    return structure(data["result"], Result)


# --- the child ------------------------------------------------------------------------------


def _child() -> int:
    """Run the test asked on stdin; its result (or error) as JSON on stdout."""
    from netprobe.convert import structure, unstructure
    from netprobe.engine.auth import load_secret
    from netprobe.registry import load_registry
    from netprobe.reporting import NullReporter
    from netprobe.session import AgentAccess, run_spec

    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt  # as Ctrl-C: the run stops its tool and its far end

    signal.signal(signal.SIGTERM, interrupt)
    answer: dict[str, Any]
    try:
        asked = json.loads(sys.stdin.read(1 << 20))
        spec = structure(asked["spec"], TestSpec)
        secret_file = asked["secret_file"]
        # No agent there: the target's own server listens on the port, so none is started
        # here even when the target is this machine (as `run --no-agent -p PORT`).
        options: dict[str, Any] = {"secret_file": secret_file} if secret_file else {}
        if asked.get("iperf3"):
            options["iperf3"] = True  # a stock iperf3 -s: its protocol, on its port
        elif not asked["far_end"] and spec.port is not None:
            options["start_server"] = False
        tool = load_registry(only=spec.tool).get(spec.tool)(options or None)
        result = run_spec(tool, spec, NullReporter(), from_host=asked["from"],
                          agent=AgentAccess(secret=load_secret(secret_file),
                                            port=asked["agent_port"],
                                            target_port=asked.get("target_agent_port"),
                                            far_end=asked["far_end"]))
        answer = {"result": unstructure(result)}
    except NetprobeError as exc:
        answer = {"error": str(exc) or type(exc).__name__}
    except KeyboardInterrupt:
        answer = {"error": "stopped"}
    sys.stdout.write(json.dumps(answer, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(_child())
