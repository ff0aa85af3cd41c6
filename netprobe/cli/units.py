"""Numbers with unit suffixes, as users of iperf3 and nuttcp type them, and back.

Two conventions, on purpose different (they are what iperf3 does, and what people expect):

* Byte quantities (``--bytes``, ``--length``, ``--window``, ``--mss``) take ``k``, ``m``,
  ``g``, ``t`` suffixes in powers of **1024**: ``64k`` is 65,536 bytes.
* Rates (``--bitrate``) are bits per second with **SI** suffixes: ``100M`` is
  100,000,000 bit/s.

Reading them is :mod:`netprobe.units`' (re-exported here); this module shows them. Nothing
here imports rich, so the module stays cheap to load.
"""
from __future__ import annotations

from netprobe.units import POWERS, PREFIX_LETTERS


def format_bytes(value: float | None) -> str:
    """A byte count for people, 1024-based like iperf3: ``1.10 GBytes``; ``-`` when unknown."""
    if value is None:
        return "-"
    for letter in PREFIX_LETTERS[:-1]:
        if abs(value) < 1023.995:  # stays below "1024.00" once rounded
            return f"{value:.2f} {letter}Bytes" if letter else f"{value:.0f} Bytes"
        value /= 1024
    return f"{value:.2f} {PREFIX_LETTERS[-1]}Bytes"


def format_length(value: int | None) -> str:
    """A call length as ``-l`` takes it: ``128K``, ``1M``, else ``1000 B``; ``-`` when
    unknown."""
    if value is None:
        return "-"
    for size, letter in ((1024 * 1024, "M"), (1024, "K")):
        if value >= size and value % size == 0:
            return f"{value // size}{letter}"
    return f"{value} B"


def format_rate(bits_per_second: float | None) -> str:
    """A rate for people, SI like iperf3: ``941 Mbit/s``, ``9.42 Gbit/s``; ``-`` when unknown."""
    if bits_per_second is None:
        return "-"
    value = bits_per_second
    for letter in PREFIX_LETTERS[:-1]:
        if abs(value) < 999.5:  # 999.7 would round to "1000": show 1.00 of the next unit
            return f"{_three_figures(value)} {letter}bit/s"
        value /= 1000
    return f"{_three_figures(value)} {PREFIX_LETTERS[-1]}bit/s"


def _three_figures(value: float) -> str:
    # Three significant figures, as iperf3 shows: 9.42, 94.2, 942.
    if abs(value) >= 99.95:
        return f"{value:.0f}"
    if abs(value) >= 9.995:
        return f"{value:.1f}"
    return f"{value:.2f}"


def format_percent(value: float | None) -> str:
    """A percentage with one decimal; ``-`` when unknown."""
    return "-" if value is None else f"{value:.1f}%"


def format_ms_from_us(value_us: float | None) -> str:
    """Microseconds shown as milliseconds (RTT): ``0.052 ms``; ``-`` when unknown."""
    if value_us is None:
        return "-"
    ms = value_us / 1000
    return f"{ms:.3f} ms" if ms < 10 else f"{ms:.1f} ms"


UNIT_LETTERS = "kmgtKMGT"
"""``-f`` letters as iperf3 takes them: k m g t for bit/s, K M G T for Byte/s."""


class Units:
    """How rates and byte counts are shown: adaptive (the default), or fixed by iperf3's
    ``-f`` letter (``m``: rates in Mbit/s and counts in MBytes; ``M``: rates in MByte/s)."""

    def __init__(self, letter: str | None = None) -> None:
        if letter is not None and (len(letter) != 1 or letter not in UNIT_LETTERS):
            raise ValueError(f"-f takes one of {', '.join(UNIT_LETTERS)}, not {letter!r}")
        self.letter = letter

    def rate(self, bits_per_second: float | None) -> str:
        """A rate in the chosen unit."""
        if self.letter is None or bits_per_second is None:
            return format_rate(bits_per_second)
        power = POWERS[self.letter.lower()]
        if self.letter.isupper():
            return f"{_three_figures(bits_per_second / 8 / 1024**power)} " \
                   f"{self.letter}Byte/s"
        return f"{_three_figures(bits_per_second / 1000**power)} {self.letter.upper()}bit/s"

    def bytes(self, value: float | None) -> str:
        """A byte count in the chosen unit's prefix (1024-based)."""
        if self.letter is None or value is None:
            return format_bytes(value)
        power = POWERS[self.letter.lower()]
        return f"{value / 1024**power:.2f} {self.letter.upper()}Bytes"
