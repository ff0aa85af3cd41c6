"""What an iperf3 or nuttcp user types, answered with netprobe's spelling.

A curated table, not string similarity: ``server --daemon`` is nearest to ``--max-memory``
by letters and to docs/service.md by meaning. Only options netprobe does not know reach it
(``-N`` is netprobe's and iperf3's nodelay, not nuttcp's stream count)."""

from __future__ import annotations

from collections.abc import Sequence

_DSCP = ("iperf3's -S/--tos sets the TOS byte: here --dscp VALUE sets its DSCP bits "
         "(EF or 46, where TOS 0xb8 is DSCP 46)")
_DAEMON = ("netprobe server does not fork itself: run it under systemd, procd or OpenRC "
           "(docs/service.md), with --pidfile and --logfile where wanted")
_AUTH = "netprobe's servers authenticate with a shared secret: --secret-file FILE"
_AFFINITY = ("netprobe places its own threads; to pin the whole process: "
             "taskset -c CPUS netprobe ...")

HABITS: dict[str, str] = {
    "-S": _DSCP,
    "--tos": _DSCP,
    "-D": _DAEMON,
    "--daemon": _DAEMON,
    "--fq-rate": "iperf3's --fq-rate is -b RATE here (each stream paced at RATE)",
    "--rcv-timeout": ("a netprobe client stops by itself when its server goes silent; a "
                      "server's own bound is netprobe server --idle-timeout SECONDS"),
    "--cport": ("netprobe chooses its client ports; a firewall needs only the server's "
                "port (-p, TCP and UDP) open"),
    "-A": _AFFINITY,
    "--affinity": _AFFINITY,
    "--username": _AUTH,
    "--rsa-public-key-path": _AUTH,
    "--rsa-private-key-path": _AUTH,
    "--authorized-users-path": _AUTH,
    "--get-server-output": "the far end's figures are always in the result (sender and receiver)",
    "--forceflush": "every interval line is written as it is measured already",
    "-d": "-V/--verbose says more; NETPROBE_DEBUG=1 shows a traceback",
    "--debug": "-V/--verbose says more; NETPROBE_DEBUG=1 shows a traceback",
    "-r": "nuttcp's -r (this end receives) is -R/--reverse here",
    "-T": ("nuttcp's -T SECONDS is -t here; iperf3's -T/--title has no equivalent (results "
           "carry both hosts and the start time)"),
    "--title": "results carry both hosts and the start time; name the file with -o FILE",
    "-F": "netprobe sends no file: -n BYTES sends a byte count",
    "--file": "netprobe sends no file: -n BYTES sends a byte count",
}

SIMILARITY_CUTOFF = 0.75
"""How near a typo must be to a known option to be named. 0.6 named --max-memory for
--daemon; 0.75 still names --time for --tiem (0.83)."""


def hint_for(word: str, known: Sequence[str]) -> str | None:
    """The hint for an unknown option: the table's, else a known option nearly spelt so."""
    if word in HABITS:
        return HABITS[word]
    import difflib

    near = difflib.get_close_matches(word, known, n=1, cutoff=SIMILARITY_CUTOFF)
    return f"did you mean {near[0]}?" if near else None
