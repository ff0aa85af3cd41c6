"""The agent's side of the requests: what ``netprobe server`` does for other tools.

``far_end`` starts a driven tool's server side on a free port of this host, tells the
client the port once it listens, and stops it (by PID) when the client is done, gone or
late, then sends its output back. ``third_party`` runs a whole test from this host to
another one and streams the result back. ``tools`` lists what this host can run.
``status`` says what the agent is doing now (idle or busy, and with what).
"""
from __future__ import annotations

import contextlib
import functools
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable

import attrs

from netprobe import convert
from netprobe.agent import fence, udpcount
from netprobe.agent.fence import Fence, FenceUnavailable
from netprobe.agent.guard import CHECK_S, EXTRA_CONNECTIONS, Guard, limits_for, listens
from netprobe.agent.liveness import RequesterWatch, keep_alive
from netprobe.agent.udpcount import CounterUnavailable, UdpCounter
from netprobe.driven import DrivenProcess, port_is_free
from netprobe.engine.handlers import ControlConnection
from netprobe.engine.log import client, escape
from netprobe.errors import NetprobeError, SecretMissing, SecretRefused, TestFailed
from netprobe.plugin import Tool
from netprobe.registry import Registry, load_registry, tool_rows
from netprobe.schema import Interval, RawOutput, TestSpec
from netprobe.session import AgentAccess, availability, run_spec

READY_TIMEOUT_S = 10.0  # how long a tool's server may take to start listening
EXIT_WAIT_S = 5.0  # how long a one-shot server may take to exit after the client is done

OUTPUT_CHUNK_CHARS = 8_000  # JSON-escaped (6 bytes a character at worst), still one frame
START_TRIES = 3  # blocks of ports tried before a far end is refused
_PORTS_LOCK = threading.Lock()  # one far end at a time picks its ports and starts

RegistryLoader = Callable[..., Registry]


def handlers(loader: RegistryLoader = load_registry) -> dict[str, Callable[[Any, dict], None]]:
    """The request handlers to give the engine's server (the agent starting up: what a
    killed predecessor left of its far ends' counters is removed first)."""
    udpcount.remove_stale()
    fence.remove_stale()
    return {
        "tools": lambda control, msg: _tools(control, loader),
        "far_end": lambda control, msg: _far_end(control, msg, loader),
        "third_party": lambda control, msg: _third_party(control, msg, loader),
        "status": lambda control, msg: _status(control),
    }


# --- status -------------------------------------------------------------------------------


def _status(control: ControlConnection) -> None:
    # Answered without a slot, so a busy agent can still say what keeps it busy. The agent
    # refuses a test beyond its slots ("busy") rather than queueing it: the queue of a
    # fleet lives in its runner, not here.
    server = control.server
    running = server.admission.activity()
    # Listeners beside the port (iperf3's) report their own counters under their kind,
    # for an exporter to show (netprobe_iperf3_tests_total).
    services = {service.kind: service.status() for service in getattr(server, "services", ())
                if callable(getattr(service, "status", None)) and hasattr(service, "kind")}
    control.channel.send({"type": "status", "state": "busy" if running else "idle",
                          "running": running, "slots": server.config.max_tests,
                          "served": server.admission.served,
                          "third_party": server.config.allow_third_party,
                          "far_end_limits": limits_note(), **services})


@functools.lru_cache(maxsize=1)
def _fence_missing() -> str | None:
    """Why far ends cannot be fenced on this host (None: they are); found once."""
    return fence.unavailable()


def limits_note() -> str:
    """How this agent holds its far ends to its limits, for its start line and status:
    never silently weaker than the kernel would allow."""
    missing = _fence_missing()
    if missing is None:
        return ("far ends held by the kernel: own cgroup, nftables rate limit, connection "
                "count and only the requester as destination")
    return (f"far ends held only after the fact (watched and stopped): no kernel fence "
            f"here ({missing})")


# --- tools ------------------------------------------------------------------------------


def _tools(control: ControlConnection, loader: RegistryLoader) -> None:
    control.channel.send({"type": "tools", "tools": tool_rows(loader())})


def _modes(control: ControlConnection, message: dict, cls: type[Tool]) -> dict[str, bool]:
    """The tool modes a request asks for: only ones the tool declares, only on/off."""
    modes = message.get("modes")
    if not isinstance(modes, dict) or not all(
            isinstance(k, str) and v is True for k, v in modes.items()):
        control.refuse("bad modes in the request")
    unknown = sorted(set(modes) - set(cls.modes))
    if unknown:
        control.refuse(f"{cls.name} has no mode {escape(unknown[0])}")
    return dict(modes)


# --- far end ----------------------------------------------------------------------------


def _tool(control: ControlConnection, message: dict, loader: RegistryLoader) -> Tool:
    name = message.get("tool")
    if not isinstance(name, str):
        control.refuse("request names no tool")
    try:
        cls = loader(only=name).get(name)
        tool = cls(_modes(control, message, cls)) if message.get("modes") else cls()
    except NetprobeError as exc:
        control.refuse(str(exc))
    found = availability(tool)
    if not found.available:
        control.refuse(f"{name} cannot run on this agent: " + "; ".join(found.reasons))
    return tool


def _far_end(control: ControlConnection, message: dict, loader: RegistryLoader) -> None:
    tool = _tool(control, message, loader)
    spec = control.checked_spec(message, tool.refusals)
    with control.slot(spec, "far_end"):
        server, stopped, dropped = _run_far_end(control, tool, spec)
        if stopped:
            control.server.log(f"{client(control.peer)}: {tool.name} server stopped: {stopped}",
                               event="refused", client=client(control.peer), reason="limit")
        notes = [n for n in (server.output_note(), _dropped_note(dropped)) if n]
        _send_output(control, server.raw(), stopped, "; ".join(notes) or None)


def _dropped_note(dropped: int) -> str | None:
    # Said, not failed: an honest test at the allowed rate may see a burst's few drops.
    if not dropped:
        return None
    return (f"the agent's fence dropped {dropped} packets of its far end past this agent's "
            "limits (rate, streams or addresses)")


def _run_far_end(control: ControlConnection, tool: Tool,
                 spec: TestSpec) -> tuple[DrivenProcess, str | None, int]:
    """Start the far end, serve it under its guard and fence, stop it (its counter and
    fence go with it); the stopped process, why the agent stopped it, if it did, and the
    packets its fence dropped."""
    who = client(control.peer)
    keep_alive(control.channel.sock)
    with _udp_counter(control, spec) as (counter, no_udp), _fence(control, spec) as held:
        family = socket.AF_INET6 if ":" in control.local_address else socket.AF_INET
        server, port = _start_far_end(control, tool, spec, family, held)
        control.server.log(f"{who}: started {tool.name} server, pid {server.pid}",
                           event="far-end", client=who, tool=tool.name, pid=server.pid,
                           state="started")
        try:
            guard = _guard(control, spec, server, counter, no_udp)
            stopped = _serve_far_end(control, guard, server, port)
        finally:
            code = server.stop()
            control.server.log(f"{who}: {tool.name} server ended ({code})", event="far-end",
                               client=who, tool=tool.name, pid=server.pid, state="stopped",
                               exit_code=code)
        return server, stopped, held.dropped() if held is not None else 0


def _start_far_end(control: ControlConnection, tool: Tool, spec: TestSpec, family: int,
                   held: Fence | None = None) -> tuple[DrivenProcess, int]:
    """Start the tool's server on a free block of ports, listening by its own PID.

    The port is chosen and the tool started under one lock, and it is ready only once a
    socket of *its* process listens there: two far ends once got the same port, the loser
    failed to bind, and its client was sent to the winner. A failed start is retried on
    the next block."""
    tried: set[int] = set()
    tail = "no output"
    for _ in range(START_TRIES):
        with _PORTS_LOCK:
            port = _free_block(spec.streams, family, tried)
            argv = tool.far_end_argv(spec, control.local_address, port)
            if argv is None:
                control.refuse(f"{tool.name} has no server side for an agent to start")
            if held is not None:
                argv = held.argv(argv)  # it joins its cgroup before the tool runs
            server = DrivenProcess(argv, name="server", die_with_parent=True).start()
            if _wait_ready(server, port):
                return server, port
        server.stop()
        tried.add(port)
        tail = " | ".join(server.text.strip().splitlines()[-3:]) or "no output"
    control.refuse(f"the tool's server did not start listening: {tail}")


@contextlib.contextmanager
def _udp_counter(control: ControlConnection,
                 spec: TestSpec) -> Iterator[tuple[UdpCounter | None, str | None]]:
    """The far end's UDP byte counter, where ``--max-rate`` needs one (removed after), and
    why there is none. A UDP test that could not be held to the rate is refused here;
    for another, the guard stops the far end if it opens a UDP socket."""
    if not control.server.config.max_rate_bps:
        yield None, None
        return
    try:
        counter = UdpCounter.install()
    except CounterUnavailable as exc:
        if spec.protocol == "udp":
            control.refuse(str(exc))
        yield None, str(exc)
        return
    with counter:
        yield counter, None


@contextlib.contextmanager
def _fence(control: ControlConnection, spec: TestSpec) -> Iterator[Fence | None]:
    """The far end's kernel fence (see :mod:`netprobe.agent.fence`), taken down after; None
    where this host has none (the guard alone holds it then, as the start line said)."""
    if _fence_missing() is not None:
        yield None
        return
    config = control.server.config
    directions = len(spec.flow_directions())
    # --max-rate is what one test may move, every stream and direction together (as for
    # the native server's tests), not a figure per stream.
    rate = config.max_rate_bps / 8 if config.max_rate_bps else None
    try:
        held = Fence.put_up(str(control.peer[0]), spec.streams * directions + EXTRA_CONNECTIONS,
                            rate)
    except FenceUnavailable as exc:
        control.server.log(f"{client(control.peer)}: far end not fenced ({exc}): "
                           "only watched", event="far-end", state="unfenced")
        yield None
        return
    with held:
        yield held


def _guard(control: ControlConnection, spec: TestSpec, server: DrivenProcess,
           counter: UdpCounter | None, no_udp: str | None) -> Guard:
    # Behind a fence too: the fence holds what leaves, the guard stops a far end whose
    # client asks for more than it was allowed (what it tries, counted before the fence),
    # so that the test fails and says why rather than measuring the fence.
    config = control.server.config
    return Guard(server.pid, limits_for(
        spec.streams, len(spec.flow_directions()), spec.planned_s() or config.max_duration_s,
        config.max_rate_bps, control.server.allows), udp=counter, no_udp=no_udp)


def _serve_far_end(control: ControlConnection, guard: Guard, server: DrivenProcess,
                   port: int) -> str | None:
    """Serve the far end until its client is done; why the agent stopped it, if it did."""
    control.channel.send({"type": "far_end_ready", "port": port})
    while True:
        try:
            message = control.channel.recv(timeout=CHECK_S)
        except socket.timeout:
            breach = guard.breach()
            if breach is not None:
                return breach  # the caller's finally stops it
            continue
        except (OSError, NetprobeError):
            return None  # client gone: the finally of the caller stops the server
        if message.get("type") == "far_end_done":
            server.wait(EXIT_WAIT_S)  # one-shot servers exit by themselves; others are stopped
            return None


def _wait_ready(server: DrivenProcess, port: int) -> bool:
    end = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < end:
        if listens(server.pid, port):
            return True
        if server.wait(0.05) is not None:
            return False  # it exited instead of listening
    return False


def _free_block(streams: int, family: int, tried: set[int]) -> int:
    # Tools put data ports above the control port (nuttcp, ntttcp) and a sync port below
    # (ntttcp): the whole block must be free.
    for base in range(20000, 60000, 97):
        block = range(base - 1, base + streams + 2)
        if base not in tried and all(port_is_free(p, family) for p in block):
            return base
    raise TestFailed("no block of free ports on the agent")


def _addresses(host: str) -> list[str]:
    """Every address ``host`` resolves to (itself if it does not resolve: refused then)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return [host]
    return sorted({str(info[4][0]) for info in infos})


def _send_output(control: ControlConnection, raw: RawOutput, stopped: str | None,
                 note: str | None) -> None:
    """The far end's output, however long: its text in ``far_end_text`` chunks that each
    fit a frame, then ``far_end_output`` with the rest (once one message, which a long
    output overflowed, so the receiver figures were silently lost) and ``note``, what of
    it was not kept (the output the agent keeps is bounded as every tool's is)."""
    text = raw.text
    for start in range(0, len(text), OUTPUT_CHUNK_CHARS):
        _send_quietly(control, {"type": "far_end_text",
                                "text": text[start:start + OUTPUT_CHUNK_CHARS]})
    _send_quietly(control, {"type": "far_end_output", "chunked": True, "stopped": stopped,
                            "output_note": note,
                            "raw": convert.unstructure(attrs.evolve(raw, text=""))})


def _send_quietly(control: ControlConnection, message: dict) -> None:
    with contextlib.suppress(OSError, NetprobeError):  # the client went away: nothing to tell
        control.channel.send(message)


# --- third party --------------------------------------------------------------------------


class _Forward:
    """A reporter that sends the test's live events to the client that asked for it."""

    def __init__(self, control: ControlConnection) -> None:
        self.control = control
        self.lock = threading.Lock()

    def interval(self, sample: Interval) -> None:
        with self.lock:
            _send_quietly(self.control, {"type": "interval", "sample": convert.unstructure(sample)})

    def note(self, message: str) -> None:
        with self.lock:
            _send_quietly(self.control, {"type": "note", "message": message})


def _third_party(control: ControlConnection, message: dict, loader: RegistryLoader) -> None:
    config = control.server.config
    if not config.allow_third_party:
        control.refuse("third-party tests are off on this agent "
                       "(start it with --allow-third-party to allow them)", "third_party")
    tool = _tool(control, message, loader)
    spec = control.checked_spec(message, tool.refusals)
    receive = bool(tool.options.get("receive"))  # listens here: HOST is a local address
    if not spec.host and not receive:
        control.refuse("a third-party test needs a target host")
    refused = [] if receive else [a for a in _addresses(str(spec.host))
                                  if not control.server.allows(a)]
    if refused:
        control.refuse(f"the target {escape(spec.host)} ({refused[0]}) is outside this agent's "
                       "--allow list: it sends only to addresses it would accept as clients")
    access = _target_access(control, message)
    with control.slot(spec, "third_party"):
        who = client(control.peer)
        what = "receive-only" if receive else f"test to {escape(str(spec.host))}"
        control.server.log(f"{who}: third-party {tool.name} {what}",
                           event="test", client=who, tool=tool.name, target=spec.host)
        reply: dict[str, Any] = {"type": "result"}
        keep_alive(control.channel.sock)
        try:
            with RequesterWatch(control.channel.sock) as watch:
                result = run_spec(tool, spec, _Forward(control), agent=access)
            reply["result"] = convert.unstructure(result)
        except KeyboardInterrupt:
            # Only the watch raises it here (the agent's own Ctrl-C reaches its main
            # thread): the requester is gone, so is the test; no one is left to tell.
            control.server.log(f"{who}: third-party {tool.name} stopped: {watch.gone}",
                               event="test", client=who, tool=tool.name, state="stopped")
            return
        except SecretMissing as exc:
            # Said of this agent, which lacks it: its requester gave its own secret, to
            # this agent, and cannot give one for the next hop.
            reply["error"] = (f"the agent at {control.local_address} has no shared secret, "
                              f"and the one at {exc.host} requires one: start that agent "
                              "with --secret-file (the secret of the agents it tests to)")
        except SecretRefused as exc:
            reply["error"] = (f"the agent at {exc.host} refused the shared secret of the agent "
                              f"at {control.local_address}: the two agents were started with "
                              "different secrets (--secret-file)")
        except TestFailed as exc:
            reply["error"] = str(exc)
            reply["result"] = convert.unstructure(exc.partial) if exc.partial else None
        except NetprobeError as exc:
            reply["error"] = str(exc)
        _send_quietly(control, reply)


def _target_access(control: ControlConnection, message: dict) -> AgentAccess:
    """How this agent, as the client of a third-party test, reaches the target's agent:
    with its own secret, on the port the requester names (it was once always 5301)."""
    port = message.get("agent_port")
    if port is None:  # a requester older than the field: the default port
        return AgentAccess(secret=control.server.config.secret)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        control.refuse("bad agent_port in the request")
    return AgentAccess(secret=control.server.config.secret, port=port)


def with_port(spec: TestSpec, port: int) -> TestSpec:
    """``spec`` aimed at ``port``."""
    return attrs.evolve(spec, port=port)


__all__ = ["handlers", "with_port"]
