"""The one redaction of secrets in URLs and connection strings, for everything netprobe
prints, logs, saves in a result or a page, or puts in an error message.

A password is replaced by ``***`` wherever it stands: in a URL's user information
(``postgresql://user:PASSWORD@host/db``), as a libpq key/value (``password=PASSWORD``,
quoted or not) and as a query parameter (``?password=PASSWORD&...``). The text around it,
the user, host and database included, is kept, since that is what a reader needs to tell
which archive a message means. Imports nothing.
"""
from __future__ import annotations

import re
from urllib.parse import unquote

MASK = "***"

# scheme://user:PASSWORD@ : the user information ends at the last "@" before the host;
# the password holds no whitespace, "@" or "/" (libpq ends the user information there).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@?#]*:)([^\s@/]*)(@)")
# password=VALUE in a libpq key/value string or a query: quoted ('...', with \' inside)
# or up to the next space, "&", ";" or quote.
_KEYWORD = re.compile(r"(?i)\b(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&;'\"]*)")


def redact(text: str, url: str | None = None) -> str:
    """``text`` with every password in it replaced by ``***``; with ``url``, also any
    other spelling of that URL's password (a driver's message may quote it alone)."""
    cleaned = _KEYWORD.sub(lambda m: m.group(1) + MASK, _USERINFO.sub(r"\1" + MASK + r"\3",
                                                                       text))
    for secret in _passwords(url) if url else ():
        cleaned = cleaned.replace(secret, MASK)
    return cleaned


def _passwords(url: str) -> set[str]:
    """The passwords ``url`` holds, as written and decoded (at least 3 characters: a
    shorter one would mask unrelated text and is no secret anyway)."""
    found = [m.group(2) for m in _USERINFO.finditer(url)]
    found += [m.group(2).strip("'") for m in _KEYWORD.finditer(url)]
    return {form for secret in found for form in (secret, unquote(secret)) if len(form) >= 3}


__all__ = ["MASK", "redact"]
