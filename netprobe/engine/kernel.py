"""Host-wide kernel counters the native engine reads from /proc (Linux): running totals,
diffed over a test by the caller."""

from __future__ import annotations


def udp_receive_buffer_errors() -> int | None:
    """Datagrams this host (this network namespace) dropped so far because a UDP socket's
    receive buffer was full: ``Udp: RcvbufErrors`` in /proc/net/snmp plus
    ``Udp6RcvbufErrors`` in /proc/net/snmp6. None where they cannot be read."""
    total = _snmp_value("/proc/net/snmp", "Udp:", "RcvbufErrors")
    if total is None:
        return None
    return total + (_snmp6_value("/proc/net/snmp6", "Udp6RcvbufErrors") or 0)


def _snmp_value(path: str, group: str, name: str) -> int | None:
    # Pairs of lines: "Udp: InDatagrams NoPorts ..." then "Udp: 123 0 ...".
    try:
        with open(path) as handle:
            rows = [line.split() for line in handle if line.startswith(group)]
    except OSError:
        return None
    if len(rows) < 2 or name not in rows[0]:
        return None
    try:
        return int(rows[1][rows[0].index(name)])
    except (IndexError, ValueError):
        return None


def _snmp6_value(path: str, name: str) -> int | None:
    try:
        with open(path) as handle:
            for line in handle:
                key, _, value = line.partition(" ")
                if key == name:
                    return int(value)
    except (OSError, ValueError):
        return None
    return None
