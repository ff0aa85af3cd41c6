"""What a netprobe server is configured with (:class:`ServerConfig`) and the check that it
can run with it: apart from the server, so that the handler contract, admission and the
command line read it without importing the server itself."""

from __future__ import annotations

import math

import attrs

from netprobe.engine import protocol
from netprobe.errors import SpecError


@attrs.define
class ServerConfig:
    """How the server listens and what it allows."""

    bind_address: str | None = None
    """Address to listen on; None for every IPv4 and IPv6 address."""
    port: int = protocol.DEFAULT_PORT
    """TCP and UDP port (0 picks a free one)."""
    max_tests: int = 2
    """Tests that may run at once; more get a clear 'busy'."""
    one_off: bool = False
    """Serve one test, then exit."""
    handshake_timeout_s: float = 10.0
    """Time a new connection has to say hello and a test has to open its streams."""
    idle_timeout_s: float = 30.0
    """Time a control connection may stay silent before its test is requested."""
    max_duration_s: float = 3600.0
    """Longest test accepted."""
    max_streams: int = 128
    """Most parallel streams (per direction) of one test, and of all running tests
    together: a test that does not fit beside the others is told the server is busy."""
    max_pending: int = 256
    """Connections allowed to be in their handshake at once."""
    max_rate_bps: float | None = None
    """Highest total rate (bits/s) of one test, every stream and direction together, and
    of all running tests together (a test that alone asks more is refused; one that does
    not fit beside the others is told the server is busy). With it set, unlimited tests
    are refused: the limit binds before the bytes leave."""
    max_stream_rate_bps: float | None = None
    """Highest rate of one stream (bits/s), only when asked for; with it set, unlimited
    tests are refused."""
    max_message_bytes: int = protocol.MAX_MESSAGE_BYTES
    """Largest control message read from a client."""
    max_connections_per_address: int = 32
    """Control connections and handshakes open at once from one client address."""
    allow: tuple = ()
    """Client networks (CIDR strings) allowed to connect; empty allows every address."""
    allow_third_party: bool = False
    """Run tests this agent is asked to send to another host (off: an agent that sends
    traffic wherever it is told would be a traffic amplifier)."""
    max_memory_bytes: int | None = None
    """Buffer memory all running tests may take together (a test that alone needs more is
    refused, one that does not fit beside the others is told the server is busy); None:
    a quarter of this host's memory."""
    allow_other_data_addresses: bool = False
    """Take a test's data connections and UDP streams (and probe sessions) from addresses
    other than its control connection's (off: a client could otherwise point a reverse
    test at a third host). UDP still needs the return-routability proof."""
    secret: bytes | None = attrs.field(default=None, repr=False)
    """Shared secret clients must prove they know (HMAC challenge); None: no authentication."""


# Timeouts a server can keep (poll() takes milliseconds in a C int; a day is plenty).
CONFIG_SECONDS_MAX = 86_400.0


def check_config(config: ServerConfig) -> None:
    """Refuse (SpecError, naming the option) values a server cannot run with."""
    for name, flag in (("handshake_timeout_s", "--handshake-timeout"),
                       ("idle_timeout_s", "--idle-timeout")):
        value = getattr(config, name)
        if not (math.isfinite(value) and 0 < value <= CONFIG_SECONDS_MAX):
            raise SpecError(f"{flag} must be more than 0 and at most {CONFIG_SECONDS_MAX:g} "
                            f"seconds, got {value:g}")
    if not (math.isfinite(config.max_duration_s) and config.max_duration_s > 0):
        raise SpecError(f"--max-duration must be a finite number of seconds, "
                        f"got {config.max_duration_s:g}")
    for rate, flag in ((config.max_rate_bps, "--max-rate"),
                       (config.max_stream_rate_bps, "--max-stream-rate")):
        if rate is not None and not (math.isfinite(rate) and rate > 0):
            raise SpecError(f"{flag} must be a finite rate, got {rate:g}")


