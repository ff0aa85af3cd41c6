"""Foreign text made safe for the medium that shows it: the one helper per medium.

Foreign text is anything netprobe did not write itself: a far end's replies and refusals,
an agent's status and tool list, saved results and archives (tool names, versions, hosts,
notes, warnings, errors), a driven tool's raw output. It is data, never instructions to
the terminal, to rich, to matplotlib or to a spreadsheet:

* :func:`for_terminal`: control characters (C0 but tab and newline, DEL, C1 such as the
  one-byte CSI) and the bidirectional overrides that reorder what a reader sees are made
  visible as Python escapes (``\\x1b``, ``\\u202e``). rich markup is not parsed at all
  (the consoles of :mod:`netprobe.cli.render` have markup off and pass everything they
  draw through this function).
* :func:`for_csv`: a cell a spreadsheet would run as a formula (it starts with ``=``,
  ``+``, ``-``, ``@``, tab or carriage return) gets a leading ``'``, as OWASP advises.
* matplotlib: :data:`netprobe.cli.htmlparts._RC` turns mathtext and TeX off for every
  chart, so a ``$`` in a name is a dollar sign.

Pure functions with no imports, so that any view can use them.
"""
from __future__ import annotations

from typing import TypeVar

_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_LINE_SEPARATORS = (0x2028, 0x2029)


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_VISIBLE = {code: _escape(code) for code in (*range(0x20), 0x7F, *range(0x80, 0xA0),
                                             *_BIDI, *_LINE_SEPARATORS)
            if code not in (0x09, 0x0A)}
_VISIBLE_ONE_LINE = {**_VISIBLE, 0x09: "\\t", 0x0A: "\\n"}


def for_terminal(text: str, *, one_line: bool = False) -> str:
    """``text`` with every character that would act on a terminal (or reorder the line)
    shown as its escape; ``one_line`` also shows tabs and newlines (a field in a line)."""
    return text.translate(_VISIBLE_ONE_LINE if one_line else _VISIBLE)


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")

T = TypeVar("T")


def for_csv(value: T) -> T | str:
    """A CSV cell: text a spreadsheet would take for a formula gets a leading ``'``;
    numbers and None are left as they are (a negative number is not text)."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


__all__ = ["for_csv", "for_terminal"]
