"""Issue 33 item 11: every field a peer or a caller gives is type-checked strictly in one
place, what a far end can make the client hold is bounded by what the test asked, address
options name themselves in errors, and ``parse`` reads big saved files in bounded memory."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import typing
from collections.abc import Iterator
from typing import Any, Callable

import attrs
import pytest

import netprobe
from netprobe import convert
from netprobe.errors import ParseError, SpecError, TestFailed
from netprobe.schema import Interval, Result, TestSpec

from .test_hardening_round2 import ask, engine_server, request, run_spec_port

# --- (c) every TestSpec field, every wrong type: SpecError naming the field ------------------

_WRONG = {
    int: [None, True, "2", 1.9, 2.0, [], {}, float("nan")],
    float: [None, True, "1.5", [], {}, float("nan"), float("inf")],
    str: [None, 5, 1.5, True, [], {}, b"bytes"],
    bool: [None, 1, 0, "true", 1.0, []],
}


def _cases() -> list[tuple[str, Any]]:
    hints = typing.get_type_hints(TestSpec)
    cases = []
    for a in attrs.fields(TestSpec):
        declared = hints[a.name]
        args = typing.get_args(declared)
        optional = type(None) in args
        kind = next(t for t in args if t is not type(None)) if optional else declared
        for value in _WRONG[kind]:
            if value is None and optional:
                continue
            cases.append((a.name, value))
    return cases


@pytest.mark.parametrize(("name", "value"), _cases())
def test_every_spec_field_refuses_a_wrong_type_naming_the_field(name: str, value: Any) -> None:
    base: dict[str, Any] = {"duration_s": 1.0}
    if name == "duration_s":
        base = {"bytes_total": 1000} if value is not None else {}
    with pytest.raises(SpecError, match=name):
        TestSpec(**{**base, name: value})


@pytest.mark.parametrize(("field", "value"), [
    ("protocol", "sctp"), ("direction", "sideways"), ("streams", None), ("dscp", "ef"),
    ("congestion", "c" * 65_000), ("congestion", "c" * 16), ("host", "h" * 70_000),
    ("bind_address", 4), ("ip_version", "6"), ("nodelay", "yes"),
])
def test_api_misuse_is_a_spec_error_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(SpecError, match=field):
        netprobe.run(**{field: value, "duration_s": 0.2})


@pytest.mark.parametrize("wrong", [
    {"from_host": 5}, {"tool_options": "path=/bin/x"}, {"reporter": "live"},
    {"tool": None}, {"tool": 3}, {"agent": "secret"},
])
def test_api_call_arguments_are_checked_too(wrong: dict[str, Any]) -> None:
    with pytest.raises(SpecError, match=next(iter(wrong))):
        netprobe.run(duration_s=0.2, **wrong)


def test_a_congestion_name_the_kernel_keeps_is_taken() -> None:
    assert TestSpec(congestion="c" * 15).congestion == "c" * 15


# --- (a) the one structurer is strict: what a peer sends is refused, never coerced ------------


@pytest.mark.parametrize(("spec", "word"), [
    ({"streams": "2"}, "streams"), ({"streams": 1.9}, "streams"), ({"streams": True}, "streams"),
    ({"nodelay": 1}, "nodelay"), ({"duration_s": "5"}, "duration_s"),
    ({"protocol": 6}, "protocol"), ({"congestion": "c" * 65_000}, "congestion"),
    ({"port": 5301.0}, "port"), ({"omit_s": None}, "omit_s"),
])
def test_the_server_refuses_wrong_json_types_with_the_reason(spec: dict, word: str) -> None:
    with engine_server() as server:
        reply = ask(server.port, request({"duration_s": 0.2, **spec}))
    assert reply["type"] == "error", reply
    assert word in reply["message"], reply


@pytest.mark.parametrize("sample", [
    {"bytes": "10"}, {"bytes": 1.5}, {"bytes": True}, {"stream_id": "0"},
    {"omitted": 1}, {"start_s": "0"}, {"direction": 1},
])
def test_an_interval_from_a_peer_is_checked_strictly(sample: dict) -> None:
    good = {"direction": "client_to_server", "role": "sender", "stream_id": 0,
            "start_s": 0.0, "end_s": 1, "bytes": 10, "bits_per_second": 80.0}
    assert convert.structure(good, Interval).end_s == 1.0  # an integer is a number
    with pytest.raises(ParseError, match=next(iter(sample))):
        convert.structure({**good, **sample}, Interval)


# --- (b) a hostile server cannot make the client hold more than the test asked ----------------


def _hostile_server(monkeypatch: pytest.MonkeyPatch, port: int,
                    flood: Callable[[Any], None]) -> None:
    """Make the in-process server on ``port`` (its end: the receiver of a normal test) call
    ``flood`` with its Conductor once, at its first interval sample. The port tells it
    from a session of an earlier test's server still ending in this process."""
    from netprobe.engine import conduct

    real = conduct.Conductor.send_interval
    done: list[bool] = []

    def send_interval(self: Any, sample: Interval) -> None:
        ours = self.channel.sock.fileno() >= 0 and self.channel.sock.getsockname()[1] == port
        if self.side.streams[0].role == "receiver" and ours and not done:
            done.append(True)
            flood(self)
        real(self, sample)

    monkeypatch.setattr(conduct.Conductor, "send_interval", send_interval)


def _send_many(conductor: Any, messages: Iterator[dict[str, Any]]) -> int:
    sent = 0
    for message in messages:
        try:
            conductor.channel.send(message, timeout=2.0)
        except OSError:  # the client gave up and closed: what the test wants
            break
        sent += 1
    return sent


def _fake_sample(stream_id: Any = 1, pad: int = 2000) -> dict[str, Any]:
    return {"type": "interval", "sample": {
        "direction": "client_to_server", "role": "receiver", "stream_id": stream_id,
        "start_s": 0.0, "end_s": 0.1, "bytes": 1, "bits_per_second": 80.0,
        "padding": "p" * pad}}


def test_a_flood_of_interval_samples_is_refused_and_the_client_keeps_its_figures(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with engine_server() as server, pytest.raises(TestFailed) as failed:
        _hostile_server(monkeypatch, server.port,
                        lambda c: _send_many(c, (_fake_sample() for _ in range(20_000))))
        run_spec_port(server.port, duration_s=0.5, interval_s=0.1)
    assert "interval samples" in str(failed.value), failed.value
    partial = failed.value.partial
    assert isinstance(partial, Result) and partial.status == "failed"
    sender = partial.summaries[0].sender
    assert sender is not None and sender.bytes > 0  # the client's own figures are kept
    peer = [s for s in partial.intervals if s.role == "receiver"]
    # 0.5 s at 0.1 s, one stream: 2 samples a step over (0.5 + 2) s and 3 steps of slack
    assert len(peer) <= 2 * (25 + 3), len(peer)


@pytest.mark.parametrize("sample", [_fake_sample(stream_id=7), _fake_sample(stream_id=0),
                                    {**_fake_sample(), "sample": {**_fake_sample()["sample"],
                                     "direction": "server_to_client"}}])
def test_an_interval_of_a_stream_the_test_lacks_is_refused(
        monkeypatch: pytest.MonkeyPatch, sample: dict) -> None:
    with engine_server() as server, pytest.raises(TestFailed) as failed:
        _hostile_server(monkeypatch, server.port, lambda c: _send_many(c, iter([sample])))
        run_spec_port(server.port, duration_s=0.5, interval_s=0.1)
    assert "stream" in str(failed.value) or "direction" in str(failed.value), failed.value
    assert failed.value.partial.summaries[0].sender.bytes > 0


def test_a_report_s_text_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from netprobe.engine import conduct

    real = conduct.local_report

    def hostile(side: Any) -> dict[str, Any]:
        report = real(side)
        if side.streams[0].role == "receiver":
            return {**report, "warnings": ["w" * 20_000] + ["x"] * 500, "system": "s" * 30_000}
        return report

    monkeypatch.setattr(conduct, "local_report", hostile)
    with engine_server() as server:
        try:
            result = run_spec_port(server.port, duration_s=0.3)
        except TestFailed as exc:
            result = exc.partial
    assert sum(len(w) for w in result.warnings) < 20_000, len(result.warnings)
    assert len(result.warnings) < 100


def test_the_reader_holds_a_bounded_number_of_messages_and_ends_with_its_channel() -> None:
    from netprobe.engine import conduct, protocol

    ours, theirs = socket.socketpair()
    frames = protocol.encode({"type": "interval", "pad": "p" * 1000}) * 1000
    writer = threading.Thread(target=lambda: _quietly(lambda: theirs.sendall(frames)))
    writer.start()
    channel = protocol.Channel(ours)
    reader = conduct.Reader(channel)
    for _ in range(100):  # bounded wait for the reader to fill its queue
        if reader.messages.full():
            break
        time.sleep(0.05)
    assert reader.messages.qsize() == conduct.READ_AHEAD  # held, not the 1000 sent
    reader.wake()  # a wake-up never blocks a stream thread on a full queue
    channel.close()
    reader._thread.join(5)
    assert not reader._thread.is_alive()
    theirs.close()
    writer.join(5)


def _quietly(action: Callable[[], None]) -> None:
    with contextlib.suppress(OSError):  # the reader's end closed first: expected
        action()


# --- (d) address options name themselves in the error ------------------------------------------


@pytest.mark.parametrize(("argv", "option"), [
    (["run", "-B", "notanaddr", "-t", "0.3", "127.0.0.1"], "-B/--bind notanaddr"),
    (["run", "-B", "192.0.2.1", "-t", "0.3", "127.0.0.1"], "-B/--bind 192.0.2.1"),
    (["run", "--bind", "bad host!", "-t", "0.3"], "-B/--bind bad host!"),
    (["run", "-t", "0.3", "bad host!"], "HOST bad host!"),
    (["run", "-t", "0.3", "-c", "bad host!"], "-c/--client bad host!"),
    (["run", "--from", "bad host!", "--to", "127.0.0.1", "-t", "0.3"], "--from bad host!"),
    (["run", "--from", "127.0.0.1", "--to", "bad host!", "-t", "0.3"], "--to bad host!"),
])
def test_an_address_option_that_does_not_resolve_is_named(
        argv: list[str], option: str, capsys: pytest.CaptureFixture[str]) -> None:
    from netprobe.cli.main import main

    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert option in err and "Errno" not in err and len(err.splitlines()) == 1, err


# --- (e) a big saved iperf 2 log is read in bounded memory -------------------------------------

_IPERF2_HEAD = ("------------------------------------------------------------\n"
                "Client connecting to 127.0.0.1, TCP port 5001\n"
                "TCP window size: 4.00 MByte (default)\n"
                "------------------------------------------------------------\n"
                "[  1] local 127.0.0.1 port 40904 connected with 127.0.0.1 port 5001\n"
                "[ ID] Interval       Transfer     Bandwidth\n")


def _iperf2_log(steps: int) -> Iterator[str]:
    yield _IPERF2_HEAD
    for k in range(steps):
        yield f"[  1] {k}.0000-{k + 1}.0000 sec  1.06 GBytes  9.12 Gbits/sec\n"
    yield f"[  1] 0.0000-{steps}.0124 sec  5.85 GBytes  10.0 Gbits/sec\n"


def test_a_long_iperf2_log_keeps_a_bounded_number_of_intervals_and_an_exact_summary(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from netprobe import reporting
    from netprobe.tools.iperf2 import parse_output as p2
    from netprobe.tools.iperf2.tool import Iperf2Tool

    monkeypatch.setattr(reporting, "MAX_INTERVALS_KEPT", 50)
    monkeypatch.setattr(p2, "RAW_KEPT_CHARS", 10_000)
    reader = p2.TextReader(True)
    for line in _iperf2_log(1000):
        reader.feed(line)
    assert len(reader.records) <= 51  # the kept, and the last line of each stream
    text = "".join(_iperf2_log(1000))
    result = Iperf2Tool().parse([("client", text)])
    assert len(result.intervals) <= 50
    assert any("not kept" in w for w in result.warnings), result.warnings
    sender = result.summaries[0].sender
    assert sender is not None and sender.bits_per_second == 10.0e9  # the final line, exact
    assert sum(len(r.text) for r in result.raw) < len(text)  # the raw text is cut, and said


def test_a_test_past_the_spool_limit_is_read_from_disk_with_the_same_figures(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from netprobe.tools.iperf2 import parse_output as p2
    from netprobe.tools.iperf2.tool import Iperf2Tool

    lines = list(_iperf2_log(300))
    whole = [str(t) for t in Iperf2Tool().split_tests(iter(lines))]
    monkeypatch.setattr(p2, "SPOOL_CHARS", 2000)
    spooled = list(Iperf2Tool().split_tests(iter(lines)))
    assert len(spooled) == 1 and isinstance(spooled[0], p2.SpooledLog)
    assert "".join(spooled[0]) == whole[0]  # every line, in order, read again
    one, two = (Iperf2Tool().parse([("client", t)]) for t in (whole[0], spooled[0]))
    assert one.summaries == two.summaries and one.intervals == two.intervals
    assert one.spec == two.spec


def test_a_long_iperf2_csv_log_keeps_a_bounded_number_of_intervals(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from netprobe import reporting
    from netprobe.tools.iperf2 import parse_output as p2

    monkeypatch.setattr(reporting, "MAX_INTERVALS_KEPT", 50)
    rows = [f"20261205090000,127.0.0.1,40000,127.0.0.1,5001,1,{k}.0-{k + 1}.0,1000,8000\n"
            for k in range(500)]
    rows.append("20261205090000,127.0.0.1,40000,127.0.0.1,5001,1,0.0-500.0,500000,8000\n")
    parts = p2.parse_csv("".join(rows), True)
    assert len(parts.intervals) <= 51
    assert parts.summaries[0].sender.bytes == 500000  # the final row, exact
    assert any("not kept" in w for w in parts.warnings)
