"""The optional kernel features a data stream uses, each confirmed positively before use,
and what a stream loses where the kernel refuses one (the notes a result carries).

An old kernel (a router's 4.14, 3.x) answers an option it does not know with
ENOPROTOOPT, EINVAL or EOPNOTSUPP, or returns a shorter TCP_INFO. Worse, a kernel before
4.18 takes a UDP_SEGMENT control message without an error and ignores it: so GSO is
confirmed with getsockopt(SOL_UDP, UDP_SEGMENT), never by a send that did not fail (the
C core asks the same before its first send). Every fallback keeps the figures right; the
notes say what it costs.
"""

from __future__ import annotations

import errno
import os
import socket

from netprobe import core

SOL_UDP = 17
UDP_SEGMENT = 103  # Linux 4.18
UDP_GRO = 104  # Linux 5.0

GSO_COST = ("each datagram is sent as a message of its own, which costs the sender a system "
            "call share per datagram and can hold its packet rate below a GSO sender's")
GRO_COST = ("each datagram is read on its own, which costs the receiver CPU per datagram "
            "and, at high rates, drops at its socket (counted as loss)")
RCVLOWAT_COST = ("the receiver is woken at every arrival instead of once ~1 MiB waits, "
                 "which costs it CPU at high rates; the bytes are counted the same")
TCP_INFO_COST = ("retransmits, RTT and congestion window are not reported (null, not zero)")


def refusal(sock: socket.socket, level: int, option: int) -> str | None:
    """Why the kernel will not say what ``option`` is on ``sock`` (its error name), or
    None where it answers: the positive test of a feature."""
    try:
        sock.getsockopt(level, option)
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))
    return None


def gso_usable(sock: socket.socket) -> bool:
    """Whether this kernel confirms UDP GSO (UDP_SEGMENT) on ``sock``."""
    return refusal(sock, SOL_UDP, UDP_SEGMENT) is None


def unavailable(sock: socket.socket, role: str, *, gso: bool, gro: bool) -> list[str]:
    """What a stream of ``role`` on ``sock`` would use and this kernel refuses, each with
    its cost. ``gso``: a UDP sender that would send GSO messages on this data path;
    ``gro``: a UDP receiver that asks for coalesced datagrams."""
    tcp = sock.type == socket.SOCK_STREAM
    notes: list[str] = []
    if not tcp and role == "sender" and gso:
        why = refusal(sock, SOL_UDP, UDP_SEGMENT)
        if why:
            notes.append(f"UDP GSO unavailable (the kernel refused UDP_SEGMENT: {why}): "
                         f"{GSO_COST}")
    if not tcp and role == "receiver" and gro:
        why = refusal(sock, SOL_UDP, UDP_GRO)
        if why:
            notes.append(f"UDP GRO unavailable (the kernel refused UDP_GRO: {why}): {GRO_COST}")
    if tcp and role == "receiver":
        why = refusal(sock, socket.SOL_SOCKET, socket.SO_RCVLOWAT)
        if why:
            notes.append(f"wake-up threshold unavailable (the kernel refused SO_RCVLOWAT: "
                         f"{why}): {RCVLOWAT_COST}")
    if tcp and role == "sender":
        note = tcp_info_note(sock.fileno())
        if note:
            notes.append(note)
    return notes


def tcp_info_note(fd: int) -> str | None:
    """What this kernel's TCP_INFO leaves out of a TCP sender's figures, or None."""
    try:
        info = core.tcp_info(fd)
    except OSError as exc:
        why = errno.errorcode.get(exc.errno or 0, os.strerror(exc.errno or 0))
        return f"TCP_INFO unavailable (the kernel refused it: {why}): {TCP_INFO_COST}"
    return tcp_info_gaps(info)


def tcp_info_gaps(info: core.TcpInfo) -> str | None:
    """The note for a TCP_INFO shorter than netprobe reads (an old kernel's), or None."""
    missing = [name for name, value in (
        ("retransmits", info.retransmits), ("RTT", info.rtt_us),
        ("congestion window", info.snd_cwnd_bytes), ("minimum RTT", info.min_rtt_us),
        ("acknowledged bytes", info.bytes_acked), ("delivery rate", info.delivery_rate_bps),
        ("retransmitted bytes", info.bytes_retrans)) if value is None]
    # min_rtt is None too before the first RTT sample: only a short struct is news.
    missing = [m for m in missing if m != "minimum RTT" or info.bytes_acked is None]
    if not missing:
        return None
    return (f"TCP_INFO is shorter on this kernel than netprobe reads: {', '.join(missing)} "
            "not reported (null, not zero)")
