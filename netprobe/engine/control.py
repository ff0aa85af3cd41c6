"""One client's control connection on a netprobe server: the welcome, the proof of the
shared secret, the request, and the handler it names (the contract is
:mod:`netprobe.engine.handlers`).

A :class:`Connection` is what every handler gets (the contract's
:class:`~netprobe.engine.handlers.ControlConnection`): it refuses (the client told why,
the refusal logged), checks a test's spec against the server's limits and the tool's
rules, and holds a test slot (:meth:`Connection.slot`) for as long as the handler runs a test.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from typing import Callable, NoReturn

from netprobe import convert
from netprobe.engine import auth, protocol
from netprobe.engine.admission import doing, mbits, mib, test_memory, test_rate
from netprobe.engine.capabilities import native_refusals
from netprobe.engine.conduct import system_name
from netprobe.engine.handlers import ServerFacts
from netprobe.engine.log import client, escape
from netprobe.engine.protocol import Channel
from netprobe.errors import NetprobeError, ProtocolError, SpecError
from netprobe.schema import TestSpec
from netprobe.version import __version__

REFUSAL_CHARS = 1000  # longest refusal told to a client (it may echo what the client sent)


class Connection:
    """One client's control connection on the server (see the module's docstring)."""

    def __init__(self, server: ServerFacts, handlers: dict, channel: Channel,
                 peer: tuple) -> None:
        self.server = server
        self.handlers = handlers
        """Request type -> handler (:data:`netprobe.engine.handlers.Handler`)."""
        self.channel = channel
        self.peer = peer
        self.control_peer = peer
        self.udp_key = secrets.token_bytes(16)
        self.local_address = channel.sock.getsockname()[0]
        self._handshaking = True

    def run(self) -> None:
        """Welcome, prove the secret both ways, read the request, run its handler."""
        cfg = self.server.config
        challenge = auth.new_challenge() if cfg.secret else None
        # With a secret set, nothing about this host (version, kernel) goes to a client
        # before it has proved itself: the auth_ok carries it instead.
        about = {} if challenge else _about()
        self.channel.send({"type": "welcome", "version": protocol.VERSION, **about,
                           "auth": auth.METHOD if challenge else None, "challenge": challenge})
        if cfg.secret and challenge:
            self._authenticate(cfg.secret, challenge)
        try:
            request = self.channel.recv(timeout=cfg.idle_timeout_s)
        except ProtocolError as exc:  # a request that cannot be read: say why, then end
            self.refuse(f"bad request: {exc}", code="protocol")
        self.handshake_over()
        handler = self.handlers.get(str(request["type"]))
        if handler is None:
            self.refuse(f"unknown request {request['type']!r}", code="unknown")
        handler(self, request)

    def require_udp_proof(self, request: dict) -> None:
        """Refuse, naming this server's version, a client that does not make the UDP
        return-routability check (an older netprobe): its hellos would go unanswered, and
        it would wait for nothing."""
        features = request.get("features")
        if not isinstance(features, list) or protocol.UDP_PROOF_FEATURE not in features:
            self.refuse(f"this server ({version()}) opens UDP streams only for clients that "
                        f"prove they receive at their address (feature "
                        f"'{protocol.UDP_PROOF_FEATURE}', which this client's request lacks): "
                        "use a netprobe client as new as the server", "version")

    def handshake_over(self) -> None:
        """The request is in (or the session ended): it no longer counts as a handshake."""
        if self._handshaking:
            self._handshaking = False
            self.server.admission.handshakes.release()

    @contextlib.contextmanager
    def slot(
        self, spec: TestSpec | None = None, kind: str = "test", memory: int = 0
    ) -> Iterator[None]:
        """Hold one of the server's test slots and ``memory`` bytes of its buffer budget
        (SpecError 'busy' if either is short); ``spec`` and ``kind`` say what it is used
        for, as the ``status`` request reports it.

        A slot is taken only by a valid test, and held until its connection ends; a
        refused, idle or unauthenticated client never holds one."""
        rate, streams = (test_rate(spec) or 0.0, spec.streams) if spec else (0.0, 0)
        admission = self.server.admission
        short = admission.take(id(self), doing(kind, self.peer, spec), memory, rate, streams)
        if short is not None:
            self.refuse(f"server busy: {short}", "busy")
        try:
            yield
        finally:
            admission.release(id(self))

    def _authenticate(self, secret: bytes, challenge: str) -> None:
        # Nothing but an auth message is accepted before the client has proved itself.
        cfg = self.server.config
        try:
            message = self.channel.recv(timeout=cfg.handshake_timeout_s)
        except (ProtocolError, OSError) as exc:
            # A client without the secret hangs up (or stays silent) at the challenge: that
            # is a refusal for want of the secret, not a session that merely ended.
            self.refuse(f"no shared secret: no answer to the challenge ({exc})", "auth")
        if message.get("type") != "auth" or not auth.verify(
            secret, challenge, "client", message.get("response")
        ):
            self.refuse("authentication failed: wrong or missing shared secret", "auth")
        theirs = message.get("challenge")
        if not isinstance(theirs, str) or len(theirs) > 2 * auth.CHALLENGE_BYTES:
            raise ProtocolError("bad client challenge")
        self.channel.send({"type": "auth_ok", "response": auth.respond(secret, theirs, "server"),
                           **_about()})

    def checked_spec(
        self, request: dict, refusals: Callable[[TestSpec], list[str]] = native_refusals
    ) -> TestSpec:
        """The request's spec, refused (to the client, and raised) if invalid, if the tool
        cannot run it (the same rules the CLI applies) or if it is over a limit."""
        cfg = self.server.config
        try:
            spec = convert.structure(request.get("spec"), TestSpec)
        except NetprobeError as exc:
            self.refuse(f"bad test spec: {exc}", "spec")
        found = refusals(spec)
        if found:
            self.refuse("; ".join(found), "spec")
        memory, budget = test_memory(spec), self.server.admission.max_memory
        if memory > budget:
            self.refuse(f"the test's buffers need {mib(memory)} of memory, over this server's "
                        f"limit of {mib(budget)}", "limit")
        planned = max(spec.planned_s() or 0.0, _paced_seconds(spec))  # warm-up on top
        if planned and planned > cfg.max_duration_s:
            self.refuse(
                f"duration {planned:g} s (with the warm-up; a byte count at its rate) exceeds "
                f"this server's limit of "
                f"{cfg.max_duration_s:g} s", "limit"
            )
        if spec.streams > cfg.max_streams:
            self.refuse(f"{spec.streams} streams exceed this server's limit of {cfg.max_streams}",
                        "limit")
        self._check_rate(spec)
        return spec

    def _check_rate(self, spec: TestSpec) -> None:
        # The limits bind before any byte leaves: a test whose streams together ask more
        # than --max-rate (or one unlimited stream) is refused, never started and cut.
        cfg = self.server.config
        rate, total = spec.rate_bits_per_second, test_rate(spec)
        limit = cfg.max_stream_rate_bps
        if limit and (rate is None or rate > limit):
            shown = "unlimited" if rate is None else mbits(rate)
            self.refuse(f"rate {shown} a stream exceeds this server's limit of "
                        f"{mbits(limit)} a stream (--max-stream-rate)", "limit")
        limit = cfg.max_rate_bps
        if limit and (total is None or total > limit):
            count = spec.streams * len(spec.flow_directions())
            shown = "unlimited" if total is None else f"{mbits(total)} in all"
            self.refuse(f"rate {shown} ({count} stream(s) and directions together) exceeds "
                        f"this server's limit of {mbits(limit)} for all its tests together "
                        f"(--max-rate): ask for at most {mbits(limit / count)} a stream",
                        "limit")

    def refuse(self, message: str, code: str = "refused") -> NoReturn:
        """Tell the client why not, log it, then end the session (SpecError)."""
        who = client(self.peer)
        self.server.log(f"{who}: {escape(message)}", event="refused", client=who, reason=code)
        # What goes back is cut and escaped too: a refusal that echoes a client's value
        # must stay under the frame limit (it was never sent) and carry no escape codes.
        told = escape(message, REFUSAL_CHARS)
        with contextlib.suppress(OSError, NetprobeError):  # the refusal is the error
            self.channel.send({"type": "error", "code": code, "message": told})
        raise SpecError(told)


def _paced_seconds(spec: TestSpec) -> float:
    """How long a byte-count test at a fixed rate must take, warm-up included (0: not
    paced): -n 128k at -b 8 would hold a slot for days before --max-duration stopped it."""
    if spec.bytes_total is None or not spec.rate_bits_per_second:
        return 0.0
    return spec.bytes_total * 8 / spec.rate_bits_per_second + spec.omit_s


def version() -> str:
    """This server's name and version, as clients and the log are told it."""
    return f"netprobe {__version__}"


def _about() -> dict[str, str]:
    """What a client is told about this host (once it may know)."""
    return {"server": version(), "system": system_name()}
