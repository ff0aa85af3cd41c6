"""What the HTML report's modules share (the page in :mod:`netprobe.cli.html`, the latency
charts in :mod:`netprobe.cli.htmllatency`): escaping, matplotlib's settings, unique SVG ids.
Apart so that neither imports the other.
"""
from __future__ import annotations

import html
import re
from typing import Any

from netprobe.cli.textsafe import for_terminal

# text.parse_math off (and TeX off): a `$` in a tool's name or a group's label is a dollar
# sign, not mathtext (a name like "$\\foo{$" from a saved result crashed report --html).
_RC = {"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False,
       "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3,
       "text.parse_math": False, "text.usetex": False}


def _e(text: Any) -> str:
    """Foreign text in HTML: escaped, and its control characters shown as escapes."""
    return html.escape(for_terminal(str(text), one_line=True))


def _label(text: str) -> str:
    """Foreign text for a matplotlib label: its control characters shown as escapes (a
    `$` stays a dollar sign: mathtext is off in :data:`_RC`)."""
    return for_terminal(text, one_line=True)


_ID = re.compile(r'\bid="([^"]+)"')
_REFERENCE = re.compile(r'(url\(#|href="#)([^")]+)')


def _scoped(svg: str, scope: str) -> str:
    """matplotlib names its elements ``figure_1``, ``axes_1``, ... in every SVG: prefix
    them (and what refers to them) with the chart's id so that ids stay unique in a page
    of many charts. The series ids assigned here are already unique and stay as they are."""
    own = {name for name in _ID.findall(svg) if not name.startswith(("series-", "trial-"))}

    def rename(name: str) -> str:
        return f"{scope}-{name}" if name in own else name

    svg = _ID.sub(lambda m: f'id="{rename(m.group(1))}"', svg)
    return _REFERENCE.sub(lambda m: m.group(1) + rename(m.group(2)), svg)


__all__ = ["_RC", "_e", "_label", "_scoped"]
