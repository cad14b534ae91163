"""consensus.transport.framing: bytes in, messages out (no sockets)."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.transport.framing import (
    FRAME_PREFIX_BYTES,
    PROTOCOL_VERSION,
    FrameDecoder,
    Handshake,
    PeerStream,
    ProtocolError,
    encode_frame,
    encode_frames,
    hello,
)

MESSAGES = [
    [1, 2, [b"cmd", "op", None]],
    {"t": "x", "v": [1.5, True, False]},
    b"\x00" * 300,
    "é" * 50,
    2**63 - 1,
    [],
]


def decode_all(data: bytes, max_frame_bytes: int = 1 << 20) -> list:
    dec = FrameDecoder(max_frame_bytes)
    out = dec.feed(data)
    dec.eof()
    return out


def reason_of(fn) -> str:
    with pytest.raises(ProtocolError) as e:
        fn()
    return e.value.reason


def test_round_trip_and_multiple_frames_per_feed():
    stream = encode_frames(MESSAGES)
    assert stream == b"".join(encode_frame(m) for m in MESSAGES)
    assert decode_all(stream) == MESSAGES
    body = encode_frame(MESSAGES[0])[FRAME_PREFIX_BYTES:]
    assert struct.unpack(">I", encode_frame(MESSAGES[0])[:4]) == (len(body),)


def test_split_at_every_byte_boundary():
    stream = encode_frames(MESSAGES)
    for cut in range(len(stream) + 1):
        dec = FrameDecoder()
        assert dec.feed(stream[:cut]) + dec.feed(stream[cut:]) == MESSAGES
        dec.eof()


def test_one_byte_at_a_time():
    stream = encode_frames(MESSAGES)
    dec = FrameDecoder()
    out = []
    for i in range(len(stream)):
        out += dec.feed(stream[i : i + 1])
    assert out == MESSAGES and dec.buffered_bytes == 0


@settings(max_examples=100, deadline=None)
@given(
    msgs=st.lists(
        st.recursive(
            st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=20) | st.binary(max_size=40),
            lambda inner: st.lists(inner, max_size=4),
            max_leaves=10,
        ),
        max_size=12,
    ),
    cuts=st.lists(st.integers(0, 10_000), max_size=20),
)
def test_arbitrary_chunking_decodes_identically(msgs, cuts):
    stream = encode_frames(msgs)
    points = sorted({c % (len(stream) + 1) for c in cuts})
    dec = FrameDecoder()
    out, prev = [], 0
    for p in points + [len(stream)]:
        out += dec.feed(stream[prev:p])
        prev = p
    dec.eof()
    assert out == msgs


def test_oversized_prefix_is_rejected_before_the_body_is_buffered():
    dec = FrameDecoder(max_frame_bytes=1000)
    assert dec.feed(b"\x00\x00") == []
    assert reason_of(lambda: dec.feed(b"\x03\xe9")) == "oversized"  # 1001
    assert dec.buffered_bytes == 0
    # The decoder stays failed.
    assert reason_of(lambda: dec.feed(encode_frame(1))) == "oversized"
    assert reason_of(lambda: FrameDecoder(1000).feed(b"\xff\xff\xff\xff")) == "oversized"
    FrameDecoder(1000).feed(struct.pack(">I", 1000))  # exactly the max is fine


def test_encoder_refuses_what_the_peer_would_refuse():
    with pytest.raises(ValueError):
        encode_frame(b"x" * 2000, max_frame_bytes=1000)
    with pytest.raises(TypeError):
        encode_frame(object())


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # a byte msgpack never uses
        b"\x01\x02",  # extra data after the value
        b"\xa3ab",  # string shorter than announced
        b"\xa2\xff\xfe",  # invalid utf-8
        b"\x81\x01\x02",  # int map key
        b"\x91" * 5000 + b"\x01",  # nesting deeper than msgpack allows
    ],
)
def test_malformed_bodies(body):
    frame = struct.pack(">I", len(body)) + body
    assert reason_of(lambda: FrameDecoder().feed(frame)) == "malformed"


def test_empty_frame_is_malformed():
    assert reason_of(lambda: FrameDecoder().feed(b"\x00\x00\x00\x00")) == "malformed"


def test_truncated_at_eof():
    frame = encode_frame(MESSAGES[0])
    for cut in range(1, len(frame)):
        dec = FrameDecoder()
        assert dec.feed(frame[:cut]) == []
        assert reason_of(dec.eof) == "truncated"
    dec = FrameDecoder()
    dec.feed(frame)
    dec.eof()  # clean EOF between frames


def test_large_frame_in_small_pieces_is_linear_enough():
    big = b"z" * (4 << 20)
    frame = encode_frame(big, max_frame_bytes=8 << 20)
    dec = FrameDecoder(8 << 20)
    out = []
    for i in range(0, len(frame), 4096):  # 1025 feeds; quadratic copying would take ~4 GB of memmove
        out += dec.feed(frame[i : i + 4096])
    assert out == [big]


# --- handshake ---------------------------------------------------------------------

HS = Handshake("cellar-test", 1, {1, 2, 3})


@pytest.mark.parametrize(
    "msg, reason",
    [
        (hello("other", 2), "wrong-cluster"),
        (hello("cellar-test", 9), "unknown-node"),
        (hello("cellar-test", 1), "unknown-node"),  # our own id
        (hello("cellar-test", 2, PROTOCOL_VERSION + 1), "version"),
        ({"t": "hello", "cluster": "cellar-test", "node": "2", "version": 1}, "bad-handshake"),
        ({"t": "hello", "cluster": "cellar-test", "version": 1}, "bad-handshake"),
        ([1, 2, 3], "bad-handshake"),
        ("hello", "bad-handshake"),
    ],
)
def test_bad_hellos(msg, reason):
    assert reason_of(lambda: HS.check(msg)) == reason
    stream = PeerStream(HS)
    assert reason_of(lambda: stream.receive_data(encode_frame(msg))) == reason
    assert stream.peer_id is None
    assert reason_of(lambda: stream.receive_data(encode_frame([1]))) == reason  # stays failed


def test_good_hello_then_messages_in_the_same_read():
    peer = Handshake("cellar-test", 2, {1, 2, 3})
    stream = PeerStream(HS)
    data = peer.hello_frame() + encode_frames(MESSAGES[:3])
    assert msgpack.unpackb(peer.hello_frame()[4:]) == hello("cellar-test", 2)
    assert stream.receive_data(data[:5]) == []
    assert stream.receive_data(data[5:]) == MESSAGES[:3]
    assert stream.peer_id == 2
    assert stream.receive_data(encode_frame("more")) == ["more"]
    assert stream.receive_data(b"") == []


def test_dialer_checks_it_reached_the_node_it_dialed():
    stream = PeerStream(HS, expected_peer_id=3)
    assert reason_of(lambda: stream.receive_data(encode_frame(hello("cellar-test", 2)))) == "unknown-node"


def test_truncated_hello():
    stream = PeerStream(HS)
    stream.receive_data(HS.hello_frame()[:-1])
    assert reason_of(lambda: stream.receive_data(b"")) == "truncated"
