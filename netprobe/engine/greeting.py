"""What the client says when the port it reached is not a netprobe server.

After the client's hello a netprobe server answers at once with a framed ``welcome``.
Anything else gets a sentence that names what is there, instead of a decoding error
("frame of 1213486160 bytes exceeds the limit" is "HTTP" read as a length):

* text where the frame length should be: ``it answered like HTTP`` (or SSH, SMTP, ...);
* silence: an iperf3 server reads a 37-byte cookie before it says anything, so it waits
  for the rest of our 8-byte hello. A second connection that sends a cookie, as iperf3's
  own client does, gets iperf3's one-byte reply (``PARAM_EXCHANGE``, or ``ACCESS_DENIED``
  when it is busy) and so names it;
* no answer to the connection itself (a filtered port): ``no answer ... within N s``.
"""
from __future__ import annotations

import contextlib
import socket
import time

from netprobe.engine.protocol import close_quietly, reason

FIRST_ANSWER_S = 2.0
"""How long the client waits for the first byte before it looks for an iperf3 server."""

IPERF3_COOKIE_BYTES = 37  # iperf3's cookie: 36 characters and a NUL
_IPERF3_REPLIES = {b"\x09": "ready", b"\xff": "busy"}  # PARAM_EXCHANGE, ACCESS_DENIED
_TEXT_PROTOCOLS = (("HTTP", "HTTP"), ("SSH-", "SSH"), ("220 ", "SMTP or FTP"),
                   ("+OK", "POP3"), ("* OK", "IMAP"), ("<", "HTML or XML"))


def connect_failure(host: str, port: int, exc: OSError, timeout_s: float) -> str:
    """The message for a connection that could not be made."""
    if isinstance(exc, socket.timeout):
        return (f"no answer from {host}:{port} within {timeout_s:g} s (a firewall that drops "
                "the connection, or a host that is down)")
    return f"cannot connect to netprobe server at {host} port {port}: {reason(exc)}"


def not_netprobe(host: str, port: int, first: bytes) -> str | None:
    """The message when the first bytes of the answer are not a netprobe frame, else None."""
    if not first or first[:1] == b"\x00":  # a frame length under 16 MiB starts with 0
        return None
    if first[:1] in (b"\xff", b"\xfe"):  # iperf3's ACCESS_DENIED and SERVER_ERROR states
        return iperf3_message(host, port, "busy" if first[:1] == b"\xff" else "error")
    text = first.decode("ascii", errors="replace")
    for start, name in _TEXT_PROTOCOLS:
        if text.startswith(start):
            return f"the service at {host}:{port} is not a netprobe server (it answered " \
                   f"like {name})"
    if text.isprintable():
        return f"the service at {host}:{port} is not a netprobe server (it answered " \
               f"{text!r}...)"
    return f"the service at {host}:{port} is not a netprobe server (its answer is no " \
           "netprobe message)"


def peek_first(sock: socket.socket, timeout_s: float) -> bytes | None:
    """The first bytes the server sent (left in the socket), b"" if it closed, or None if it
    said nothing within ``timeout_s``."""
    sock.settimeout(timeout_s)
    try:
        return sock.recv(4, socket.MSG_PEEK)
    except socket.timeout:
        return None
    except OSError:
        return b""  # reset: the channel reports it in its own words


def silent(host: str, port: int, waited_s: float) -> str:
    """The message when the service accepted the connection and never said a word."""
    return (f"the service at {host}:{port} accepted the connection but said nothing within "
            f"{waited_s:g} s: it is not a netprobe server (or one that is stuck)")


def iperf3_there(address: tuple, family: int, timeout_s: float = 3.0) -> str | None:
    """``ready`` or ``busy`` if an iperf3 server answers a cookie at ``address``, else None."""
    # An iperf3 server that lost a client mid-handshake closes its listener and listens
    # anew, refusing or resetting what waited in the old one: that is a moment, not the end.
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            sock.connect(address)
            sock.sendall(b"netprobe-checks-for-an-iperf3-server"[:IPERF3_COOKIE_BYTES - 1]
                         + b"\0")
            return _IPERF3_REPLIES.get(sock.recv(1))
        except (ConnectionRefusedError, ConnectionResetError):
            time.sleep(0.1)
        except OSError:
            return None
        finally:
            with contextlib.suppress(OSError):
                close_quietly(sock)
    return None


def iperf3_message(host: str, port: int, state: str) -> str:
    """The message when an iperf3 server answers where a netprobe server was expected."""
    busy = {"busy": " (busy with another test right now)",
            "error": " (it reported an error)"}.get(state, "")
    return (f"the service at {host}:{port} is an iperf3 server{busy}, not a netprobe server: "
            f"run it with --iperf3 -p {port} (netprobe speaks iperf3's protocol), or "
            f"with --tool iperf3 --no-agent -p {port}")


__all__ = ["FIRST_ANSWER_S", "connect_failure", "iperf3_message", "iperf3_there",
           "not_netprobe", "peek_first", "silent"]
