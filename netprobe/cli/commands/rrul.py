"""``netprobe rrul [HOST]``: Flent's RRUL ("realtime response under load") as netprobe's
engine can run it: 4 TCP streams each way at once (``bidir``, ``-P 4``) for 60 s, with
latency probes from 5 s before the load to 5 s after it, Flent's defaults (``-l 60``,
``--delay 5``).

Flent's ``rrul`` marks its four streams of each direction with four DSCP classes (BE, BK,
CS5, EF) and measures with three UDP round-trip flows and ICMP ping; netprobe marks all
streams alike (``--dscp``) and measures with its own UDP echo probes, so this is Flent's
``rrul_be`` (every stream best effort) in shape. Everything else is ``netprobe
bufferbloat``'s: the same options, result, grade and verdict, with one loaded phase,
``rrul``.
"""
from __future__ import annotations

import argparse
from typing import Any

from netprobe.cli import common
from netprobe.cli.commands.bufferbloat import add_phased_parser, run_phases

FLENT_LENGTH_S = 60.0
"""Flent's default test length (``-l``)."""
FLENT_DELAY_S = 5.0
"""Flent's default ``--delay``: its pings start this long before the loads and end this
long after them."""


def add_parser(commands: Any, summary: str, epilog: str) -> None:
    """The ``rrul`` command's options (``bufferbloat``'s, with RRUL's defaults)."""
    parser = add_phased_parser(commands, "rrul", summary, epilog, loaded_s=FLENT_LENGTH_S,
                               idle_s=FLENT_DELAY_S,
                               phases="seconds of the load, both directions at once")
    parser.description = (f"{summary}. Flent's rrul_be in shape (every stream best effort; "
                          "Flent's rrul marks its streams with four DSCP classes), measured "
                          "by netprobe's probes; the result, grade and verdict are "
                          "`netprobe bufferbloat`'s.")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, load: common.RegistryLoader) -> int:
    """Idle, both directions at once, idle; the one result."""
    from netprobe.latency.bufferbloat import RRUL_PHASES

    return run_phases(args, load, RRUL_PHASES)
