"""The wire codec: every message round-trips; garbage raises RemoteProtocolError only."""

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.core import messages as M

SAMPLES = [
    M.CAccept(1, 2, 3, 34, [[7, 1, ["put", "k", "v"]]]),
    M.CAccept(0, 0, 0, 0, None),
    M.CAck(0, 1, 2, 3, True),
    M.CCommit(0, 1, 2, 3, False, None),
    M.CRequest(2, 1, 9, ["k"]),
    M.CPrepare(0, 1, 2, 65, 9),
    M.CPromise(0, 1, 65, True, [[2, 33, None, False]]),
    M.OAccept(3, 10, [0, 1, -1, 2], True, 8),
    M.OAck(3, 14),
    M.OCommit(3, 14, 12, [1, 2]),
    M.Forward(0, [["c", 1, ["get", "k"]]]),
    M.MAccept(0, 5, [[["c", 1, ["put", "k", 1]]]]),
    M.MAck(0, 6),
    M.MCommit(0, 6, 5, [None]),
    M.Fetch(0, 1, 4),
    M.Compacted(33, 120, 1, 40),
    M.VRequest(33, 10),
    M.Vote(33, 9, [[10, 1, 0, False]], [3, -1, 2], 33, [3, -1, 1]),
    M.PreVote(65),
    M.PreVoteReply(65, True),
    M.EpochNotice(-1, 3),
    M.Ping(33, 1234),
    M.Pong(33, 1234),
    M.RRequest(33, 7, "key"),
    M.RReply(33, 7, 99),
    M.Handover(33, 2),
    M.Straggler(33, True),
    M.Probe(33, 1234),
    M.Echo(33, 1234),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    src, out = M.decode_envelope(M.encode_envelope(4, [msg, msg]))
    assert src == 4 and out == [msg, msg]


def test_every_message_type_has_a_sample():
    assert {type(m) for m in SAMPLES} == set(M._REGISTRY.values())


@pytest.mark.parametrize(
    "raw",
    [
        b"\xc1",  # never-used msgpack byte
        msgpack.packb([1]),
        msgpack.packb([1, [[999, 1]]]),  # unknown code
        msgpack.packb([1, [[1, 0, 0]]]),  # CAccept with too few fields
        msgpack.packb([1, [[1, "x", 0, 0, 0, None]]]),  # wrong field type
        msgpack.packb([1, [[11, 0, True]]]),  # bool where an int belongs
        msgpack.packb({"a": 1}),
        b"",
    ],
)
def test_malformed_envelopes_are_refused(raw):
    with pytest.raises(M.RemoteProtocolError):
        M.decode_envelope(raw)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_never_raises_anything_else(data):
    try:
        M.decode_envelope(data)
    except M.RemoteProtocolError:
        pass
