"""iperf3's control-connection framing: the 37-byte cookie, one-byte states, the error
frame, length-prefixed JSON, and the params a client sends read as a stock server reads
them (presence means on, case-insensitive keys, omitted keys reset to defaults)."""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import struct
from typing import Any

import attrs

from netprobe.errors import NetprobeError

COOKIE_BYTES = 37
COOKIE_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"
"""The 32 characters a stock client draws its cookie's 36 from."""
MAX_PARAMS_BYTES = 8192
"""The longest params object a stock server (3.18+) reads."""
MAX_RESULTS_BYTES = 1 << 20
"""The longest results object read from a client (iperf3 sets none; a bound is ours)."""

# State bytes (signed on the wire).
TEST_START = 1
TEST_RUNNING = 2
TEST_END = 4
PARAM_EXCHANGE = 9
CREATE_STREAMS = 10
SERVER_TERMINATE = 11
CLIENT_TERMINATE = 12
EXCHANGE_RESULTS = 13
DISPLAY_RESULTS = 14
IPERF_DONE = 16
ACCESS_DENIED = -1
SERVER_ERROR = -2

# iperf3's numeric error codes a stock client prints as a message.
IEDURATION = 5
IENUMSTREAMS = 6
IEBLOCKSIZE = 7
IEBUFSIZE = 8
IEOMIT = 12
IEUDPBLOCKSIZE = 20
IEBADTOS = 21
IETOTALRATE = 27
IEMAXSERVERTESTDURATIONEXCEEDED = 37
IERECVPARAMS = 114
IEAUTHTEST = 142
IENOMSG = 144
IESERVERTESTDURATIONEXPIRED = 160

ERROR_WORDS = {
    IEDURATION: "test duration out of the server's range",
    IENUMSTREAMS: "number of streams out of the server's range",
    IEBLOCKSIZE: "block size (-l) out of the server's range",
    IEBUFSIZE: "socket buffer size (-w) out of the server's range",
    IEOMIT: "omit time (-O) out of the server's range",
    15: "burst size out of the server's range",
    IEUDPBLOCKSIZE: "UDP datagram length (-l) out of the server's range",
    IETOTALRATE: "total rate over the server's bitrate limit",
    IEMAXSERVERTESTDURATIONEXCEEDED: "test longer than the server's maximum duration",
    IERECVPARAMS: "the server could not read the test's parameters",
    IEAUTHTEST: "test authorization failed",
    IENOMSG: "the server received no data for too long",
    IESERVERTESTDURATIONEXPIRED: "the server's test duration expired",
}
"""What the iperf3 error codes a server relays mean (others are shown by number)."""

DEFAULT_TCP_LEN = 131072
UDP_HELLO = b"9876"
"""What a 3.12+ client sends on each UDP stream (a stock server takes any 4 bytes)."""
UDP_HELLO_REPLY = b"6789"


class WireError(NetprobeError):
    """The peer broke iperf3's protocol (or went away)."""


def recv_exact(sock: socket.socket, count: int) -> bytes:
    """``count`` bytes from ``sock`` (its timeout applies to each read); WireError on EOF."""
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise WireError(f"connection closed after {len(data)} of {count} bytes")
        data += chunk
    return bytes(data)


def send_state(sock: socket.socket, state: int) -> None:
    """One state byte."""
    sock.sendall(struct.pack("b", state))


def read_state(sock: socket.socket) -> int:
    """One state byte, signed."""
    return int(struct.unpack("b", recv_exact(sock, 1))[0])


def error_frame(code: int, os_errno: int = 0) -> bytes:
    """SERVER_ERROR, then iperf3's error code and errno (int32 big-endian each)."""
    return struct.pack(">bii", SERVER_ERROR, code, os_errno)


def make_cookie() -> bytes:
    """A new test's cookie: 36 random characters of :data:`COOKIE_ALPHABET`, then a NUL."""
    chars = "".join(secrets.choice(COOKIE_ALPHABET) for _ in range(COOKIE_BYTES - 1))
    return chars.encode() + b"\0"


def read_error(sock: socket.socket) -> tuple[int, int]:
    """The iperf3 error code and errno that follow a SERVER_ERROR state byte. A stock
    server refusing a token (3.9 to 3.20) sends the code alone and closes: the errno is
    then 0, as a stock client reads it."""
    (code,) = struct.unpack(">i", recv_exact(sock, 4))
    try:
        (os_errno,) = struct.unpack(">i", recv_exact(sock, 4))
    except (OSError, WireError):
        os_errno = 0
    return int(code), int(os_errno)


def error_words(code: int) -> str:
    """A relayed iperf3 error code in words (unknown ones by number)."""
    return ERROR_WORDS.get(code, f"iperf3 error {code}")


def send_json(sock: socket.socket, value: dict) -> None:
    """A JSON object behind its 4-byte big-endian length."""
    body = json.dumps(value, separators=(",", ":")).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)


def read_json(sock: socket.socket, limit: int) -> dict:
    """A length-prefixed JSON object of at most ``limit`` bytes (WireError otherwise)."""
    (length,) = struct.unpack(">I", recv_exact(sock, 4))
    if not 0 < length <= limit:
        raise WireError(f"a JSON message of {length} bytes (1 to {limit} accepted)")
    try:
        value = json.loads(recv_exact(sock, length).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        # Foreign text: nesting deeper than the parser recurses is bad JSON like any other.
        raise WireError(f"bad JSON: {str(exc)[:200]}") from None
    if not isinstance(value, dict):
        raise WireError("the JSON message is not an object")
    return value


@attrs.frozen
class Params:
    """A test's parameters as a stock iperf3 server reads them."""

    udp: bool = False
    reverse: bool = False
    bidirectional: bool = False
    time: int = 10
    omit: int = 0
    parallel: int = 1
    length: int = DEFAULT_TCP_LEN
    window: int = 0
    bandwidth: int = 0
    mss: int = 0
    nodelay: bool = False
    num: int = 0
    blockcount: int = 0
    udp_counters_64bit: bool = False
    get_server_output: bool = False
    tos: int = 0
    """IP_TOS / IPv6 traffic class of this end's data sockets (-S); 0 leaves the default."""
    congestion: str | None = None
    """TCP congestion control asked for (-C); one that cannot be set only warns, as in
    iperf3."""

    @property
    def directions(self) -> tuple[str, ...]:
        """The flow directions, as netprobe names them."""
        if self.bidirectional:
            return ("client_to_server", "server_to_client")
        return ("server_to_client",) if self.reverse else ("client_to_server",)


def _lookup(params: dict, key: str) -> Any | None:
    # cJSON looks keys up case-insensitively and takes the first match.
    for name, value in params.items():
        if name.lower() == key.lower():
            return value
    return None


def _number(params: dict, key: str, default: int) -> int:
    value = _lookup(params, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default  # absent or the wrong type: ignored, as 3.18+ does
    if value != value or abs(value) > 2**62:
        return default
    return int(value)


def parse_params(params: dict) -> Params:
    """The params object read as a stock server reads it: booleans by presence (so
    ``"reverse": false`` is reverse ON), number flags by presence, the rest by type."""
    present = {name.lower() for name in params}
    udp = "udp" in present
    return Params(
        udp=udp, reverse="reverse" in present, bidirectional="bidirectional" in present,
        time=_number(params, "time", 10), omit=_number(params, "omit", 0),
        parallel=_number(params, "parallel", 1),
        length=_number(params, "len", 0 if udp else DEFAULT_TCP_LEN),
        window=_number(params, "window", 0), bandwidth=_number(params, "bandwidth", 0),
        mss=_number(params, "MSS", 0), nodelay="nodelay" in present,
        num=_number(params, "num", 0), blockcount=_number(params, "blockcount", 0),
        udp_counters_64bit="udp_counters_64bit" in present,
        get_server_output="get_server_output" in present,
        tos=_number(params, "TOS", 0), congestion=_algorithm(_lookup(params, "congestion")))


def _algorithm(value: Any) -> str | None:
    # A name the kernel could know (as /proc/sys/net/ipv4/tcp_available_congestion_control
    # lists them): short, printable, no spaces; anything else is not passed on to it.
    if isinstance(value, str) and 0 < len(value) < 16 and value.isascii() and \
            value.replace("_", "").replace("-", "").isalnum():
        return value
    return None


def check_params(p: Params) -> tuple[int, str] | None:
    """iperf3's own range checks: (code, reason) for the first one broken, else None."""
    if not 0 <= p.time <= 86400:
        return IEDURATION, f"duration {p.time} s out of range"
    if not 0 <= p.omit <= 600:
        return IEOMIT, f"omit {p.omit} s out of range"
    if not 1 <= p.parallel <= 128:
        return IENUMSTREAMS, f"{p.parallel} streams out of range"
    if p.udp and not 16 <= p.length <= 65507:
        return IEUDPBLOCKSIZE, f"UDP length {p.length} out of range"
    if not p.udp and not 1 <= p.length <= 1 << 20:
        return IEBLOCKSIZE, f"block size {p.length} out of range"
    if not 0 <= p.window <= 512 << 20:
        return IEBUFSIZE, f"window {p.window} out of range"
    if not 0 <= p.tos <= 255:
        return IEBADTOS, f"TOS {p.tos} out of range"
    return None


def stream_row(stream_id: int, count: int, retransmits: int, seconds: float, *,
               jitter_s: float = 0.0, errors: int = 0, packets: int = 0) -> dict:
    """One stream's row of the results each end sends in EXCHANGE_RESULTS."""
    return {"id": stream_id, "bytes": int(count), "retransmits": retransmits,
            "jitter": jitter_s, "errors": errors, "packets": packets,
            "omitted_errors": 0, "omitted_packets": 0, "start_time": 0, "end_time": seconds}


def results_message(cpu_total: float, cpu_user: float, cpu_system: float,
                    has_retransmits: int, rows: list[dict]) -> dict:
    """The results object each end sends in EXCHANGE_RESULTS (CPU in percent;
    ``has_retransmits`` 1, 0 or -1 as iperf3 puts it)."""
    return {"cpu_util_total": cpu_total, "cpu_util_user": cpu_user,
            "cpu_util_system": cpu_system, "sender_has_retransmits": has_retransmits,
            "streams": rows}


def results_ok(results: dict) -> bool:
    """Whether a client's results object has what a stock server requires of it."""
    needed = ("cpu_util_total", "cpu_util_user", "cpu_util_system", "sender_has_retransmits")
    return all(key in results for key in needed) and isinstance(results.get("streams"), list)


def sync_close(sock: socket.socket) -> None:
    """Close a control connection as iperf3 3.21 does: shut our side down, read to the
    peer's end (bounded: 16 reads, 1 s each), then close, so that the last state byte
    sent is not lost to a reset."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(1.0)
        for _ in range(16):
            if not sock.recv(65536):
                break
    with contextlib.suppress(OSError):
        sock.close()
