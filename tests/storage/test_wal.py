"""consensus.storage.wal: format, recovery rules (torn tail vs corruption), fsync modes, group commit."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import struct
import tempfile
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consensus.storage.wal import (
    COMMIT_MARKER_BYTES,
    RECORD_HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    WAL,
    CommitQueueFull,
    GroupCommitter,
    WALCorruption,
    WALError,
    WALFailed,
    encode_record,
    segment_name,
)


def payloads(n: int, size: int = 20, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(0, size)) for _ in range(n)]


def record_offset(ps: list[bytes], index: int) -> int:
    """Byte offset of record ``index`` (0-based) in a single-segment log of ``ps``."""
    return SEGMENT_HEADER_BYTES + sum(RECORD_HEADER_BYTES + len(p) for p in ps[:index])


def write_log(directory, ps: list[bytes], **kw) -> str:
    wal, recovered = WAL.open(directory, **kw)
    assert recovered == []
    wal.append_many(ps)
    wal.sync()
    wal.close()
    return os.path.join(directory, segment_name(1))


def flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def reopen(directory, **kw) -> tuple[WAL, list[tuple[int, bytes]]]:
    return WAL.open(directory, **kw)


# --- round trip, rotation ----------------------------------------------------------


def test_round_trip(tmp_path):
    ps = payloads(100)
    wal, recovered = WAL.open(tmp_path)
    assert recovered == [] and wal.last_seq == 0 and wal.durable_seq == 0
    assert wal.append(ps[0]) == 1
    assert wal.append_many(ps[1:]) == 100
    assert wal.durable_seq == 0
    assert wal.sync() == 100
    wal.close()

    wal, recovered = reopen(tmp_path)
    assert recovered == list(enumerate(ps, start=1))
    assert (wal.first_seq, wal.last_seq, wal.durable_seq) == (1, 100, 100)
    assert wal.append(b"next") == 101
    wal.close()
    _, recovered = reopen(tmp_path)
    assert recovered[-1] == (101, b"next")


def test_record_encoding_is_documented_format():
    rec = encode_record(7, b"abc")
    length, _crc, seq = struct.unpack(">IIQ", rec[:RECORD_HEADER_BYTES])
    assert (length, seq, rec[RECORD_HEADER_BYTES:]) == (3, 7, b"abc")


def test_many_records_across_segment_rotation(tmp_path):
    ps = payloads(2000, size=200, seed=2)
    wal, _ = WAL.open(tmp_path, segment_bytes_max=4096)
    for i in range(0, len(ps), 37):
        wal.append_many(ps[i : i + 37])
        wal.sync()
    assert len(wal.segment_paths) > 20
    wal.close()
    for path in os.listdir(tmp_path):
        assert path == "LOCK" or os.path.getsize(tmp_path / path) <= 4096
    wal, recovered = reopen(tmp_path, segment_bytes_max=4096)
    assert recovered == list(enumerate(ps, start=1))
    # Segment file names carry their first seq.
    firsts = sorted(int(p[4:24]) for p in os.listdir(tmp_path) if p.startswith("wal-"))
    assert firsts[0] == 1 and firsts == sorted(set(firsts))
    wal.close()


def test_replay_from_seq_skips_but_still_verifies(tmp_path):
    ps = payloads(50)
    write_log(tmp_path, ps)
    wal, recovered = reopen(tmp_path, replay_from_seq=41)
    assert [s for s, _ in recovered] == list(range(41, 51))
    wal.close()
    flip_byte(os.path.join(tmp_path, segment_name(1)), record_offset(ps, 3) + RECORD_HEADER_BYTES - 1)
    with pytest.raises(WALCorruption):
        reopen(tmp_path, replay_from_seq=41)


def test_record_larger_than_a_segment_is_refused(tmp_path):
    wal, _ = WAL.open(tmp_path, segment_bytes_max=1024)
    with pytest.raises(ValueError):
        wal.append(bytes(1024))
    # Room is kept for the commit marker that closes the batch.
    with pytest.raises(ValueError):
        wal.append(bytes(1024 - SEGMENT_HEADER_BYTES - RECORD_HEADER_BYTES))
    assert wal.append(bytes(1024 - SEGMENT_HEADER_BYTES - RECORD_HEADER_BYTES - COMMIT_MARKER_BYTES)) == 1
    wal.close()


def test_second_open_of_the_same_directory_is_refused(tmp_path):
    wal, _ = WAL.open(tmp_path)
    with pytest.raises(WALError, match="locked"):
        WAL.open(tmp_path)
    wal.close()
    WAL.open(tmp_path)[0].close()


# --- torn tails --------------------------------------------------------------------


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param(lambda: encode_record(11, b"x" * 40)[:7], id="partial-header"),
        pytest.param(lambda: encode_record(11, b"x" * 40)[:30], id="partial-payload"),
        pytest.param(lambda: bytes(4096), id="zero-filled"),
        pytest.param(lambda: encode_record(11, b"x" * 40)[:20] + bytes(500), id="partial-then-zeros"),
        pytest.param(lambda: struct.pack(">IIQ", 1 << 30, 0, 11), id="length-past-eof"),
    ],
)
def test_torn_tail_is_truncated_and_appends_continue(tmp_path, caplog, tail):
    ps = payloads(10)
    path = write_log(tmp_path, ps)
    good_size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(tail())

    with caplog.at_level(logging.WARNING, logger="consensus.storage.wal"):
        wal, recovered = reopen(tmp_path)
    assert recovered == list(enumerate(ps, start=1))
    assert os.path.getsize(path) == good_size
    assert any(path in r.getMessage() and str(good_size) in r.getMessage() for r in caplog.records)
    assert wal.append(b"after") == 11
    wal.close()
    wal, recovered = reopen(tmp_path)
    assert recovered[-1] == (11, b"after") and len(recovered) == 11
    wal.close()


def test_flipped_byte_in_the_last_batch_after_a_crash_is_a_torn_tail(tmp_path):
    # Documented: damage confined to the last batch of a log that was not closed
    # cleanly cannot be told apart from a torn write, so it is truncated like one.
    ps = payloads(10, size=30)
    wal, _ = WAL.open(tmp_path)
    wal.append_many(ps[:9])
    wal.sync()
    wal.append(ps[9])
    wal.sync()
    wal.abandon()  # no seal: nothing vouches for the last batch
    path = os.path.join(tmp_path, segment_name(1))
    flip_byte(path, os.path.getsize(path) - COMMIT_MARKER_BYTES - 1)
    wal, recovered = reopen(tmp_path)
    assert recovered == list(enumerate(ps[:9], start=1))
    assert os.path.getsize(path) == record_offset(ps, 9) + COMMIT_MARKER_BYTES
    wal.close()


def test_flipped_byte_in_the_last_record_after_a_clean_close_is_corruption(tmp_path):
    # close() seals the segment with a marker vouching for everything synced.
    ps = payloads(10, size=30)
    path = write_log(tmp_path, ps)
    flip_byte(path, record_offset(ps, 10) - 1)
    with pytest.raises(WALCorruption) as err:
        reopen(tmp_path)
    assert err.value.offset == record_offset(ps, 9) and "durable" in err.value.reason


def test_torn_segment_creation_is_discarded(tmp_path):
    ps = payloads(5)
    write_log(tmp_path, ps)
    # A crash while creating the next segment: the file exists, its header does not.
    with open(os.path.join(tmp_path, segment_name(6)), "wb") as f:
        f.write(b"CELL")
    wal, recovered = reopen(tmp_path)
    assert len(recovered) == 5
    assert wal.append(b"x") == 6
    wal.close()
    assert len(reopen(tmp_path)[1]) == 6


# --- corruption --------------------------------------------------------------------


def test_flipped_byte_mid_log_fails_naming_file_and_offset(tmp_path):
    ps = payloads(100, size=40)
    path = write_log(tmp_path, ps)
    offset = record_offset(ps, 50)
    flip_byte(path, offset + RECORD_HEADER_BYTES)  # first payload byte of record 51
    if not ps[50]:
        flip_byte(path, offset + 8)  # empty payload: damage its seq field instead
    with pytest.raises(WALCorruption) as err:
        reopen(tmp_path)
    assert err.value.path == path and err.value.offset == offset
    assert path in str(err.value) and f"offset {offset}" in str(err.value)
    # Nothing was truncated: refusing to start must not destroy the evidence.
    assert os.path.getsize(path) == record_offset(ps, 100) + 2 * COMMIT_MARKER_BYTES  # batch + seal
    with pytest.raises(WALCorruption):
        reopen(tmp_path)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 400), data=st.data())
def test_any_bit_flip_in_a_closed_log_is_corruption(n, data):
    """Every single-bit flip in a cleanly closed log is caught and reported at the
    damaged record's offset: the seal marker vouches for every record, the last
    one included."""
    ps = payloads(n, size=12, seed=n)
    index = data.draw(st.integers(0, n - 1), label="record")
    start, end = record_offset(ps, index), record_offset(ps, index + 1)
    offset = data.draw(st.integers(start, end - 1), label="offset")
    bit = data.draw(st.integers(0, 7), label="bit")
    with tempfile.TemporaryDirectory() as d:
        path = write_log(d, ps)
        with open(path, "r+b") as f:
            f.seek(offset)
            b = f.read(1)[0]
            f.seek(offset)
            f.write(bytes([b ^ (1 << bit)]))
        with pytest.raises(WALCorruption) as err:
            WAL.open(d)
        assert (err.value.path, err.value.offset) == (path, start)


def test_damaged_length_mid_log_is_corruption_not_a_torn_tail(tmp_path):
    ps = payloads(20, size=40)
    path = write_log(tmp_path, ps)
    offset = record_offset(ps, 5)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack(">I", 1 << 30))  # "runs past EOF", yet records follow
    with pytest.raises(WALCorruption) as err:
        reopen(tmp_path)
    assert err.value.offset == offset and "durable" in err.value.reason


def test_zeroed_record_mid_log_is_corruption(tmp_path):
    ps = payloads(20, size=40)
    path = write_log(tmp_path, ps)
    offset = record_offset(ps, 5)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(RECORD_HEADER_BYTES + len(ps[5])))
    with pytest.raises(WALCorruption) as err:
        reopen(tmp_path)
    assert err.value.offset == offset


def test_damage_in_a_non_last_segment_is_corruption_even_at_its_end(tmp_path):
    ps = payloads(300, size=100, seed=3)
    wal, _ = WAL.open(tmp_path, segment_bytes_max=2048)
    wal.append_many(ps)
    wal.close()
    first = wal.segment_paths[0]
    flip_byte(first, os.path.getsize(first) - 1)  # last byte of its last record
    with pytest.raises(WALCorruption) as err:
        reopen(tmp_path, segment_bytes_max=2048)
    assert err.value.path == first


def test_missing_middle_segment_is_corruption(tmp_path):
    ps = payloads(300, size=100, seed=3)
    wal, _ = WAL.open(tmp_path, segment_bytes_max=2048)
    wal.append_many(ps)
    wal.close()
    os.unlink(wal.segment_paths[2])
    with pytest.raises(WALCorruption, match="expected"):
        reopen(tmp_path)


def test_bad_segment_header_is_corruption(tmp_path):
    path = write_log(tmp_path, payloads(5))
    flip_byte(path, 2)
    with pytest.raises(WALCorruption) as err:
        reopen(tmp_path)
    assert err.value.offset == 0 and err.value.path == path


# --- fsync modes, group commit -------------------------------------------------------


def test_batch_mode_one_fsync_covers_every_append(tmp_path):
    wal, _ = WAL.open(tmp_path)
    base = wal.stats["fsyncs"]
    wal.append_many(payloads(100))
    for p in payloads(50, seed=9):
        wal.append(p)
    assert wal.stats["fsyncs"] == base and wal.durable_seq == 0
    assert wal.sync() == 150
    assert wal.stats["fsyncs"] == base + 1
    assert wal.sync() == 150  # nothing new: no fsync
    assert wal.stats["fsyncs"] == base + 1
    wal.close()


def test_always_mode_fsyncs_every_append_call(tmp_path):
    wal, _ = WAL.open(tmp_path, fsync="always")
    base = wal.stats["fsyncs"]
    for i, p in enumerate(payloads(10), start=1):
        assert wal.append(p) == i
        assert wal.durable_seq == i
    assert wal.stats["fsyncs"] == base + 10
    wal.append_many(payloads(5))
    assert wal.stats["fsyncs"] == base + 11 and wal.durable_seq == 15
    wal.close()


def test_never_mode_does_not_fsync_but_survives_a_process_crash(tmp_path):
    ps = payloads(30)
    wal, _ = WAL.open(tmp_path, fsync="never")
    base = wal.stats["fsyncs"]
    wal.append_many(ps)
    assert wal.sync() == 30  # handed to the OS only
    assert wal.stats["fsyncs"] == base
    wal.abandon()  # a process crash: the page cache keeps what was written
    wal, recovered = reopen(tmp_path, fsync="never")
    assert recovered == list(enumerate(ps, start=1))
    wal.close()


def test_unknown_mode_is_refused(tmp_path):
    with pytest.raises(ValueError):
        WAL.open(tmp_path, fsync="sometimes")


def test_failed_fsync_is_fatal(tmp_path, monkeypatch):
    import consensus.storage.wal as walmod

    wal, _ = WAL.open(tmp_path)
    wal.append(b"a")

    def boom(fd):
        raise OSError(5, "EIO")

    monkeypatch.setattr(walmod, "_fdatasync", boom)
    with pytest.raises(WALFailed):
        wal.sync()
    with pytest.raises(WALFailed):
        wal.append(b"b")
    monkeypatch.undo()
    wal.close()


# --- compaction ----------------------------------------------------------------------


def test_compact_deletes_only_whole_segments_below_the_snapshot(tmp_path):
    ps = payloads(400, size=100, seed=4)
    wal, _ = WAL.open(tmp_path, segment_bytes_max=2048)
    wal.append_many(ps)
    wal.sync()
    n_segments = len(wal.segment_paths)
    firsts = [int(os.path.basename(p)[4:24]) for p in wal.segment_paths]
    upto = firsts[3] + 2  # inside segment 3: segments 0..2 are entirely below
    with pytest.raises(ValueError):
        wal.compact(wal.durable_seq + 1)
    assert wal.compact(upto) == 3
    assert wal.first_seq == firsts[3] <= upto + 1
    assert len(wal.segment_paths) == n_segments - 3
    assert wal.compact(wal.durable_seq) == n_segments - 4  # keeps the last
    assert len(wal.segment_paths) == 1
    last_first = wal.first_seq
    wal.close()
    wal, recovered = reopen(tmp_path, segment_bytes_max=2048)
    assert recovered[0][0] == last_first and recovered[-1] == (400, ps[-1])
    assert wal.first_seq == last_first
    wal.close()


# --- crash property ------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 120)),
        st.tuples(st.just("sync"), st.just(0)),
        st.tuples(st.just("crash"), st.integers(0, 2**32)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, seed=st.integers(0, 2**32))
def test_recovery_after_crash_keeps_exactly_a_prefix_with_every_synced_record(ops, seed):
    """Crash = the process dies (buffer lost), then power loss removes an arbitrary
    suffix of the *unsynced* bytes of the last segment (never the synced part), maybe
    leaving zero-filled or garbage bytes where the lost data was."""
    rng = random.Random(seed)
    segment_bytes_max = 700
    with tempfile.TemporaryDirectory() as d:
        wal, _ = WAL.open(d, segment_bytes_max=segment_bytes_max)
        model: list[bytes] = []
        for op, arg in ops + [("crash", rng.getrandbits(32))]:
            if op == "append":
                payload = rng.randbytes(arg)
                assert wal.append(payload) == len(model) + 1
                model.append(payload)
            elif op == "sync":
                assert wal.sync() == len(model)
            else:
                durable = wal.durable_seq
                last_path = wal.segment_paths[-1]
                synced_end = wal._seg_durable_end  # bytes of the last segment a completed fsync covers
                wal.abandon(write_buffer=rng.random() < 0.5)
                size = os.path.getsize(last_path)
                assert synced_end <= size
                cut = synced_end + arg % (size - synced_end + 1)
                os.truncate(last_path, cut)
                junk = rng.choice([b"", bytes(rng.randint(1, 600)), rng.randbytes(rng.randint(1, 40))])
                with open(last_path, "ab") as f:
                    f.write(junk)

                wal, recovered = WAL.open(d, segment_bytes_max=segment_bytes_max)
                seqs = [s for s, _ in recovered]
                assert seqs == list(range(1, len(recovered) + 1))
                assert durable <= len(recovered) <= len(model)
                assert [p for _, p in recovered] == model[: len(recovered)]
                assert wal.durable_seq == wal.last_seq == len(recovered)
                model = model[: len(recovered)]
        wal.close()


# --- GroupCommitter ------------------------------------------------------------------


@pytest.mark.parametrize("inline", [False, True], ids=["thread", "inline"])
async def test_group_committer_concurrent_waiters_share_one_fsync(inline, tmp_path):
    wal, _ = WAL.open(tmp_path)
    committer = GroupCommitter(wal, inline=inline)
    base = wal.stats["fsyncs"]

    async def writer(p: bytes) -> int:
        seq = wal.append(p)
        await committer.durable(seq)
        assert wal.durable_seq >= seq
        return seq

    async with asyncio.timeout(10):
        seqs = await asyncio.gather(*(writer(p) for p in payloads(50)))
    assert sorted(seqs) == list(range(1, 51))
    # All 50 tasks append in the same loop turn; the sync is kicked at its end.
    assert wal.stats["fsyncs"] == base + 1
    await committer.close()
    wal.close()


async def test_group_committer_appends_during_an_fsync_ride_the_next_one(tmp_path, monkeypatch):
    wal, _ = WAL.open(tmp_path)
    committer = GroupCommitter(wal)
    base = wal.stats["fsyncs"]
    entered, release = threading.Event(), threading.Event()
    real = wal.perform_sync

    def slow_sync(ticket):
        entered.set()
        assert release.wait(10)
        real(ticket)

    monkeypatch.setattr(wal, "perform_sync", slow_sync)
    released: list[int] = []

    first = wal.append(b"first")
    committer.on_durable(first, lambda exc: released.append(first))
    async with asyncio.timeout(10):
        await asyncio.to_thread(entered.wait, 10)  # fsync #1 is in flight
        later = [wal.append(p) for p in payloads(10)]
        for seq in later:
            committer.on_durable(seq, lambda exc, seq=seq: released.append(seq))
        assert released == [] and wal.durable_seq == 0
        release.set()
        await committer.durable(later[-1])
    assert released == [first] + later  # in seq order
    assert wal.stats["fsyncs"] == base + 2
    await committer.close()
    wal.close()


@pytest.mark.parametrize("inline", [False, True], ids=["thread", "inline"])
async def test_group_committer_request_sync_and_immediate_waiters(inline, tmp_path):
    wal, _ = WAL.open(tmp_path)
    committer = GroupCommitter(wal, inline=inline)
    seq = wal.append(b"a")
    committer.request_sync()
    async with asyncio.timeout(10):
        await committer.durable(seq)
        assert await committer.durable(seq) == 1  # already durable
    with pytest.raises(ValueError):
        committer.on_durable(5, lambda exc: None)  # never appended: would hang
    await committer.close()
    wal.close()


@pytest.mark.parametrize("inline", [False, True], ids=["thread", "inline"])
async def test_group_committer_bounds_its_waiters(inline, tmp_path):
    wal, _ = WAL.open(tmp_path)
    committer = GroupCommitter(wal, waiters_max=3, inline=inline)
    for _ in range(3):
        committer.on_durable(wal.append(b"x"), lambda exc: None)
    with pytest.raises(CommitQueueFull):
        committer.on_durable(wal.append(b"y"), lambda exc: None)
    async with asyncio.timeout(10):
        await committer.close()
    assert wal.durable_seq == 4
    wal.close()


@pytest.mark.parametrize("inline", [False, True], ids=["thread", "inline"])
async def test_group_committer_fsync_failure_reaches_every_waiter(inline, tmp_path, monkeypatch):
    wal, _ = WAL.open(tmp_path)
    committer = GroupCommitter(wal, inline=inline)

    def boom(ticket):
        raise OSError(5, "EIO")

    monkeypatch.setattr(wal, "perform_sync", boom)
    seqs = [wal.append(p) for p in payloads(3)]
    async with asyncio.timeout(10):
        results = await asyncio.gather(*(committer.durable(s) for s in seqs), return_exceptions=True)
    assert all(isinstance(r, WALFailed) for r in results)
    with pytest.raises(WALFailed):
        committer.on_durable(seqs[0], lambda exc: None)
    with pytest.raises(WALFailed):
        wal.append(b"more")
    await committer.close()
    wal.close()


async def test_group_committer_never_and_always_modes(tmp_path):
    for mode in ("never", "always"):
        wal, _ = WAL.open(tmp_path / mode, fsync=mode)
        committer = GroupCommitter(wal)
        base = wal.stats["fsyncs"]
        seqs = [wal.append(p) for p in payloads(5)]
        async with asyncio.timeout(10):
            await asyncio.gather(*(committer.durable(s) for s in seqs))
        assert wal.durable_seq == 5
        assert wal.stats["fsyncs"] - base == (0 if mode == "never" else 5)
        await committer.close()
        wal.close()


async def test_an_inline_committer_syncs_on_the_loop_at_the_end_of_the_turn(tmp_path, monkeypatch):
    """inline (what cellar serve uses): no thread; the turn's appends share one fsync,
    run on the loop after the turn, and a waiter hears of it only after it returned."""
    wal, _ = WAL.open(tmp_path)
    committer = GroupCommitter(wal, inline=True)
    assert committer._executor is None
    base = wal.stats["fsyncs"]
    real = wal.perform_sync
    synced_on: list[str] = []

    def sync(ticket):
        synced_on.append(threading.current_thread().name)
        real(ticket)

    monkeypatch.setattr(wal, "perform_sync", sync)
    heard: list[int] = []
    seqs = [wal.append(p) for p in payloads(5)]
    for seq in seqs:
        committer.on_durable(seq, lambda exc, seq=seq: heard.append((seq, wal.durable_seq, len(synced_on))))
    assert heard == [] and synced_on == []  # nothing before the turn ends
    async with asyncio.timeout(10):
        await committer.durable(seqs[-1])
    assert synced_on == [threading.current_thread().name]
    assert wal.stats["fsyncs"] == base + 1
    assert heard == [(seq, 5, 1) for seq in seqs]
    await committer.close()
    wal.close()


async def test_rotation_while_an_fsync_is_in_flight(tmp_path, monkeypatch):
    wal, _ = WAL.open(tmp_path, segment_bytes_max=512)
    committer = GroupCommitter(wal)
    entered, release = threading.Event(), threading.Event()
    real = wal.perform_sync

    def slow_sync(ticket):
        entered.set()
        assert release.wait(10)
        real(ticket)

    monkeypatch.setattr(wal, "perform_sync", slow_sync)
    ps = payloads(60, size=60, seed=5)
    first = wal.append(ps[0])
    fut = asyncio.ensure_future(committer.durable(first))
    async with asyncio.timeout(10):
        await asyncio.to_thread(entered.wait, 10)
        last = wal.append_many(ps[1:])  # rotates several times under the in-flight fsync
        assert len(wal.segment_paths) > 3
        release.set()
        await fut
        await committer.durable(last)
    await committer.close()
    wal.close()
    wal, recovered = reopen(tmp_path, segment_bytes_max=512)
    assert recovered == list(enumerate(ps, start=1))
    wal.close()


def test_restart_at_drops_every_record_and_numbers_on_after_a_seq(tmp_path):
    """For an owner whose snapshot restates all of the log (a WAL that lost records a
    snapshot covers): the old segments go, appends continue at the given seq."""
    wal, _ = WAL.open(tmp_path, segment_bytes_max=4096)
    for i in range(40):
        wal.append(b"x" * 200)
    wal.sync()
    assert len(wal.segment_paths) > 1
    wal.close()
    wal, records = WAL.open(tmp_path, segment_bytes_max=4096)
    assert len(records) == 40
    with pytest.raises(ValueError):
        wal.restart_at(40)  # must be past the last seq
    wal.restart_at(101)
    assert (wal.last_seq, wal.durable_seq, wal.first_seq) == (100, 100, 101)
    assert wal.append(b"new") == 101
    wal.sync()
    wal.close()
    wal, records = WAL.open(tmp_path, segment_bytes_max=4096)
    assert records == [(101, b"new")]
    wal.append(b"more")
    with pytest.raises(WALError):
        wal.restart_at(500)  # only right after open
    wal.close()


@pytest.mark.parametrize("fails", [False, True])
def test_a_rotation_during_an_inflight_sync_counts_only_once_that_sync_succeeds(tmp_path, fails):
    """Review 69: the in-flight sync (a thread's or the fsync process's) shares the
    segment's file description, and the kernel reports a writeback error to one fsync
    per description. If that sync took the error, the rotation's own fsync returned 0
    for pages that never reached the disk; the rotation then declared every record
    durable before the in-flight sync answered. Now the seal counts once that sync
    succeeded, and its failure leaves the records never durable; so does the seal of a
    later segment (the first version of the fix let a second rotation count)."""
    wal, _ = WAL.open(str(tmp_path / "wal"), fsync="batch", segment_bytes_max=4096)
    first = wal.append(b"a" * 100)
    ticket = wal.prepare_sync()  # in flight: perform_sync runs elsewhere
    created = wal.stats["segments_created"]
    while wal.stats["segments_created"] < created + 2:  # appends until the segment rotated twice
        wal.append(b"b" * 100)
    sealed = wal.last_seq - 1  # the last record opened the newest segment
    assert wal.durable_seq < first, "nothing counts before the in-flight sync answered"
    if fails:
        with pytest.raises(WALFailed):
            wal.complete_sync(ticket, OSError(5, "Input/output error"))
        assert wal.durable_seq < first
    else:
        wal.perform_sync(ticket)
        assert wal.complete_sync(ticket) >= sealed
        wal.close()
