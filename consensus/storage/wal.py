"""A durable write-ahead log with group commit.

The WAL stores opaque ``bytes`` payloads (the caller msgpack-encodes its acceptor
records: promises, accepted C- and O-instances, views, commit markers) under
consecutive sequence numbers starting at 1. ``docs/storage.md`` describes the
on-disk format, the fsync modes, the recovery rules and the crash guarantees in
full; this docstring is the interface.

Opening and recovery::

    wal, records = WAL.open(directory, fsync="batch", segment_bytes_max=64 << 20,
                            replay_from_seq=1, stream=False)
    for seq, payload in records: ...        # every recovered record >= replay_from_seq

``WAL.open`` reads every segment, verifies every record and every commit marker,
truncates a torn tail of the *last* segment (everything after its last valid commit
marker, logging one warning naming the file and offset) and raises ``WALCorruption``
(whose message names the file and the byte offset) on damage that a crash cannot
explain: anywhere in a non-last segment, or before a point that a later intact
commit marker vouches was durable. With ``stream=True`` the records come as an
iterator that re-reads one segment at a time (verification has already happened),
so the whole log is never held in memory; consume it before the first append. It
holds an exclusive ``flock`` on ``<directory>/LOCK`` until ``close()``.

Writing (all on one thread, the event loop's)::

    seq = wal.append(payload)               # buffered; not durable yet
    last = wal.append_many([p1, p2, p3])    # returns the last seq assigned
    durable = wal.sync()                    # group commit: one commit marker, one fsync
    wal.durable_seq, wal.last_seq, wal.first_seq, wal.stats["fsyncs"]
    wal.compact(upto_seq)                   # drop whole segments <= upto_seq, oldest first
    wal.restart_at(first_seq)               # after open: a new (flagged) segment at first_seq, then drop the older ones
    wal.close()                             # sync (per mode), seal, release
    wal.abandon()                           # crash simulation: release without syncing

Each group commit ends with a *commit marker*: the last seq of the batch, the
length and CRC32C of the batch's bytes, and the offset up to which the segment was
already durable when the marker was written (a claim that is always true). Only
records covered by a valid marker are replayed. Every checksum in a segment is
seeded with a random 64-bit salt from its header, so a record or marker embedded in
a payload (or left over from anything else) never verifies.

Fsync modes (``fsync=``):

- ``"batch"`` (default): ``append`` only buffers; ``sync()`` writes the buffer and its
  commit marker and issues *one* ``fdatasync`` that covers every record appended
  since the previous one. The runtime calls it (or ``GroupCommitter``) once per
  event-loop turn and releases a reply only once its record's seq is
  ``<= durable_seq``.
- ``"always"``: every ``append``/``append_many`` call writes and fsyncs before it
  returns (one marker and one fsync per call). Simplest and slowest.
- ``"never"``: no per-record fsync; ``sync()`` only hands the buffer (and marker) to
  the OS and reports it as "durable". That survives a *process* crash (the page
  cache keeps it) but not power loss or a kernel crash. For tests and benchmarks.

In every mode, creating a segment (at open and at rotation) seals and fsyncs the
previous segment, fsyncs the new segment's header and the directory, so only the
last segment can ever hold unsynced bytes (recovery relies on that). Compaction
deletes the oldest segment first and fsyncs the directory after each deletion, so
a crash leaves a gap-free suffix. Recovery ends with an fsync of the last segment,
the directory and its parent.

Group commit from asyncio (``GroupCommitter``)::

    committer = GroupCommitter(wal)                 # owns one fsync thread
    seq = wal.append(payload)
    committer.on_durable(seq, callback)             # callback(None) or callback(exc)
    await committer.durable(seq)                    # or await it
    committer.request_sync()                        # sync without a waiter
    await committer.close()

One fsync runs at a time, so the loop keeps accepting work; records appended while
it is in flight are covered by the next one. Where it runs: by default in a single
worker thread; with ``inline=True`` (what ``cellar serve`` uses, ``fsync_worker =
"loop"``) on the loop, at the end of the turn that appended; with ``process=True``
(``fsync_worker = "process"``) in a child process (``FsyncProcess``) that is sent the
segment's descriptor and answers over a socket, so the loop neither waits for the
disk nor hands the GIL back and forth. An error
from a write, an fsync or a segment creation is fatal (retrying after a failed
fsync is unsafe: the kernel may have dropped the dirty pages): every waiter gets
the error and the WAL refuses further writes.

Threading: the WAL is not thread-safe. ``prepare_sync``/``complete_sync`` run on the
owner's thread and only ``perform_sync`` (a bare ``fdatasync``) runs on the
committer's thread (or its equivalent, in the child process); that split is the
whole concurrency story.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import fcntl
import heapq
import itertools
import logging
import os
import re
import socket
import struct
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import crc32c

log = logging.getLogger(__name__)

SEGMENT_MAGIC = b"CELLRWAL"
SEGMENT_VERSION = 4
# Versions 3 and 4 have version 2's layout. Version 3 marks a data dir whose snapshots
# may restate the WAL's older records (snapshot version 3, live records) and whose
# WAL may have been compacted against them: a build that reads only versions 1 and 2
# would skip such a snapshot and replay a suffix of the log on an empty state, so it
# must refuse the data dir, and it does, on the unknown segment version. Version 4
# marks a log that may hold the core's early-send reservations ("CR" records,
# docs/early-send.md): a build before them would skip the records and, restarted,
# propose new values at instances it had sent early.
SEGMENTS_SAME_LAYOUT = (2, 3, 4)
# Versions 1 (no salt, no commit markers), 2 and 3 are still read; an older last
# segment is closed at open and appends go to a new version-4 segment
# (docs/storage.md).
# v1 header: magic, version, flags, first_seq, crc32c of the 20 bytes before it.
_SEGMENT_HEADER_V1 = struct.Struct(">8sHHQI")
SEGMENT_HEADER_BYTES_V1 = _SEGMENT_HEADER_V1.size  # 24
# v2 header: magic, version, flags, first_seq, salt, crc32c of the 28 bytes before it.
_SEGMENT_HEADER = struct.Struct(">8sHHQQI")
SEGMENT_HEADER_BYTES = _SEGMENT_HEADER.size  # 32
# length of payload, crc32c, seq. The crc covers (salt, length, seq, payload) so a
# damaged length, a record at the wrong position or a record-shaped payload cannot pass.
_RECORD_HEADER = struct.Struct(">IIQ")
RECORD_HEADER_BYTES = _RECORD_HEADER.size  # 16
_CRC_PREFIX_V1 = struct.Struct(">IQ")
_CRC_PREFIX = struct.Struct(">QIQ")
_ZERO_RECORD_HEADER = bytes(RECORD_HEADER_BYTES)
# A commit marker sits where a record header would and starts with this length value
# (no record is that long): tag, crc32c, last_seq, batch_bytes, batch_crc, durable_end.
COMMIT_TAG = 0xFFFFFFFF
_COMMIT_TAG_BYTES = COMMIT_TAG.to_bytes(4, "big")
_COMMIT = struct.Struct(">IIQIIQ")
COMMIT_MARKER_BYTES = _COMMIT.size  # 32

SEGMENT_BYTES_MAX_DEFAULT = 64 << 20
SEGMENT_BYTES_MAX_LIMIT = (1 << 32) - 1  # batch_bytes is a 32-bit field
WRITE_BUFFER_BYTES_MAX_DEFAULT = 1 << 20
_SEGMENT_NAME = re.compile(r"^wal-(\d{20})\.log$")
FSYNC_MODES = ("always", "batch", "never")

_fdatasync = getattr(os, "fdatasync", os.fsync)


class WALError(Exception):
    """Base class of WAL errors."""


class WALCorruption(WALError):
    """Durable log data is damaged; the replica must not start on it."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        super().__init__(
            f"WAL corruption in {path} at byte offset {offset}: {reason}; refusing to start "
            f"(restore the file from a copy of this replica's own disk, or inspect it; never start this "
            f"replica id on an empty or another replica's data dir: docs/operations.md, Members)"
        )


class WALFailed(WALError):
    """An earlier fsync or write failed; the WAL accepts no more work."""


class CommitQueueFull(WALError):
    """Too many durability waiters are pending; the caller must shed load."""


def segment_name(first_seq: int) -> str:
    return f"wal-{first_seq:020d}.log"


def _record_crc(length: int, seq: int, payload: bytes | memoryview, salt: int | None) -> int:
    if salt is None:  # version 1
        return crc32c.crc32c(payload, crc32c.crc32c(_CRC_PREFIX_V1.pack(length, seq)))
    return crc32c.crc32c(payload, crc32c.crc32c(_CRC_PREFIX.pack(salt, length, seq)))


def encode_record(seq: int, payload: bytes, salt: int | None = None) -> bytes:
    """One record as it sits on disk: header + payload (``salt=None``: version 1)."""
    length = len(payload)
    return _RECORD_HEADER.pack(length, _record_crc(length, seq, payload, salt), seq) + payload


def _marker_crc(salt: int, body: bytes | memoryview) -> int:
    """crc32c over (salt, tag, the marker's bytes after its crc field)."""
    return crc32c.crc32c(body, crc32c.crc32c(salt.to_bytes(8, "big") + _COMMIT_TAG_BYTES))


def encode_commit(salt: int, last_seq: int, batch_bytes: int, batch_crc: int, durable_end: int) -> bytes:
    body = struct.pack(">QIIQ", last_seq, batch_bytes, batch_crc, durable_end)
    return _COMMIT_TAG_BYTES + _marker_crc(salt, body).to_bytes(4, "big") + body


FLAG_RESTART = 1  # restart_at made this segment: every segment before it is obsolete


def _encode_segment_header(first_seq: int, salt: int, flags: int = 0) -> bytes:
    head = struct.pack(">8sHHQQ", SEGMENT_MAGIC, SEGMENT_VERSION, flags, first_seq, salt)
    return head + struct.pack(">I", crc32c.crc32c(head))


def fsync_dir(directory: str) -> None:
    """fsync a directory, making the creations, renames and deletions in it durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_fsync_dir = fsync_dir


def makedirs_durable(path: str | os.PathLike[str]) -> str:
    """``os.makedirs`` whose result survives power loss: each directory created is
    fsynced into its parent, and the leaf's parent is fsynced even when the leaf
    already existed (an earlier process may have crashed before doing it)."""
    path = os.path.abspath(os.fspath(path))
    missing = []
    p = path
    while not os.path.isdir(p):  # bounded by the depth of the path
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    synced = set()
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            pass
        fsync_dir(os.path.dirname(d))
        synced.add(os.path.dirname(d))
    parent = os.path.dirname(path)
    if parent not in synced:
        fsync_dir(parent)
    return path


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    # The views are released on the way out, even if something keeps this frame alive
    # (a traceback, a sampling profiler): a live view of the WAL's bytearray buffer
    # makes its next clear() raise BufferError, which would stop the node.
    with memoryview(data) as view:
        done = 0
        # Each os.write makes progress or raises, so this loop is bounded by len(data).
        while done < len(view):
            with view[done:] as rest:
                done += os.write(fd, rest)


def _drop_cached(fd: int) -> None:
    """Best effort: drop clean cached pages so recovery reads what is on the disk,
    not pages a failed writeback left in the cache ("fsyncgate")."""
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except (AttributeError, OSError):
        pass


def _read_file(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        _drop_cached(fd)
        chunks = []
        while True:  # bounded by the file size
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class SyncTicket:
    """One pending group commit: fsync ``fd`` and everything ``<= seq`` is durable,
    and so is the segment up to byte ``end``."""

    fd: int
    seq: int
    end: int = 0


@dataclass(slots=True)
class _Segment:
    first_seq: int
    path: str


# --- recovery -----------------------------------------------------------------


@dataclass(slots=True)
class _SegmentScan:
    records: list[tuple[int, bytes]]
    next_seq: int
    valid_end: int  # offset just past the last replayable byte (v2: last valid marker)
    torn_reason: str | None
    version: int = SEGMENT_VERSION
    salt: int = 0
    claimed_end: int = 0  # highest durable_end claimed by a valid marker
    discard: bool = False  # a torn segment creation: delete the file


def _read_header(path: str, data: bytes, first_seq: int, is_last: bool) -> tuple[int, int, int, int] | None:
    """(version, salt, header bytes, flags), or None for a torn creation of the last
    segment. Raises ``WALCorruption`` for any other header problem."""
    size = len(data)
    problem = None
    version = salt = flags = 0
    hdr = SEGMENT_HEADER_BYTES
    if size < SEGMENT_HEADER_BYTES_V1:
        problem = "segment header missing or torn"
    elif data[:SEGMENT_HEADER_BYTES_V1] == bytes(SEGMENT_HEADER_BYTES_V1):
        problem = "segment header is zero-filled"
    elif data[:8] != SEGMENT_MAGIC:
        problem = f"bad segment magic {data[:8]!r}"
    else:
        version = struct.unpack_from(">H", data, 8)[0]
        if version == 1:
            _m, _v, _f, header_seq, crc = _SEGMENT_HEADER_V1.unpack_from(data, 0)
            hdr = SEGMENT_HEADER_BYTES_V1
            if crc32c.crc32c(data[: hdr - 4]) != crc:
                problem = "segment header checksum mismatch"
        elif version in SEGMENTS_SAME_LAYOUT:
            if size < SEGMENT_HEADER_BYTES:
                problem = "segment header missing or torn"
            else:
                _m, _v, flags, header_seq, salt, crc = _SEGMENT_HEADER.unpack_from(data, 0)
                if crc32c.crc32c(data[: hdr - 4]) != crc:
                    problem = "segment header checksum mismatch"
        else:
            raise WALCorruption(path, 0, f"unsupported segment version {version} (this build reads 1 to {SEGMENT_VERSION})")
        if problem is None and header_seq != first_seq:
            raise WALCorruption(path, 0, f"segment header says first seq {header_seq}, file name says {first_seq}")
    if problem is None:
        return version, salt, hdr, flags
    rest = data[SEGMENT_HEADER_BYTES:].strip(b"\x00")
    if is_last and not rest:
        # A crash while the segment was being created: its header is fsynced before
        # any record goes in, and nothing follows it, so nothing acknowledged lives here.
        return None
    if is_last:
        problem += (f", but {len(rest)} nonzero bytes follow it (not a torn segment creation; "
                    f"acknowledged records may be in this file, so it is not deleted)")
    raise WALCorruption(path, 0, problem)


def _parse_record_v1(data: bytes, pos: int, size: int) -> tuple[str | None, int, int, int]:
    """Try the version-1 record at ``pos``: (problem or None, length, crc, seq)."""
    if size - pos < RECORD_HEADER_BYTES:
        return "partial record header", 0, 0, 0
    length, crc, seq = _RECORD_HEADER.unpack_from(data, pos)
    if data[pos : pos + RECORD_HEADER_BYTES] == _ZERO_RECORD_HEADER:
        return "zero-filled record header", length, crc, seq
    end = pos + RECORD_HEADER_BYTES + length
    if end > size:
        return f"record length {length} runs past end of file ({size} bytes)", length, crc, seq
    body = memoryview(data)[pos + RECORD_HEADER_BYTES : end]
    if _record_crc(length, seq, body, None) != crc:
        return "record checksum mismatch", length, crc, seq
    return None, length, crc, seq


def _find_valid_record_after_v1(data: bytes, pos: int, size: int, seq_bad: int) -> tuple[int, int] | None:
    """Version 1 only: the first intact record that starts after ``pos`` with a seq
    above ``seq_bad`` (damage followed by log data is corruption in version 1)."""
    seq_lo = seq_bad + 1
    seq_hi = seq_bad + (size - pos) // RECORD_HEADER_BYTES
    lo, hi = seq_lo.to_bytes(8, "big"), seq_hi.to_bytes(8, "big")
    k = 0
    while k < 8 and lo[k] == hi[k]:
        k += 1
    prefix = lo[:k]
    last_start = min(len(data.rstrip(b"\x00")) - 1, size - RECORD_HEADER_BYTES)
    seq_at = 8
    unpack = _RECORD_HEADER.unpack_from
    hit = data.find(prefix, pos + 1 + seq_at, last_start + seq_at + k)
    while hit != -1:  # each pass moves hit forward by >= 1 byte
        start = hit - seq_at
        length, crc, seq = unpack(data, start)
        end = start + RECORD_HEADER_BYTES + length
        if seq_lo <= seq <= seq_hi and end <= size:
            if _record_crc(length, seq, memoryview(data)[start + RECORD_HEADER_BYTES : end], None) == crc:
                return start, seq
        hit = data.find(prefix, hit + 1, last_start + seq_at + k)
    return None


def _scan_v1(path: str, data: bytes, first_seq: int, is_last: bool, replay_from_seq: int) -> _SegmentScan:
    """The version-1 rules (docs/storage.md, "Version 1 segments")."""
    size = len(data)
    records: list[tuple[int, bytes]] = []
    seq_expected = first_seq
    pos = SEGMENT_HEADER_BYTES_V1
    while pos < size:  # each iteration advances pos by >= RECORD_HEADER_BYTES or exits
        problem, length, _crc, seq = _parse_record_v1(data, pos, size)
        if problem is None and seq != seq_expected:
            raise WALCorruption(path, pos, f"record has seq {seq}, expected {seq_expected}")
        if problem is not None:
            if not is_last:
                raise WALCorruption(path, pos, problem + " in a non-last (fully synced) segment")
            found = _find_valid_record_after_v1(data, pos, size, seq_expected)
            if found is not None:
                raise WALCorruption(
                    path, pos,
                    f"{problem} (seq {seq_expected}), but an intact record (seq {found[1]}) follows at offset {found[0]}",
                )
            return _SegmentScan(records, seq_expected, pos, f"{problem} (seq {seq_expected})", version=1)
        body_start = pos + RECORD_HEADER_BYTES
        if seq >= replay_from_seq:
            records.append((seq, data[body_start : body_start + length]))
        seq_expected += 1
        pos = body_start + length
    return _SegmentScan(records, seq_expected, pos, None, version=1)


def _walk_v2(data: bytes, salt: int, first_seq: int, replay_from_seq: int, collect: bool,
             ) -> tuple[list[tuple[int, bytes]], int, int, int, str | None, int]:
    """Walk a version-2 segment from its header: (committed records, next seq after
    them, end of the last valid marker, highest claim, problem or None, problem offset).
    Records count only once a valid commit marker covers them."""
    size = len(data)
    view = memoryview(data)
    records: list[tuple[int, bytes]] = []
    pending: list[tuple[int, bytes]] = []
    pos = committed_end = batch_start = SEGMENT_HEADER_BYTES
    seq = committed_next = first_seq
    claimed = SEGMENT_HEADER_BYTES
    unpack = _RECORD_HEADER.unpack_from
    problem = None
    while pos < size:  # each pass advances pos by >= RECORD_HEADER_BYTES or exits
        if size - pos < RECORD_HEADER_BYTES:
            problem = "partial record header"
            break
        length, crc, rseq = unpack(data, pos)
        if length == COMMIT_TAG:
            if size - pos < COMMIT_MARKER_BYTES:
                problem = "partial commit marker"
                break
            _tag, mcrc, last, batch_bytes, batch_crc, durable_end = _COMMIT.unpack_from(data, pos)
            if _marker_crc(salt, view[pos + 8 : pos + COMMIT_MARKER_BYTES]) != mcrc:
                problem = "commit marker checksum mismatch"
                break
            if last != seq - 1 or batch_bytes != pos - batch_start or not SEGMENT_HEADER_BYTES <= durable_end <= batch_start:
                problem = (f"commit marker (last seq {last}, {batch_bytes} bytes) does not match the "
                           f"records before it (last seq {seq - 1}, {pos - batch_start} bytes)")
                break
            if crc32c.crc32c(view[batch_start:pos]) != batch_crc:
                problem = "batch checksum mismatch"
                break
            if pending:
                records.extend(pending)
                pending = []
            pos += COMMIT_MARKER_BYTES
            committed_end = batch_start = pos
            committed_next = seq
            claimed = max(claimed, durable_end)
            continue
        if data[pos : pos + RECORD_HEADER_BYTES] == _ZERO_RECORD_HEADER:
            problem = "zero-filled record header"
            break
        end = pos + RECORD_HEADER_BYTES + length
        if end > size:
            problem = f"record length {length} runs past end of file ({size} bytes)"
            break
        if _record_crc(length, rseq, view[pos + RECORD_HEADER_BYTES : end], salt) != crc:
            problem = "record checksum mismatch"
            break
        if rseq != seq:
            problem = f"record has seq {rseq}, expected {seq}"
            break
        if collect and rseq >= replay_from_seq:
            pending.append((rseq, data[pos + RECORD_HEADER_BYTES : end]))
        seq += 1
        pos = end
    if problem is None and pos > committed_end:
        problem, pos = f"records {committed_next}..{seq - 1} have no commit marker", committed_end
    return records, committed_next, committed_end, claimed, problem, pos


def _claim_after(data: bytes, salt: int, start: int, first_seq: int) -> tuple[int, int] | None:
    """The first intact commit marker at or after ``start`` that claims bytes past
    ``start`` were durable: (its offset, its claim), else None. Markers are found by
    their tag and checked by plausibility first, then by their salted CRC."""
    size = len(data)
    view = memoryview(data)
    seq_hi = first_seq + size // RECORD_HEADER_BYTES
    hit = data.find(_COMMIT_TAG_BYTES, start)
    while hit != -1 and hit + COMMIT_MARKER_BYTES <= size:  # each pass moves hit forward
        _tag, mcrc, last, batch_bytes, _bcrc, durable_end = _COMMIT.unpack_from(data, hit)
        if (start < durable_end <= hit and first_seq - 1 <= last <= seq_hi and batch_bytes <= hit
                and _marker_crc(salt, view[hit + 8 : hit + COMMIT_MARKER_BYTES]) == mcrc):
            return hit, durable_end
        hit = data.find(_COMMIT_TAG_BYTES, hit + 1)
    return None


def _scan_segment(path: str, first_seq: int, is_last: bool, replay_from_seq: int,
                  collect: bool = True) -> _SegmentScan:
    data = _read_file(path)
    head = _read_header(path, data, first_seq, is_last)
    if head is None:
        return _SegmentScan([], first_seq, 0, "segment header missing or torn (a crash while creating it)",
                            discard=True)
    version, salt, _hdr, _flags = head
    if version == 1:
        return _scan_v1(path, data, first_seq, is_last, replay_from_seq)
    records, next_seq, valid_end, claimed, problem, bad_at = _walk_v2(data, salt, first_seq, replay_from_seq, collect)
    if problem is None:
        return _SegmentScan(records, next_seq, valid_end, None, version=version, salt=salt, claimed_end=claimed)
    if not is_last:
        raise WALCorruption(path, bad_at, problem + " in a non-last (fully synced) segment")
    vouched = _claim_after(data, salt, valid_end, first_seq)
    if vouched is not None:
        raise WALCorruption(
            path, bad_at,
            f"{problem}, but the commit marker at offset {vouched[0]} says the segment was durable "
            f"up to offset {vouched[1]} (acknowledged data is damaged)",
        )
    return _SegmentScan(records, next_seq, valid_end, f"{problem} (at offset {bad_at})", version=version,
                        salt=salt, claimed_end=claimed)


# --- the log --------------------------------------------------------------------


class WAL:
    """A segmented write-ahead log. Build it with ``WAL.open``; see the module docstring."""

    def __init__(self, directory: str, mode: str, segment_bytes_max: int, write_buffer_bytes_max: int,
                 lock_fd: int) -> None:
        self.directory = directory
        self.mode = mode
        self.segment_bytes_max = segment_bytes_max
        self.write_buffer_bytes_max = write_buffer_bytes_max
        self.stats: dict[str, int] = {"appends": 0, "bytes_appended": 0, "fsyncs": 0, "segments_created": 0,
                                      "commit_markers": 0}
        self._lock_fd = lock_fd
        self._segments: list[_Segment] = []
        self._fd = -1  # current (last) segment, opened for writing
        self._salt = 0  # current segment's salt
        self._seg_end = 0  # logical end of the current segment, including _buf
        self._seg_records = 0
        self._seg_durable_end = 0  # bytes of the current segment covered by a completed fsync
        self._claimed_end = 0  # the highest durable_end a marker of this segment claims
        self._batch_start = 0  # offset of the first byte not yet covered by a commit marker
        self._batch_crc = 0  # crc32c of the bytes from _batch_start to _seg_end
        self._marked_seq = 0  # last seq covered by a commit marker
        self._buf = bytearray()
        self._last_seq = 0
        self._durable_seq = 0
        self._retired_fds: list[int] = []  # old segments kept open while a sync may use them
        self._ticket: SyncTicket | None = None
        # A rotation's seal while a sync of that segment was in flight: durable only once
        # that sync succeeds (_rotate).
        self._rotated_seq = 0
        self._failed: BaseException | None = None
        self._closed = False

    # -- open / recover --

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        fsync: str = "batch",
        segment_bytes_max: int = SEGMENT_BYTES_MAX_DEFAULT,
        write_buffer_bytes_max: int = WRITE_BUFFER_BYTES_MAX_DEFAULT,
        replay_from_seq: int = 1,
        stream: bool = False,
    ) -> tuple[WAL, list[tuple[int, bytes]] | Iterator[tuple[int, bytes]]]:
        """Recover the log in ``directory`` (created if missing) and open it for appends.

        Returns the WAL and the recovered ``(seq, payload)`` records with
        ``seq >= replay_from_seq``, in order (records below are still verified): a
        list, or with ``stream=True`` an iterator reading one segment at a time.
        Raises ``WALCorruption`` on damage that is not a torn tail.
        """
        if fsync not in FSYNC_MODES:
            raise ValueError(f"fsync must be one of {FSYNC_MODES}, not {fsync!r}")
        if not SEGMENT_HEADER_BYTES + RECORD_HEADER_BYTES + 1 + COMMIT_MARKER_BYTES <= segment_bytes_max <= SEGMENT_BYTES_MAX_LIMIT:
            raise ValueError(f"segment_bytes_max {segment_bytes_max} is out of range")
        directory = os.fspath(directory)
        if not os.path.isdir(directory):
            makedirs_durable(directory)
        lock_fd = os.open(os.path.join(directory, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(lock_fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise WALError(f"WAL directory {directory} is locked by another open WAL") from e
            raise
        wal = cls(directory, fsync, segment_bytes_max, write_buffer_bytes_max, lock_fd)
        try:
            records = wal._recover(replay_from_seq, stream)
        except BaseException:
            wal._release_lock()
            raise
        return wal, records

    def _recover(self, replay_from_seq: int, stream: bool) -> list[tuple[int, bytes]] | Iterator[tuple[int, bytes]]:
        found: list[_Segment] = []
        for name in os.listdir(self.directory):
            m = _SEGMENT_NAME.match(name)
            if m:
                found.append(_Segment(int(m.group(1)), os.path.join(self.directory, name)))
        found.sort(key=lambda s: s.first_seq)
        if len(found) > 1:  # a torn creation of the last segment (maybe restart_at's): gone first
            with open(found[-1].path, "rb") as f:
                data = f.read()
            try:
                torn = _read_header(found[-1].path, data, found[-1].first_seq, True) is None
            except WALCorruption:
                torn = False
            if torn:
                os.unlink(found.pop().path)
                fsync_dir(self.directory)
        # An interrupted restart_at: its new segment (intact header, FLAG_RESTART) is
        # durable; the segments before it are obsolete: finish deleting them.
        for i in range(len(found) - 1, 0, -1):
            with open(found[i].path, "rb") as f:
                head = f.read(SEGMENT_HEADER_BYTES)
            try:
                parsed = _read_header(found[i].path, head, found[i].first_seq, False)
            except WALCorruption:
                parsed = None  # not a restart's segment; the scan below judges it
            if parsed is not None and parsed[0] != 1 and parsed[3] & FLAG_RESTART:
                for seg in found[:i]:
                    os.unlink(seg.path)
                    fsync_dir(self.directory)
                found = found[i:]
                break

        records: list[tuple[int, bytes]] = []
        replay: list[tuple[_Segment, int]] = []  # stream: (segment, first seq) to re-read
        next_seq = found[0].first_seq if found else 1
        last_scan: _SegmentScan | None = None
        for i, seg in enumerate(found):
            is_last = i == len(found) - 1
            if seg.first_seq != next_seq:
                # A missing segment (or an overlapping one) loses acknowledged records.
                raise WALCorruption(seg.path, 0, f"segment starts at seq {seg.first_seq}, expected {next_seq}")
            scan = _scan_segment(seg.path, seg.first_seq, is_last, replay_from_seq, collect=not stream)
            if scan.torn_reason is not None:
                log.warning("WAL: torn tail in %s at byte offset %d (%s); truncating",
                            seg.path, scan.valid_end, scan.torn_reason)
                if scan.discard:
                    os.unlink(seg.path)
                    fsync_dir(self.directory)
                    continue
                fd = os.open(seg.path, os.O_WRONLY)
                try:
                    os.ftruncate(fd, scan.valid_end)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            if stream:
                if scan.next_seq > max(seg.first_seq, replay_from_seq):
                    replay.append((seg, scan.next_seq))
            else:
                records.extend(scan.records)
            next_seq = scan.next_seq
            self._segments.append(seg)
            last_scan = scan

        self._last_seq = self._marked_seq = next_seq - 1
        if last_scan is not None and last_scan.version == SEGMENT_VERSION:
            seg = self._segments[-1]
            self._fd = os.open(seg.path, os.O_WRONLY)
            os.lseek(self._fd, last_scan.valid_end, os.SEEK_SET)
            # What we read may have been only in the page cache (a process crash
            # before its fsync); make it durable before anyone acts on it.
            self._fsync(self._fd)
            self._salt = last_scan.salt
            self._seg_end = self._seg_durable_end = self._batch_start = last_scan.valid_end
            self._claimed_end = last_scan.claimed_end
            self._seg_records = last_scan.next_seq - seg.first_seq
        else:
            if last_scan is not None:  # an older last segment: closed, appends go to a new one
                fd = os.open(self._segments[-1].path, os.O_RDONLY)
                try:
                    self._fsync(fd)
                finally:
                    os.close(fd)
                if last_scan.next_seq == self._segments[-1].first_seq:  # no records: drop it
                    os.unlink(self._segments.pop().path)
                    fsync_dir(self.directory)
            self._create_segment(next_seq)
        # A segment created or deleted by a process that crashed before its directory
        # fsync, and the directory itself, are made durable before anyone acts on them.
        fsync_dir(self.directory)
        fsync_dir(os.path.dirname(os.path.abspath(self.directory)))
        self._durable_seq = self._last_seq
        if stream:
            return self._replay(replay, replay_from_seq)
        # Pair assertion: what we hand back is exactly the contiguous tail of the log.
        assert all(b[0] == a[0] + 1 for a, b in zip(records, records[1:]))
        assert not records or records[-1][0] == self._last_seq
        return records

    def _replay(self, segments: list[tuple[_Segment, int]], replay_from_seq: int) -> Iterator[tuple[int, bytes]]:
        """Re-read the verified segments one at a time (``stream=True``)."""
        for seg, next_seq in segments:
            scan = _scan_segment(seg.path, seg.first_seq, False, replay_from_seq)
            if scan.next_seq < next_seq:  # the file changed under us
                raise WALError(f"{seg.path} changed during replay (consume the records before appending)")
            for rec in scan.records:
                if rec[0] < next_seq:
                    yield rec

    # -- properties --

    @property
    def last_seq(self) -> int:
        """Highest seq appended (durable or not); 0 for an empty log."""
        return self._last_seq

    @property
    def durable_seq(self) -> int:
        """Highest seq covered by a completed fsync (``never``: handed to the OS)."""
        return self._durable_seq

    @property
    def first_seq(self) -> int:
        """Lowest seq still stored (after compaction); ``last_seq + 1`` if none."""
        return self._segments[0].first_seq if self._segments else self._last_seq + 1

    @property
    def segment_paths(self) -> list[str]:
        return [s.path for s in self._segments]

    # -- appends --

    def _check_usable(self) -> None:
        if self._closed:
            raise WALError("WAL is closed")
        if self._failed is not None:
            raise WALFailed(f"WAL failed earlier: {self._failed!r}") from self._failed

    def append(self, payload: bytes) -> int:
        """Buffer one record; returns its seq. Durable only after a covering sync
        (immediately in ``always`` mode)."""
        seq = self._append_one(payload)
        if self.mode == "always":
            self.sync()
        return seq

    def append_many(self, payloads: Iterable[bytes]) -> int:
        """Buffer several records; returns the last seq (``last_seq`` if empty).
        ``always`` mode fsyncs once for the whole call."""
        for payload in payloads:
            self._append_one(payload)
        if self.mode == "always":
            self.sync()
        return self._last_seq

    def _append_one(self, payload: bytes) -> int:
        self._check_usable()
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"WAL payloads are bytes, not {type(payload).__name__}")
        record_bytes = RECORD_HEADER_BYTES + len(payload)
        # Room is always kept for the commit marker that will close the batch.
        if SEGMENT_HEADER_BYTES + record_bytes + COMMIT_MARKER_BYTES > self.segment_bytes_max:
            raise ValueError(f"record of {len(payload)} bytes exceeds segment_bytes_max {self.segment_bytes_max}")
        if self._seg_records > 0 and self._seg_end + record_bytes + COMMIT_MARKER_BYTES > self.segment_bytes_max:
            self._rotate()
        seq = self._last_seq + 1
        record = encode_record(seq, bytes(payload), self._salt)
        assert len(record) == record_bytes
        self._buf += record
        self._batch_crc = crc32c.crc32c(record, self._batch_crc)
        self._seg_end += record_bytes
        self._seg_records += 1
        self._last_seq = seq
        self.stats["appends"] += 1
        self.stats["bytes_appended"] += record_bytes
        if len(self._buf) >= self.write_buffer_bytes_max:
            self._flush()
        return seq

    def _mark(self, seal: bool = False) -> None:
        """Buffer the commit marker that closes the current batch (``seal``: an
        empty batch, written only to claim what the last fsync made durable)."""
        if self._last_seq == self._marked_seq and not seal:
            return
        marker = encode_commit(self._salt, self._last_seq, self._seg_end - self._batch_start, self._batch_crc,
                               self._seg_durable_end)
        self._buf += marker
        self._claimed_end = max(self._claimed_end, self._seg_durable_end)
        self._seg_end += COMMIT_MARKER_BYTES
        self._batch_start = self._seg_end
        self._batch_crc = 0
        self._marked_seq = self._last_seq
        self.stats["commit_markers"] += 1

    def _flush(self) -> None:
        """Hand the buffer to the OS (no fsync)."""
        if self._buf:
            try:
                _write_all(self._fd, self._buf)
            except BaseException as e:
                # After a failed write we no longer know what is in the file.
                self._failed = e
                raise
            self._buf.clear()

    def _rotate(self) -> None:
        # Seal the finished segment and make it durable before the next one receives
        # any record, so a torn write can only ever sit in the last segment.
        try:
            self._mark()
        except BaseException as e:
            self._failed = e
            raise
        self._flush()
        self._fsync(self._fd)
        if self._ticket is not None:
            # The in-flight sync (another thread or process) shares a segment's file
            # description, and the kernel reports a writeback error to one fsync per
            # description: if that one took it, a seal's fsync of the same segment
            # returned 0 for pages that never reached the disk. So what the seal covers
            # is durable only once that sync succeeds too (complete_sync; its error fails
            # the WAL as ever), and so is the seal of any later segment: durable_seq is
            # a prefix.
            self._rotated_seq = self._last_seq
            if self._ticket.fd == self._fd:
                self._retired_fds.append(self._fd)  # closed by complete_sync
            else:
                os.close(self._fd)
        else:
            self._durable_seq = self._last_seq
            os.close(self._fd)
        self._fd = -1
        try:
            self._create_segment(self._last_seq + 1)
        except BaseException as e:
            # No segment to write to: every later append would fail differently. Fail now.
            self._failed = e
            raise

    def _create_segment(self, first_seq: int, flags: int = 0) -> None:
        path = os.path.join(self.directory, segment_name(first_seq))
        salt = int.from_bytes(os.urandom(8), "big")
        header = _encode_segment_header(first_seq, salt, flags)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, header)
            self._fsync(fd)
            # Pair assertion: the header we will trust at recovery reads back intact.
            assert os.pread(fd, SEGMENT_HEADER_BYTES, 0) == header
            fsync_dir(self.directory)
        except BaseException:
            os.close(fd)
            raise
        self._segments.append(_Segment(first_seq, path))
        self._fd = fd
        self._salt = salt
        self._seg_end = self._seg_durable_end = self._claimed_end = self._batch_start = SEGMENT_HEADER_BYTES
        self._batch_crc = 0
        self._marked_seq = first_seq - 1
        self._seg_records = 0
        self.stats["segments_created"] += 1

    def _fsync(self, fd: int) -> None:
        # Structural fsyncs (segment creation, rotation, recovery) happen in every
        # mode, ``never`` included: they are rare and keep the recovery rules true.
        try:
            _fdatasync(fd)
        except BaseException as e:
            self._failed = e
            raise
        self.stats["fsyncs"] += 1

    # -- group commit --

    def sync(self) -> int:
        """Group commit: make every appended record durable with (at most) one fsync.
        Returns ``durable_seq``. Not to be mixed with an in-flight ``GroupCommitter`` sync."""
        ticket = self.prepare_sync()
        if ticket is None:
            return self._durable_seq
        try:
            self.perform_sync(ticket)
        except OSError as e:
            return self.complete_sync(ticket, e)
        return self.complete_sync(ticket)

    def prepare_sync(self) -> SyncTicket | None:
        """Owner thread: write out the buffer and its commit marker and describe the
        fsync that would cover it; None if everything appended is already durable."""
        self._check_usable()
        if self._ticket is not None:
            raise WALError("a sync is already in flight")
        self._mark()
        self._flush()
        if self._durable_seq >= self._last_seq:
            return None
        self._ticket = SyncTicket(self._fd, self._last_seq, self._seg_end)
        return self._ticket

    def perform_sync(self, ticket: SyncTicket) -> None:
        """Any thread: the fsync itself. Touches nothing but the file descriptor."""
        if self.mode != "never":
            _fdatasync(ticket.fd)

    def complete_sync(self, ticket: SyncTicket, error: BaseException | None = None) -> int:
        """Owner thread: record the outcome of ``perform_sync``; returns ``durable_seq``."""
        assert self._ticket is ticket, "complete_sync for a ticket that is not in flight"
        self._ticket = None
        for fd in self._retired_fds:
            os.close(fd)
        self._retired_fds.clear()
        if error is not None:
            self._failed = error
            raise WALFailed(f"fsync failed: {error!r}") from error
        if self.mode != "never":
            self.stats["fsyncs"] += 1
            if ticket.fd == self._fd:  # not a segment retired by a rotation meanwhile
                self._seg_durable_end = max(self._seg_durable_end, ticket.end)
        self._durable_seq = max(self._durable_seq, ticket.seq, self._rotated_seq)
        self._rotated_seq = 0
        assert self._durable_seq <= self._last_seq
        return self._durable_seq

    # -- compaction / close --

    def compact(self, upto_seq: int) -> int:
        """Delete whole segments whose records are all ``<= upto_seq`` (covered by a
        snapshot), oldest first, each deletion made durable before the next, so a
        crash never leaves a gap. The last segment is never deleted. Returns how
        many were removed."""
        self._check_usable()
        if upto_seq > self._durable_seq:
            raise ValueError(f"cannot compact past durable seq {self._durable_seq} (asked {upto_seq})")
        removed = 0
        # Bounded by the number of segments; segment i ends where segment i+1 starts.
        while len(self._segments) > 1 and self._segments[1].first_seq - 1 <= upto_seq:
            try:
                os.unlink(self._segments[0].path)
                fsync_dir(self.directory)
            except BaseException as e:
                self._failed = e
                raise
            del self._segments[0]
            removed += 1
        return removed

    def restart_at(self, first_seq: int) -> None:
        """Drop every record and continue the log at ``first_seq`` (> ``last_seq``): for
        an owner whose snapshot restates all of them (its WAL lost records that the
        snapshot covers). Only before the first append. Deletes the segments oldest
        first, each deletion durable, then creates the new one: a crash on the way
        leaves a suffix of the old log, or none, all of it below ``first_seq``."""
        self._check_usable()
        if first_seq <= self._last_seq:
            raise ValueError(f"restart_at({first_seq}) must be past the last seq {self._last_seq}")
        if self._ticket is not None or self._buf or self._durable_seq != self._last_seq:
            raise WALError("restart_at() only right after open")
        # The new (version-3, FLAG_RESTART) segment first, then the old ones: the data
        # dir is never without a version-3 segment (the fence), and recovery finishes
        # an interrupted restart (WAL._recover).
        old_segments, self._segments = self._segments, []
        try:
            os.close(self._fd)
            self._fd = -1
            self._create_segment(first_seq, FLAG_RESTART)
            for seg in old_segments:  # bounded by the number of segments
                os.unlink(seg.path)
                fsync_dir(self.directory)
        except BaseException as e:
            self._failed = e
            raise
        self._last_seq = self._marked_seq = self._durable_seq = first_seq - 1

    def close(self) -> None:
        """Write out the buffer and sync it (per the mode), seal the segment with a
        marker that vouches for everything synced, then release the files."""
        if self._closed:
            return
        if self._ticket is not None:
            raise WALError("close() while a sync is in flight; await the committer first")
        try:
            if self._failed is None:
                self.sync()
                if (self.mode != "never" and self._seg_durable_end > self._claimed_end
                        and self._seg_end + COMMIT_MARKER_BYTES <= self.segment_bytes_max):
                    self._mark(seal=True)
                    self._flush()
                    self._fsync(self._fd)
        finally:
            self._closed = True
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            for fd in self._retired_fds:
                os.close(fd)
            self._retired_fds.clear()
            self._release_lock()

    def abandon(self, *, write_buffer: bool = False) -> None:
        """Drop the files without syncing: what a crashed process leaves behind.
        Buffered appends are lost unless ``write_buffer`` (the process died just after
        its ``write`` call, before the commit marker). For tests and fault injection."""
        if self._closed:
            return
        if write_buffer and self._failed is None:
            self._flush()
        self._closed = True
        for fd in [self._fd, *self._retired_fds]:
            if fd >= 0:
                os.close(fd)
        self._fd = -1
        self._retired_fds.clear()
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> WAL:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- asyncio group committer ------------------------------------------------------

DurableCallback = Callable[[BaseException | None], None]


_FSYNC_CHILD = r"""
import os, signal, socket, struct, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
s = socket.socket(fileno=int(sys.argv[1]))
while True:
    try:
        msg, fds, _f, _a = socket.recv_fds(s, 16, 1)
    except OSError:
        break
    if not msg:
        break
    err = 0
    try:
        if fds:
            os.fdatasync(fds[0])
        else:
            err = 22
    except OSError as e:
        err = e.errno or 5
    for fd in fds:
        os.close(fd)
    try:
        s.send(msg[:8] + struct.pack("<i", err))
    except OSError:
        break
"""


class FsyncProcess:
    """The fsync in a child process, so the event loop neither waits for it nor
    hands the GIL to a thread when it returns. ``fdatasync`` flushes the file's dirty
    pages, whichever process or descriptor wrote them: the WAL writes its batch
    (``prepare_sync``) and then sends the child a duplicate of the segment's
    descriptor (SCM_RIGHTS); the child syncs it and answers with the request's id
    and an errno (0 for success). The child exits when its socket reaches EOF (this
    process, and every fork of it, exited). It runs in a session of its own, so a
    terminal's Ctrl-C, which is this process's to handle, never reaches it (and it
    ignores SIGINT/SIGTERM once started)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _FSYNC_CHILD, str(child.fileno())],
                pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, close_fds=True, start_new_session=True)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        parent.setblocking(False)
        self._sock = parent
        self._next_id = itertools.count(1)
        self._pending: dict[int, asyncio.Future[None]] = {}
        self._closed = False
        try:
            loop.add_reader(parent.fileno(), self._on_reply)
        except BaseException:
            self._closed = True
            parent.close()  # EOF: the child exits
            self._proc.kill()
            self._proc.wait()
            raise

    def submit(self, fd: int) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = self._loop.create_future()
        if self._closed:
            fut.set_exception(WALError("the fsync process is gone"))
            return fut
        rid = next(self._next_id)
        try:
            socket.send_fds(self._sock, [rid.to_bytes(8, "little")], [fd])
        except OSError as e:
            fut.set_exception(e)
            return fut
        self._pending[rid] = fut
        return fut

    def _on_reply(self) -> None:
        # Bounded by the replies queued in the socket (at most one per request).
        while True:
            try:
                msg = self._sock.recv(16)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._gone(e)
                return
            if not msg:
                self._gone(WALError("the fsync process exited"))
                return
            rid = int.from_bytes(msg[:8], "little")
            err = int.from_bytes(msg[8:12], "little", signed=True)
            fut = self._pending.pop(rid, None)
            if fut is None or fut.done():
                continue
            if err:
                fut.set_exception(OSError(err, os.strerror(err)))
            else:
                fut.set_result(None)

    def _gone(self, error: BaseException) -> None:
        for fut in self._pending.values():  # with this error, before close()'s generic one
            if not fut.done():
                fut.set_exception(error)
        self._pending.clear()
        self.close()

    def close(self) -> None:
        """Never blocks the loop for long: an idle child exits at once on EOF; one stuck
        in an fdatasync of a hung disk is killed and left to be reaped by the kernel
        when this process exits (SIGKILL waits for the syscall). Requests still pending
        fail."""
        if self._closed:
            return
        self._closed = True
        try:
            self._loop.remove_reader(self._sock.fileno())
        except Exception:  # the loop is closed already
            pass
        self._sock.close()  # EOF: the child exits
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(WALError("the fsync process was closed"))
        self._pending.clear()
        try:
            self._proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            try:
                self._proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                log.error("the fsync process %d does not exit (a hung disk?); left behind", self._proc.pid)


class GroupCommitter:
    """Runs a WAL's fsyncs and tells waiters when their record is durable. See the
    module docstring. Where a ``batch`` fsync runs: ``process``, in a child process
    (``FsyncProcess``), while the loop goes on; ``inline``, on the loop at the end of
    the turn; otherwise in one background thread.

    ``waiters_max`` bounds pending waiters; beyond it ``on_durable``/``durable``
    raise ``CommitQueueFull``. Callbacks run on the event loop, in seq order, and
    must not raise (an exception is logged and swallowed so others still run).
    """

    def __init__(self, wal: WAL, *, waiters_max: int = 65536, inline: bool = False,
                 process: bool = False) -> None:
        self._wal = wal
        self._loop = asyncio.get_running_loop()
        # inline: the fsync runs on the loop at the end of the turn that appended (still
        # one per turn for everything appended in it), not in the thread: no hand-off
        # to a thread and back per sync (0.81-0.84x the replicas' CPU per write at 256
        # sessions, docs/runtime.md); the loop waits for the fsync instead (0.1-0.8 ms here).
        # process: neither; a child process syncs while the loop goes on, and its answer
        # arrives as a readable socket (docs/runtime.md, "Where batch's fsync runs").
        self._inline = inline
        self._process: FsyncProcess | None = None
        if process and not inline and wal.mode == "batch":
            try:
                self._process = FsyncProcess(self._loop)
            except OSError as e:  # no process to be had: the fsync on the loop, still correct
                log.warning("cannot start the fsync process (%s); fsyncs run on the event loop", e)
                self._inline = True
        self._executor = (None if self._inline or process or wal.mode != "batch" else
                          concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="wal-fsync"))
        self._waiters: list[tuple[int, int, DurableCallback]] = []  # heap by seq
        self._tiebreak = itertools.count()
        self._waiters_max = waiters_max
        self._in_flight: asyncio.Future[None] | None = None
        self._kick_scheduled = False
        self._sync_requested_seq = 0
        self._failed: BaseException | None = None
        self._closed = False

    @property
    def pending_waiters(self) -> int:
        return len(self._waiters)

    def on_durable(self, seq: int, callback: DurableCallback) -> None:
        """Call ``callback(None)`` once ``seq`` is durable (``callback(exc)`` if the
        WAL fails first). Immediate if it already is."""
        if self._failed is not None:
            raise WALFailed(f"WAL failed earlier: {self._failed!r}") from self._failed
        if self._closed:
            raise WALError("committer is closed")
        if seq > self._wal.last_seq:
            raise ValueError(f"seq {seq} has not been appended (last seq {self._wal.last_seq})")
        if seq <= self._wal.durable_seq:
            callback(None)
            return
        if len(self._waiters) >= self._waiters_max:
            raise CommitQueueFull(f"{len(self._waiters)} durability waiters pending")
        heapq.heappush(self._waiters, (seq, next(self._tiebreak), callback))
        self._kick()

    async def durable(self, seq: int) -> int:
        """Wait until ``seq`` is durable; returns the durable seq at that moment."""
        fut: asyncio.Future[None] = self._loop.create_future()

        def done(exc: BaseException | None) -> None:
            if fut.done():  # the waiter was cancelled
                return
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)

        self.on_durable(seq, done)
        await fut
        return self._wal.durable_seq

    def request_sync(self) -> None:
        """Sync everything appended so far even though nobody waits on it."""
        if self._failed is None and not self._closed:
            self._sync_requested_seq = self._wal.last_seq
            self._kick()

    def _kick(self) -> None:
        # Deferred to the end of this loop turn so appends made later in the same
        # turn ride on the same fsync.
        if not self._kick_scheduled and self._in_flight is None:
            self._kick_scheduled = True
            self._loop.call_soon(self._start_sync)

    def _wanted_seq(self) -> int:
        return max(self._sync_requested_seq, self._waiters[0][0] if self._waiters else 0)

    def _start_sync(self) -> None:
        self._kick_scheduled = False
        if self._in_flight is not None or self._failed is not None or self._closed:
            return
        if self._wanted_seq() <= self._wal.durable_seq:
            # Nothing to sync, but a rotation's fsync may have covered waiters since
            # they registered: theirs is the only call that would tell them.
            self._release(None)
            return
        try:
            if self._wal.mode != "batch" or self._inline:
                # always: already durable; never: only a write to the page cache;
                # inline: the fsync, here.
                self._wal.sync()
                self._release(None)
                return
            ticket = self._wal.prepare_sync()
        except BaseException as e:
            self._fail(e)
            return
        if ticket is None:
            self._release(None)
            return
        if self._process is not None:
            self._in_flight = self._process.submit(ticket.fd)
        else:
            assert self._executor is not None
            self._in_flight = self._loop.run_in_executor(self._executor, self._wal.perform_sync, ticket)
        self._in_flight.add_done_callback(lambda fut: self._sync_done(ticket, fut))

    def _sync_done(self, ticket: SyncTicket, fut: asyncio.Future[None]) -> None:
        self._in_flight = None
        error = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
        try:
            self._wal.complete_sync(ticket, error)
        except BaseException as e:
            self._fail(e)
            return
        self._release(None)
        # Everything appended while that fsync ran goes in the next one, right away.
        if self._wanted_seq() > self._wal.durable_seq:
            self._start_sync()

    def _release(self, error: BaseException | None) -> None:
        durable = self._wal.durable_seq
        # Bounded by the number of waiters.
        while self._waiters and (error is not None or self._waiters[0][0] <= durable):
            _seq, _n, callback = heapq.heappop(self._waiters)
            try:
                callback(error)
            except Exception:
                log.exception("WAL durability callback raised")

    def _fail(self, error: BaseException) -> None:
        log.error("WAL sync failed, the WAL accepts no more work: %r", error)
        self._failed = error
        self._release(error)

    async def close(self, timeout_s: float = 30.0) -> None:
        """Finish the in-flight fsync, sync for remaining waiters, stop the thread.
        Does not close the WAL."""
        if self._closed:
            return
        finished = False
        try:
            async with asyncio.timeout(timeout_s):
                if self._in_flight is not None:
                    await asyncio.wait([self._in_flight])
                # Each pass completes a sync or fails the committer; bounded by the timeout
                # (a released callback may append and wait again).
                while self._waiters and self._failed is None:
                    synced = self._wal.durable_seq
                    self._start_sync()
                    if self._in_flight is not None:
                        await asyncio.wait([self._in_flight])
                    elif self._wal.durable_seq == synced:
                        break
                    else:  # synced here (inline, always, never): a released callback may wait again
                        await asyncio.sleep(0)
            finished = True
        finally:
            # Also on the timeout: every waiter hears, nothing is left pending.
            if self._process is not None:
                self._process.close()
            self._closed = True
            self._release(WALError("committer closed"))
            if self._executor is not None:
                self._executor.shutdown(wait=finished)
