"""Shared-secret authentication for the control connection: HMAC-SHA256 challenge and
response, in both directions, so neither side ever sends the secret and each proves it
knows it (a client cannot be fooled by a server that does not).

The secret is read from a file or the ``NETPROBE_SECRET`` environment variable, never
from the command line, where other users of the host could read it in the process list.
"""
from __future__ import annotations

import os

from netprobe.errors import SpecError
from netprobe.limits import SECRET_MAX_BYTES, InputTooLarge, read_regular_file

SECRET_ENV = "NETPROBE_SECRET"
"""Environment variable that may hold the shared secret."""
METHOD = "hmac-sha256"
CHALLENGE_BYTES = 32

# hashlib, hmac and secrets are imported where a secret is in use: they load OpenSSL's
# libcrypto (~5 ms of start-up), which a test without a secret never touches.


def read_credential(path: str, what: str) -> bytes:
    """The one line held in ``path`` (a secret, a token, a password): SpecError naming
    ``what`` when it cannot be read, is empty, or is longer than a line may be."""
    try:
        value = read_regular_file(path, SECRET_MAX_BYTES).rstrip(b"\r\n")
    except OSError as exc:
        raise SpecError(f"cannot read the {what} file {path}: {exc.strerror}") from None
    except InputTooLarge:
        raise SpecError(f"the {what} file {path} is longer than {SECRET_MAX_BYTES} bytes: "
                        "it holds one line") from None
    if not value:
        raise SpecError(f"the {what} file {path} is empty")
    return value


def load_secret(path: str | None = None) -> bytes | None:
    """The shared secret from ``path`` (trailing newline dropped) or ``$NETPROBE_SECRET``."""
    if path:
        return read_credential(path, "secret")
    value = os.environ.get(SECRET_ENV)
    return value.encode() if value else None


def new_challenge() -> str:
    """A fresh random challenge, hex-encoded for the JSON control messages."""
    import secrets

    return secrets.token_hex(CHALLENGE_BYTES)


def respond(secret: bytes, challenge: str, role: str) -> str:
    """The proof that ``role`` (client or server) knows the secret, for this challenge.

    The role is mixed in so that one side's answer can never be replayed as the other's.
    """
    import hashlib
    import hmac

    return hmac.new(secret, f"{role}:{challenge}".encode(), hashlib.sha256).hexdigest()


def verify(secret: bytes, challenge: str, role: str, response: object) -> bool:
    """Check a response in constant time (anything that is not a string fails)."""
    import hmac

    if not isinstance(response, str):
        return False
    return hmac.compare_digest(respond(secret, challenge, role).encode(), response.encode())
