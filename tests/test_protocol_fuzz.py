"""Property tests of the control protocol's decoders: arbitrary and mutated input raises
only netprobe's ProtocolError, and the frame reader never buffers beyond its limit."""

from __future__ import annotations

import contextlib
import json
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from netprobe.engine import protocol
from netprobe.engine.conduct import sent_datagrams
from netprobe.engine.protocol import DataHello, FrameReader
from netprobe.errors import ProtocolError

from .budget import scaled

LIMIT = 1024

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)  # what encode() can send
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def frame(body: bytes) -> bytes:
    return struct.pack("!I", len(body)) + body


def good_frames() -> st.SearchStrategy[bytes]:
    messages = st.dictionaries(st.text(max_size=8), json_values, max_size=5).map(
        lambda d: {**d, "type": "x"}
    )
    return messages.map(lambda m: frame(json.dumps(m).encode()))


def mutate(data: bytes, flips: list[tuple[int, int]]) -> bytes:
    buf = bytearray(data)
    for pos, value in flips:
        if buf:
            buf[pos % len(buf)] = value
    return bytes(buf)


def feed_all(reader: FrameReader, data: bytes, chunk: int) -> None:
    for start in range(0, len(data), chunk):
        try:
            reader.feed(data[start : start + chunk])
        except ProtocolError:
            return
        assert reader.buffered <= LIMIT + chunk


@settings(max_examples=scaled(400), deadline=None)
@given(st.binary(max_size=4096), st.integers(1, 300))
def test_random_bytes_raise_only_protocol_error(data: bytes, chunk: int) -> None:
    feed_all(FrameReader(LIMIT), data, chunk)


@settings(max_examples=scaled(300), deadline=None)
@given(
    st.lists(good_frames(), min_size=1, max_size=4),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
    st.integers(1, 64),
)
def test_mutated_frames_raise_only_protocol_error(
    frames: list[bytes], flips: list, chunk: int
) -> None:
    feed_all(FrameReader(LIMIT), mutate(b"".join(frames), flips), chunk)


@settings(max_examples=scaled(100), deadline=None)
@given(st.lists(good_frames(), min_size=1, max_size=5), st.integers(1, 50))
def test_valid_frames_decode_whatever_the_chunking(frames: list[bytes], chunk: int) -> None:
    reader, got = FrameReader(1 << 20), []
    data = b"".join(frames)
    for start in range(0, len(data), chunk):
        got += reader.feed(data[start : start + chunk])
    assert len(got) == len(frames) and all(m["type"] == "x" for m in got)
    assert reader.buffered == 0


def test_huge_length_prefix_is_refused_before_any_body() -> None:
    reader = FrameReader(LIMIT)
    try:
        reader.feed(b"\xff\xff\xff\xff")
    except ProtocolError as exc:
        assert "exceeds" in str(exc)
    else:
        raise AssertionError("a 4 GiB frame was accepted")


@settings(max_examples=scaled(300), deadline=None)
@given(st.binary(max_size=40))
def test_hello_decoders_raise_only_protocol_error(data: bytes) -> None:
    for decode in (protocol.unpack_hello, protocol.unpack_data_hello):
        with contextlib.suppress(ProtocolError):
            decode(data)


@given(
    st.binary(min_size=16, max_size=16),
    st.integers(0, 65535),
    st.sampled_from(sorted(protocol.DIRECTION_CODES)),
)
def test_data_hello_round_trip(cookie: bytes, stream_id: int, direction: str) -> None:
    hello = DataHello(cookie, stream_id, direction)
    packed = protocol.pack_data_hello(protocol.KIND_DATA, hello)
    assert protocol.unpack_hello(packed[: protocol.HELLO_BYTES]) == protocol.KIND_DATA
    assert protocol.unpack_data_hello(packed[protocol.HELLO_BYTES :]) == hello


def test_deeply_nested_json_is_a_protocol_error() -> None:
    body = b"[" * 50_000 + b"]" * 50_000
    try:
        FrameReader(1 << 20).feed(frame(body))
    except ProtocolError:
        return
    raise AssertionError("nested JSON was accepted as a message")


def test_a_sent_messages_datagram_counts_keep_only_well_formed_entries() -> None:
    # The peer's counts make the receivers' tail loss: one of another shape (a float, a
    # negative or boolean count, a bad direction) must not become a figure or an exception.
    items = [[1, "client_to_server", 11], [2, "client_to_server", -1], [3, 7, 5],
             [4, "client_to_server", 2.5], [True, "client_to_server", 3], [5, "x"],
             [6, "server_to_client", 1 << 64], "junk", [7, "server_to_client", 0]]
    assert sent_datagrams(items) == {(1, "client_to_server"): 11, (7, "server_to_client"): 0}
    assert sent_datagrams({"1": 5}) == {} and sent_datagrams(None) == {}


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner, max_size=4), max_leaves=20))
@settings(max_examples=scaled(200), deadline=None)
def test_sent_datagram_counts_of_any_shape_never_raise(items: object) -> None:
    for (stream_id, direction), count in sent_datagrams(items).items():
        assert type(stream_id) is int and isinstance(direction, str) and type(count) is int
