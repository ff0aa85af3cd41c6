"""netprobe's exception tree.

Every error netprobe raises on purpose derives from :class:`NetprobeError`. The CLI maps
each family to one exit code (see ``EXIT_CODES`` in netprobe/cli/exitcodes.py and the README).
Errors that end a test carry what was measured before the failure in ``partial`` so that
nothing already measured is lost.
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Any


class NetprobeError(Exception):
    """Base of every error netprobe raises on purpose."""


class SpecError(NetprobeError):
    """The test spec is invalid, or a tool cannot honour one of its options."""


class ToolNotFound(NetprobeError):
    """No installed tool plugin has the requested name."""


class ToolUnavailable(NetprobeError):
    """The tool plugin is installed but cannot run here (binary missing, too old, ...)."""


class TestFailed(NetprobeError):
    """A test started but did not complete; ``partial`` holds what was measured (or None)."""

    __test__ = False  # not a pytest test class

    def __init__(self, message: str, partial: Any = None) -> None:
        super().__init__(message)
        self.partial = partial


class TestInterrupted(TestFailed):
    """The user interrupted the test (Ctrl-C); ``partial`` holds what was measured."""

    __test__ = False


class SecretMissing(TestFailed):
    """The netprobe server or agent at ``host`` requires a shared secret and this side was
    given none. Its own class, so that an agent acting as the client of another can say
    that it is the one without the secret (not tell its user to set the one they set)."""

    __test__ = False

    def __init__(self, host: str, kind: str = "netprobe server") -> None:
        super().__init__(f"the {kind} at {host} requires a shared secret and this side has "
                         "none: give it with --secret-file or $NETPROBE_SECRET")
        self.host = host


class SecretRefused(TestFailed):
    """The netprobe server or agent at ``host`` refused the shared secret this side gave:
    the two hold different ones."""

    __test__ = False

    def __init__(self, host: str, kind: str = "netprobe server") -> None:
        super().__init__(f"authentication failed: the {kind} at {host} refused this side's "
                         "shared secret: the two hold different secrets")
        self.host = host


def refused_secret(message: dict[str, Any]) -> bool:
    """Whether ``message``, the answer to this side's proof of the secret, refuses it."""
    return message.get("type") == "error" and message.get("code") == "auth"


class ProtocolError(NetprobeError):
    """A control-protocol message was malformed, too large, or out of place."""


class ParseError(NetprobeError):
    """A peer tool's output could not be read; names the source and line where known."""

    def __init__(self, message: str, source: str | None = None, line: int | None = None) -> None:
        where = source or "<input>"
        if line is not None:
            where = f"{where}:{line}"
        super().__init__(f"{where}: {message}")
        self.detail = message
        """The message without the location, for re-raising with a better one."""
        self.source = source
        self.line = line


class CoreError(NetprobeError, OSError):
    """A system call in the data path failed: ``syscall`` names it, ``errno`` says why."""

    def __init__(self, syscall: str, errno_: int) -> None:
        super().__init__(errno_, f"{syscall}: {os.strerror(errno_)}")
        self.syscall = syscall


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line: how an error nobody expected is shown to a user."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def unresolved(host: str, reason: object) -> SpecError:
    """What a user reads when ``host`` resolves to nothing: the name and the reason only
    (a gaierror's strerror, never its bare EAI code)."""
    return SpecError(f"cannot resolve host {host!r}: {reason}")


def listen_error(option: str | None, address: str, port: int, exc: OSError) -> Exception:
    """What binding ``address`` failing with ``exc`` says to a user. When the user gave
    the address (``option`` names how, e.g. ``-B/--bind``): SpecError naming the option
    if it is no name this host resolves or no address it has (exit 2). Otherwise an
    OSError naming the address and port (a busy port, no permission)."""
    if option is not None and isinstance(exc, socket.gaierror):
        return SpecError(f"{option} {address}: not an address or a name this host "
                         f"resolves ({exc.strerror})")
    if option is not None and exc.errno == errno.EADDRNOTAVAIL:
        return SpecError(f"{option} {address}: not an address of this host ({exc.strerror})")
    return OSError(exc.errno, f"cannot listen on {address} port {port}: {exc.strerror}")
