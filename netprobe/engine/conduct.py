"""The part of a test both ends share once data flows: watch the local side, tell the
peer when sending is over, stop receivers once the peer has stopped sending, exchange
final reports, and give up cleanly when the peer vanishes.

Messages after ``start`` (either direction):
``interval`` {sample}, ``sent`` {elapsed_s, datagrams}, ``report`` {streams, cpu, errors, system},
``abort`` {reason}, ``bye`` {}; and ``warm-up`` {bytes} where both ends offered
``protocol.WARM_UP_FEATURE``.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Callable

import attrs

from netprobe import convert, core
from netprobe.engine.log import escape
from netprobe.engine.protocol import SEND_TIMEOUT_S, Channel
from netprobe.engine.side import Side, default_length
from netprobe.errors import NetprobeError, ProtocolError
from netprobe.host import system_name
from netprobe.reporting import KeptIntervals
from netprobe.schema import Interval

UDP_DRAIN_S = 0.5  # datagrams still in flight when the peer says it stopped sending
TCP_DRAIN_S = 5.0  # a TCP receiver should see EOF well within this after the peer's "sent"
REPORT_WAIT_S = 15.0  # how long past the planned end to wait for the peer's report
UDP_QUIET_S = 0.05  # ... but a receiver with no new datagram for this long has drained
POLL_S = 0.05
MIN_SEND_S = 0.5  # even an overdue end may still say "abort" to a peer that reads
NO_PROGRESS_S = 20.0  # a byte-count test with nothing moving this long has stalled
# While data flows nothing needs a poll: messages and the local loops' ends wake the
# conductor at once. It looks in twice a second for an overdue peer, and polls fast only
# while a local receiver drains after the peer's "sent" (idle wake-ups are CPU on a router).
IDLE_POLL_S = 0.5
REPORT_BYTES_PER_STREAM = 4096
"""Room each stream may take in a final report (its summary and socket figures take about
600 bytes, its error or warning up to a few hundred more): at -P 128 a report passed the
64 KiB frame limit and neither end ever received the other's. Bounded by the streams the
server accepted (--max-streams)."""
READ_AHEAD = 64
"""Messages the reader thread holds ahead of the test loop (each at most one frame) before
the test says how many it may produce (:data:`READ_AHEAD_STEPS`): past it the reader stops
reading and the peer's sends wait. Unbounded, 2,000 interval samples of 60 KB from a
hostile server took a client whose reporter spends 2 ms a sample to 478 MB (peak RSS)."""
READ_AHEAD_STEPS = 8
"""Interval steps of samples (every stream's and the sums, both ways) the reader may hold
ahead of the test loop: a burst of 258 samples a step at -P 128 --bidir passes whole."""
SLACK_STEPS = 3
"""Interval steps a peer may report beyond its elapsed time: the warm-up boundary, the
tail, and a step under way."""
SLACK_S = 2.0
"""Seconds the peer's clock may run ahead of ours: it starts when it sends ``start``, ours
when that arrives, a one-way delay later (300 ms over a geostationary satellite)."""
PEER_TEXT_CHARS = 1000
"""Longest error, warning or system text kept from a peer (cut and escaped past it)."""
PEER_NOTES = 32
"""Most errors and most warnings kept from a peer's report (the rest counted)."""
CLOSED = "__closed__"
LOCAL = "__local__"


class Reader:
    """Reads control messages on a thread of its own into a queue, so the test loop can
    wait for messages and watch the local side at the same time."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue(READ_AHEAD)
        self._thread = threading.Thread(target=self._run, name="np-control-reader", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                message = self.channel.recv(None)
            except (OSError, NetprobeError) as exc:
                reason = str(exc) if isinstance(exc, NetprobeError) else (exc.strerror or str(exc))
                self._put({"type": CLOSED, "reason": reason})
                return
            if not self._put(message) or message.get("type") in ("bye", "abort"):
                return

    def _put(self, message: dict[str, Any]) -> bool:
        # A full queue holds the reader (and so the peer's sends) until the loop takes one;
        # False once the channel is closed, so a reader never outlives its test waiting.
        while True:
            try:
                self.messages.put(message, timeout=IDLE_POLL_S)
                return True
            except queue.Full:
                if self.channel.sock.fileno() < 0:
                    return False

    def allow(self, count: int) -> None:
        """Let the queue hold ``count`` messages (never fewer than it does)."""
        with self.messages.mutex:
            self.messages.maxsize = max(self.messages.maxsize, count)
            self.messages.not_full.notify_all()

    def wake(self) -> None:
        """Wake the loop from any thread without waiting (a full queue wakes it anyway)."""
        with contextlib.suppress(queue.Full):
            self.messages.put_nowait({"type": LOCAL})

    def get(self, timeout: float) -> dict[str, Any] | None:
        """The next message, or None if none arrived within ``timeout``."""
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            return None


@attrs.define
class Outcome:
    """What the conductor learnt from the peer."""

    peer_report: dict[str, Any] | None = None
    peer_kept: KeptIntervals = attrs.Factory(KeptIntervals)
    """The peer's interval samples kept for the result (bounded: reporting.MAX_INTERVALS_KEPT)."""
    error: str | None = None
    aborted_by_peer: bool = False

    @property
    def peer_intervals(self) -> list[Interval]:
        """The peer's interval samples kept, in arrival order."""
        return self.peer_kept.samples


class Conductor:
    """Runs the end-of-test handshake for one side."""

    def __init__(
        self,
        channel: Channel,
        reader: Reader,
        side: Side,
        on_peer_interval: Callable[[Interval], None],
        planned_s: float | None,
    ) -> None:
        self.channel = channel
        self.reader = reader
        self.side = side
        # Both ends have every stream, so this bounds the peer's report as well as ours.
        channel.allow_frames_of(channel.max_size + REPORT_BYTES_PER_STREAM * len(side.streams))
        self.on_peer_interval = on_peer_interval
        self.planned_s = planned_s
        self.outcome = Outcome()
        self.dropped_intervals = 0
        self.timed_out_waits = 0
        """How often the loop woke with no message: its idle cost (tests count it)."""
        self._messages = 0
        self._progress_mark: tuple = ()
        self._progress_at = 0.0
        """Interval samples not sent because the peer was not taking them."""
        self._sent_told = False
        self._report_sent = False
        self._peer_sent_at: float | None = None
        self._last_udp_counts: tuple = ()
        # Wake the loop at once when a local stream finishes, not at the next poll.
        side.on_change = reader.wake
        if side.shared_boundary:
            side.on_boundary = self.send_boundary
        reader.allow(READ_AHEAD_STEPS * samples_per_step(side.spec))
        self._peer_samples = 0

    def send(self, message: dict[str, Any]) -> bool:
        """Send a message from any thread; False if the connection is gone or the peer
        did not take it within the channel's send deadline."""
        try:
            self.channel.send(message, self._send_timeout())
            return True
        except (OSError, NetprobeError):
            return False

    def _send_timeout(self) -> float:
        # No send may wait past the moment the test is overdue: the report of a session
        # whose client stopped reading waited behind the queued samples for the whole send
        # deadline, past the end the watchdog allows.
        if self.planned_s is None or not self.side.t0:
            return SEND_TIMEOUT_S
        left = self.side.t0 + self.planned_s + REPORT_WAIT_S - core.monotonic()
        return max(MIN_SEND_S, min(SEND_TIMEOUT_S, left))

    def send_interval(self, sample: Interval) -> None:
        """Forward one local interval sample to the peer (called by the sampler).

        A sample is dropped, never waited for, when the peer is not reading: the sampler
        must go on taking figures, and the test loop must reach its deadline checks."""
        message = {"type": "interval", "sample": convert.unstructure(sample)}
        try:
            sent = self.channel.try_send(message)
        except (OSError, NetprobeError):
            sent = False
        if not sent:
            self.dropped_intervals += 1

    def send_boundary(self, counts: dict[tuple[int, str], int]) -> None:
        """Tell the peer each local TCP sender's byte count at the warm-up's end (called by
        the sampler): the byte at which the peer's receivers start their summaries.

        Never waited for, as an interval sample: a message not taken leaves the peer's
        receivers on their own clock's boundary, as before the feature existed."""
        message = {"type": "warm-up", "bytes": [[i, d, n] for (i, d), n in counts.items()]}
        with contextlib.suppress(OSError, NetprobeError):
            self.channel.try_send(message)

    def run(self) -> Outcome:
        """Drive the test to its end; returns once both reports are exchanged or it failed."""
        while True:
            self._watch_local()
            # Done as soon as both reports are out, before waiting for another message:
            # the peer that has both says "bye" at once, which is no message of the test.
            if self._report_sent and self.outcome.peer_report is not None:
                break
            if self._overdue():
                self._fail("the peer did not finish in time")
            elif self._stalled():
                self._fail(f"no progress for {self._stall_limit():.0f} s: the peer seems stalled")
            message = self.reader.get(POLL_S if self._draining() else IDLE_POLL_S)
            if message is None:
                self.timed_out_waits += 1
            else:
                self._handle(message)
            if self.outcome.error or self.outcome.aborted_by_peer:
                break
        return self.outcome

    def _watch_local(self) -> None:
        if not self._sent_told and self.side.senders_done():
            self._sent_told = self.send({
                "type": "sent", "elapsed_s": self.side.sending_elapsed(),
                "datagrams": [[i, d, n] for (i, d), n in self.side.sent_packets().items()]})
        if self._peer_sent_at is not None:
            since = core.monotonic() - self._peer_sent_at
            drained = since > UDP_DRAIN_S or (since > UDP_QUIET_S and self._udp_quiet())
            # Not while a datagram still waits in a receiver's socket: a receiving thread
            # starved of CPU counts nothing new for a while, and stopping it then made the
            # datagrams it had not read yet count as lost (up to TCP_DRAIN_S, the limit).
            if since > TCP_DRAIN_S or (drained and not self.side.udp_backlog()):
                self._stop_receivers(udp_only=since <= TCP_DRAIN_S)
        if not self._report_sent and self.side.done:
            self.side.wait(2.0)
            report = local_report(self.side)
            if self.dropped_intervals:
                report["warnings"].append(f"{self.dropped_intervals} interval samples were not "
                                          "sent: the peer was not reading them")
            self._report_sent = self.send(report)

    def _draining(self) -> bool:
        # Only a receiver still running after the peer's "sent" needs the fast poll (its
        # drain ends by a time, not by a message). A side with no sending stream says
        # "sent" at once: taken alone, that kept its peer polling 20 times a second for
        # the whole test with nothing to drain.
        return self._peer_sent_at is not None and any(
            s.role == "receiver" and s.ended_at is None for s in self.side.streams)

    def _udp_quiet(self) -> bool:
        # Once the peer has stopped sending, a UDP receiver that got nothing new for a
        # while has drained; no need to wait the full drain time.
        counts = tuple(s.counters.packets for s in self.side.udp_receivers())
        quiet = counts == self._last_udp_counts
        self._last_udp_counts = counts
        return quiet and bool(counts)

    def _stop_receivers(self, udp_only: bool) -> None:
        for stream in self.side.streams:
            if stream.role == "receiver" and (not udp_only or not stream.is_tcp):
                stream.counters.stop()

    def _overdue(self) -> bool:
        if self.planned_s is None or not self.side.t0:
            return False
        return core.monotonic() - self.side.t0 > self.planned_s + REPORT_WAIT_S

    def _stalled(self) -> bool:
        # A byte-count test has no planned end: it gives up when neither its own streams
        # nor the peer have moved for a while (a frozen server, a cut link).
        if self.planned_s is not None or not self.side.t0:
            return False
        now = core.monotonic()
        mark = (sum(s.counters.bytes for s in self.side.streams), self._messages)
        if mark != self._progress_mark or not self._progress_at:
            self._progress_mark, self._progress_at = mark, now
            return False
        return now - self._progress_at > self._stall_limit()

    def _stall_limit(self) -> float:
        # At a low rate one buffer takes a while to go: never give up before two would.
        rate = self.side.spec.rate_bits_per_second
        per_buffer = 8 * default_length(self.side.spec) / rate if rate else 0.0
        return max(NO_PROGRESS_S, 2 * per_buffer)

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == LOCAL:
            return  # only a wake-up: the loop re-checks the local side
        self._messages += 1
        if kind == "interval":
            self._peer_interval(message)
        elif kind == "sent":
            self._peer_sent_at = core.monotonic()
            elapsed = message.get("elapsed_s")
            self.side.peer_done(float(elapsed) if isinstance(elapsed, (int, float)) else None,
                                sent_datagrams(message.get("datagrams")))
        elif kind == "warm-up" and self.side.shared_boundary:
            # The same [[stream_id, direction, count], ...] shape as a "sent" message's.
            self.side.peer_boundary(sent_datagrams(message.get("bytes")))
        elif kind == "report":
            try:
                self.outcome.peer_report = check_report(message, len(self.side.streams))
            except ProtocolError as exc:
                self._fail(f"{exc}: only this side's figures are kept")
        elif kind == "abort":
            self.outcome.aborted_by_peer = True
            told = escape(message.get("reason", "no reason given"), PEER_TEXT_CHARS)
            self.outcome.error = f"peer aborted the test: {told}"
            self.side.stop()
        elif kind == "error":
            told = escape(message.get("message", "an error"), PEER_TEXT_CHARS)
            self._fail(f"peer reported: {told}")
        elif kind == CLOSED:
            self._fail(f"control connection lost: {message.get('reason')}")
        else:
            self._fail(f"unexpected message '{escape(kind, 40)}' during the test")

    def _peer_interval(self, message: dict[str, Any]) -> None:
        self._peer_samples += 1
        allowed = self._samples_allowed()
        if self._peer_samples > allowed:
            self._fail(f"the peer sent {self._peer_samples} interval samples, more than "
                       f"{allowed} this test can produce so far: only this side's figures "
                       "are kept")
            return
        try:
            sample = convert.structure(message.get("sample"), Interval)
        except NetprobeError as exc:
            self._fail(f"peer sent a malformed interval ({escape(exc, PEER_TEXT_CHARS)})")
            return
        wrong = foreign_sample(sample, self.side.spec)
        if wrong:
            self._fail(f"peer sent an interval of {wrong}: only this side's figures are kept")
            return
        self.outcome.peer_kept.add(sample)
        self.side.emit_to(self.on_peer_interval, sample)

    def _samples_allowed(self) -> int:
        """The most interval samples the peer can have taken by now: per step, one per
        stream and direction and a sum per direction, over the steps its elapsed time
        holds (with :data:`SLACK_S`), plus :data:`SLACK_STEPS`: what a hostile peer can make
        this side hold."""
        spec = self.side.spec
        step = spec.interval_s or 1.0
        elapsed = core.monotonic() - self.side.t0 if self.side.t0 else 0.0
        return int(samples_per_step(spec) * ((elapsed + SLACK_S) / step + SLACK_STEPS))

    def _fail(self, reason: str) -> None:
        if self.outcome.error is None:
            self.outcome.error = reason
        self.side.stop()

    def abort(self, reason: str) -> None:
        """Tell the peer the test is over (Ctrl-C, local failure) and stop local loops."""
        self.send({"type": "abort", "reason": reason})
        self.side.stop()


def sent_datagrams(items: Any) -> dict[tuple[int, str], int]:
    """A ``sent`` message's UDP datagram counts, ``[[stream_id, direction, count], ...]``,
    by stream; an entry of another shape is left out (a peer of an older version sends
    none: its receivers then count no tail, as before)."""
    counts: dict[tuple[int, str], int] = {}
    for item in items if isinstance(items, list) else ():
        if isinstance(item, list) and len(item) == 3 and _count(item[0]) \
                and isinstance(item[1], str) and _count(item[2]):
            counts[(item[0], item[1])] = item[2]
    return counts


def samples_per_step(spec: Any) -> int:
    """The most interval samples one end takes at each step of a test of ``spec``: one per
    stream and direction, and a sum per direction."""
    return len(spec.flow_directions()) * (spec.streams + 1)


def foreign_sample(sample: Interval, spec: Any) -> str | None:
    """What is wrong with a peer's sample for a test of ``spec`` (a stream or direction the
    test does not have), or None: a peer can make this side keep only its own streams."""
    if sample.direction not in spec.flow_directions():
        return f"direction {sample.direction}, which the test does not run"
    if sample.stream_id is not None and not 1 <= sample.stream_id <= spec.streams:
        return f"stream {sample.stream_id}, which the test does not have"
    return None


def peer_notes(items: list[Any]) -> list[str]:
    """A peer's errors or warnings as at most :data:`PEER_NOTES` strings, each cut and
    escaped to :data:`PEER_TEXT_CHARS` (the rest counted in a last note)."""
    notes = [escape(item, PEER_TEXT_CHARS) for item in items[:PEER_NOTES]]
    if len(items) > PEER_NOTES:
        notes.append(f"... and {len(items) - PEER_NOTES} more from the peer, not kept")
    return notes


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 1 << 64


def local_report(side: Side) -> dict[str, Any]:
    """This side's final figures as a ``report`` message."""
    streams = [
        {
            "stream_id": stream.stream_id,
            "direction": stream.direction,
            "role": stream.role,
            "summary": convert.unstructure(summary),
            "socket": convert.unstructure(stream.socket_info),
        }
        for stream, summary in side.stream_summaries()
    ]
    return {
        "type": "report",
        "streams": streams,
        "cpu": convert.unstructure(side.cpu()),
        "errors": side.errors(),
        "warnings": side.warnings(),
        "system": system_name(),
    }


def check_report(message: dict[str, Any], max_streams: int) -> dict[str, Any]:
    """Validate the shape of a peer's report before it is used (ProtocolError if it is
    not one); its errors and warnings come back as lists of strings."""
    streams, errors = message.get("streams"), message.get("errors")
    warnings = message.get("warnings", [])
    if not isinstance(streams, list) or not all(isinstance(s, dict) for s in streams) \
            or not isinstance(errors, list) or not isinstance(warnings, list):
        raise ProtocolError("malformed report from peer")
    if len(streams) > max_streams:
        raise ProtocolError(f"report from peer of {len(streams)} streams, where the test has "
                            f"{max_streams}")
    system = message.get("system")
    return {**message, "errors": peer_notes(errors), "warnings": peer_notes(warnings),
            "system": escape(system, PEER_TEXT_CHARS) if isinstance(system, str) else None}
