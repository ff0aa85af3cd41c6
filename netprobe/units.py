"""Numbers with unit suffixes, as users of iperf3 and nuttcp type them: the one place that
reads them (the CLI, the fleet file and the exporter's configuration all do).

Two conventions, on purpose different (they are what iperf3 does, and what people expect):

* Byte quantities (``--bytes``, ``--length``, ``--window``, ``--mss``) take ``k``, ``m``,
  ``g``, ``t`` suffixes in powers of **1024**: ``64k`` is 65,536 bytes.
* Rates (``--bitrate``) are bits per second with **SI** suffixes: ``100M`` is
  100,000,000 bit/s.

Suffixes are case-insensitive; a trailing ``B``/``iB`` (bytes) or ``bit``/``bps``/``b``
(rates) is accepted and ignored. Every parser raises ValueError with a message fit to
show the user. Imports nothing of netprobe's: any layer may use it.

:data:`POWERS` is the one table of prefixes: the readers of every tool's output
(:func:`binary_factor`, :func:`si_factor`) and the CLI's formatting use it, so no prefix
can mean one thing to one parser and another to the next (a copy once read iperf3's
``512 Bytes`` as 512 KiB).
"""
from __future__ import annotations

import math
import re

_NUMBER = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)\s*([a-z/]*)\s*$", re.IGNORECASE)
POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}
"""Each unit prefix (lower case; no prefix is ``""``) and its power of 1000 or 1024."""
PREFIX_LETTERS = tuple(prefix.upper() for prefix in POWERS)
"""The prefixes as the tools print them, smallest first: ``""``, ``K``, ``M``, ``G``, ``T``."""
_BYTE_TAILS = ("", "b", "ib")
_RATE_TAILS = ("", "b", "bit", "bits", "bps", "bit/s", "b/s")

DSCP_NAMES = {
    "df": 0, "be": 0, "le": 1, "ef": 46, "va": 44,
    **{f"cs{n}": 8 * n for n in range(8)},
    **{f"af{c}{d}": 8 * c + 2 * d for c in range(1, 5) for d in range(1, 4)},
}
"""DSCP names (RFC 2474, 2597, 3246, 5865, 8622) and their code points."""


def binary_factor(prefix: str) -> int:
    """What a byte prefix multiplies by, 1024-based as iperf, nuttcp and ntttcp print
    bytes: ``""`` 1, ``K`` 1024, ``M`` 2**20 (either case). KeyError for any other."""
    return 1024 ** POWERS[prefix.lower()]


def si_factor(prefix: str) -> int:
    """What a rate prefix multiplies by, SI as the tools print bits per second:
    ``""`` 1, ``K`` 1000, ``M`` 10**6 (either case). KeyError for any other."""
    return 1000 ** POWERS[prefix.lower()]


KIB = binary_factor("k")
"""1024 bytes: the KB/KByte of iperf, nuttcp and Windows NTttcp."""
MIB = binary_factor("m")
"""2**20 bytes: nuttcp's MB (and NTttcp's, and NTTTCP for Linux 1.4.0's result files)."""


def _split(text: str, tails: tuple[str, ...], what: str) -> tuple[float, int]:
    match = _NUMBER.match(text)
    if not match or match.group(3).lower() not in tails:
        raise ValueError(f"not a {what}: {text!r}")
    return float(match.group(1)), POWERS[match.group(2).lower()]


def parse_bytes(text: str) -> int:
    """Parse a byte count: ``65536``, ``64k``, ``1.5M``, ``2G`` (suffixes are 1024-based)."""
    value, power = _split(text, _BYTE_TAILS, "byte count (e.g. 128k, 1.5M, 2G)")
    return round(value * 1024**power)


def parse_bitrate(text: str) -> float:
    """Parse a rate in bits per second: ``100M``, ``1.5g``, ``64k`` (SI: 1M = 10**6)."""
    value, power = _split(text, _RATE_TAILS, "bit rate (e.g. 100M, 1.5G, 64k)")
    return value * 1000**power


def parse_seconds(text: str) -> float:
    """Parse a duration in seconds (``10``, ``0.5``); an optional trailing ``s`` is allowed."""
    stripped = text.strip().lower()
    stripped = stripped[:-1] if stripped.endswith("s") else stripped
    try:
        value = float(stripped)
    except ValueError:
        raise ValueError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"seconds must be a finite number >= 0, got {text!r}")
    return value


def parse_dscp(text: str) -> int:
    """Parse a DSCP code point: a number 0-63 (decimal or 0x hex) or a name like EF, AF41, CS1."""
    key = text.strip().lower()
    if key in DSCP_NAMES:
        return DSCP_NAMES[key]
    try:
        value = int(key, 16) if key.startswith("0x") else int(key, 10)
    except ValueError:
        raise ValueError(f"not a DSCP value (0-63, or a name like EF, AF41, CS1): {text!r}"
                         ) from None
    if not 0 <= value <= 63:
        raise ValueError(f"DSCP must be 0-63, got {text!r}")
    return value


__all__ = ["DSCP_NAMES", "KIB", "MIB", "POWERS", "PREFIX_LETTERS", "binary_factor", "parse_bitrate",
           "parse_bytes", "parse_dscp", "parse_seconds", "si_factor"]
