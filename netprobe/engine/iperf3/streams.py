"""The server's data loops for iperf3 TCP streams: plain socket loops on a thread each
(not netprobe's C loops: an iperf3 stream's end is told on the control connection, and
these loops stop on a flag), counting the bytes before and after the omit time."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from netprobe import core

POLL_S = 0.2  # how often a blocked loop looks at its stop flag
DRAIN_S = 1.0  # the longest a receiver reads (uncounted) after the test's end


class BaseStream:
    """What every data stream of an iperf3 test has: its socket, role and counts, a loop on
    a thread of its own (``_loop``, the subclass's), the omit time's cut and the stop."""

    thread_prefix = "np-i3-"

    def __init__(self, sock: socket.socket, stream_id: int, sending: bool,
                 length: int, rate_bps: int) -> None:
        self.sock = sock
        self.stream_id = stream_id
        self.sending = sending
        self.length = length
        self.rate_bps = rate_bps
        self.bytes = 0
        self.omitted_bytes = 0  # counted before the omit time ended
        self.retransmits: int | None = None
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"{self.thread_prefix}{stream_id}")

    @property
    def direction(self) -> str:
        """The flow direction, as netprobe names it."""
        return "server_to_client" if self.sending else "client_to_server"

    @property
    def counted(self) -> int:
        """Bytes after the omit time."""
        return self.bytes - self.omitted_bytes

    def start(self) -> None:
        """Start the loop."""
        self.sock.settimeout(POLL_S)
        self._thread.start()

    def end_omit(self) -> None:
        """The omit time is over: what was counted so far is not the test's."""
        self.omitted_bytes = self.bytes

    def stop_loop(self) -> None:
        """Stop the loop (a receiver reads on for at most DRAIN_S)."""
        self.stop.set()
        self._thread.join(DRAIN_S + 2 * POLL_S)

    def _loop(self) -> None:
        raise NotImplementedError


class Stream(BaseStream):
    """One TCP data connection of a test, as a receiver or a sender."""

    def finish(self) -> None:
        """Stop the loop (a receiver drains what already arrived) and read TCP_INFO."""
        self.stop_loop()
        if self.sending:
            # A stock receiver blocked reading the rest of a block (3.12 reads -l bytes at a
            # time, blocking) would wait for ever if the block could not be finished: the
            # end of what this stream sends tells it there is no more.
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_WR)
            try:
                self.retransmits = core.tcp_info(self.sock.fileno()).retransmits
            except (OSError, ValueError):
                self.retransmits = None

    def _loop(self) -> None:
        try:
            if self.sending:
                self._send()
            else:
                self._receive()
        except OSError:
            pass  # the client closed or reset: the count so far stands

    def _receive(self) -> None:
        buffer = bytearray(self.length)
        drain_until: float | None = None
        while True:
            if self.stop.is_set() and drain_until is None:
                drain_until = time.monotonic() + DRAIN_S
            if drain_until is not None and time.monotonic() >= drain_until:
                return
            try:
                count = self.sock.recv_into(buffer)
            except socket.timeout:
                if drain_until is not None:
                    return  # nothing more in flight
                continue
            if count == 0:
                return
            # The test's time ends at TEST_END (the stop), and a stock server stops counting
            # there: what is drained after it (the client's send buffer and the path's
            # queue, ~1 MB on a 100 Mbit/s link) is read so that nothing is reset, but not
            # counted. Counted, it put a 100 Mbit/s link's figure at 96.6 Mbit/s.
            if not self.stop.is_set():
                self.bytes += count

    def _send(self) -> None:
        # Whole blocks only: a stock iperf3 receiver reads its -l length at a time on a
        # blocking socket (3.12's Nread), so a stream that stops part-way through a block
        # leaves it waiting for the rest for ever (every other -R run hung so). A block
        # begun is finished, within DRAIN_S after the stop.
        block = memoryview(b"0123456789" * (self.length // 10 + 1))[: self.length]
        started = time.monotonic()
        offset = 0  # bytes of the current block already sent
        give_up: float | None = None
        while True:
            if self.stop.is_set():
                if offset == 0:
                    return
                give_up = give_up or time.monotonic() + DRAIN_S
                if time.monotonic() >= give_up:
                    return
            elif offset == 0 and self.rate_bps:
                # Pace to the asked rate per stream, as iperf3's sender does.
                ahead = self.bytes * 8 / self.rate_bps - (time.monotonic() - started)
                if ahead > 0:
                    self.stop.wait(min(ahead, POLL_S))
                    continue
            try:
                sent = self.sock.send(block[offset:])
            except socket.timeout:
                continue
            self.bytes += sent
            offset = (offset + sent) % self.length
