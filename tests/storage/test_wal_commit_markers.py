"""consensus.storage.wal, format 2: commit markers, salted checksums, torn tails that are not
corruption, directory durability, version-1 logs, streaming replay (issue 17)."""

from __future__ import annotations

import logging
import os
import struct

import crc32c
import pytest

import consensus.storage.wal as walmod
from consensus.storage.wal import (
    COMMIT_MARKER_BYTES,
    RECORD_HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    SEGMENT_HEADER_BYTES_V1,
    WAL,
    WALCorruption,
    encode_commit,
    encode_record,
    segment_name,
)

PAGE = 4096


def salt_of(path: str) -> int:
    with open(path, "rb") as f:
        return struct.unpack_from(">Q", f.read(SEGMENT_HEADER_BYTES), 20)[0]


def batches(tmp_path, sizes: list[int], payload_bytes: int = 100, close: bool = False) -> tuple[str, list[bytes]]:
    """A log of one sync per batch; the process 'crashes' at the end unless ``close``."""
    wal, _ = WAL.open(tmp_path)
    ps: list[bytes] = []
    for n in sizes:
        batch = [bytes([len(ps) + i & 0xFF]) * payload_bytes for i in range(n)]
        wal.append_many(batch)
        wal.sync()
        ps.extend(batch)
    if close:
        wal.close()
    else:
        wal.abandon()
    return os.path.join(tmp_path, segment_name(1)), ps


def test_a_zero_hole_before_intact_unacknowledged_records_is_a_torn_tail(tmp_path, caplog):
    """Power loss during a group commit kept a later page and lost an earlier one:
    the last batch has a zero hole followed by intact records and even its own
    intact commit marker. Nothing acknowledged is lost, so the replica starts."""
    wal, _ = WAL.open(tmp_path)
    acked = [bytes([i]) * 100 for i in range(10)]
    wal.append_many(acked)
    assert wal.sync() == 10
    acked_end = wal._seg_durable_end
    wal.append_many([bytes([50 + i]) * 100 for i in range(200)])  # ~23 KiB, several pages
    wal.prepare_sync()  # written with its marker, the fsync never completes
    wal.abandon()
    path = os.path.join(tmp_path, segment_name(1))
    hole = (acked_end // PAGE + 1) * PAGE
    with open(path, "r+b") as f:
        f.seek(hole)
        f.write(bytes(PAGE))  # page lost, later pages (and the marker) kept
    with caplog.at_level(logging.WARNING, logger="consensus.storage.wal"):
        wal, recovered = WAL.open(tmp_path)
    assert recovered == list(enumerate(acked, start=1))
    assert os.path.getsize(path) == acked_end
    assert any("torn tail" in r.getMessage() for r in caplog.records)
    assert wal.append(b"after") == 11
    wal.close()
    assert WAL.open(tmp_path)[1][-1] == (11, b"after")


def test_damage_before_a_point_a_later_marker_vouches_for_is_corruption(tmp_path):
    path, ps = batches(tmp_path, [5, 5, 5])
    # Batch 2's marker claims batch 1 was durable; damage in batch 1 is bit rot.
    offset = SEGMENT_HEADER_BYTES + 2 * (RECORD_HEADER_BYTES + 100) + RECORD_HEADER_BYTES
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\x00")
    with pytest.raises(WALCorruption) as err:
        WAL.open(tmp_path)
    assert "durable" in err.value.reason and err.value.offset == offset - RECORD_HEADER_BYTES


def test_damage_in_the_last_unvouched_batch_is_a_torn_tail(tmp_path):
    path, ps = batches(tmp_path, [5, 5, 5])
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - COMMIT_MARKER_BYTES - 3)
        f.write(b"\x00")
    wal, recovered = WAL.open(tmp_path)
    assert [p for _, p in recovered] == ps[:10]
    wal.close()


def test_records_without_a_commit_marker_are_not_replayed(tmp_path):
    wal, _ = WAL.open(tmp_path)
    wal.append_many([b"a", b"b"])
    wal.sync()
    wal.append_many([b"c", b"d"])
    wal.abandon(write_buffer=True)  # written, never marked, never acknowledged
    wal, recovered = WAL.open(tmp_path)
    assert recovered == [(1, b"a"), (2, b"b")]
    assert wal.append(b"C") == 3
    wal.close()


def test_a_torn_record_whose_payload_holds_a_valid_looking_record_is_not_replayed(tmp_path):
    """Even a payload that embeds a perfectly encoded next record (right salt, right
    seq) is never resynchronised onto: only a valid commit marker commits records."""
    wal, _ = WAL.open(tmp_path)
    wal.append_many([b"one", b"two"])
    wal.sync()
    path = os.path.join(tmp_path, segment_name(1))
    salt = salt_of(path)
    inner = encode_record(4, b"forged", salt)
    inner_v1 = encode_record(4, b"forged")
    outer = b"\x00" * 8 + inner + inner_v1 + b"\x00" * 8
    wal.append(outer)  # seq 3
    wal.sync()
    wal.abandon()
    size = os.path.getsize(path)
    # Tear record 3: its first bytes never reached the disk.
    start = size - COMMIT_MARKER_BYTES - RECORD_HEADER_BYTES - len(outer)
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(bytes(RECORD_HEADER_BYTES + 4))
    wal, recovered = WAL.open(tmp_path)
    assert recovered == [(1, b"one"), (2, b"two")]
    wal.close()


def test_a_marker_shaped_payload_without_the_salt_does_not_count(tmp_path):
    wal, _ = WAL.open(tmp_path)
    wal.append(b"x")
    wal.sync()
    fake = encode_commit(0, 10, 0, 0, 1 << 20)  # claims a lot, wrong salt
    wal.append(b"\x00" * 4 + fake)
    wal.sync()
    wal.abandon()
    path = os.path.join(tmp_path, segment_name(1))
    size = os.path.getsize(path)
    with open(path, "r+b") as f:  # tear the record that carries it
        f.seek(size - COMMIT_MARKER_BYTES - len(fake) - 4 - RECORD_HEADER_BYTES)
        f.write(bytes(RECORD_HEADER_BYTES))
    wal, recovered = WAL.open(tmp_path)
    assert recovered == [(1, b"x")]
    wal.close()


def test_a_zeroed_header_with_records_after_it_is_refused_not_deleted(tmp_path, caplog):
    wal, _ = WAL.open(tmp_path, segment_bytes_max=1024)
    wal.append_many([b"r" * 100 for _ in range(20)])  # several segments
    wal.sync()
    last = wal.segment_paths[-1]
    wal.abandon()
    with open(last, "r+b") as f:
        f.write(bytes(SEGMENT_HEADER_BYTES))
    size = os.path.getsize(last)
    with pytest.raises(WALCorruption) as err:
        WAL.open(tmp_path, segment_bytes_max=1024)
    assert err.value.path == last and "not deleted" in str(err.value)
    assert os.path.getsize(last) == size


def test_a_last_segment_of_zeros_is_a_torn_creation(tmp_path):
    path, ps = batches(tmp_path, [3])
    with open(os.path.join(tmp_path, segment_name(4)), "wb") as f:
        f.write(bytes(PAGE))  # size extended, data never written
    wal, recovered = WAL.open(tmp_path)
    assert [p for _, p in recovered] == ps
    assert wal.append(b"next") == 4
    wal.close()


def test_unsupported_version_is_one_clear_line(tmp_path):
    path, _ = batches(tmp_path, [2], close=True)
    with open(path, "r+b") as f:
        head = bytearray(f.read(SEGMENT_HEADER_BYTES))
        head[8:10] = (7).to_bytes(2, "big")
        head[28:32] = crc32c.crc32c(bytes(head[:28])).to_bytes(4, "big")
        f.seek(0)
        f.write(head)
    with pytest.raises(WALCorruption, match="unsupported segment version 7"):
        WAL.open(tmp_path)


def write_v1_log(directory, records: list[bytes], first_seq: int = 1) -> str:
    head = struct.pack(">8sHHQ", b"CELLRWAL", 1, 0, first_seq)
    head += struct.pack(">I", crc32c.crc32c(head))
    assert len(head) == SEGMENT_HEADER_BYTES_V1
    path = os.path.join(directory, segment_name(first_seq))
    with open(path, "wb") as f:
        f.write(head + b"".join(encode_record(first_seq + i, p) for i, p in enumerate(records)))
    return path


def test_a_version_1_log_is_read_and_appends_go_to_a_new_version_2_segment(tmp_path):
    v1 = write_v1_log(tmp_path, [b"old1", b"old2", b"old3"])
    with open(v1, "ab") as f:
        f.write(encode_record(4, b"torn")[:10])  # a v1 torn tail
    wal, recovered = WAL.open(tmp_path)
    assert recovered == [(1, b"old1"), (2, b"old2"), (3, b"old3")]
    assert wal.segment_paths == [v1, os.path.join(tmp_path, segment_name(4))]
    wal.append(b"new4")
    wal.close()
    wal, recovered = WAL.open(tmp_path)
    assert [p for _, p in recovered] == [b"old1", b"old2", b"old3", b"new4"]
    wal.close()


def test_an_empty_version_1_last_segment_is_replaced(tmp_path):
    write_v1_log(tmp_path, [])
    wal, recovered = WAL.open(tmp_path)
    assert recovered == [] and len(wal.segment_paths) == 1
    wal.append(b"a")
    wal.close()
    assert WAL.open(tmp_path)[1] == [(1, b"a")]


def _version_of(path: str) -> int:
    with open(path, "rb") as f:
        return struct.unpack_from(">H", f.read(SEGMENT_HEADER_BYTES), 8)[0]


def _set_version(path: str, version: int) -> None:
    with open(path, "r+b") as f:
        head = bytearray(f.read(SEGMENT_HEADER_BYTES))
        head[8:10] = version.to_bytes(2, "big")
        head[28:32] = crc32c.crc32c(bytes(head[:28])).to_bytes(4, "big")
        f.seek(0)
        f.write(head)


def test_a_version_2_log_is_read_and_appends_go_to_a_new_version_3_segment(tmp_path):
    """Version 3 is version 2's layout; the new number fences the data dir off from a
    build that reads only 1 and 2 (it would replay a WAL compacted against version-3
    snapshots on an empty state): the first open by this build closes a version-2
    last segment and starts a version-3 one, before any such snapshot can exist."""
    path, ps = batches(tmp_path, [2, 3], close=True)
    assert _version_of(path) == walmod.SEGMENT_VERSION == 4
    _set_version(path, 2)
    wal, recovered = WAL.open(tmp_path)
    assert [p for _, p in recovered] == ps
    new = os.path.join(tmp_path, segment_name(6))
    assert wal.segment_paths == [path, new] and _version_of(new) == 4 and _version_of(path) == 2
    wal.append(b"new6")
    wal.close()
    wal, recovered = WAL.open(tmp_path)
    assert [p for _, p in recovered] == ps + [b"new6"] and wal.segment_paths == [path, new]
    wal.close()


def test_an_empty_version_2_last_segment_is_replaced_by_a_version_3_one(tmp_path):
    path, _ = batches(tmp_path, [], close=True)
    _set_version(path, 2)
    wal, recovered = WAL.open(tmp_path)
    assert recovered == [] and len(wal.segment_paths) == 1 and _version_of(wal.segment_paths[0]) == 4
    wal.close()


def test_restart_at_makes_its_segment_before_it_deletes_the_old_ones(tmp_path, monkeypatch):
    """A crash after restart_at's new segment (version 3, FLAG_RESTART) is durable and
    before every old segment is gone: the next open finishes the restart."""
    wal, _ = WAL.open(tmp_path, segment_bytes_max=4096)
    wal.append_many([b"r" * 200] * 40)  # several segments
    wal.close()
    wal, _ = WAL.open(tmp_path, segment_bytes_max=4096)
    old = list(wal.segment_paths)
    assert len(old) > 2
    real_unlink, calls = os.unlink, [0]

    def unlink(path, *a, **k):
        calls[0] += 1
        if calls[0] == 2:
            raise OSError("the process dies here")
        return real_unlink(path, *a, **k)

    monkeypatch.setattr(walmod.os, "unlink", unlink)
    with pytest.raises(OSError):
        wal.restart_at(100)
    monkeypatch.undo()
    wal._release_lock()  # the process is gone: its lock with it
    assert os.path.exists(os.path.join(tmp_path, segment_name(100))) and os.path.exists(old[-1])
    wal, recovered = WAL.open(tmp_path, segment_bytes_max=4096)
    assert recovered == [] and wal.segment_paths == [os.path.join(tmp_path, segment_name(100))]
    assert wal.first_seq == 100 and wal.last_seq == 99
    assert wal.append(b"after") == 100
    wal.close()
    assert WAL.open(tmp_path)[1] == [(100, b"after")]


def test_a_torn_restart_segment_leaves_the_old_log(tmp_path):
    """restart_at's segment torn at creation (zeros): deleted at open like any torn
    creation; the old segments are the log again (and the node restarts again)."""
    wal, _ = WAL.open(tmp_path)
    wal.append_many([b"a", b"b", b"c"])
    wal.close()
    with open(os.path.join(tmp_path, segment_name(10)), "wb") as f:
        f.write(bytes(SEGMENT_HEADER_BYTES))
    wal, recovered = WAL.open(tmp_path)
    assert [p for _, p in recovered] == [b"a", b"b", b"c"]
    assert not os.path.exists(os.path.join(tmp_path, segment_name(10)))
    wal.close()


def test_stream_replay_yields_the_same_records(tmp_path):
    wal, _ = WAL.open(tmp_path, segment_bytes_max=2048)
    ps = [bytes([i % 256]) * (i % 90) for i in range(300)]
    wal.append_many(ps)
    wal.close()
    wal, listed = WAL.open(tmp_path, segment_bytes_max=2048, replay_from_seq=17)
    wal.close()
    wal, streamed = WAL.open(tmp_path, segment_bytes_max=2048, replay_from_seq=17, stream=True)
    assert not isinstance(streamed, list)
    assert list(streamed) == listed == list(enumerate(ps, start=1))[16:]
    wal.close()


def record_dir_ops(monkeypatch) -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []
    real_unlink, real_fsync_dir = os.unlink, walmod.fsync_dir
    monkeypatch.setattr(walmod.os, "unlink", lambda p: (calls.append(("unlink", os.path.basename(p))), real_unlink(p))[1])
    monkeypatch.setattr(walmod, "fsync_dir", lambda d: (calls.append(("fsync_dir", d)), real_fsync_dir(d))[1])
    return calls


def test_compaction_makes_each_deletion_durable_oldest_first(tmp_path, monkeypatch):
    wal, _ = WAL.open(tmp_path, segment_bytes_max=1024)
    wal.append_many([b"c" * 200 for _ in range(30)])
    wal.sync()
    names = [os.path.basename(p) for p in wal.segment_paths]
    calls = record_dir_ops(monkeypatch)
    removed = wal.compact(wal.durable_seq)
    monkeypatch.undo()
    assert removed == len(names) - 1
    expected = []
    for name in names[:-1]:
        expected += [("unlink", name), ("fsync_dir", str(tmp_path))]
    assert calls == expected
    wal.close()


def test_recovery_ends_with_the_directory_and_its_parent_synced(tmp_path, monkeypatch):
    d = tmp_path / "data" / "wal"
    WAL.open(d)[0].close()
    calls = record_dir_ops(monkeypatch)
    WAL.open(d)[0].close()
    monkeypatch.undo()
    assert ("fsync_dir", str(d)) in calls and ("fsync_dir", str(tmp_path / "data")) in calls


def test_makedirs_durable_syncs_every_parent_it_changes(tmp_path, monkeypatch):
    calls = record_dir_ops(monkeypatch)
    walmod.makedirs_durable(tmp_path / "a" / "b" / "c")
    walmod.makedirs_durable(tmp_path / "a" / "b" / "c")  # exists: its parent is still synced
    monkeypatch.undo()
    assert calls == [("fsync_dir", str(tmp_path)), ("fsync_dir", str(tmp_path / "a")),
                     ("fsync_dir", str(tmp_path / "a" / "b")), ("fsync_dir", str(tmp_path / "a" / "b"))]


def test_a_version_3_log_is_read_and_appends_go_to_a_new_version_4_segment(tmp_path):
    """Version 4 (version 2's layout) fences a log that may hold early-send
    reservations off from the builds before them (docs/early-send.md): they read 1 to
    3 and would skip the "CR" records. The first open by this build closes a version-3
    last segment, so a reservation only ever goes into a version-4 segment."""
    path, ps = batches(tmp_path, [2, 3], close=True)
    _set_version(path, 3)
    wal, recovered = WAL.open(tmp_path)
    assert [p for _, p in recovered] == ps
    new = os.path.join(tmp_path, segment_name(6))
    assert wal.segment_paths == [path, new] and _version_of(new) == 4 and _version_of(path) == 3
    wal.append(b"CR")
    wal.close()
    wal, recovered = WAL.open(tmp_path)
    assert [p for _, p in recovered] == ps + [b"CR"]
    wal.close()
