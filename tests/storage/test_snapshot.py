"""consensus.storage.snapshot: atomic files, fallback to the older snapshot, chunked transfer."""

from __future__ import annotations

import logging
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.storage.snapshot import (
    SNAPSHOT_HEADER_BYTES,
    Chunk,
    ChunkError,
    Snapshot,
    SnapshotCorrupt,
    SnapshotReceiver,
    compactable_seq,
    decode_snapshot,
    encode_snapshot,
    iter_chunks,
    load_latest,
    snapshot_name,
    write_snapshot,
)


def snap(seq: int, size: int = 1000) -> Snapshot:
    return Snapshot(seq, meta=f"view={seq}".encode(), body=bytes((seq + i) % 251 for i in range(size)))


def test_encode_decode_round_trip_and_header():
    s = snap(42)
    data = encode_snapshot(s)
    assert len(data) == SNAPSHOT_HEADER_BYTES + len(s.meta) + len(s.body)
    assert decode_snapshot(data) == s
    assert decode_snapshot(encode_snapshot(Snapshot(0, b"", b""))) == Snapshot(0, b"", b"")


@pytest.mark.parametrize("offset", [0, 9, 12, 20, 30, SNAPSHOT_HEADER_BYTES, SNAPSHOT_HEADER_BYTES + 3, -1])
def test_any_flipped_byte_is_detected(offset):
    data = bytearray(encode_snapshot(snap(7)))
    data[offset] ^= 0x01
    with pytest.raises(SnapshotCorrupt):
        decode_snapshot(bytes(data), "x.snap")


def test_write_then_load_latest(tmp_path):
    assert load_latest(tmp_path) is None
    assert load_latest(tmp_path / "missing") is None
    path = write_snapshot(tmp_path, snap(10))
    assert os.path.basename(path) == snapshot_name(10)
    assert load_latest(tmp_path) == snap(10)
    write_snapshot(tmp_path, snap(20))
    assert load_latest(tmp_path) == snap(20)


def test_keeps_the_last_two(tmp_path):
    for seq in (10, 20, 30, 40):
        write_snapshot(tmp_path, snap(seq))
    assert sorted(os.listdir(tmp_path)) == [snapshot_name(30), snapshot_name(40)]


def test_compactable_seq_is_the_oldest_retained_snapshot(tmp_path):
    assert compactable_seq(tmp_path) == 0
    write_snapshot(tmp_path, snap(10))
    assert compactable_seq(tmp_path) == 0  # an only snapshot may be damaged: keep the WAL
    write_snapshot(tmp_path, snap(20))
    assert compactable_seq(tmp_path) == 10
    write_snapshot(tmp_path, snap(30))
    assert compactable_seq(tmp_path) == 20


def test_crash_mid_write_leaves_the_previous_snapshot(tmp_path):
    write_snapshot(tmp_path, snap(10))
    # A crash before the rename: only a temporary file exists for the new one.
    data = encode_snapshot(snap(20))
    with open(tmp_path / (snapshot_name(20) + ".tmp"), "wb") as f:
        f.write(data[: len(data) // 2])
    assert load_latest(tmp_path) == snap(10)
    write_snapshot(tmp_path, snap(30))  # cleans the leftover up
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "rename"])
def test_damaged_newest_snapshot_falls_back_to_the_older_one(tmp_path, caplog, damage):
    write_snapshot(tmp_path, snap(10))
    newest = write_snapshot(tmp_path, snap(20))
    if damage == "truncate":
        os.truncate(newest, os.path.getsize(newest) - 100)
    elif damage == "flip":
        with open(newest, "r+b") as f:
            f.seek(500)
            b = f.read(1)
            f.seek(500)
            f.write(bytes([b[0] ^ 0xFF]))
    elif damage == "empty":
        os.truncate(newest, 0)
    else:  # an intact snapshot of seq 10 filed under the newest name, 30
        with open(tmp_path / snapshot_name(30), "wb") as f:
            f.write(encode_snapshot(snap(10)))
    with caplog.at_level(logging.WARNING, logger="consensus.storage.snapshot"):
        loaded = load_latest(tmp_path)
    if damage == "rename":
        assert loaded == snap(20)
        assert any(snapshot_name(30) in r.getMessage() for r in caplog.records)
    else:
        assert loaded == snap(10)
        assert any(newest in r.getMessage() for r in caplog.records)


def test_all_damaged_means_none(tmp_path):
    p = write_snapshot(tmp_path, snap(10))
    os.truncate(p, 3)
    assert load_latest(tmp_path) is None


# --- chunked transfer ----------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=3000), chunk_bytes=st.integers(1, 700))
def test_chunks_reassemble(data, chunk_bytes):
    receiver = SnapshotReceiver(total_bytes_max=4096, image=False)  # the transfer layer alone
    chunks = list(iter_chunks(data, chunk_bytes))
    assert all(len(c.data) <= chunk_bytes for c in chunks)
    results = [receiver.feed(Chunk.from_wire(c.to_wire())) for c in chunks]
    assert results[:-1] == [None] * (len(chunks) - 1)
    assert results[-1] == data and receiver.done


def test_chunk_faults_are_rejected_and_the_transfer_can_resume():
    data = encode_snapshot(snap(5, size=5000))
    chunks = list(iter_chunks(data, 1000))
    rx = SnapshotReceiver(total_bytes_max=1 << 20)
    assert rx.feed(chunks[0]) is None

    bad = Chunk(chunks[1].offset, chunks[1].total, chunks[1].total_crc, chunks[1].crc, b"X" + chunks[1].data[1:])
    with pytest.raises(ChunkError) as e:
        rx.feed(bad)
    assert e.value.reason == "bad-chunk"

    with pytest.raises(ChunkError) as e:
        rx.feed(chunks[2])  # skipped ahead
    assert e.value.reason == "out-of-order"
    with pytest.raises(ChunkError) as e:
        rx.feed(chunks[0])  # duplicate
    assert e.value.reason == "out-of-order"

    c1 = chunks[1]
    with pytest.raises(ChunkError) as e:
        rx.feed(Chunk(c1.offset, c1.total + 1, c1.total_crc, c1.crc, c1.data))
    assert e.value.reason == "wrong-total"
    assert rx.next_offset == 1000  # every rejection left the receiver unchanged

    for c in chunks[1:-1]:
        assert rx.feed(c) is None
    assert rx.feed(chunks[-1]) == data
    assert decode_snapshot(data) == snap(5, size=5000)
    with pytest.raises(ChunkError):
        rx.feed(chunks[-1])


def test_final_checksum_mismatch_restarts_the_transfer():
    data = b"a" * 2500
    # Every chunk is self-consistent, but they belong to different wholes.
    chunks = list(iter_chunks(data, 1000))
    forged = list(iter_chunks(b"b" * 2500, 1000))
    mixed = [chunks[0], Chunk(1000, 2500, chunks[0].total_crc, forged[1].crc, forged[1].data), chunks[2]]
    rx = SnapshotReceiver(total_bytes_max=10_000, image=False)  # the transfer layer alone
    rx.feed(mixed[0])
    rx.feed(mixed[1])
    with pytest.raises(ChunkError) as e:
        rx.feed(mixed[2])
    assert e.value.reason == "checksum"
    assert rx.next_offset == 0 and not rx.done
    for c in chunks[:-1]:
        assert rx.feed(c) is None
    assert rx.feed(chunks[-1]) == data


def test_oversized_transfer_and_overrun_are_wrong_total():
    rx = SnapshotReceiver(total_bytes_max=100)
    with pytest.raises(ChunkError) as e:
        rx.feed(next(iter_chunks(b"x" * 101, 50)))
    assert e.value.reason == "wrong-total"
    c = next(iter_chunks(b"x" * 50, 50))
    with pytest.raises(ChunkError) as e:
        rx.feed(Chunk(0, 10, c.total_crc, c.crc, c.data))
    assert e.value.reason == "wrong-total"


@pytest.mark.parametrize("raw", [None, [1, 2, 3], [0, 1, 2, 3, "str"], [-1, 1, 2, 3, b""], "x"])
def test_malformed_wire_chunks(raw):
    with pytest.raises(ChunkError) as e:
        Chunk.from_wire(raw)
    assert e.value.reason == "malformed"


def test_a_snapshot_with_live_records_round_trips_and_transfers(tmp_path):
    """Version 3: the owner's live records after the body, under the same checksum."""
    from consensus.storage.snapshot import SNAPSHOT_HEADER_BYTES_V3, SnapshotReceiver, iter_chunks

    s = Snapshot(41, b"meta", b"body" * 100, slot=7, live=b"live records")
    data = encode_snapshot(s)
    assert len(data) == SNAPSHOT_HEADER_BYTES_V3 + 4 + 400 + 12
    assert decode_snapshot(data) == s
    path = write_snapshot(tmp_path, s)
    assert load_latest(tmp_path) == s and path.endswith("snap-slot-00000000000000000007.snap")
    for offset in (SNAPSHOT_HEADER_BYTES_V3 + 2, len(data) - 1):  # meta and live records are checked too
        bad = bytearray(data)
        bad[offset] ^= 1
        with pytest.raises(SnapshotCorrupt):
            decode_snapshot(bytes(bad))
    receiver = SnapshotReceiver(1 << 20)
    got = None
    for chunk in iter_chunks(data, 17):
        got = receiver.feed(chunk)
    assert got == data
    plain = Snapshot(41, b"meta", b"body", slot=7)  # no live records: still version 2
    assert encode_snapshot(plain)[8:10] == b"\x00\x02" and decode_snapshot(encode_snapshot(plain)) == plain
    with pytest.raises(ValueError):
        encode_snapshot(Snapshot(1, b"m", b"b", live=b"x"))  # live records need a slot
