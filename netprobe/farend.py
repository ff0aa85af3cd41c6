"""The far-end client: one command runs both ends of any tool, by asking the far host's agent.

Below the run road (session.py imports it; it imports nothing above the plugin contract).
The agent's own side, the daemon that answers these requests, is netprobe/agent/.

``run`` asks the agent on the target host (if one answers) to start the tool's server side,
runs the client side here, and merges what the far end printed into the result.
``third_party`` asks an agent to run a test against another host; ``remote_tools`` asks
an agent what it can run; ``agent_status`` what it is doing now.
"""
from __future__ import annotations

import socket
from typing import Any

import attrs

from netprobe import convert
from netprobe.engine import protocol
from netprobe.engine.auth import METHOD, new_challenge, respond, verify
from netprobe.errors import (
    NetprobeError,
    ProtocolError,
    SecretMissing,
    SecretRefused,
    TestFailed,
    refused_secret,
    unresolved,
)
from netprobe.plugin import Reporter, Tool
from netprobe.schema import Interval, RawOutput, Result, TestSpec

CONNECT_TIMEOUT_S = 3.0
REPLY_TIMEOUT_S = 20.0  # a tool's server may take a moment to start on a small router
RECEIVE_WAIT_S = 600.0
"""How long a receive-only test on an agent may wait for its outside sender to begin."""


class AgentConnection:
    """A control connection to a netprobe agent, authenticated if it asks."""

    def __init__(self, channel: protocol.Channel, host: str) -> None:
        self.channel = channel
        self.host = host
        self.stopped: str | None = None
        """Why the agent stopped the far end before its client was done (its limits)."""
        self.output_notes: list[str] = []
        """What of the far end's output was not kept, by the agent or here."""

    @classmethod
    def open(cls, host: str, port: int, secret: bytes | None) -> AgentConnection | None:
        """Connect and say hello; None when no netprobe agent answers there."""
        try:
            sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        except socket.gaierror as exc:
            # No agent, and no server of any tool either: said as the native engine says
            # it, not as "no agent there, using the tool's server" and the tool's failure.
            raise unresolved(host, exc.strerror) from None
        except OSError:
            return None
        channel = protocol.Channel(sock)
        try:
            sock.sendall(protocol.pack_hello(protocol.KIND_CONTROL))
            welcome = channel.expect("welcome", timeout=CONNECT_TIMEOUT_S)
        except (OSError, NetprobeError):
            channel.close()
            return None
        agent = cls(channel, host)
        if welcome.get("auth"):
            agent._authenticate(welcome, secret)
        return agent

    def _authenticate(self, welcome: dict[str, Any], secret: bytes | None) -> None:
        if welcome.get("auth") != METHOD:
            self.close()
            raise TestFailed(f"the agent at {self.host} asks for an unknown authentication")
        if not secret:
            self.close()
            raise SecretMissing(self.host, "agent")
        ours = new_challenge()
        self.channel.send({"type": "auth", "challenge": ours,
                           "response": respond(secret, str(welcome.get("challenge")), "client")})
        try:
            reply = self.channel.recv(timeout=REPLY_TIMEOUT_S)
        except (OSError, ProtocolError) as exc:
            raise TestFailed(f"agent at {self.host}: {protocol.reason(exc)}") from None
        if refused_secret(reply):
            self.close()
            raise SecretRefused(self.host, "agent")
        if reply.get("type") != "auth_ok":
            self.close()
            raise TestFailed(f"agent at {self.host}: expected 'auth_ok', got "
                             f"'{reply.get('type')}'")
        if not verify(secret, ours, "server", reply.get("response")):
            raise TestFailed(f"the agent at {self.host} could not prove it knows the secret")

    def _expect(self, kind: str, timeout: float = REPLY_TIMEOUT_S) -> dict[str, Any]:
        try:
            return self.channel.expect(kind, timeout=timeout)
        except (OSError, ProtocolError) as exc:
            raise TestFailed(f"agent at {self.host}: {protocol.reason(exc)}") from None

    def far_end(self, tool: str, spec: TestSpec) -> int:
        """Have the agent start ``tool``'s server side; the port it listens on."""
        self.channel.send({"type": "far_end", "tool": tool, "spec": convert.unstructure(spec)})
        reply = self._expect("far_end_ready")
        port = reply.get("port")
        if not isinstance(port, int) or not 0 < port < 65536:
            raise TestFailed(f"agent at {self.host} sent a bad port")
        return port

    def finish(self, timeout: float = REPLY_TIMEOUT_S) -> RawOutput | None:
        """Tell the agent the client is done; the far end's output (None if it is lost)."""
        # Here, not at the top: driven.process (subprocess, ctypes) is for driven tools,
        # and a native run, which imports this module too, never comes here.
        from netprobe.driven import KeptOutput

        try:
            self.channel.send({"type": "far_end_done"})
            chunks = KeptOutput()  # an agent that sends without end costs a bounded memory
            reply = self.channel.recv(timeout=timeout)
            while reply.get("type") == "far_end_text":  # a long output comes in pieces
                chunks.add(str(reply.get("text", "")))
                reply = self.channel.recv(timeout=timeout)
            if reply.get("type") != "far_end_output":
                raise ProtocolError(f"expected 'far_end_output', got '{reply.get('type')}'")
            stopped, note = reply.get("stopped"), reply.get("output_note")
            self.stopped = stopped if isinstance(stopped, str) else None
            mine = chunks.note("the far end's (as received)")
            self.output_notes = [n for n in (note, mine) if isinstance(n, str)]
            raw = convert.structure(reply.get("raw"), RawOutput)
            return (attrs.evolve(raw, text="".join(chunks.chunks())) if reply.get("chunked")
                    else raw)
        except (OSError, NetprobeError):
            return None

    def close(self) -> None:
        """Close the connection."""
        self.channel.close()


def agent_port(tool: Tool) -> int:
    """The agent's port: the tool option ``agent_port`` or netprobe's default."""
    port = tool.options.get("agent_port")
    return int(port) if port else protocol.DEFAULT_PORT


def run(tool: Tool, spec: TestSpec, reporter: Reporter, secret: bytes | None = None,
        use_agent: bool = True, port: int | None = None) -> Result:
    """Run ``spec`` with ``tool``; when the target host runs an agent (on ``port``, or
    :func:`agent_port`) and no test port was given, which would mean a server the user
    started, the agent runs the far end. A tool whose far end is a netprobe server (the
    native engine) goes to the agent itself: on ``port``, with ``secret``."""
    if _speaks_netprobe(tool):
        return _to_the_agent(tool, spec, reporter, secret, port)
    if not _wants_agent(tool, spec, use_agent):
        return tool.run(spec, reporter)
    assert spec.host is not None
    agent = AgentConnection.open(spec.host, port or agent_port(tool), secret)
    if agent is None:
        reporter.note(f"no netprobe agent at {spec.host}: using the {tool.name} server there")
        return tool.run(spec, reporter)
    try:
        return _run_far(agent, tool, spec, reporter)
    finally:
        agent.close()


def _speaks_netprobe(tool: Tool) -> bool:
    """Whether ``tool``'s far end is netprobe's own server (an agent), not one it starts."""
    return tool.name == "native" and type(tool).far_end_argv is Tool.far_end_argv


def _to_the_agent(tool: Tool, spec: TestSpec, reporter: Reporter, secret: bytes | None,
                  port: int | None) -> Result:
    """Run the native engine against the agent on ``port`` (unless the spec names a port)
    with ``secret``: an agent that ran a third-party test once gave its native client
    neither, and a fleet with a secret, or on another port, failed every pair."""
    if spec.host and spec.port is None and port is not None:
        spec = attrs.evolve(spec, port=port)
    if secret and not tool.options.get("secret"):
        # A copy: the caller's instance may be shared (the fleet caches one per tool).
        tool = type(tool)({**tool.options, "secret": secret})
    return tool.run(spec, reporter)


def _wants_agent(tool: Tool, spec: TestSpec, use_agent: bool) -> bool:
    # Whether the host is this machine is asked last: it resolves the name and binds a
    # socket to each address, and a tool with no far end to start (the native engine, whose
    # far end is the netprobe server itself) never needs the answer.
    if type(tool).far_end_argv is Tool.far_end_argv:
        return False
    if not use_agent or not spec.host or spec.port is not None:
        return False
    if tool.options.get("receive"):
        return False  # receive-only listens here (--from AGENT runs it on an agent)
    from netprobe.driven import is_local_host  # netprobe.driven.net: ipaddress and more

    return not is_local_host(spec.host)


def _run_far(agent: AgentConnection, tool: Tool, spec: TestSpec, reporter: Reporter) -> Result:
    port = agent.far_end(tool.name, spec)
    reporter.note(f"the agent at {agent.host} started the {tool.name} server on port {port}")
    try:
        result = tool.run(attrs.evolve(spec, port=port), reporter)
    except TestFailed as exc:
        far = agent.finish()
        if far is not None and isinstance(exc.partial, Result):
            exc.partial = _stopped(agent, tool.merge_far_end(exc.partial, far))
        raise
    far = agent.finish()
    if far is None:
        return attrs.evolve(result, warnings=(*result.warnings, "the far end's output was lost"))
    merged = _stopped(agent, tool.merge_far_end(result, far))
    if merged.status == "failed" and result.status == "ok":
        raise TestFailed(merged.errors[-1], merged)
    return merged


def _stopped(agent: AgentConnection, result: Result) -> Result:
    """``result`` failed with the agent's reason, if it stopped the far end (and saying
    what of the far end's output was not kept, if anything)."""
    if agent.output_notes:
        result = attrs.evolve(result, warnings=(*result.warnings, *agent.output_notes))
    if agent.stopped is None:
        return result
    reason = f"the agent at {agent.host} stopped the far end: {agent.stopped}"
    return attrs.evolve(result, status="failed", errors=(*result.errors, reason))


def third_party(source: str, spec: TestSpec, reporter: Reporter, secret: bytes | None = None,
                port: int = protocol.DEFAULT_PORT,
                modes: dict[str, bool] | None = None,
                target_port: int | None = None) -> Result:
    """Ask the agent at ``source`` to run ``spec`` against ``spec.host``; its Result.
    ``modes``: the tool's modes to run it in (:attr:`netprobe.plugin.Tool.modes`); in
    ``receive`` mode the agent runs only a receiver, for a sender started elsewhere.
    ``target_port``: where the agent on ``spec.host`` listens (default: ``port``, as the
    agents of one deployment do); the source's agent uses its own secret there."""
    agent = AgentConnection.open(source, port, secret)
    if agent is None:
        raise TestFailed(f"no netprobe agent answers at {source} port {port}")
    try:
        message = {"type": "third_party", "tool": spec.tool, "spec": convert.unstructure(spec),
                   "agent_port": target_port or port}
        if modes:
            message["modes"] = modes
        agent.channel.send(message)
        wait = RECEIVE_WAIT_S if (modes or {}).get("receive") else 0.0
        return _third_party_result(agent, spec, reporter, wait)
    finally:
        agent.close()


def _third_party_result(agent: AgentConnection, spec: TestSpec, reporter: Reporter,
                        wait_s: float = 0.0) -> Result:
    limit = (spec.duration_s or 3600.0) + spec.omit_s + 2 * REPLY_TIMEOUT_S + wait_s
    while True:
        try:
            message = agent.channel.recv(timeout=limit)
        except (OSError, ProtocolError) as exc:
            raise TestFailed(f"agent at {agent.host}: {protocol.reason(exc)}") from None
        kind = message.get("type")
        if kind == "interval":
            reporter.interval(convert.structure(message.get("sample"), Interval))
        elif kind == "note":
            reporter.note(str(message.get("message")))
        elif kind == "error":
            raise TestFailed(f"agent at {agent.host}: {message.get('message')}")
        elif kind == "result":
            return _final(agent, message)


def _final(agent: AgentConnection, message: dict[str, Any]) -> Result:
    data = message.get("result")
    result = convert.structure(data, Result) if data else None
    if message.get("error"):
        raise TestFailed(f"agent at {agent.host}: {message['error']}", result)
    if result is None:
        raise TestFailed(f"agent at {agent.host} sent no result")
    return result


def agent_status(host: str, secret: bytes | None = None, port: int = protocol.DEFAULT_PORT,
                 timeout: float = CONNECT_TIMEOUT_S) -> dict[str, Any]:
    """What the agent at ``host`` is doing now: state (idle or busy), running (one dict per
    held slot: kind, tool, peer, target, started), slots, served. TestFailed when no agent
    answers or it is too old to know the request."""
    agent = AgentConnection.open(host, port, secret)
    if agent is None:
        raise TestFailed(f"no netprobe agent answers at {host} port {port}")
    try:
        agent.channel.send({"type": "status"})
        reply = agent._expect("status", timeout=timeout)
    finally:
        agent.close()
    if reply.get("state") not in ("idle", "busy") or not isinstance(reply.get("running"), list):
        raise TestFailed(f"agent at {host} sent a malformed status")
    return reply


def remote_tools(host: str, secret: bytes | None = None,
                 port: int = protocol.DEFAULT_PORT) -> list[dict[str, Any]]:
    """What the agent at ``host`` can run: one row per tool."""
    agent = AgentConnection.open(host, port, secret)
    if agent is None:
        raise TestFailed(f"no netprobe agent answers at {host} port {port}")
    try:
        agent.channel.send({"type": "tools"})
        rows = agent._expect("tools").get("tools")
    finally:
        agent.close()
    if not isinstance(rows, list):
        raise TestFailed(f"agent at {host} sent a malformed tool list")
    return [row for row in rows if isinstance(row, dict)]
