"""iperf3's RSA authentication (``--rsa-private-key-path``, ``--authorized-users-path``,
``--username``, ``--rsa-public-key-path``), both ends.

The client puts ``authtoken`` in its params: base64 (one line) of the RSA encryption, with
the server's public key, of ``"user: U\\npwd:  P\\nts:   T"`` (T the client's Unix time).
The padding is OAEP (SHA-1) from iperf3 3.17 on and PKCS#1 v1.5 before it, or with
``--use-pkcs1-padding``: both ends must use the same. The server takes the token when U
and the hex SHA-256 of ``"{U}P"`` are a ``user,hash`` line of its authorized-users file
and T is within the time-skew threshold of its own clock.

This module needs the ``cryptography`` package (``pip install netprobe-meter[iperf3-auth]``)
and is imported only where authentication is configured, so a server without it neither
needs nor loads the package. Nothing here logs or returns a password or a token.
"""

from __future__ import annotations

import base64
import binascii
import collections
import hashlib
import hmac
import re
import threading
import time

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from netprobe.errors import NetprobeError

DEFAULT_SKEW_S = 10
"""iperf3's default ``--time-skew-threshold``: a token's time at most this far from the
server's clock, either way."""
MAX_KEY_FILE_BYTES = 1 << 20
MAX_USERS_FILE_BYTES = 16 << 20
MAX_FIELD_CHARS = 256  # a user name or password longer than this is refused
MAX_REPLAYS_KEPT = 65536
"""Tokens remembered to refuse a second use within the skew window: a stock client makes
a new one for every test (RSA padding is random), so only a replay repeats one."""
PASSWORD_ENV = "IPERF3_PASSWORD"
"""Where a stock iperf3 client (and netprobe's) takes the password from."""

# The token's text as a stock server reads it (C's sscanf: "%s" stops at whitespace, a
# space in the format matches any run of whitespace, text past the number is ignored).
_TOKEN_TEXT = re.compile(rb"user:\s*(\S+)\s*pwd:\s*(\S+)\s*ts:\s*([+-]?\d{1,19})")


class AuthError(NetprobeError):
    """A key or users file that cannot be used, or credentials a token cannot carry."""


def _padding(pkcs1: bool) -> padding.AsymmetricPadding:
    # OAEP as OpenSSL's RSA_PKCS1_OAEP_PADDING: SHA-1 for the digest and MGF1, no label.
    if pkcs1:
        return padding.PKCS1v15()
    return padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA1()), algorithm=hashes.SHA1(),
                        label=None)


def _read(path: str, what: str, most: int) -> bytes:
    try:
        with open(path, "rb") as handle:
            data = handle.read(most + 1)
    except OSError as exc:
        raise AuthError(f"cannot read the {what} {path!r}: {exc.strerror or exc}") from None
    if len(data) > most:
        raise AuthError(f"the {what} {path!r} is over {most} bytes")
    return data


def load_private_key(path: str) -> rsa.RSAPrivateKey:
    """The server's RSA private key from a PEM file without a passphrase (PKCS#1 or
    PKCS#8, as iperf3 reads it); AuthError in one line otherwise."""
    data = _read(path, "RSA private key file", MAX_KEY_FILE_BYTES)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise AuthError(f"the RSA private key in {path!r} has a passphrase: iperf3 keys "
                        "have none (openssl rsa -in KEY -out PLAIN)") from None
    except (ValueError, UnsupportedAlgorithm):
        raise AuthError(f"{path!r} holds no PEM private key") from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise AuthError(f"the key in {path!r} is not an RSA key")
    return key


def load_public_key(path: str) -> rsa.RSAPublicKey:
    """The server's RSA public key from a PEM file (``BEGIN PUBLIC KEY``, as ``openssl
    rsa -pubout`` writes it); AuthError in one line otherwise."""
    data = _read(path, "RSA public key file", MAX_KEY_FILE_BYTES)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise AuthError(f"{path!r} holds no PEM public key") from None
    if not isinstance(key, rsa.RSAPublicKey):
        raise AuthError(f"the key in {path!r} is not an RSA key")
    return key


def password_hash(username: str, password: str) -> str:
    """The authorized-users file's hash of a password: hex SHA-256 of ``{user}password``."""
    return hashlib.sha256(f"{{{username}}}{password}".encode()).hexdigest()


def read_users(path: str) -> dict[str, str]:
    """``user -> hash`` from an authorized-users file, read as iperf3 reads it: a line is
    cut at its first CR or LF; empty lines, lines without a comma and lines starting with
    ``#`` are skipped; empty fields between commas do not count. AuthError if unreadable."""
    users: dict[str, str] = {}
    text = _read(path, "authorized users file", MAX_USERS_FILE_BYTES)
    for line in text.split(b"\n"):
        line = line.split(b"\r", 1)[0]
        if not line or b"," not in line or line.startswith(b"#"):
            continue
        fields = [f for f in line.split(b",") if f]
        if len(fields) >= 2:
            users.setdefault(fields[0].decode("utf-8", "replace"),
                             fields[1].decode("ascii", "replace").lower())
    return users


def _check_field(name: str, value: str) -> None:
    if not value or len(value) > MAX_FIELD_CHARS or any(c.isspace() for c in value):
        raise AuthError(f"the {name} must be 1 to {MAX_FIELD_CHARS} characters without "
                        "spaces: iperf3's token cannot carry it otherwise")


def make_token(username: str, password: str, key: rsa.RSAPublicKey, pkcs1: bool,
               now: float | None = None) -> str:
    """An ``authtoken`` for ``username`` and ``password``, stamped ``now`` (default: the
    clock now), as a stock client makes it; AuthError if the text does not fit the key."""
    _check_field("user name", username)
    _check_field("password", password)
    stamp = int(time.time() if now is None else now)
    text = f"user: {username}\npwd:  {password}\nts:   {stamp}".encode()
    try:
        sealed = key.encrypt(text, _padding(pkcs1))
    except ValueError:
        raise AuthError(f"the user name and password are too long for a "
                        f"{key.key_size}-bit key") from None
    return base64.b64encode(sealed).decode("ascii")


class ServerAuth:
    """What a server checks every iperf3 client's token with (one per server)."""

    def __init__(self, key: rsa.RSAPrivateKey, users_path: str, pkcs1: bool = False,
                 skew_s: int = DEFAULT_SKEW_S) -> None:
        self.key = key
        self.users_path = users_path
        self.pkcs1 = pkcs1
        self.skew_s = skew_s
        self._seen: collections.OrderedDict[bytes, float] = collections.OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def load(cls, key_path: str, users_path: str, pkcs1: bool = False,
             skew_s: int = DEFAULT_SKEW_S) -> ServerAuth:
        """From the files' paths, both read now (AuthError in one line if either cannot
        be used); the users file is read again at every test, so edits apply at once."""
        if skew_s <= 0:
            raise AuthError("the time skew threshold must be a whole number of seconds "
                            "over 0")
        read_users(users_path)
        key = load_private_key(key_path)
        # One round trip now: whatever the library loads on first use is loaded before
        # the server listens (at the open-files limit a late load would fail mid-test).
        probe = b"netprobe"
        if key.decrypt(key.public_key().encrypt(probe, _padding(pkcs1)),
                       _padding(pkcs1)) != probe:
            raise AuthError(f"the RSA key in {key_path!r} does not decrypt what it encrypts")
        return cls(key, users_path, pkcs1, skew_s)

    def check(self, token: object, now: float | None = None) -> str | None:
        """None if ``token`` (the params' ``authtoken``, foreign data) authorises a test;
        else why not, in words that hold no secret."""
        if not isinstance(token, str):
            return "the authtoken is not a string"
        size = self.key.key_size // 8 + (1 if self.key.key_size % 8 else 0)
        if len(token) > 4 * (size // 3 + 1):  # base64 of one RSA block, at most
            return f"an authtoken of {len(token)} characters (too long for the key)"
        try:
            sealed = base64.b64decode(token.encode("ascii"), validate=True)
        except (UnicodeEncodeError, binascii.Error, ValueError):
            return "the authtoken is not base64"
        if len(sealed) != size:
            return f"an authtoken of {len(sealed)} bytes where the key's {size} are due"
        try:
            text = self.key.decrypt(sealed, _padding(self.pkcs1))
        except ValueError:
            return self._undecryptable()
        found = _TOKEN_TEXT.match(text)
        if found is None:
            # PKCS#1 v1.5 decryption rejects implicitly where OpenSSL guards against the
            # Marvin attack (3.2 on): a token in OAEP, or for another key, comes out as
            # random text, not as an error. An OAEP try tells the padding apart.
            if self.pkcs1 and self._decrypts_as_oaep(sealed):
                return self._undecryptable()
            return "the authtoken's text is not iperf3's user, password and time"
        return self._verdict(sealed, found, time.time() if now is None else now)

    def _decrypts_as_oaep(self, sealed: bytes) -> bool:
        try:
            self.key.decrypt(sealed, _padding(False))
        except ValueError:
            return False
        return True

    def _undecryptable(self) -> str:
        return ("the authtoken does not decrypt with this key and padding (the client "
                f"uses {'OAEP' if self.pkcs1 else 'PKCS#1 v1.5'}? iperf3 clients send "
                "OAEP from 3.17 on, PKCS#1 v1.5 before; a server takes one of them, "
                "--use-pkcs1-padding: the old)")

    def _verdict(self, sealed: bytes, found: re.Match[bytes], now: float) -> str | None:
        username = found.group(1).decode("utf-8", "replace")
        password = found.group(2).decode("utf-8", "replace")
        who = f"user {_shown(username)}"
        skew = int(now) - int(found.group(3))
        if abs(skew) > self.skew_s:
            return (f"{who}: the token's time is {abs(skew)} s "
                    f"{'old' if skew > 0 else 'ahead'} (over the {self.skew_s} s allowed)")
        try:
            users = read_users(self.users_path)
        except AuthError as exc:
            return f"{who}: {exc}"
        known = users.get(username)
        if known is None:
            return f"{who}: not in the authorized users file"
        if not hmac.compare_digest(known, password_hash(username, password)):
            return f"{who}: wrong password"
        if not self._first_use(sealed, now):
            return f"{who}: the token was used before (a replay)"
        return None

    def _first_use(self, sealed: bytes, now: float) -> bool:
        """Whether this token is new; it is remembered for the window a replay could use."""
        digest = hashlib.sha256(sealed).digest()
        with self._lock:
            while self._seen:
                oldest, at = next(iter(self._seen.items()))
                if at > now - 2 * self.skew_s and len(self._seen) < MAX_REPLAYS_KEPT:
                    break
                del self._seen[oldest]
            if digest in self._seen:
                return False
            self._seen[digest] = now
        return True


def _shown(name: str) -> str:
    """A client's user name for the log: printable ASCII, at most 64 characters."""
    safe = "".join(c if 32 < ord(c) < 127 else "?" for c in name[:64])
    return repr(safe)



class ClientAuth:
    """A client's credentials for a stock server: a fresh token for every test."""

    def __init__(self, username: str, password: str, key: rsa.RSAPublicKey,
                 pkcs1: bool = False) -> None:
        self.username = username
        self._password = password
        self.key = key
        self.pkcs1 = pkcs1

    @classmethod
    def load(cls, username: str, password: str, key_path: str,
             pkcs1: bool = False) -> ClientAuth:
        """From the server's public key file; AuthError (one line) if the key cannot be
        used or the user name and password cannot go in a token with it."""
        made = cls(username, password, load_public_key(key_path), pkcs1)
        made.token()  # a name or password the token cannot carry is refused now
        return made

    def token(self) -> str:
        """The params' ``authtoken``, stamped now (the server allows a few seconds)."""
        return make_token(self.username, self._password, self.key, self.pkcs1)

    def __repr__(self) -> str:  # never the password
        return f"ClientAuth(username={self.username!r}, pkcs1={self.pkcs1})"
