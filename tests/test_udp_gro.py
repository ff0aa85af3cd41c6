"""The UDP receiver with UDP_GRO: a coalesced message is counted datagram by datagram.

Real loopback sockets, both data paths. A GSO send (one sendmsg with a UDP_SEGMENT cmsg)
reaches a socket with UDP_GRO on as ONE message of many datagrams, and a socket without
it as as many messages: so each test below sends the same datagrams as one burst and
checks that loss, reordering, duplicates, foreign datagrams and byte counts come out as
they do datagram by datagram, with GRO and without (the fallback path). Where the test
needs the burst to arrive whole it says so with the receive calls it counts.
"""
from __future__ import annotations

import errno
import socket
import struct
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from netprobe import core
from netprobe.core import contract, wrapper
from tests.test_core import datagram, finish, soon, udp_pair

SOL_UDP = 17
UDP_SEGMENT = 103
UDP_GRO = 104
SO_TIMESTAMPNS = 35  # asm-generic (x86, arm, aarch64); not in Python's socket module
# What a kernel, device or emulator without UDP GSO answers to a UDP_SEGMENT send.
GSO_REFUSED = (errno.EIO, errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP)

# Sequence numbers in arrival order: 6 and 8 never come, the second 3 is a duplicate,
# 3 and 4 arrive after 5 and 7 after 9 (the same as test_core's per-datagram test).
SEQUENCE = (0, 1, 2, 5, 3, 3, 4, 9, 7)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=1) as executor:
        yield executor


def _gro_or_skip() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.setsockopt(SOL_UDP, UDP_GRO, 1)
        except OSError as exc:
            pytest.skip(f"this kernel refuses UDP_GRO: {exc}")


def send_burst(tx: socket.socket, frames: list[bytes]) -> None:
    """All frames in ONE GSO send: every frame but the last must be as long as the first."""
    size = len(frames[0])
    assert all(len(f) == size for f in frames[:-1]) and len(frames[-1]) <= size
    try:
        tx.sendmsg([b"".join(frames)], [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", size))])
    except OSError as exc:
        if exc.errno in GSO_REFUSED:
            pytest.skip(f"no UDP GSO here: {exc}")
        raise


def _gro_state(sock: socket.socket) -> int:
    return int(sock.getsockopt(SOL_UDP, UDP_GRO))


def receive(pool: ThreadPoolExecutor, rx: socket.socket, counters: Any, count: int,
            gro: bool, **kwargs: Any) -> Future[int]:
    """Start the receiver loop; returns once the loop has set its socket up, so that what
    the caller sends next is queued as the loop's option says (GRO decides at arrival
    whether a burst is kept whole)."""
    kwargs.setdefault("length", 2048)
    got = pool.submit(core.udp_recv, rx.fileno(), counters, max_packets=count,
                      deadline=soon(5), gro=gro, **kwargs)
    end = time.monotonic() + 5
    while gro and not _gro_state(rx) and time.monotonic() < end:
        time.sleep(0.001)
    if not gro:  # nothing to watch for: the loop only has to be waiting in its call
        time.sleep(0.05)
    return got


@pytest.mark.parametrize("gro", [True, False], ids=["gro", "fallback"])
def test_a_burst_is_counted_datagram_by_datagram(data_path: str, pool: ThreadPoolExecutor,
                                                 gro: bool) -> None:
    _gro_or_skip()
    frames = [datagram(seq) for seq in SEQUENCE] + [b"not ours"]  # the short last segment
    with udp_pair() as (tx, rx):
        counters = core.Counters()
        got = receive(pool, rx, counters, len(frames), gro, batch=1)
        send_burst(tx, frames)
        assert finish(got, 5) == counters.bytes == 9 * 64 + 8
    assert counters.packets == 10
    assert counters.duplicates == 1
    assert counters.out_of_order == 3
    assert counters.lost == 2
    # One receive call for the whole burst is what GRO buys; without it, one per datagram.
    assert counters.calls == (1 if gro else len(frames))


@pytest.mark.parametrize("gro", [True, False], ids=["gro", "fallback"])
def test_foreign_datagrams_inside_a_burst_are_left_out(data_path: str, pool: ThreadPoolExecutor,
                                                       gro: bool) -> None:
    # Each datagram of a coalesced message proves on its own that it belongs to the test
    # (its number relative to the test's secret base): forged ones in the same burst are
    # foreign and touch no figure, while the test's own are all counted.
    _gro_or_skip()
    base = (1 << 62) + 12345
    keyed = [base + i for i in range(4)]
    order = [keyed[0], 7, keyed[1], 1 << 63, keyed[3], 12345, keyed[2], base - 1]
    with udp_pair() as (tx, rx):
        counters = core.Counters()
        counters.sequence_base = base
        got = receive(pool, rx, counters, len(order), gro, batch=1)
        send_burst(tx, [datagram(seq) for seq in order])
        finish(got, 5)
    assert counters.foreign == 4  # 7, 1 << 63, 12345 and base - 1: out of the test's reach
    assert (counters.packets, counters.bytes) == (4, 4 * 64)
    assert counters.out_of_order == 1  # keyed[2] after keyed[3]
    assert counters.lost == 0
    assert counters.calls == (1 if gro else len(order))


def test_a_burst_longer_than_the_read_length_is_read_whole(
        data_path: str, pool: ThreadPoolExecutor) -> None:
    # The receiver's length is the largest datagram; a coalesced message is up to 64 KiB
    # whatever that length is, so its slots must be that big or the tail of the burst
    # would be cut off (and counted lost).
    _gro_or_skip()
    frames = [datagram(seq, length=1400) for seq in range(40)]  # 56,000 bytes in one send
    with udp_pair() as (tx, rx):
        counters = core.Counters()
        got = receive(pool, rx, counters, len(frames), True, length=1500, batch=1)
        send_burst(tx, frames)
        assert finish(got, 5) == 40 * 1400
    assert (counters.packets, counters.lost, counters.calls) == (40, 0, 1)


def test_a_socket_left_with_gro_on_is_still_walked(data_path: str) -> None:
    # gro=False does not turn the option off (coalesced messages may be queued already);
    # a socket that has it on from before still delivers bursts whole, and they are cut.
    _gro_or_skip()
    with udp_pair() as (tx, rx):
        rx.setsockopt(SOL_UDP, UDP_GRO, 1)
        send_burst(tx, [datagram(seq) for seq in range(10)])
        counters = core.Counters()
        assert core.udp_recv(rx.fileno(), counters, length=2048, max_packets=10,
                             deadline=soon(3), gro=False, batch=1) == 640
    assert (counters.packets, counters.lost, counters.calls) == (10, 0, 1)


@pytest.mark.parametrize("gro", [True, False], ids=["gro", "fallback"])
def test_the_native_gso_sender_into_the_receiver_counts_exact(
        data_path: str, pool: ThreadPoolExecutor, gro: bool) -> None:
    # The native sender packs 32 datagrams into each sendmmsg message with UDP_SEGMENT.
    # 2,000 of them fit the receive buffer whole even before the receiver reads (coalesced
    # or not), so nothing may be lost, and every datagram is counted once.
    if not wrapper.LOADED:
        pytest.skip("the native sender is the compiled core's")
    if gro:
        _gro_or_skip()
    native = contract.DataPath(wrapper)
    count = 2000
    with udp_pair() as (tx, rx):
        tx_counters, rx_counters = wrapper.Counters(), core.Counters()
        tx_counters.sequence_base = rx_counters.sequence_base = 1 << 40
        got = receive(pool, rx, rx_counters, count, gro, batch=1)
        sent = native.udp_send(tx.fileno(), tx_counters, length=100, max_packets=count,
                                 deadline=soon(5))
        assert finish(got, 5) == sent == count * 100
        gro_on = _gro_state(rx)
    assert rx_counters.packets == tx_counters.packets == count
    assert (rx_counters.lost, rx_counters.out_of_order, rx_counters.duplicates) == (0, 0, 0)
    assert rx_counters.foreign == 0
    if gro_on:  # the sender's messages arrived whole: far fewer reads than datagrams
        assert rx_counters.calls <= count // 8
    else:
        assert rx_counters.calls >= count
    assert bool(gro_on) == gro


def test_the_gso_sender_fills_whole_messages_and_every_datagram_is_its_own(
        data_path: str, pool: ThreadPoolExecutor) -> None:
    # 1472-byte datagrams: 44 fit one GSO message (65507 bytes, IPv4's largest UDP
    # payload; 60 KiB messages held 41). Each call must carry whole messages, and each
    # datagram of the contiguous layout its own number: the receiver counts every one
    # once, none lost or duplicated, including a short last message (7 datagrams past a
    # multiple of 44). With UDP_GRO a message arrives whole, one per read here, so the
    # reads count the messages.
    if not wrapper.LOADED:
        pytest.skip("the native sender is the compiled core's")
    _gro_or_skip()
    count, length = 44 * 40 + 7, 1472
    with udp_pair() as (tx, rx):
        tx_counters, rx_counters = _native_send(pool, tx, rx, count, length, True, 1)
        whole = _gro_state(rx)
    assert rx_counters.packets == tx_counters.packets == count
    assert (rx_counters.lost, rx_counters.out_of_order, rx_counters.duplicates) == (0, 0, 0)
    assert rx_counters.bytes == count * length
    assert tx_counters.calls <= count // 44
    if whole:
        assert rx_counters.calls <= 41 + 1  # 41 messages (44 of 60 KiB); one empty read


def test_a_path_with_longer_headers_gets_shorter_messages(
        data_path: str, pool: ThreadPoolExecutor) -> None:
    # IP options leave less than 65507 bytes for a message's datagrams: 47 of 1393 bytes
    # (65471) fit without them, not with 40 bytes of options (65475 at most). The kernel
    # answers EMSGSIZE, and the sender halves its messages instead of failing.
    if not wrapper.LOADED:
        pytest.skip("the native sender is the compiled core's")
    count, length = 47 * 10, 1393
    with udp_pair() as (tx, rx):
        try:
            tx.setsockopt(socket.IPPROTO_IP, socket.IP_OPTIONS, b"\x01" * 39 + b"\x00")
        except OSError as exc:
            pytest.skip(f"IP options refused here: {exc}")
        tx_counters, rx_counters = _native_send(pool, tx, rx, count, length, False, 32)
    assert rx_counters.packets == tx_counters.packets == count
    assert (rx_counters.lost, rx_counters.duplicates) == (0, 0)


def test_datagrams_one_per_message_are_still_read_a_batch_per_call() -> None:
    # The receiver offers fewer slots when messages come coalesced (a call copies about a
    # batch of datagrams either way), and all of them again when messages are single.
    if not wrapper.LOADED:
        pytest.skip("recvmmsg batching is the compiled core's")
    with udp_pair() as (tx, rx):
        for seq in range(320):
            tx.send(datagram(seq))
        counters = wrapper.Counters()
        contract.DataPath(wrapper).udp_recv(rx.fileno(), counters, length=2048,
                                            max_packets=320, deadline=soon(3), batch=32)
    assert (counters.packets, counters.lost) == (320, 0)
    assert counters.calls <= 320 // 32 + 1  # the first call has one slot, then 32


def test_other_control_messages_do_not_crowd_out_the_segment_size(data_path: str) -> None:
    # A socket whose owner asked for receive timestamps gets that cmsg beside UDP_GRO's:
    # the control area must hold both, or the segment size is lost and a burst of ten
    # would count as one datagram.
    _gro_or_skip()
    with udp_pair() as (tx, rx):
        try:
            rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            rx.setsockopt(SOL_UDP, UDP_GRO, 1)
        except OSError as exc:  # qemu-user does not carry SO_TIMESTAMPNS (ENOPROTOOPT)
            pytest.skip(f"this kernel or emulator refuses timestamps beside UDP_GRO: {exc}")
        send_burst(tx, [datagram(seq) for seq in range(10)])
        counters = core.Counters()
        core.udp_recv(rx.fileno(), counters, length=2048, max_packets=10, deadline=soon(3),
                      batch=1)
    assert (counters.packets, counters.lost, counters.calls) == (10, 0, 1)


def _native_send(pool: ThreadPoolExecutor, tx: socket.socket, rx: socket.socket, count: int,
                 length: int, gro: bool, batch: int) -> tuple[Any, Any]:
    """``count`` datagrams of ``length`` bytes by the compiled sender into the receiver
    loop; both ends' counters, once every byte sent is counted received."""
    tx_counters, rx_counters = wrapper.Counters(), core.Counters()
    tx_counters.sequence_base = rx_counters.sequence_base = 1 << 40
    got = receive(pool, rx, rx_counters, count, gro=gro, batch=batch)
    sent = contract.DataPath(wrapper).udp_send(tx.fileno(), tx_counters, length=length,
                                               max_packets=count, deadline=soon(5))
    assert finish(got, 5) == sent == count * length
    return tx_counters, rx_counters
