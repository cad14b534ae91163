"""consensus.storage.snapshot (issue 17): naming monotonic by slot, durable folders, a bounded
and verified receive, serving without a whole-file CRC per chunk."""

from __future__ import annotations

import os

import pytest

import consensus.storage.snapshot as snapmod
import consensus.storage.wal as walmod
from consensus.storage.snapshot import (
    META_RECEIVE_BYTES_MAX,
    Chunk,
    ChunkError,
    Snapshot,
    SnapshotReceiver,
    chunk_at,
    compactable_seq,
    decode_snapshot,
    encode_snapshot,
    iter_chunks,
    load_latest,
    snapshot_name,
    write_snapshot,
)


def snap(seq: int, slot: int | None, size: int = 300) -> Snapshot:
    return Snapshot(seq, f"slot={slot}".encode(), bytes((seq + i) % 251 for i in range(size)), slot)


def test_slot_round_trip_and_name():
    s = snap(7, 123)
    assert decode_snapshot(encode_snapshot(s)) == s
    assert snapshot_name(7, 123) == "snap-slot-00000000000000000123.snap"


def test_a_just_installed_snapshot_survives_a_lower_wal_seq(tmp_path):
    """The WAL seq went down after a torn-tail truncation; the installed (newer)
    snapshot is named by its slot, so pruning keeps it and load_latest returns it."""
    write_snapshot(tmp_path, snap(900, 5000))
    write_snapshot(tmp_path, snap(950, 10000))
    installed = snap(40, 25000)  # wal.last_seq is 40 now
    path = write_snapshot(tmp_path, installed, keep=1)
    assert os.listdir(tmp_path) == [os.path.basename(path)]
    assert load_latest(tmp_path) == installed


def test_slot_named_snapshots_are_newer_than_seq_named_ones(tmp_path):
    write_snapshot(tmp_path, snap(99999, None))  # written by an older version
    write_snapshot(tmp_path, snap(10, 1))
    assert load_latest(tmp_path).slot == 1
    assert compactable_seq(tmp_path) == 99999
    write_snapshot(tmp_path, snap(20, 2))
    assert compactable_seq(tmp_path) == 10


def test_a_slot_file_whose_header_disagrees_with_its_name_is_skipped(tmp_path):
    write_snapshot(tmp_path, snap(1, 1))
    with open(tmp_path / snapshot_name(0, 2), "wb") as f:
        f.write(encode_snapshot(snap(2, 3)))
    assert load_latest(tmp_path) == snap(1, 1)


def test_write_snapshot_syncs_the_folder_into_its_parent(tmp_path, monkeypatch):
    calls: list[str] = []
    real = walmod.fsync_dir
    monkeypatch.setattr(walmod, "fsync_dir", lambda d: (calls.append(d), real(d))[1])
    write_snapshot(tmp_path / "data" / "snapshots", snap(1, 1))
    monkeypatch.undo()
    assert str(tmp_path / "data") in calls and str(tmp_path) in calls


def test_receiver_refuses_a_bogus_claim_at_the_first_chunk():
    rx = SnapshotReceiver(total_bytes_max=4 << 30)
    junk = b"x" * 1000
    c = Chunk(0, 3 << 30, 0, __import__("crc32c").crc32c(junk), junk)
    with pytest.raises(ChunkError) as e:
        rx.feed(c)
    assert e.value.reason == "bad-header" and rx.next_offset == 0
    # A real header that promises fewer bytes than the transfer claims.
    data = encode_snapshot(snap(1, 1))
    first = next(iter_chunks(data, 100))
    lie = Chunk(0, len(data) + (1 << 30), first.total_crc, first.crc, first.data)
    with pytest.raises(ChunkError) as e:
        rx.feed(lie)
    assert e.value.reason == "bad-header"


def test_receiver_caps_metadata_size():
    data = bytearray(encode_snapshot(snap(1, 1)))
    # meta_len field of a version-2 header (offset 28).
    data[28:32] = (META_RECEIVE_BYTES_MAX + 1).to_bytes(4, "big")
    rx = SnapshotReceiver(total_bytes_max=1 << 40)
    with pytest.raises(ChunkError) as e:
        rx.feed(next(iter_chunks(bytes(data), 1 << 20)))
    assert e.value.reason == "bad-header"


def test_receiver_checks_the_whole_file_before_returning_it():
    data = bytearray(encode_snapshot(snap(1, 1, size=3000)))
    data[-1] ^= 1  # the transfer's own CRCs are consistent, the file's is not
    chunks = list(iter_chunks(bytes(data), 1000))
    rx = SnapshotReceiver(total_bytes_max=1 << 20)
    for c in chunks[:-1]:
        assert rx.feed(c) is None
    with pytest.raises(ChunkError) as e:
        rx.feed(chunks[-1])
    assert e.value.reason == "checksum" and rx.next_offset == 0


def test_chunk_at_computes_the_whole_crc_once_per_image(monkeypatch):
    data = encode_snapshot(snap(1, 1, size=50_000))
    sizes: list[int] = []
    real = snapmod.crc32c.crc32c

    class Counting:
        @staticmethod
        def crc32c(b, *a):
            sizes.append(len(b))
            return real(b, *a)

    monkeypatch.setattr(snapmod, "crc32c", Counting)
    chunks = [chunk_at(data, off, 4096) for off in range(0, len(data), 4096)]
    monkeypatch.undo()
    assert sum(1 for n in sizes if n == len(data)) == 1
    rx = SnapshotReceiver(total_bytes_max=1 << 20)
    out = [rx.feed(c) for c in chunks]
    assert out[-1] == data
